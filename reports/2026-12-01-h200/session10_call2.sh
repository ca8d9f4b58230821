#!/bin/bash
# Session 10, second H200 call: the fmha-nightly hypothesis profile over properties/ (issue 15),
# with the GPU memory sampled every 5 s.
cd "$(dirname "$0")/../.." || exit 1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=memory.used --format=csv,noheader -l 5 > $OUT/nightly-profile-gpu-memory.txt &
start=$(date +%s)
CI=true timeout -s INT 545 python -m pytest -q -n auto properties --fmha-device cuda \
  --hypothesis-profile fmha-nightly --timeout 1800 --timeout-method thread --durations=30 \
  -p no:cacheprovider -p no:benchmark -rfE --tb=line 2>&1 | tail -250 > $OUT/nightly-profile.txt
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/nightly-profile.txt
kill %1
sort -n $OUT/nightly-profile-gpu-memory.txt | tail -1
tail -5 $OUT/nightly-profile.txt

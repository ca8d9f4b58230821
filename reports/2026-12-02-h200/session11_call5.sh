#!/bin/bash
# Session 11, call 5: the fmha-nightly hypothesis profile over properties/ (the issue's
# command), GPU memory sampled every 5 s; then the nightly gate's hd512 grids (dense and the
# 96 DSV4 sparse-decode configs) for fmha, whose sparse calls run the Gluon sparse kernel here.
cd "$(dirname "$0")/../.." || exit 1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export CI=true TRITON_CACHE_DIR=/tmp/triton-cache-session11
nvidia-smi --query-gpu=memory.used --format=csv,noheader -l 5 > $OUT/nightly-profile-gpu-memory.txt &
start=$(date +%s)
timeout -s INT 420 python -m pytest -q -n auto properties --fmha-device cuda \
  --hypothesis-profile fmha-nightly --timeout 1800 --timeout-method thread --durations=30 \
  -p no:cacheprovider -rfE --tb=short > $OUT/nightly-profile.txt 2>&1
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/nightly-profile.txt
kill %1
echo "peak GPU memory: $(sort -n $OUT/nightly-profile-gpu-memory.txt | tail -1)" | tee -a $OUT/nightly-profile.txt
grep -E "^(FAILED|ERROR)|INTERNALERROR|node down|crashed" $OUT/nightly-profile.txt | cut -c1-250 | head -30
tail -3 $OUT/nightly-profile.txt
timeout -s INT 120 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-hd512 > $OUT/nightly-gate-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-gate-hd512.txt
tail -20 $OUT/nightly-gate-hd512.txt

#!/bin/bash
# Session 10, fourth H200 call, on the final tree: the GPU job with an empty Triton cache (a
# fresh TRITON_CACHE_DIR), bench --quick for the Triton kernel with the window's mask only in
# the tiles a window ends in and with the window a compile-time flag (the kernels of commit
# 969d747: before_window_runtime_*.py, copied in for the second run), then the fmha-nightly
# profile over properties/.
# before_window_runtime_*.py were `git show 969d747:fmha/triton_attention.py` and
# `git show 969d747:fmha/triton_sources.py`, beside this script for the run (not committed).
cd "$(dirname "$0")/../.." || exit 1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export CI=true TRITON_CACHE_DIR=/tmp/triton-cache-session10-final
rm -rf $TRITON_CACHE_DIR
start=$(date +%s)
timeout -s INT 190 python -m pytest -n auto regressions properties oracles tests --fmha-device cuda \
  --timeout 300 --timeout-method thread --durations=20 -p no:cacheprovider -p no:benchmark -rfE --tb=short \
  2>&1 | tail -150 > $OUT/pytest-auto-cold-session10-final.txt
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/pytest-auto-cold-session10-final.txt
grep -E "^(FAILED|ERROR)| passed" $OUT/pytest-auto-cold-session10-final.txt | cut -c1-250
mkdir -p /tmp/before && cp fmha/triton_attention.py fmha/triton_sources.py /tmp/before/
timeout -s INT 40 python -m fmha.bench --quick --only "fmha, Gluon off" > $OUT/bench-window-final.txt 2>&1
cp reports/2026-12-01-h200/before_window_runtime_triton_attention.py fmha/triton_attention.py
cp reports/2026-12-01-h200/before_window_runtime_triton_sources.py fmha/triton_sources.py
timeout -s INT 40 python -m fmha.bench --quick --only "fmha, Gluon off" >> $OUT/bench-window-final.txt 2>&1
cp /tmp/before/triton_attention.py /tmp/before/triton_sources.py fmha/
grep "^| " $OUT/bench-window-final.txt
nvidia-smi --query-gpu=memory.used --format=csv,noheader -l 5 > $OUT/nightly-profile-gpu-memory.txt &
start=$(date +%s)
timeout -s INT 290 python -m pytest -q -n auto properties --fmha-device cuda \
  --hypothesis-profile fmha-nightly --timeout 1800 --timeout-method thread --durations=30 \
  -p no:cacheprovider -p no:benchmark -rfE --tb=short > $OUT/nightly-profile-final.txt 2>&1
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/nightly-profile-final.txt
kill %1
sort -n $OUT/nightly-profile-gpu-memory.txt | tail -1
grep -E "^(FAILED|ERROR)" $OUT/nightly-profile-final.txt | cut -c1-250 | head -30
tail -2 $OUT/nightly-profile-final.txt

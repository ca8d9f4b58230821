#!/bin/bash
# Session 10, third H200 call: the GPU job with an empty Triton cache (a fresh TRITON_CACHE_DIR
# on a machine that had run before), again with that cache warm, then bench --quick for the
# Triton kernel with the window a runtime value (this tree) and a compile-time flag (before).
# before_window_runtime_*.py were `git show 969d747:fmha/triton_attention.py` and
# `git show 969d747:fmha/triton_sources.py`, beside this script for the run (not committed).
cd "$(dirname "$0")/../.." || exit 1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export CI=true TRITON_CACHE_DIR=/tmp/triton-cache-session10
rm -rf $TRITON_CACHE_DIR
for run in cold warm; do
  start=$(date +%s)
  timeout -s INT 280 python -m pytest -n auto regressions properties oracles tests --fmha-device cuda \
    --timeout 300 --timeout-method thread --durations=20 -p no:cacheprovider -p no:benchmark -rfE --tb=short \
    2>&1 | tail -120 > $OUT/pytest-auto-$run-session10.txt
  echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/pytest-auto-$run-session10.txt
  tail -2 $OUT/pytest-auto-$run-session10.txt
done
timeout -s INT 70 python -m fmha.bench --quick --only "fmha, Gluon off" > $OUT/bench-window-runtime.txt 2>&1
cp reports/2026-12-01-h200/before_window_runtime_triton_attention.py fmha/triton_attention.py
cp reports/2026-12-01-h200/before_window_runtime_triton_sources.py fmha/triton_sources.py
timeout -s INT 70 python -m fmha.bench --quick --only "fmha, Gluon off" > $OUT/bench-window-constexpr.txt 2>&1
tail -6 $OUT/bench-window-runtime.txt $OUT/bench-window-constexpr.txt

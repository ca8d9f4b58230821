#!/bin/bash
# Session 11, call 4, on the final tree: the PR workflow's GPU job (`pytest -n auto regressions
# properties oracles tests --fmha-device cuda`, its timeout and durations flags) with an empty
# Triton cache (a fresh TRITON_CACHE_DIR: cold), then again with that cache (warm).
cd "$(dirname "$0")/../.." || exit 1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
export CI=true TRITON_CACHE_DIR=/tmp/triton-cache-session11
rm -rf $TRITON_CACHE_DIR
for run in cold warm; do
  start=$(date +%s)
  timeout -s INT 290 python -m pytest -n auto regressions properties oracles tests --fmha-device cuda \
    --timeout 300 --timeout-method thread --durations=20 -p no:cacheprovider -rfE --tb=short \
    2>&1 | tail -120 > $OUT/pytest-auto-$run.txt
  echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/pytest-auto-$run.txt
  grep -E "^(FAILED|ERROR)|node down|crashed| passed|fmha: Triton compiled" $OUT/pytest-auto-$run.txt | cut -c1-300
done

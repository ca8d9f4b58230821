#!/bin/bash
# Session 15, call 4, on the final tree: the sparse bench, then the PR workflow's GPU job (the Triton cache warm
# from the bench only).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout -s INT 220 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" 2>&1 | grep -v Warning \
  | tee $OUT/bench-sparse.txt
start=$(date +%s)
timeout -s INT 300 python -m pytest -n auto regressions properties oracles tests --fmha-device cuda \
  --timeout 300 --timeout-method thread --durations=10 -p no:cacheprovider -rfE --tb=short \
  2>&1 | tail -60 > $OUT/pytest-auto.txt
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/pytest-auto.txt
grep -E "^(FAILED|ERROR)|node down|crashed| passed|fmha: Triton compiled" $OUT/pytest-auto.txt | cut -c1-250

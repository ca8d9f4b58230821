#!/bin/bash
# Session 14, call 7, on the final tree: the PR workflow's GPU job (cold Triton cache on a fresh machine).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
start=$(date +%s)
timeout -s INT 300 python -m pytest -n auto regressions properties oracles tests --fmha-device cuda \
  --timeout 300 --timeout-method thread --durations=10 -p no:cacheprovider -rfE --tb=short \
  2>&1 | tail -60 > $OUT/pytest-auto-cold.txt
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/pytest-auto-cold.txt
grep -E "^(FAILED|ERROR)|node down|crashed| passed|fmha: Triton compiled" $OUT/pytest-auto-cold.txt | cut -c1-250

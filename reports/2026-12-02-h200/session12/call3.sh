#!/bin/bash
# Session 12, call 3, on the final tree: the Gluon sparse kernel's own tests (e4m3 against torch,
# rows with no key), the PR workflow's GPU job (cold Triton cache), the nightly gate's hd512
# grids (its 96 DSV4 sparse-decode configs run the Gluon sparse kernel) and the sparse bench.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 70 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 30 \
  --timeout-method thread 2>&1 | tail -4 | tee $OUT/gluon-sparse-tests.txt
start=$(date +%s)
timeout -s INT 250 python -m pytest -n auto regressions properties oracles tests --fmha-device cuda \
  --timeout 300 --timeout-method thread --durations=10 -p no:cacheprovider -rfE --tb=short \
  2>&1 | tail -60 > $OUT/pytest-auto-cold.txt
echo "wall $(( $(date +%s) - start )) s" | tee -a $OUT/pytest-auto-cold.txt
grep -E "^(FAILED|ERROR)|node down|crashed| passed|fmha: Triton compiled" $OUT/pytest-auto-cold.txt | cut -c1-250
timeout -s INT 110 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-hd512 > $OUT/nightly-gate-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-gate-hd512.txt
tail -6 $OUT/nightly-gate-hd512.txt
timeout 120 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" 2>&1 | tee $OUT/bench-sparse.txt

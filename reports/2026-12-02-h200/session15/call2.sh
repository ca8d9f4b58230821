#!/bin/bash
# Session 15, call 2: the gatherer asks L2 for the next tile's keys while its own are in flight. The kernel's
# tests; FP8 on every bench shape and FP4 on B64 T1 against call 1's kernel; the gatherer alone with and without.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session15
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 100 \
  --timeout-method thread 2>&1 | tail -3 | tee $OUT/gluon-sparse-tests.txt
timeout 120 python $H/variants.py 1 3 4 5 2>&1 | grep -v Warning | tee $OUT/variants-fp8-b64t1.txt
SHAPES=" " timeout 150 python $H/variants.py 1 3 2>&1 | grep -v Warning | tee $OUT/variants-fp8-all.txt
SECOND=dsv4-fp4 SHAPES="B64 Hq128 T1" timeout 100 python $H/variants.py 1 3 2>&1 | grep -v Warning \
  | tee $OUT/variants-fp4.txt

#!/bin/bash
# Session 14, call 3, on the final kernel: its tests; the consumers with FlashAttention-3's overlap (full and
# alone); an FP4 second scope timed; the sparse bench against gather + our dense kernel.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 100 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 60 \
  --timeout-method thread 2>&1 | tail -2 | tee $OUT/gluon-sparse-tests.txt
V=reports/2026-12-02-h200/session14/variants.py
timeout 150 python $V 1 3 6 7 2>&1 | grep -v Warning | tee $OUT/variants-overlap.txt
SECOND=dsv4-fp4 SHAPES="B64 Hq128 T1" timeout 90 python $V 1 2>&1 | grep -v Warning | tee $OUT/variants-fp4.txt
timeout -s INT 240 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" 2>&1 | grep -v Warning \
  | tee $OUT/bench-sparse.txt

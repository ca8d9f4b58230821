#!/bin/bash
# Session 15, call 1: the FP4 second scope's e2m1 decoded a byte at a time. The kernel's tests (the e2m1
# decoder test bit for bit against the oracle) and that test against four wrong decoders; FP4 on every bench
# shape and FP8 against session 14's kernel; the kernel with P hi only (timing only).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session15
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 100 \
  --timeout-method thread 2>&1 | tail -3 | tee $OUT/gluon-sparse-tests.txt
for m in high-nibble-first halves-scales-swapped signs-dropped high-nibble-misplaced; do
  PYTHONPATH=. timeout 60 python $H/decoder_mutants.py $m 2>&1 | grep -v Warning | tail -2 | tee -a $OUT/decoder-mutants.txt
done
SECOND=dsv4-fp4 SHAPES=" " timeout 170 python $H/variants.py 0 1 2>&1 | grep -v Warning | tee $OUT/variants-fp4.txt
timeout 90 python $H/variants.py 0 1 2 2>&1 | grep -v Warning | tee $OUT/variants-fp8.txt

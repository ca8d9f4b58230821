#!/bin/bash
# Session 14, call 4, on the final tree (the FP4 gather rewritten as the FP8 one): the kernel's tests (with the
# new e2m1 decoder test) and that test against two wrong decoders; FP4 and FP8 timed against session 13's
# kernel; the sparse mutants; the nightly gate's hd512 grids (FP8 and FP4 second caches).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session14
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 60 \
  --timeout-method thread 2>&1 | tail -3 | tee $OUT/gluon-sparse-tests.txt
for m in high-nibble-first halves-scales-swapped; do
  PYTHONPATH=. timeout 60 python $H/decoder_mutants.py $m 2>&1 | grep -v Warning | tail -2 | tee -a $OUT/decoder-mutants.txt
done
SECOND=dsv4-fp4 SHAPES="B64 Hq128 T1" timeout 100 python $H/variants.py 0 1 2>&1 | grep -v Warning | tee $OUT/variants-fp4.txt
timeout 60 python $H/variants.py 0 1 2>&1 | grep -v Warning | tee $OUT/variants-fp8.txt
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_gluon_mutants.py -k sparse --fmha-device cuda \
  --timeout 100 --timeout-method thread 2>&1 | tail -2 | tee $OUT/gluon-mutants.txt
timeout -s INT 110 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-hd512 > $OUT/nightly-gate-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-gate-hd512.txt
tail -5 $OUT/nightly-gate-hd512.txt

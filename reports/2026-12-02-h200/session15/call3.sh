#!/bin/bash
# Session 15, call 3, on the final kernel (the L2 prefetch for FP4 only): the kernel's tests, the sparse mutants,
# the nightly gate's hd512 grids (FP8 and FP4 second caches); FP4 on the B64 shapes against call 1's kernel and
# call 2's (prefetch for both layouts), FP8 on every shape against call 1's.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session15
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 100 \
  --timeout-method thread 2>&1 | tail -3 | tee $OUT/gluon-sparse-tests.txt
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gluon_mutants.py -k sparse --fmha-device cuda \
  --timeout 120 --timeout-method thread 2>&1 | tail -2 | tee $OUT/gluon-mutants.txt
timeout -s INT 130 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-hd512 > $OUT/nightly-gate-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-gate-hd512.txt
tail -4 $OUT/nightly-gate-hd512.txt
SECOND=dsv4-fp4 SHAPES="B64" timeout 110 python $H/variants.py 1 3 6 2>&1 | grep -v Warning | tee $OUT/variants-fp4.txt
SHAPES=" " timeout 110 python $H/variants.py 1 6 2>&1 | grep -v Warning | tee $OUT/variants-fp8.txt

#!/bin/bash
# Session 13, call 2: the FP8 gather staged through cp.async one tile ahead (the tree then), its own tests, the
# variants against session 12's kernel on every bench shape, the nightly gate's hd512 grids.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 100 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 60 \
  --timeout-method thread 2>&1 | tail -4 | tee $OUT/gluon-sparse-tests.txt
SHAPES="B64 Hq128 T1 top-k 128+512" timeout 120 python reports/2026-12-02-h200/session13/variants.py 0 1 5 6 7 2>&1 \
  | grep -v Warning | tee $OUT/variants-bar.txt
SHAPES=" " timeout 150 python reports/2026-12-02-h200/session13/variants.py 0 5 7 2>&1 | grep -v Warning \
  | tee $OUT/variants-all.txt
timeout -s INT 110 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-hd512 > $OUT/nightly-gate-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-gate-hd512.txt
tail -6 $OUT/nightly-gate-hd512.txt

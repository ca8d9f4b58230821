#!/bin/bash
# Session 14, call 1: the FP8 tile stored at once (the tree then): its own tests, the variants on the bar's
# shape (random, then sorted slots), then session 13's kernel against it on every bench shape.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 110 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 60 \
  --timeout-method thread 2>&1 | tail -4 | tee $OUT/gluon-sparse-tests.txt
V=reports/2026-12-02-h200/session14/variants.py
timeout 200 python $V 0 1 3 4 2 5 2>&1 | grep -v Warning | tee $OUT/variants-bar.txt
INDICES=sorted timeout 80 python $V 1 2 5 2>&1 | grep -v Warning | tee $OUT/variants-sorted.txt
SHAPES=" " timeout 110 python $V 0 1 2>&1 | grep -v Warning | tee $OUT/variants-all.txt

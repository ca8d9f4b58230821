# Session 12, call 1: the 32-key-tile kernel's verdicts, its variants against session 11's on the
# DSV4 bench shapes, and the v2 laws and traps on it.
set -o pipefail
export PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
timeout 150 python reports/2026-12-02-h200/sparse_smoke.py gluon-sparse 2>&1 | tee $OUT/smoke.txt
SHAPES="T1 top-k" timeout 240 python reports/2026-12-02-h200/session12/variants.py 2>&1 | tee $OUT/variants.txt
timeout 150 python -m pytest -q -n 16 -p no:cacheprovider properties/test_source_laws.py regressions/test_traps.py \
  --fmha-device cuda --fmha-kernel gluon-sparse --timeout 140 --timeout-method thread 2>&1 | tail -15 | tee $OUT/v2-gluon-sparse.txt

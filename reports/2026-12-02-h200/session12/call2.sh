# Session 12, call 2: e4m3 decoded by bits: the decoder against torch for every code, the kernel's
# verdicts, its variants (hardware conversions, 64-key tiles, no loads) on the T1 bench shapes, and
# the v2 laws, traps and Gluon sparse mutants on it.
set -o pipefail
export PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
timeout 100 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse_decode.py --fmha-device cuda 2>&1 | tail -5 | tee $OUT/decode.txt
timeout 100 python reports/2026-12-02-h200/sparse_smoke.py gluon-sparse 2>&1 | cut -c1-160 | tee $OUT/smoke.txt
SHAPES="T1 top-k" timeout 200 python reports/2026-12-02-h200/session12/variants.py 2>&1 | tee $OUT/variants.txt
timeout 200 python -m pytest -q -n 16 -p no:cacheprovider properties/test_source_laws.py regressions/test_traps.py \
  tests/test_gluon_mutants.py --fmha-device cuda --fmha-kernel gluon-sparse --timeout 190 --timeout-method thread \
  2>&1 | grep -v Warning | tail -12 | tee $OUT/v2-gluon-sparse.txt

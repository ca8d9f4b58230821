# Session 11, call 1: install, the Gluon sparse kernel's verdicts, the v2 laws and traps on it,
# the sparse bench, and where an fp32 Triton kernel's local memory goes.
set -o pipefail
export PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
timeout 150 python reports/2026-12-02-h200/sparse_smoke.py 2>&1 | tee $OUT/smoke.txt
timeout 200 python -m pytest -q -n 16 -p no:cacheprovider properties/test_source_laws.py regressions/test_traps.py \
  --fmha-device cuda --fmha-kernel gluon-sparse --timeout 150 --timeout-method thread -x 2>&1 | tail -30 | tee $OUT/v2-gluon-sparse.txt
timeout 150 python -m fmha.bench --sparse --only fmha --only "fmha, Gluon off" --only "gather + fmha dense" 2>&1 | tee $OUT/bench-sparse.txt
timeout 60 python reports/2026-12-02-h200/lmem_probe.py 2>&1 | tee $OUT/lmem.txt

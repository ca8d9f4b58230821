# Session 11, call 2: two gathering warpgroups (one a stage) with the slots of the next tile
# prefetched; its verdicts, variants that place its time, the sparse bench, the v2 suite on it,
# and the fp32 tiles' local memory after FP32_TILES.
set -o pipefail
export PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
timeout 120 python reports/2026-12-02-h200/sparse_smoke.py gluon-sparse 2>&1 | tee $OUT/smoke.txt
timeout 120 python reports/2026-12-02-h200/sparse_variants.py 2>&1 | tee $OUT/variants.txt
timeout 100 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" 2>&1 | tee $OUT/bench-sparse.txt
timeout 90 python reports/2026-12-02-h200/lmem_probe.py 2>&1 | tee $OUT/lmem.txt

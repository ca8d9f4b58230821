# Session 11, call 3: one gathering warpgroup again, an FP8 tile's bytes loaded before it waits
# for the stage; its verdicts and the sparse bench.
set -o pipefail
export PYTHONUNBUFFERED=1
python -m pip install --no-deps --no-build-isolation -e . -q 2>&1 | tail -2
timeout 100 python reports/2026-12-02-h200/sparse_smoke.py gluon-sparse 2>&1 | tee $OUT/smoke.txt
timeout 100 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" 2>&1 | tee $OUT/bench-sparse.txt

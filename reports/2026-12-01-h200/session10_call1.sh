#!/bin/bash
# Session 10, first H200 call: contract v2's Triton kernel on a GPU, the sparse-decode bench,
# the nightly gate's sparse grid, and the dense kernel with the window as a runtime value
# against the one before it (bench --quick, Triton only).
cd "$(dirname "$0")/../.." || exit 1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee $OUT/env.txt
python -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee -a $OUT/env.txt
# Open the v2 kernel's GPU capabilities for this run.
sed -i 's/    devices=("cpu",),/    devices=("cpu", "cuda"),/' fmha/triton_sources.py
grep -n 'devices=' fmha/triton_sources.py | tee -a $OUT/env.txt
export CI=true
timeout -s INT 200 python -m pytest -q -n 16 properties/test_source_laws.py regressions/test_traps.py \
  --fmha-device cuda --fmha-kernel fmha --timeout 180 --timeout-method thread --durations=15 \
  -p no:cacheprovider -p no:benchmark -rfE --tb=short 2>&1 | tail -150 > $OUT/v2-suite-cuda.txt
tail -3 $OUT/v2-suite-cuda.txt
timeout -s INT 150 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" \
  --only "gather + sdpa efficient" --only "gather + sdpa math" 2>&1 | tee $OUT/bench-sparse.txt | tail -15
timeout -s INT 90 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-sparse > $OUT/nightly-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-hd512.txt
tail -25 $OUT/nightly-hd512.txt
timeout -s INT 60 python -m fmha.bench --quick --only "fmha, Gluon off" 2>&1 | tee $OUT/bench-window-runtime.txt | tail -7
cp reports/2026-12-01-h200/before_window_runtime_triton_attention.py fmha/triton_attention.py
timeout -s INT 60 python -m fmha.bench --quick --only "fmha, Gluon off" 2>&1 | tee $OUT/bench-window-constexpr.txt | tail -7

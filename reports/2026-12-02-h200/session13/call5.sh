#!/bin/bash
# Session 13, call 5, on the final tree (session 12's kernel): the sparse bench with FlexAttention
# and SDPA mem-efficient beside ours (Flex compiles once per shape: outputs are kept as they come).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout -s INT 520 python -m fmha.bench --sparse --only fmha --only "gather + flex" --only "gather + sdpa efficient" \
  2>&1 | grep -v Warning | tee $OUT/bench-sparse-flex.txt

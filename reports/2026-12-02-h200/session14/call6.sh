#!/bin/bash
# Session 14, call 6, on call 4's kernel: where the consumers' 41 us go (variants 3 and 8-11, timing only).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 200 python reports/2026-12-02-h200/session14/variants.py 1 3 8 9 10 11 2>&1 | grep -v Warning \
  | tee $OUT/variants-consumers.txt

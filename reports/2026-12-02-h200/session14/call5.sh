#!/bin/bash
# Session 14, call 5, on call 4's kernel: the e2m1 decoder test against two wrong decoders (call 4's try
# stopped at an import: session14/profile.py shadowed the standard library's); an FP4 second scope on every
# bench shape; the sparse bench.
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session14
for m in high-nibble-first halves-scales-swapped; do
  PYTHONPATH=. timeout 60 python $H/decoder_mutants.py $m 2>&1 | grep -v Warning | tail -2 | tee -a $OUT/decoder-mutants.txt
done
SECOND=dsv4-fp4 SHAPES=" " timeout 120 python $H/variants.py 1 2>&1 | grep -v Warning | tee $OUT/variants-fp4-all.txt
timeout -s INT 240 python -m fmha.bench --sparse --only fmha --only "gather + fmha dense" 2>&1 | grep -v Warning \
  | tee $OUT/bench-sparse.txt

#!/bin/bash
# Session 13, call 4: where the time goes, for session 12's kernel and the two cp.async stagings
# (variants.py; the consumers-take-nothing variants last, as a hang there would stop the rest).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
V=reports/2026-12-02-h200/session13/variants.py
timeout 200 python $V 0 2 3 6 8 10 12 14 2>&1 | grep -v Warning | tee $OUT/variants-a.txt
timeout 150 python $V 1 7 9 11 13 2>&1 | grep -v Warning | tee $OUT/variants-b.txt

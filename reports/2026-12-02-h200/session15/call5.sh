#!/bin/bash
# Session 15, call 5: e4m3 codes scaled in bf16 (a packed bf16 product) instead of through fp32. The kernel's
# tests (the e4m3 decoder test bit for bit against torch, scale codes 0 to 255); FP8 on every bench shape against
# call 3's kernel (git cbcfbee).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session15
timeout 150 python -m pytest -q -p no:cacheprovider tests/test_gluon_sparse.py --fmha-device cuda --timeout 100 \
  --timeout-method thread 2>&1 | tail -4 | tee $OUT/gluon-sparse-tests.txt
SHAPES=" " timeout 130 python $H/variants.py 6 7 2>&1 | grep -v Warning | tee $OUT/variants-fp8.txt
# As run, the variants step stopped at an import (the git kernels were not beside the script); it ran again on
# the same machine right after, as its own command, into call5/variants-fp8.txt:
#   SHAPES=" " timeout 130 python reports/2026-12-02-h200/session15/variants.py 6 7
# (variant 7 was then the working tree; variants.py now builds it as a patch of git cbcfbee, the same source).

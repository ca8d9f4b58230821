#!/bin/bash
# Session 13, call 1: time the variants of variants.py, then one ncu profile of the product
# kernel (full set, per-instruction samples of the SASS).
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
timeout 200 python reports/2026-12-02-h200/session13/variants.py 2>&1 | grep -v Warning | tee $OUT/variants.txt
ncu --version | tail -1
timeout 200 ncu --clock-control none -k regex:_sparse_fwd -s 1 -c 1 --set full --import-source no -f \
  -o $OUT/sparse python reports/2026-12-02-h200/session13/profile.py > $OUT/ncu-log.txt 2>&1
echo "ncu rc=$?"; tail -3 $OUT/ncu-log.txt
ncu -i $OUT/sparse.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i $OUT/sparse.ncu-rep --page source --csv --print-source sass > $OUT/source-sass.csv 2>&1
ls -la $OUT; grep -E "Duration|Issue Slots Busy|Issued Ipc|Bank Conflicts|Warp Cycles Per Issued|No Eligible|One or More" $OUT/details.txt | head -30

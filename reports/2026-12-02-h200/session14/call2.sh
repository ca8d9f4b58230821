#!/bin/bash
# Session 14, call 2, on call 1's tree: the random-token gather rate; an ncu profile of the consumers alone
# (variant 3) with per-instruction stall samples; the sparse mutants; the nightly gate's hd512 grids.
# (ncu_run.py was named profile.py when this ran: it shadowed the standard library's profile module.)
cd "$(dirname "$0")/../../.." || exit 1
export PYTHONUNBUFFERED=1 CI=true
python -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1
H=reports/2026-12-02-h200/session14
timeout 90 python $H/gather_rate.py 2>&1 | grep -v Warning | tee $OUT/gather-rate.txt
timeout 150 ncu --clock-control none -k regex:_sparse_fwd -s 1 -c 1 --set full --import-source no -f \
  -o $OUT/consumers python $H/ncu_run.py 3 > $OUT/ncu-log.txt 2>&1; echo "ncu rc=$?"
ncu -i $OUT/consumers.ncu-rep --page details > $OUT/consumers-details.txt 2>&1
ncu -i $OUT/consumers.ncu-rep --page source --csv --print-source sass > /tmp/consumers.csv 2>&1
python $H/stalls.py /tmp/consumers.csv | tee $OUT/consumers-stalls.txt | head -30
rm -f $OUT/consumers.ncu-rep
timeout 120 python -m pytest -q -p no:cacheprovider tests/test_gluon_mutants.py -k sparse --fmha-device cuda \
  --timeout 100 --timeout-method thread 2>&1 | tail -3 | tee $OUT/gluon-mutants.txt
timeout -s INT 110 python -m fmha.ci.nightly --fmha-device cuda --fmha-kernel fmha --head-dims 512 --seeds 1 \
  --out /tmp/nightly-hd512 > $OUT/nightly-gate-hd512.txt 2>&1; echo "nightly rc=$?" | tee -a $OUT/nightly-gate-hd512.txt
tail -6 $OUT/nightly-gate-hd512.txt

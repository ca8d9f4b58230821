"""Session 14: the warp-stall samples of an ncu profile's SASS (`ncu -i X.ncu-rep --page source --csv
--print-source sass > X.csv`; `python stalls.py X.csv`): each reason's share, then the instructions
with the most samples (their index, so that a local disassembly of the same build places them)."""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
header, data = rows[1], rows[2:]
col = {h: i for i, h in enumerate(header)}
samples = col["Warp Stall Sampling (All Samples)"]
reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
total = sum(int(r[samples] or 0) for r in data)
count = collections.Counter()
for r in data:
    for reason in reasons:
        count[reason[6:]] += int(r[col[reason]] or 0)
print(f"{total} samples over {len(data)} instructions; " + ", ".join(
    f"{k} {100 * v / total:.0f}%" for k, v in count.most_common(8)))
for index, r in sorted(enumerate(data), key=lambda ir: -int(ir[1][samples] or 0))[:40]:
    top = sorted(((int(r[col[h]] or 0), h[6:]) for h in reasons), reverse=True)[:2]
    print(f"{index:5d} {int(r[samples] or 0):5d} {r[1].strip()[:70]:70s} " + ", ".join(f"{k} {v}" for v, k in top))

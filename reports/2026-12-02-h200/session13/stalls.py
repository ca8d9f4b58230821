"""Session 13: the warp-stall samples of call 1's ncu profile (`ncu -i sparse.ncu-rep --page source
--csv --print-source sass > source-sass.csv`; the report itself is not kept, 2.7 MB) by partition
of fmha.gluon_sparse, and how often each waiting loop spun. Partition boundaries are instruction
indices read off the SASS of that build (setmaxnreg and the loops' barriers)."""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1])))
header, data = rows[1], rows[2:]
col = {h: i for i, h in enumerate(header)}
samples, executed = col["Warp Stall Sampling (All Samples)"], col["Instructions Executed"]
reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
REGIONS = {"warpgroup 1 (P.V, Dv 256-511)": (34, 1181), "gathering warpgroup": (1191, 2435),
           "warpgroup 0 (QK^T, softmax, P.V)": (2442, 4515)}
total = sum(int(r[samples] or 0) for r in data)
print(f"{total} samples over {len(data)} instructions")
for name, (first, last) in REGIONS.items():
    count = collections.Counter()
    for r in data[first:last]:
        for reason in reasons:
            count[reason[6:]] += int(r[col[reason]] or 0)
    n = sum(int(r[samples] or 0) for r in data[first:last])
    top = ", ".join(f"{k} {100 * v / n:.0f}%" for k, v in count.most_common(5))
    print(f"{name}: {n} samples; {top}")
print("waits (mbarrier try-wait executions: first tries in the loop, retries in the stub at the end):")
for r in data:
    if "TRYWAIT" in r[1]:
        print(f"  {r[1].strip()[:60]:60s} {r[executed]}")

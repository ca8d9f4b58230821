"""Where fmha.kernels.cuda_sparse's time goes, tile by tile (GPU): clock64() at eleven events of each
of the first CTA's tiles on a bench shape (fmha.bench.sparse; the first unless --shape), as cycles
from the producer's first loads.

    python -m fmha.bench.sparse_trace
    python -m fmha.bench.sparse_trace --source /tmp/variant.cu   # an edited copy of the kernel
    python -m fmha.bench.sparse_trace --shape "B256 Hq128 T2 top-k 128+1024"

Columns: the producer's loads issued, its stage free, its first thread's key stored, all its
keys stored, and its half tile copied to the peer; warpgroup 0's keys ready, QK^T done, P
written and its P.V issued, P.V done; warpgroup 1's P received and P.V done. Then the spans
between them (QK^T, the softmax, the P.V, the fill, a tile) over the tiles in steady state, and
every CTA's span (%globaltimer): how long the CTAs ran, on how many SMs, whether some started only
after others had ended (a second wave), and its phases: to the first tile, the tiles, the output,
the end.
"""

import argparse
import os
import sys

import torch

from fmha.bench import sparse
from fmha.kernels import cuda_sparse

EVENTS = ("prod_load", "prod_free", "prod_own", "prod_all", "prod_stored", "wg0_ready", "wg0_qk", "wg0_p", "wg0_pv",
          "wg1_pfull", "wg1_pv")
ORDER = (8, 6, 9, 10, 7, 0, 1, 2, 3, 4, 5)  # the kernel's event numbers, in the columns' order
# Spans between the kernel's events (tile i's, or tile i's to tile i + 1's), in cycles.
SPANS = {
    "a tile (its keys ready to the next tile's)": (0, 0, 1),
    "warpgroup 0: keys ready to QK^T done": (0, 1, 0),
    "warpgroup 0: QK^T done to P written and its P.V issued (the softmax)": (1, 2, 0),
    "warpgroup 0: P.V issued to done": (2, 3, 0),
    "warpgroup 0: P.V done to the next tile's keys ready": (3, 0, 1),
    "warpgroup 1: P received to its P.V done": (4, 5, 0),
    "producer: stage free to all its keys stored": (6, 10, 0),
    "producer: stage free to the tile ready (the fill, the peer's half included)": (6, 0, 0),
}


def spans(events: list[list[int]], tiles: int) -> dict[str, tuple[int, int, int]]:
    """Median, min and max of each of SPANS over the tiles in steady state (neither the first nor
    the last tile takes part): `events[i][e]` is tile i's clock at the kernel's event e."""
    out = {}
    for what, (a, b, next_tile) in SPANS.items():
        steady = range(1, tiles - 1 - next_tile) if tiles > 3 else range(tiles - next_tile)
        values = sorted(events[i + next_tile][b] - events[i][a] for i in steady)
        if values:
            out[what] = (values[len(values) // 2], values[0], values[-1])
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", help="an edited copy of the kernel's .cu (as fmha.bench.cuda_variants builds it)")
    parser.add_argument("--shape", default="", help="the first bench shape whose name has this (default: the first)")
    args = parser.parse_args(argv)
    if args.source and not os.path.isfile(args.source):
        parser.error(f"--source: expected the path of a .cu file, got {args.source!r}")
    shape = next((item for item in sparse.SHAPES.items() if args.shape in item[0]), None)
    if shape is None:
        parser.error(f"--shape: expected part of a bench shape's name ({'; '.join(sparse.SHAPES)}), got {args.shape!r}")
    if cuda_sparse.availability("cuda"):
        print(f"fmha.bench.sparse_trace: {cuda_sparse.availability('cuda')}", file=sys.stderr)
        return 2
    name, p = shape
    x = sparse.inputs(p)
    blocks = p.batch * p.q_len * -(-p.heads_q // 64)
    if args.source:
        extension = cuda_sparse.build(cuda_sparse.variant_name(args.source, args.source), args.source)
    else:
        extension = cuda_sparse.module()
    events, per_cta = extension.trace_events, extension.trace_cta
    trace = torch.zeros(64 * events + per_cta * blocks, dtype=torch.int64, device="cuda")
    o = torch.empty(p.batch, p.q_len, p.heads_q, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(p.batch, p.heads_q, p.q_len, dtype=torch.float32, device="cuda")
    for _ in range(3):  # the last run's clocks stay
        extension.sparse_decode(x["q"], o, lse, x["sink"], x["k_cache"], x["indices"], None, 1,
                                x["extra_k_cache"], x["extra_indices"], None, 1, 512**-0.5, trace)
    t = trace[:64 * events].view(64, events).cpu()
    tiles = -(-p.kv_len // 64) + -(-p.extra_topk // 64)
    print(f"{name}, {torch.cuda.get_device_name()}: cycles from the producer's first loads")
    print("tile " + " ".join(f"{e:>11}" for e in EVENTS))
    for i in range(min(tiles, 64)):
        print(f"{i:4d} " + " ".join(f"{int(t[i, e] - t[0, 8]):11d}" for e in ORDER))
    print("spans in cycles, the median (min-max) of the tiles but the first and the last:")
    for what, (median, low, high) in spans(t.tolist(), min(tiles, 64)).items():
        print(f"  {what}: {median} ({low}-{high})")
    ctas = trace[64 * events:].view(blocks, per_cta).cpu()
    start, end = ctas[:, 0] - ctas[:, 0].min(), ctas[:, 1] - ctas[:, 0].min()
    ran = (end - start).double()
    print(f"{blocks} CTAs on {len(set(ctas[:, 2].tolist()))} SMs: all ended {int(end.max()) / 1e3:.1f} us after the "
          f"first start; a CTA ran {ran.median().item() / 1e3:.1f} us (median), {ran.min().item() / 1e3:.1f}-"
          f"{ran.max().item() / 1e3:.1f}; {int((start >= end.min()).sum())} started after the first had ended")
    for what, (a, b) in {"from its start to its first tile (the barriers, the cluster's start, q)": (0, 3),
                         "in its tiles": (3, 4), "from its last tile to its half of o stored": (4, 5),
                         "from then to its end (the cluster's last barrier)": (5, 1)}.items():
        us = (ctas[:, b] - ctas[:, a]).double() / 1e3
        print(f"a CTA's warpgroup 0 {what}: {us.median().item():.1f} us (median), {us.min().item():.1f}-"
              f"{us.max().item():.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

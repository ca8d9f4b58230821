"""Sweep tile configurations of fmha's Triton attention on the GPU; the best go into
fmha.kernels.triton_dense.GPU_TILES.

    python -m fmha.bench.tune [--shape SUBSTRING]

Candidates are (BLOCK_M, BLOCK_N, BLOCK_DV, num_warps, num_stages) per head dim (BLOCK_D is
the head dim, or half of it above 256); each is timed on the benchmark shapes with that head
dim (median of CUDA-graph replays). A candidate that does not fit shared memory for a shape
runs shrunk, as fmha.kernels.triton_dense._tiles would run it (fewer stages first).
"""

from __future__ import annotations

import argparse
import sys

import torch

from fmha.bench.dense import GRID_DECODE, SPEED_SHAPES, inputs, time_us
from fmha.contract import check_attention_args
from fmha.kernels import triton_dense

CANDIDATES = {
    64: [(64, 64, 64, 4, 3), (128, 64, 64, 8, 3), (128, 64, 64, 4, 3), (128, 32, 64, 4, 3)],
    128: [(64, 64, 128, 4, 3), (128, 64, 128, 8, 3), (128, 32, 128, 8, 2), (64, 32, 128, 4, 3), (128, 128, 128, 8, 2)],
    256: [(64, 64, 128, 4, 2), (64, 32, 256, 4, 2), (64, 64, 256, 4, 2), (128, 64, 128, 8, 2), (128, 32, 256, 8, 2),
          (64, 32, 128, 4, 3)],
    512: [(128, 32, 256, 8, 3), (128, 32, 256, 8, 2), (64, 32, 256, 4, 2), (64, 32, 256, 4, 3), (128, 64, 256, 8, 1),
          (128, 16, 256, 8, 4)],
}


SPLITS = (None,)  # None: the heuristic; --splits adds fixed counts


def main(argv=None) -> int:
    global SPLITS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="", help="only shapes whose name contains this")
    parser.add_argument("--splits", type=int, nargs="*", default=[], help="also try these KV split counts")
    parser.add_argument("--head-dim", type=int, action="append", default=[], help="only these head dims")
    args = parser.parse_args(argv)
    SPLITS = (None, *args.splits)
    if args.head_dim:
        for d in set(CANDIDATES) - set(args.head_dim):
            del CANDIDATES[d]
    for name, p in {**SPEED_SHAPES, **GRID_DECODE}.items():
        if args.shape not in name or p.head_dim not in CANDIDATES:
            continue
        q, k, v = inputs(p)
        out = torch.empty(p.batch, p.q_len, p.heads_q, p.head_dim_v, dtype=q.dtype, device="cuda")
        problem = check_attention_args(q, k, v, causal=p.causal, out=out)
        results = []
        for tiles, splits in [(t, s) for t in CANDIDATES[p.head_dim] for s in SPLITS]:
            try:
                us = time_us(lambda: triton_dense.attend(problem, q, k, v, out=out, tiles=tiles, splits=splits))
            except Exception as e:  # out of shared memory, ...
                print(f"  {name} {tiles}: {type(e).__name__} {str(e)[:80]}", flush=True)
                continue
            results.append((us, tiles, splits))
        results.sort()
        print(f"{name}: " + ", ".join(f"{t} splits={s or 'auto'} {us:.1f}µs" for us, t, s in results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

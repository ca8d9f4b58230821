"""The 72-config grid (docs/contract.md): head dims 64/128/256/512 x T 1/4/32/128 x S
128/256/384/512 (64 configs) plus two boundary configs per head dim: (T=1, S=100), below one
128-key tile and not a multiple of it, and (T=4, S=640), DSV4 decode with MTP over 128 SWA +
512 sparse keys.

Every grid problem is causal (the query rows are the last T positions of the sequence, as in
decode and chunked prefill with a KV cache), B = 2, Hq = 8, in the layouts below and in every
dtype a kernel declares.
"""

from __future__ import annotations

import itertools

import torch

from fmha.problem import Problem

HEAD_DIMS = (64, 128, 256, 512)
QUERY_LENS = (1, 4, 32, 128)
KEY_LENS = (128, 256, 384, 512)
BOUNDARY = ((1, 100), (4, 640))

GRID: tuple[Problem, ...] = tuple(
    Problem(batch=2, q_len=t, kv_len=s, heads_q=8, heads_kv=8, head_dim=hd, causal=True)
    for hd, t, s in [*itertools.product(HEAD_DIMS, QUERY_LENS, KEY_LENS),
                     *((hd, t, s) for hd in HEAD_DIMS for t, s in BOUNDARY)]
)
assert len(GRID) == 72

# Layout name -> Problem fields.
LAYOUTS = {
    "mha": dict(heads_q=8, heads_kv=8),
    "gqa": dict(heads_q=8, heads_kv=2),
    "mqa": dict(heads_q=8, heads_kv=1, shared_kv=True),  # DSV4: one K = V head
}


def grid_problem(config: Problem, layout: str, dtype=torch.bfloat16) -> Problem:
    return config.replace(dtype=dtype, **LAYOUTS[layout])


def config_id(config: Problem) -> str:
    return f"hd{config.head_dim}-T{config.q_len}-S{config.kv_len}"


def grid_id(config: Problem, layout: str) -> str:
    """Reads as the case: hd512-T4-S640-mqa."""
    return f"{config_id(config)}-{layout}"

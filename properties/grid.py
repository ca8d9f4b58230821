"""The 72-config grid (DESIGN.md): head dims 64/128/256/512 x T 1/4/32/128 x S 128/256/384/512
(64 configs) plus two boundary configs per head dim: (T=1, S=100), below one 128-key tile and
not a multiple of it, and (T=4, S=640), DSV4 decode with MTP over 128 SWA + 512 sparse keys."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from fmha.problem import Problem

HEAD_DIMS = (64, 128, 256, 512)
QUERY_LENS = (1, 4, 32, 128)
KEY_LENS = (128, 256, 384, 512)
BOUNDARY = ((1, 100), (4, 640))


@dataclass(frozen=True)
class GridConfig:
    head_dim: int
    q_len: int
    kv_len: int

    @property
    def id(self) -> str:
        return f"hd{self.head_dim}-T{self.q_len}-S{self.kv_len}"


GRID: tuple[GridConfig, ...] = tuple(
    [GridConfig(hd, t, s) for hd, t, s in itertools.product(HEAD_DIMS, QUERY_LENS, KEY_LENS)]
    + [GridConfig(hd, t, s) for hd in HEAD_DIMS for t, s in BOUNDARY]
)
assert len(GRID) == 72

# Layout name -> Problem fields. Every grid problem is causal (the query rows are the last T
# positions of the sequence, as in decode and chunked prefill with a KV cache).
LAYOUTS = {
    "mha": dict(heads_q=8, heads_kv=8),
    "gqa": dict(heads_q=8, heads_kv=2),
    "mqa": dict(heads_q=8, heads_kv=1, shared_kv=True),  # DSV4: one K = V head
}


def grid_problem(config: GridConfig, layout: str, dtype=torch.bfloat16, batch: int = 2) -> Problem:
    return Problem(
        batch=batch, q_len=config.q_len, kv_len=config.kv_len, head_dim=config.head_dim,
        dtype=dtype, causal=True, **LAYOUTS[layout],
    )


def grid_id(config: GridConfig, layout: str) -> str:
    """Reads as the case: hd512-T4-S640-mqa."""
    return f"{config.id}-{layout}"

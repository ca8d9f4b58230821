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

from fmha.contract import DTYPE_NAMES, Problem

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


def grid_id(config: Problem, layout: str, dtype=torch.bfloat16) -> str:
    """Reads as the case: hd512-T4-S640-mqa-bf16."""
    return f"{config_id(config)}-{layout}-{DTYPE_NAMES[dtype]}"


# DeepSeek-V4's sparse decode (contract v2): one K = V latent head of dim 512 in FlashMLA's
# FP8 layout read through 128 window indices, plus 512 or 1024 compressed keys in a second
# scope (FP8, or fmha's FP4), in pages of 1, 64 or 61 tokens, with a sink or without.
SPARSE_GRID: tuple[Problem, ...] = tuple(
    Problem(batch=2, q_len=t, kv_len=128, heads_q=h, heads_kv=1, head_dim=512, shared_kv=True, sink=sink,
            source="sparse", block_size=block, cache_layout="dsv4-fp8", extra_topk=extra, extra_block_size=block,
            extra_cache_layout=layout)
    for h, t, extra, block, layout, sink in itertools.product((64, 128), (1, 2), (512, 1024), (1, 64, 61),
                                                             ("dsv4-fp8", "dsv4-fp4"), (False, True))
)
assert len(SPARSE_GRID) == 96


def sparse_id(p: Problem) -> str:
    """Reads as the case: dsv4-h64-T1-topk128+512-block64-fp4-sink."""
    return (f"dsv4-h{p.heads_q}-T{p.q_len}-topk{p.kv_len}+{p.extra_topk}-block{p.block_size}-"
            f"{p.extra_cache_layout.removeprefix('dsv4-')}{'-sink' if p.sink else ''}")

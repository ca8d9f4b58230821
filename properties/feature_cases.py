"""A small set of samples that together touch every part of the contract.

Each is here for a reason (the comment); the 72-config grid and the random strategies live
beside it and go wider.
"""

import torch

from fmha.oracles.sample import Sample
from fmha.contract import DTYPE_NAMES, Problem


def _mha(**changes) -> Problem:
    return Problem(batch=2, q_len=4, kv_len=128, heads_q=4, heads_kv=4, head_dim=64).replace(**changes)


FEATURE_CASES = [
    # MHA, no mask, one full tile; and with a scale passed explicitly
    Sample(problem=_mha()),
    Sample(problem=_mha(), scale=0.3),
    # decode below one tile; MQA
    Sample(problem=Problem(batch=1, q_len=1, kv_len=100, heads_q=8, heads_kv=1, head_dim=128, causal=True)),
    # GQA prefill over two tiles
    Sample(problem=Problem(batch=1, q_len=32, kv_len=256, heads_q=8, heads_kv=2, head_dim=64, causal=True)),
    # window; S one past a tile; passed with causal=False, which it implies
    Sample(problem=Problem(batch=1, q_len=17, kv_len=129, heads_q=6, heads_kv=3, head_dim=128, window=16),
           scalars=("causal=False",)),
    # a window wider than 256 keys (a kernel that caps it there); scale, causal and window numpy scalars
    Sample(problem=Problem(batch=1, q_len=2, kv_len=320, heads_q=4, heads_kv=2, head_dim=64, window=300), scale=0.125,
           scalars=("numpy",)),
    # DSV4 decode with MTP
    Sample(problem=Problem(batch=1, q_len=4, kv_len=640, heads_q=8, heads_kv=1, head_dim=512, window=128, sink=True,
                           shared_kv=True)),
    # T > S: rows with nothing visible, whose lse is -inf, or the sink
    Sample(problem=Problem(batch=1, q_len=9, kv_len=5, heads_q=2, heads_kv=1, head_dim=64, causal=True)),
    Sample(problem=Problem(batch=1, q_len=9, kv_len=5, heads_q=2, heads_kv=1, head_dim=64, causal=True, sink=True)),
    # square causal prefill
    Sample(problem=Problem(batch=2, q_len=64, kv_len=64, heads_q=4, heads_kv=4, head_dim=256, causal=True)),
    # Dv != D, sink without a mask; and on the decode path
    Sample(problem=Problem(batch=1, q_len=8, kv_len=40, heads_q=4, heads_kv=2, head_dim=64, head_dim_v=128, sink=True)),
    Sample(problem=Problem(batch=3, q_len=1, kv_len=77, heads_q=8, heads_kv=2, head_dim=64, head_dim_v=128)),
    # q, k and v each in its own storage: heads broadcast, a gap between heads, a longer buffer
    Sample(problem=Problem(batch=2, q_len=5, kv_len=70, heads_q=4, heads_kv=2, head_dim=64, causal=True),
           q_storage="expanded", k_storage="strided", v_storage="sliced"),
    # head dims of real models that tiles of 16 do not fit (a diffusion UNet's 40, SigLIP's 72)
    Sample(problem=Problem(batch=1, q_len=3, kv_len=33, heads_q=4, heads_kv=2, head_dim=40, head_dim_v=72)),
]

# A wide call, in one dtype (its cost is the width's): 258 query heads in two groups.
WIDE_CASES = [
    Sample(problem=Problem(batch=1, q_len=1, kv_len=17, heads_q=258, heads_kv=2, head_dim=16, dtype=torch.bfloat16)),
]

DTYPES = tuple(DTYPE_NAMES)

# Distributions for the agreement test: typical, scale-blind (normalize-twice), overflow-prone.
AGREEMENT_DISTRIBUTIONS = ("normal", "constant_scores", "large_logits")


def with_dtypes(samples, dtypes=DTYPES):
    return [s.replace(dtype=d) for s in samples for d in dtypes]

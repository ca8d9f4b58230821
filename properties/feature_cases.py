"""A small set of problems that together touch every part of the contract.

Each case is here for a reason (the comment); the 72-config grid and the random strategies
live beside it and go wider.
"""

from fmha.problem import DTYPE_NAMES, Problem

FEATURE_CASES = [
    Problem(2, 4, 128, 4, 4, 64),  # MHA, no mask, one full tile
    Problem(1, 1, 100, 8, 1, 128, causal=True),  # decode below one tile; MQA
    Problem(1, 32, 256, 8, 2, 64, causal=True),  # GQA prefill over two tiles
    Problem(1, 17, 129, 6, 3, 128, window=16),  # window; S one past a tile
    Problem(1, 4, 640, 8, 1, 512, window=128, sink=True, shared_kv=True),  # DSV4 decode with MTP
    Problem(1, 9, 5, 2, 1, 64, causal=True),  # T > S: rows with nothing visible
    Problem(1, 9, 5, 2, 1, 64, causal=True, sink=True),  # ... whose lse is the sink
    Problem(2, 64, 64, 4, 4, 256, causal=True),  # square causal prefill
    Problem(1, 8, 40, 4, 2, 64, head_dim_v=128, sink=True),  # Dv != D, sink without a mask
]

DTYPES = tuple(DTYPE_NAMES)

# Distributions for the agreement test: typical, scale-blind (normalize-twice), overflow-prone.
AGREEMENT_DISTRIBUTIONS = ("normal", "constant_scores", "large_logits")


def with_dtypes(problems, dtypes=DTYPES):
    return [p.replace(dtype=d) for p in problems for d in dtypes]

"""What a user without a paged kernel does, as a kernel for contract v2's paged calls: gather
each request's keys out of the pages, then SDPA (math backend) on them, one request at a time
(`sdpa-paged`)."""

from __future__ import annotations

import torch

from fmha.adapters import sdpa
from fmha.contract import Capabilities, KernelEntry, check_attention_args, plain_scalars
from fmha.contract.slots import request_slots

SDPA_PAGED = Capabilities(
    sources=frozenset({"dense", "paged", "ragged"}),
    features=sdpa.KERNELS_BY_NAME["sdpa-math"].capabilities.features,
    notes={**sdpa.KERNELS_BY_NAME["sdpa-math"].capabilities.notes,
           "sparse": "a gather per query row is not what this adapter does"},
)


def sdpa_paged(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, block_table=None,
               kv_lens=None, cu_seqlens_q=None):
    p = check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                             block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                             capabilities=SDPA_PAGED)
    scale, causal, window = plain_scalars(scale, causal, window)
    math_sdpa = sdpa.KERNELS_BY_NAME["sdpa-math"].fn
    if p.source == "dense":
        return math_sdpa(q, k, v, scale=scale, causal=causal, window=window)
    bounds = cu_seqlens_q.tolist() if cu_seqlens_q is not None else None
    outputs = []
    for b in range(p.batch):
        q_b = q[b] if bounds is None else q[bounds[b]:bounds[b + 1]]
        n = int(kv_lens[b])
        if n == 0 or q_b.shape[0] == 0:
            outputs.append(q.new_zeros(q_b.shape[0], p.heads_q, p.head_dim_v))
            continue
        # Only the keys some row sees: SDPA gives the others a weight of 0, and 0 * NaN (what a
        # key no row may read can hold) is NaN. Dropping keys from the front keeps the rows'
        # bottom-right alignment.
        seen = n - q_b.shape[0] - window + 1 if window is not None else 0
        slots = request_slots(block_table[b], n, p.block_size)[max(seen, 0):]
        k_b, v_b = k.flatten(0, 1)[slots], v.flatten(0, 1)[slots]
        outputs.append(math_sdpa(q_b[None], k_b[None], v_b[None] if v is not k else k_b[None], scale=scale,
                                 causal=causal, window=window)[0][0])
    return (torch.stack(outputs) if bounds is None else torch.cat(outputs)), None


ENTRIES = [
    KernelEntry(name="sdpa-paged", fn=sdpa_paged, capabilities=SDPA_PAGED, default_devices=(),
                description="gather each request's pages, then torch SDPA (math backend) per request"),
]

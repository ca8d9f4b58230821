"""Other libraries' conventions (LSE, page tables, windows), translated to fmha's, for adapters.

fmha's LSE (docs/contract.md): float32 (B, Hq, T), natural log, the sink included; a row
with no visible key has lse = -inf, or the sink's logit when there is one. An adapter for a
kernel with another convention returns `(o, lse_from_...(lse, ...))`:

- FlashInfer returns the LSE in base 2 (every backend, by default): `lse_from_base2`.
- FlashMLA leaves the sink out of its LSE (it scales the output by
  exp(lse) / (exp(lse) + exp(sink)) instead) and returns +inf for a row with no key:
  `lse_from_sink_excluded`.

The verdict names both mismatches when an adapter forgets them ("a base-2 LSE", "the sink
left out of the LSE").

Page tables: fmha's (and vLLM's, FlashAttention's) is a block table, one row of page numbers
per request, with each request's kv length; FlashInfer's is CSR: `indptr` (B + 1), the pages
of every request in one `indices` array, and `last_page_len` (B,), the keys on each request's
last page (1 to page_size): `csr_page_table`.

Queries: a batch of T rows each, (B, T, Hq, D), is what packed-query APIs take as B * T rows
with their starts (FlashAttention's and vLLM's `cu_seqlens_q`, FlashInfer's `qo_indptr`):
`packed_queries`.

Windows: fmha's `window=w` sees exactly w keys, the current one included. FlashInfer's
`window_left` and FlashAttention's / vLLM's `window_size[0]` count the keys left of the
current one: `keys_left_of_current(w)` = w - 1, and -1 for no window. The keys left of every
row's window are no row's, and may hold anything (NaN): a library that gives a masked key a
weight of 0 still multiplies its value (0 * NaN = NaN), so an adapter passes it only the keys
some row sees: `keys_some_row_sees`.
"""

from __future__ import annotations

import math

import torch


def lse_from_base2(lse: torch.Tensor) -> torch.Tensor:
    """log2(sum exp) -> ln(sum exp); -inf stays -inf."""
    return lse * math.log(2.0)


def lse_from_sink_excluded(lse: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """FlashMLA's (B, Hq, T) LSE without the sink, +inf where a row has no key -> fmha's."""
    lse = lse.masked_fill(torch.isposinf(lse), -math.inf)
    if sink is None:
        return lse
    return torch.logaddexp(lse, sink.to(lse.dtype).view(1, -1, 1))


def csr_page_table(block_table: torch.Tensor, kv_lens: torch.Tensor, block_size: int):
    """fmha's (B, max_blocks) block table and (B,) kv lengths -> FlashInfer's int32
    (indptr, indices, last_page_len). A request's pages are the first ceil(kv_len / block_size)
    of its row; its last page holds kv_len - (pages - 1) * block_size keys."""
    pages = (kv_lens.long() + block_size - 1) // block_size
    indptr = torch.zeros(len(pages) + 1, dtype=torch.int32, device=block_table.device)
    indptr[1:] = torch.cumsum(pages, 0)
    used = torch.arange(block_table.shape[1], device=block_table.device) < pages.view(-1, 1)
    last_page_len = (kv_lens.long() - (pages - 1).clamp(min=0) * block_size).to(torch.int32)
    return indptr, block_table[used].to(torch.int32).contiguous(), last_page_len


def keys_left_of_current(window: int | None) -> int:
    """fmha's window (keys seen, the current one included) -> the count of keys left of the
    current one; -1: no window."""
    return -1 if window is None else window - 1


def packed_queries(q: torch.Tensor, cu_seqlens_q: torch.Tensor | None):
    """(packed rows, each request's start and end): a ragged call's q as it is, a batch's
    (B, T, Hq, D) as B * T rows, T a request."""
    if cu_seqlens_q is not None:
        return q, cu_seqlens_q
    batch, rows = q.shape[:2]
    return q.flatten(0, 1), torch.arange(batch + 1, dtype=torch.int32, device=q.device) * rows


def keys_some_row_sees(k: torch.Tensor, v: torch.Tensor, q_len: int, window: int | None):
    """A dense call's k and v (B, S, H, D) from the first key some query row sees: the keys
    before it are left of every row's window. Bottom-right alignment holds as it was: the rows
    sit at the last positions of the keys that are left."""
    if window is None:
        return k, v
    start = max(0, k.shape[1] - q_len - window + 1)
    return k[:, start:], (k[:, start:] if v is k else v[:, start:])

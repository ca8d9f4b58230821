"""Where a call's keys come from (contract v2), for the float64 oracle.

Every source reduces, request by request, to one gather of each query row's keys and values
plus a visibility mask; `attention` then runs the one softmax of `reference.py` over them.
Caches here hold numbers (a quantized cache is dequantized first, `quantization.dequantize`).

- `Dense(k, v)`: contract v1's (B, S, Hkv, D) keys; causal and window decide visibility.
- `Paged(k_cache, v_cache, block_table, kv_lens)`: caches (num_blocks, block_size, Hkv, D);
  logical key j < kv_lens[b] of request b is slot block_table[b, j // block_size] *
  block_size + j % block_size; causal and window apply to logical positions, each request
  bottom-right aligned on its own kv length.
- `Sparse(k_cache, v_cache, indices, topk_len)`: indices (B, T, topk) of physical slots
  (block * block_size + offset), -1 = no key, only the first topk_len[b] read; the indices
  alone decide visibility (causal and window do not apply) and a repeated index counts each
  time it appears.

Several sources in one call (DeepSeek-V4: the window's keys and the compressed keys) join
one softmax; the sink, once, in its denominator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from fmha.oracles.reference import NEG_INF, softmax_with_sink, visibility_mask


def _slots(cache: torch.Tensor) -> torch.Tensor:
    """(num_blocks, block_size, H, D) -> (num_blocks * block_size, H, D): one row per slot."""
    return cache.flatten(0, 1)


@dataclass(frozen=True)
class Dense:
    k: torch.Tensor  # (B, S, Hkv, D)
    v: torch.Tensor  # (B, S, Hkv, Dv)

    def rows(self, b: int, q_len: int, causal: bool, window: int | None):
        """keys (1, S, Hkv, D), values (1, S, Hkv, Dv) and visible (T, S) of request b."""
        visible = visibility_mask(q_len, self.k.shape[1], causal, window, device=self.k.device)
        return self.k[b][None], self.v[b][None], visible


@dataclass(frozen=True)
class Paged:
    k_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor  # (num_blocks, block_size, Hkv, Dv), may be k_cache
    block_table: torch.Tensor  # (B, max_blocks) int32
    kv_lens: torch.Tensor  # (B,) int32

    def rows(self, b: int, q_len: int, causal: bool, window: int | None):
        block_size = self.k_cache.shape[1]
        j = torch.arange(int(self.kv_lens[b]), device=self.k_cache.device)
        slots = self.block_table[b].long()[j // block_size] * block_size + j % block_size
        visible = visibility_mask(q_len, len(j), causal, window, device=self.k_cache.device)
        return _slots(self.k_cache)[slots][None], _slots(self.v_cache)[slots][None], visible


@dataclass(frozen=True)
class Sparse:
    k_cache: torch.Tensor  # (num_blocks, block_size, Hkv, D)
    v_cache: torch.Tensor  # (num_blocks, block_size, Hkv, Dv), may be k_cache
    indices: torch.Tensor  # (B, T, topk) int32, -1 = no key
    topk_len: torch.Tensor | None = None  # (B,) int32

    def rows(self, b: int, q_len: int, causal: bool, window: int | None):
        """keys (T, topk, Hkv, D), values and visible (T, topk): one key set per query row."""
        indices = self.indices[b].long()
        visible = indices != -1
        if self.topk_len is not None:
            visible &= torch.arange(indices.shape[-1], device=indices.device) < int(self.topk_len[b])
        slots = torch.where(visible, indices, 0)  # an invisible index reads nothing
        return _slots(self.k_cache)[slots], _slots(self.v_cache)[slots], visible


Source = Dense | Paged | Sparse


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scale: float,
           sink: torch.Tensor | None):
    """One request in float64: q (T, Hq, D); keys (T or 1, N, Hkv, D) and values (T or 1, N,
    Hkv, Dv) shared by the rows or one set per row; visible (T, N). Returns o (T, Hq, Dv) and
    lse (Hq, T). Invisible keys and values are never read: poison there cannot leak."""
    group = q.shape[1] // keys.shape[2]
    keys = keys.double().repeat_interleave(group, dim=2).expand(q.shape[0], -1, -1, -1)
    values = values.double().repeat_interleave(group, dim=2).expand(q.shape[0], -1, -1, -1)
    values = torch.where(visible[..., None, None], values, 0.0)
    scores = torch.einsum("thd,tnhd->htn", q.double(), torch.where(visible[..., None, None], keys, 0.0)) * scale
    weights, lse = softmax_with_sink(scores.masked_fill(~visible, NEG_INF)[None], sink)
    return torch.einsum("htn,tnhd->thd", weights[0], values), lse[0]


def attention(q: torch.Tensor, sources: Sequence[Source], *, cu_seqlens_q: torch.Tensor | None = None,
              scale: float | None = None, causal: bool = False, window: int | None = None,
              sink: torch.Tensor | None = None):
    """The contract-v2 attention in float64 over the keys of all `sources`, one softmax.

    q (B, T, Hq, D) gives o (B, T, Hq, Dv) and lse (B, Hq, T); packed q (total_q, Hq, D) with
    `cu_seqlens_q` (B + 1,) gives o (total_q, Hq, Dv) and lse (Hq, total_q), FlashAttention's
    varlen convention. A row with no visible key: o = 0, lse = -inf (the sink with one)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if cu_seqlens_q is None:
        requests = [q[b] for b in range(q.shape[0])]
    else:
        bounds = cu_seqlens_q.tolist()
        requests = [q[start:end] for start, end in zip(bounds, bounds[1:])]
    outputs, lses = [], []
    for b, q_b in enumerate(requests):
        parts = [source.rows(b, q_b.shape[0], causal, window) for source in sources]
        rows = q_b.shape[0]
        keys = torch.cat([k.expand(rows, -1, -1, -1) for k, _, _ in parts], dim=1)
        values = torch.cat([v.expand(rows, -1, -1, -1) for _, v, _ in parts], dim=1)
        visible = torch.cat([m for _, _, m in parts], dim=1)
        o_b, lse_b = attend(q_b, keys, values, visible, scale, sink)
        outputs.append(o_b)
        lses.append(lse_b)
    if cu_seqlens_q is None:
        return torch.stack(outputs), torch.stack(lses)
    return torch.cat(outputs), torch.cat(lses, dim=1)

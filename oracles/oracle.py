"""The float64 oracle over any call: where its keys come from, its answer, and the scales a
verdict measures a kernel against (`Oracle`), from one pass.

Every source of keys reduces, request by request, to one gather of each query row's keys and
values plus a visibility mask; `attention` and `oracle` then run the one softmax of
`dense_reference.py` over them. Caches here hold numbers (a quantized cache is dequantized first,
`quantization.dequantize`).

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

import itertools
from dataclasses import dataclass
from typing import Sequence

import torch

from fmha.contract.slots import request_slots
from fmha.oracles.guard import answer
from fmha.oracles.quantization import LAYOUTS, dequantize, pages_of
from fmha.oracles.dense_reference import NEG_INF, softmax_with_sink, visibility_mask


@dataclass
class Oracle:
    """The float64 answer to one call, and the scales a verdict measures a kernel against."""

    o: torch.Tensor  # (B, T, Hq, Dv)
    lse: torch.Tensor  # (B, Hq, T)
    # The attention over |v|: for each output element, the sum of the magnitudes of the terms
    # it adds up, the scale its rounding error is relative to (|o| is far smaller where they
    # cancel).
    o_abs: torch.Tensor
    # Like o: sqrt(sum_j p_j^2 v_j^2), the RMS error of an output element when each weight p_j
    # is off by the same small relative amount at random: what rounding P to the input's dtype
    # before P.V costs (FlashAttention's convention; where the terms cancel, |o| is far smaller).
    o_squares: torch.Tensor
    # RMS of the visible logits: holding them in float32 costs about 2^-24 of this.
    logit_rms: float
    # (B, Hq, T): scale * |q_row| * the longest key the row sees, what a row's logits add up
    # before they cancel.
    logit_magnitude: torch.Tensor
    # Like o: 2^-126 times the visible |v|, what a kernel computing the weights in fp32 loses
    # where they fall below fp32's smallest normal and flush to zero (an H200 kernel, a sink
    # taking all but 2^-130 of a row's weight: rows of outputs near 2^-125 off by 55 units).
    underflow: torch.Tensor

    def __post_init__(self):
        answer(self.o, self.lse, self.o_abs, self.o_squares, self.logit_magnitude, self.underflow)


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
        slots = request_slots(self.block_table[b], int(self.kv_lens[b]), self.k_cache.shape[1])
        visible = visibility_mask(q_len, len(slots), causal, window, device=self.k_cache.device)
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


# Keys one pass of the oracle holds: its float64 logits are (Hq, T, KEY_CHUNK) at most, so a request
# of 128k keys (the GPU scale tier's) is answered in bounded memory. The CPU tier's are one pass.
KEY_CHUNK = 2**14


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scale: float,
           sink: torch.Tensor | None, scales: bool = False, key_chunk: int | None = None):
    """One request in float64: q (T, Hq, D); keys (T or 1, N, Hkv, D) and values (T or 1, N,
    Hkv, Dv) shared by the rows or one set per row; visible (T, N). Returns o (T, Hq, Dv) and
    lse (Hq, T), and with `scales` what the verdict measures against (`Oracle`'s fields, per
    request). Invisible keys and values are never read: poison there cannot leak. Past
    `key_chunk` keys (default KEY_CHUNK), in passes of that many (`_in_chunks`)."""
    key_chunk = key_chunk or KEY_CHUNK
    if keys.shape[1] > key_chunk:
        return _in_chunks(q, keys, values, visible, scale, sink, scales, key_chunk)
    shared = keys.shape[0] == 1
    keys, values = _readable(keys, values, visible)
    scores = _scores(q, keys, shared) * scale
    weights, lse = softmax_with_sink(scores.masked_fill(~visible, NEG_INF)[None], sink)
    terms = _terms(q, keys, values, visible, weights[0], scores, scales)
    return (terms["o"], lse[0]) if not scales else _scales(terms, lse[0], q, scale)


def _readable(keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor):
    """keys and values in float64, zeroed where no row may read them (poison there cannot leak
    through 0 * NaN); keys shared by the rows as (N, Hkv, D), never copied per row (a paged
    request's keys are one set for all its rows: copying them per row took T times their memory)."""
    shared = keys.shape[0] == 1
    if shared:
        keys, values = keys[0], values[0]
    readable = (visible.any(0) if shared else visible)[..., None, None]
    return torch.where(readable, keys.double(), 0.0), torch.where(readable, values.double(), 0.0)


def _terms(q, keys, values, visible, weights, scores, scales: bool) -> dict:
    """The sums over these keys (`_readable`'s) that the answer and its scales are made of, at
    `weights` (Hq, T, N): sums over several passes of keys add up to the sums over all of them.
    Query head h reads KV head h // group: heads as (Hkv, group), keys never repeated per head."""
    Hkv = keys.shape[-2]
    kv = "nkd" if keys.dim() == 3 else "tnkd"
    grouped = weights.unflatten(0, (Hkv, q.shape[1] // Hkv))
    sums = lambda w, x: torch.einsum(f"kgtn,{kv}->tkgd", w, x).flatten(1, 2)  # noqa: E731
    terms = dict(o=sums(grouped, values))
    if not scales:
        return terms
    T = q.shape[0]
    # Per row, the longest key it sees.
    norms = torch.where(visible[..., None], keys.norm(dim=-1), 0.0)  # (T, N, Hkv)
    # What flushing to zero can take from a sum of p v: a weight below fp32's smallest normal
    # (p |v| < tiny |v|), or a product below it (< tiny, with |v| < 1 and p above it: an H100's
    # Gluon kernel and CPU flash SDPA returned 0 for an output of 1.2e-38 summed from two such).
    flushable = torch.where(values != 0, values.abs().clamp(min=1.0), 0.0)
    return terms | dict(o_abs=sums(grouped, values.abs()), o_squares=sums(grouped.square(), values.square()),
                        squares=float(scores.masked_select(visible.expand_as(scores)).square().sum()),
                        count=int(visible.sum()) * scores.shape[0],
                        key_norm=norms.amax(dim=1) if norms.shape[1] else norms.new_zeros(T, Hkv),
                        seen_abs=torch.einsum(f"tn,{kv}->tkd", visible.double(), flushable))


def _scales(terms: dict, lse: torch.Tensor, q: torch.Tensor, scale: float) -> dict:
    """A request's `Oracle` fields from its terms (`_terms`, summed over every pass of keys)."""
    group = q.shape[1] // terms["key_norm"].shape[-1]
    return dict(o=terms["o"], lse=lse, o_abs=terms["o_abs"], o_squares=terms["o_squares"].sqrt(),
                squares=terms["squares"], count=terms["count"],
                logit_magnitude=scale * q.double().norm(dim=-1).T * terms["key_norm"].repeat_interleave(group, 1).T,
                underflow=torch.finfo(torch.float32).tiny * terms["seen_abs"].repeat_interleave(group, 1))


def _in_chunks(q, keys, values, visible, scale, sink, scales: bool, key_chunk: int):
    """`attend` in passes of `key_chunk` keys, exact: a first pass finds each row's largest logit m
    and l, the sum of exp(logit - m) over every pass and the sink (FlashAttention's m and l, not
    their log: past |logit| ~ 1e17 lse rounds to m, and merging passes by exp(lse_i - lse) would
    weigh tied keys by the pass, not by their count); a second weighs each key exp(logit - m) / l,
    as one pass does (dense_reference.softmax_with_sink), and sums the terms."""
    passes = [slice(i, i + key_chunk) for i in range(0, keys.shape[1], key_chunk)]

    def logits(span):
        k, v = _readable(keys[:, span], values[:, span], visible[:, span])
        scores = _scores(q, k, k.dim() == 3) * scale
        return k, v, scores, scores.masked_fill(~visible[:, span], NEG_INF)

    finite = lambda m: torch.where(torch.isinf(m), 0.0, m)  # noqa: E731 (a row with nothing visible: all 0)
    top = torch.full((q.shape[1], q.shape[0]), NEG_INF, dtype=torch.float64, device=q.device)
    total = torch.zeros_like(top)
    sink_logits = [] if sink is None else [sink.double()[:, None, None]]  # a key of every row, with no value
    for masked in itertools.chain((logits(span)[3] for span in passes), sink_logits):  # one pass in memory
        new_top = torch.maximum(top, masked.amax(dim=-1))
        kept = torch.where(torch.isinf(top), 0.0, torch.exp(top - new_top))  # nothing kept before a row's first key
        total = total * kept + torch.exp(masked - finite(new_top)[..., None]).sum(-1)
        top = new_top
    lse = torch.log(total) + finite(top)
    terms = None
    for span in passes:
        k, v, scores, masked = logits(span)
        weights = torch.exp(masked - finite(top)[..., None]) / torch.where(total == 0, 1.0, total)[..., None]
        part = _terms(q, k, v, visible[:, span], weights, scores, scales)
        terms = part if terms is None else {name: torch.maximum(terms[name], x) if name == "key_norm" else terms[name] + x
                                            for name, x in part.items()}
    return (terms["o"], lse) if not scales else _scales(terms, lse, q, scale)


def _scores(q: torch.Tensor, keys: torch.Tensor, shared: bool) -> torch.Tensor:
    """q.k in float64, (Hq, T, N): q (T, Hq, D); keys (N, Hkv, D) shared by the rows, or
    (T, N, Hkv, D) one set a row. Query head h reads KV head h // group."""
    Hkv = keys.shape[-2]
    by_group = q.double().unflatten(1, (Hkv, q.shape[1] // Hkv))
    return torch.einsum(f"tkgd,{'nkd' if shared else 'tnkd'}->kgtn", by_group, keys.double()).flatten(0, 1)


def _requests(q, cu_seqlens_q):
    if cu_seqlens_q is None:
        return [q[b] for b in range(q.shape[0])]
    bounds = cu_seqlens_q.tolist()
    return [q[start:end] for start, end in zip(bounds, bounds[1:])]


def _gather(sources, b: int, q_b: torch.Tensor, causal: bool, window: int | None):
    """Request b's keys, values and visibility over every source, in one key axis."""
    parts = [source.rows(b, q_b.shape[0], causal, window) for source in sources]
    # One set for all rows while every source has one (dense, paged), else one per row.
    rows = 1 if all(k.shape[0] == 1 for k, _, _ in parts) else q_b.shape[0]
    keys = torch.cat([k.expand(rows, -1, -1, -1) for k, _, _ in parts], dim=1)
    values = torch.cat([v.expand(rows, -1, -1, -1) for _, v, _ in parts], dim=1)
    return keys, values, torch.cat([m for _, _, m in parts], dim=1)


def _stack(per_request: list, ragged: bool, dim_of_rows: int):
    return torch.cat(per_request, dim=dim_of_rows) if ragged else torch.stack(per_request)


def attention(q: torch.Tensor, sources: Sequence[Source], *, cu_seqlens_q: torch.Tensor | None = None,
              scale: float | None = None, causal: bool = False, window: int | None = None,
              sink: torch.Tensor | None = None):
    """The contract-v2 attention in float64 over the keys of all `sources`, one softmax.

    q (B, T, Hq, D) gives o (B, T, Hq, Dv) and lse (B, Hq, T); packed q (total_q, Hq, D) with
    `cu_seqlens_q` (B + 1,) gives o (total_q, Hq, Dv) and lse (Hq, total_q), FlashAttention's
    varlen convention. A row with no visible key: o = 0, lse = -inf (the sink with one)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    results = [attend(q_b, *_gather(sources, b, q_b, causal, window), scale, sink)
               for b, q_b in enumerate(_requests(q, cu_seqlens_q))]
    ragged = cu_seqlens_q is not None
    return answer(_stack([o for o, _ in results], ragged, 0), _stack([lse for _, lse in results], ragged, 1))


def largest_logit(q: torch.Tensor, sources: Sequence[Source], *, cu_seqlens_q: torch.Tensor | None = None,
                  scale: float | None = None, causal: bool = False, window: int | None = None) -> float:
    """max |scale q.k| over the keys each row sees (0 where none): the contract keeps it within
    fmha.contract.problem.LOGIT_LIMIT."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    top = 0.0
    for b, q_b in enumerate(_requests(q, cu_seqlens_q)):
        keys, _, visible = _gather(sources, b, q_b, causal, window)
        shared = keys.shape[0] == 1
        scores = _scores(q_b, keys[0] if shared else keys, shared)
        if bool(visible.any()):  # poison where no row looks: masked, not read
            top = max(top, float(scores.abs().masked_fill(~visible, 0.0).max()) * scale)
    return top


def oracle_over(q: torch.Tensor, sources: Sequence[Source], *, cu_seqlens_q: torch.Tensor | None = None,
                scale: float | None = None, causal: bool = False, window: int | None = None,
                sink: torch.Tensor | None = None) -> Oracle:
    """`attention` and what the verdict needs beside it (`Oracle`), in one pass. For
    ragged queries the tensors are shaped as one request of total_q rows: o (1, total_q, Hq,
    Dv), lse (1, Hq, total_q)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    parts = [attend(q_b, *_gather(sources, b, q_b, causal, window), scale, sink, scales=True)
             for b, q_b in enumerate(_requests(q, cu_seqlens_q))]
    ragged = cu_seqlens_q is not None
    rows = lambda name: _stack([p[name] for p in parts], ragged, 0)  # noqa: E731
    heads = lambda name: _stack([p[name] for p in parts], ragged, 1)  # noqa: E731
    count = sum(p["count"] for p in parts)
    logit_rms = (sum(p["squares"] for p in parts) / count) ** 0.5 if count else 0.0
    shape = (lambda t: t[None]) if ragged else (lambda t: t)
    return Oracle(o=shape(rows("o")), lse=shape(heads("lse")), o_abs=shape(rows("o_abs")),
                  o_squares=shape(rows("o_squares")), logit_rms=logit_rms,
                  logit_magnitude=shape(heads("logit_magnitude")), underflow=shape(rows("underflow")))


def from_call(k, v, *, block_table=None, kv_lens=None, indices=None, topk_len=None, extra_k_cache=None,
              extra_indices=None, extra_topk_len=None, cache_layout=None, extra_cache_layout=None,
              **_) -> list[Source]:
    """The sources a contract call names (its k, v and source keyword arguments), quantized
    caches decoded exactly."""
    if block_table is not None:
        k_values = _decoded(k, cache_layout)
        return [Paged(k_values, k_values if v is k else v, block_table, kv_lens)]
    if indices is None:
        return [Dense(k, v)]
    k_values = _decoded(k, cache_layout)
    scopes = [Sparse(k_values, k_values if v is k else v, indices, topk_len)]
    if extra_k_cache is not None:
        extra = _decoded(extra_k_cache, extra_cache_layout)
        scopes.append(Sparse(extra, extra, extra_indices, extra_topk_len))
    return scopes


def _decoded(cache: torch.Tensor, layout: str | None) -> torch.Tensor:
    """A (num_blocks, block_size, 1, token_bytes) byte view of a quantized cache -> float64
    (num_blocks, block_size, 1, head_dim); any other cache as it is."""
    if layout is None:
        return cache
    return dequantize(pages_of(cache), LAYOUTS[layout], cache.shape[1])

"""Float64 references for the attention contract: one plain function per operation.

Written to be read, not to be fast (JAX's lax_reference.py is the model). They run on the
inputs' device, in float64, and share no code with any kernel's masking or softmax.
"""

from __future__ import annotations

from typing import Sequence

import math

import torch

from fmha.oracles.guard import answer

NEG_INF = float("-inf")


def visibility_mask(q_len: int, kv_len: int, causal: bool, window: int | None, device=None) -> torch.Tensor:
    """(T, S) bool: may query row i see key j. Bottom-right aligned: row i sits at S - T + i."""
    position = torch.arange(q_len, device=device)[:, None] + (kv_len - q_len)
    key = torch.arange(kv_len, device=device)[None, :]
    visible = torch.ones(q_len, kv_len, dtype=torch.bool, device=device)
    if causal or window is not None:
        visible &= key <= position
    if window is not None:
        visible &= key > position - window
    return visible


def logits(q: torch.Tensor, k: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """(B, Hq, T, S) float64 scaled dot products; query head h reads KV head h // (Hq // Hkv)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    group = q.shape[2] // k.shape[2]
    k = k.double().repeat_interleave(group, dim=2)
    return torch.einsum("bthd,bshd->bhts", q.double(), k) * scale


def softmax_with_sink(scores: torch.Tensor, sink: torch.Tensor | None = None):
    """Softmax over the last dim with an optional per-head sink logit in the denominator.

    scores: (B, H, T, S) float64, -inf where masked. Returns (weights, lse) with lse (B, H, T)
    the natural-log normaliser including the sink. A row with nothing visible and no sink gets
    weights 0 and lse -inf.
    """
    if sink is not None:
        sink_column = sink.double().view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        scores = torch.cat([scores, sink_column], dim=-1)
    lse = torch.logsumexp(scores, dim=-1)
    # Normalized by the sum, not by exp(-lse): past |s| ~ 1e17 float64 rounds lse to the max (log of
    # the sum is below half its ulp), and exp(s - lse) gave each of n tied keys a weight of 1, not 1/n
    # (n times the answer for keys at scale 2^96, logits near -5e37).
    top = scores.amax(dim=-1, keepdim=True) if scores.shape[-1] else scores.new_full((*scores.shape[:-1], 1), -math.inf)
    exps = torch.exp(scores - torch.where(torch.isinf(top), 0.0, top))  # a row with nothing visible: all 0
    total = exps.sum(dim=-1, keepdim=True)
    weights = exps / torch.where(total == 0, 1.0, total)
    if sink is not None:
        weights = weights[..., :-1]  # the sink carries no value
    return weights, lse


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None):
    """The contract's attention in float64: returns (o (B, T, Hq, Dv), lse (B, Hq, T))."""
    scores = logits(q, k, scale)
    visible = visibility_mask(q.shape[1], k.shape[1], causal, window, device=q.device)
    scores = scores.masked_fill(~visible, NEG_INF)
    weights, lse = softmax_with_sink(scores, sink)
    group = q.shape[2] // v.shape[2]
    v = v.double().repeat_interleave(group, dim=2)
    o = torch.einsum("bhts,bshd->bthd", weights, v)
    return answer(o, lse)


def ksplit_attention(q, k, v, *, splits: int, scale=None, causal=False, window=None, sink=None):
    """Attention whose logits are summed over `splits` head-dim sub-blocks before the softmax.

    The correct way to handle a head dim larger than one MMA's K (seed 000, §2): k_sub parts
    are additive in logit space. Equals `attention` up to float64 rounding.
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = sum(
        logits(q_part, k_part, scale)
        for q_part, k_part in zip(q.chunk(splits, dim=-1), k.chunk(splits, dim=-1))
    )
    visible = visibility_mask(q.shape[1], k.shape[1], causal, window, device=q.device)
    weights, lse = softmax_with_sink(scores.masked_fill(~visible, NEG_INF), sink)
    v = v.double().repeat_interleave(q.shape[2] // v.shape[2], dim=2)
    return answer(torch.einsum("bhts,bshd->bthd", weights, v), lse)


def merge(parts: Sequence[tuple[torch.Tensor, torch.Tensor]], sink=None):
    """D5 merge in float64 of results over disjoint key sets: returns (o, lse).

    L = log(sum_i exp(lse_i) + exp(sink)); o = sum_i exp(lse_i - L) o_i. Empty parts
    (lse = -inf) contribute nothing; all empty gives o = 0 and lse = -inf (or the sink).
    """
    lses = torch.stack([lse.double() for _, lse in parts])  # (P, B, H, T)
    if sink is not None:
        sink_row = sink.double().view(1, 1, -1, 1).expand(1, *lses.shape[1:])
        total = torch.logsumexp(torch.cat([lses, sink_row]), dim=0)
    else:
        total = torch.logsumexp(lses, dim=0)
    safe_total = torch.where(torch.isinf(total), torch.zeros_like(total), total)
    o = 0
    for o_i, lse_i in parts:
        weight = torch.exp(lse_i.double() - safe_total).transpose(1, 2)[..., None]  # (B, T, H, 1)
        o = o + weight * o_i.double()
    return answer(o, total)


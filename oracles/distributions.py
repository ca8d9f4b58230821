"""The input distributions the tests cover (docs/contract.md, "Input distributions"), one
small function each.

Each takes a seeded CPU generator and float32 q, k, v drawn N(0, 1) in the contract's
layout, and returns reshaped ones; fmha.oracles.sample casts them to the problem's dtype,
lays them out in the sample's storage and moves them to the device, so the same sample gives
the same bits on every machine.
"""

from __future__ import annotations

from typing import Callable

import torch


def _normal(g, *shape):
    return torch.randn(*shape, generator=g)


def _unit(g, *shape):
    x = _normal(g, *shape)
    return x / x.norm(dim=-1, keepdim=True)


def _per_query_head(kv_tensor, q):
    """(B, *, Hkv, D) -> (B, *, Hq, D): query head h uses KV head h // group."""
    return kv_tensor.repeat_interleave(q.shape[2] // kv_tensor.shape[2], dim=2)


# Each takes (generator, q, k, v) float32 (B, T|S, H, D) drawn N(0, 1) and returns new ones.
def normal(g, q, k, v):
    return q, k, v


def peaky(g, q, k, v):
    return q * 4, k, v


def flat(g, q, k, v):
    return q * 0.01, k, v


def constant_scores(g, q, k, v):
    """Every logit is 0, so o is the mean of the visible v rows: exposes normalize-twice."""
    return torch.zeros_like(q), k, v


def large_logits(g, q, k, v):
    """|s| ~ 1e3: exp overflows without the max subtracted."""
    return q * 1000 / q.shape[-1] ** 0.25, k * q.shape[-1] ** 0.25, v


def negative_logits(g, q, k, v):
    """Every key turned away from every query: each logit below -4e4, the rows' answers still a
    softmax over their keys (a kernel whose -inf is a finite sentinel, -5e4 in base 2, drops them)."""
    B, S, H, D = k.shape
    direction = _unit(g, B, 1, H, D)
    size = 1000 * D**0.25  # |q| |k|: a logit of -size^2 * scale, below -4e4 for every scale the draws pass
    q = _per_query_head(direction, q) * size + q * 0.01
    k = -direction * size + k * 0.01
    return q, k, v


def rising_max(g, q, k, v):
    """Logits grow along the keys, so the running max changes in every KV tile."""
    B, S, H, D = k.shape
    direction = _unit(g, B, 1, H, D)
    ramp = torch.linspace(0, 12, S).view(1, S, 1, 1)
    q = q * 0.3 + _per_query_head(direction, q) * D**0.5  # q . direction * scale = 1
    k = k * 0.3 + direction * ramp
    return q, k, v


def outlier_key(g, q, k, v):
    """One key aligned with every query: it takes most of the weight."""
    B, S, H, D = k.shape
    direction = _unit(g, B, 1, H, D)
    q = q * 0.5 + _per_query_head(direction, q) * D**0.5
    k = k.clone()
    k[:, S // 2] = direction[:, 0] * 6 * D**0.25
    return q, k, v


def iota_v(g, q, k, v):
    """v[s, d] = s + d/Dv (shifted): a layout or permutation bug shows up as the wrong ramp."""
    B, S, H, Dv = v.shape
    ramp = torch.arange(S).view(1, S, 1, 1) + torch.arange(Dv).view(1, 1, 1, Dv) / Dv
    return q, k, (ramp - S / 2).expand(B, S, H, Dv) / max(S / 4, 1) + v * 0.01


def upper_half_energy(g, q, k, v):
    """q and k are zero in the lower half of the head dim: a GEMM that covers only part of
    the head dim sees no signal."""
    D = q.shape[-1]
    mask = (torch.arange(D) >= D // 2).float()
    return q * mask * 2, k * mask, v


def split_halves_energy(g, q, k, v):
    """The two head-dim halves carry different, strong logit patterns: merging per-half
    softmaxes (weight space) instead of summing logits gives a visibly wrong answer."""
    D = q.shape[-1]
    lower = (torch.arange(D) < D // 2).float()
    return q * (lower * 3 + (1 - lower) * 2), k, v


def large_v(g, q, k, v):
    """|v| up to ~1e5 (1e4 in fp16, whose range ends at 65504)."""
    return q, k, v * 3e4


DISTRIBUTIONS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        normal, peaky, flat, constant_scores, large_logits, negative_logits, rising_max, outlier_key,
        iota_v, upper_half_energy, split_halves_energy, large_v,
    )
}

"""Deterministic inputs for a Problem, in each distribution DESIGN.md asks the tests to cover.

Each distribution is a small function that shapes float32 tensors drawn from one seeded
generator on the CPU; the result is cast to the problem's dtype and moved to the device, so
the same (problem, distribution, seed) gives the same bits on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fmha.problem import Problem


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    sink: torch.Tensor | None
    scale: float | None = None

    def kwargs(self, problem: Problem) -> dict:
        """Keyword arguments of the contract call for this problem."""
        return dict(
            scale=self.scale, causal=problem.causal, window=problem.window, sink=self.sink
        )


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
        normal, peaky, flat, constant_scores, large_logits, rising_max, outlier_key,
        iota_v, upper_half_energy, split_halves_energy, large_v,
    )
}


def make_inputs(problem: Problem, distribution: str = "normal", seed: int = 0, device="cpu") -> Inputs:
    g = torch.Generator().manual_seed(seed)
    B, T, S = problem.batch, problem.q_len, problem.kv_len
    q = _normal(g, B, T, problem.heads_q, problem.head_dim)
    k = _normal(g, B, S, problem.heads_kv, problem.head_dim)
    v = k if problem.shared_kv else _normal(g, B, S, problem.heads_kv, problem.head_dim_v)
    q, k, v = DISTRIBUTIONS[distribution](g, q, k, v)
    if problem.shared_kv:
        v = k  # a distribution that reshapes one of them reshapes both
    elif distribution == "large_v" and problem.dtype == torch.float16:
        v = v / 3  # stay inside fp16's range (max 65504)
    sink = (torch.rand(problem.heads_q, generator=g) * 5 - 2) if problem.sink else None
    cast = dict(dtype=problem.dtype, device=device)
    q = q.to(**cast)
    k = k.to(**cast)
    v = k if problem.shared_kv else v.to(**cast)
    if sink is not None:
        sink = sink.to(device=device)
    return Inputs(q=q, k=k, v=v, sink=sink)

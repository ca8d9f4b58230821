"""The input distributions the tests cover (docs/contract.md, "Input distributions"), one
small function each.

Each takes a seeded CPU generator and float32 q, k, v drawn N(0, 1) in the contract's
layout, and returns reshaped ones; fmha.oracles.sample casts them to the problem's dtype,
lays them out in the sample's storage and moves them to the device, so the same sample gives
the same bits on every machine.
"""

from __future__ import annotations

import math
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


def massive_activations(g, q, k, v):
    """What a language model's activations look like: a few outlier channels 20x the others in q
    and k, the same channels and sign in every token (LLM.int8(), Dettmers et al. 2022: outlier
    features up to 20x; KVQuant, Hooper et al. 2024: keys' outlier channels), and a first token
    every query attends to, its value near zero (Sun et al. 2024, "Massive Activations in Large
    Language Models"; Xiao et al. 2023, attention sinks), taking about 88% of each row's weight."""
    B, S, H, D = k.shape
    channels = torch.randperm(D, generator=g)[:max(1, D // 32)]
    sign = torch.where(torch.rand(B, 1, H, len(channels), generator=g) < 0.5, -1.0, 1.0)
    q, k, v = q.clone(), k.clone(), v.clone()
    q[..., channels] *= 20
    k[..., channels] = k[..., channels] + 20 * sign
    direction = _unit(g, B, 1, H, D)
    direction[..., channels] = 0
    direction = direction / direction.norm(dim=-1, keepdim=True)
    q = q + _per_query_head(direction, q) * D**0.5  # q . direction * scale = 1, the outliers aside
    sink = direction * (math.log(S) + 3)  # e^3 S of weight against the others' e S
    sink[..., channels] = k[..., channels].mean(1, keepdim=True)  # the outliers every key shares
    k[:, :1] = sink
    v[:, :1] = v[:, :1] * 0.01
    return q, k, v


# q, k and v recorded from a user's model (--fmha-activations FILE), each float32 (tokens, heads, dim).
RECORDED: dict[str, torch.Tensor] = {}
__judge_state__ = ("RECORDED",)  # fmha.oracles.guard: loaded by the session, not a part of what judges


def load_recorded(path: str) -> None:
    """Read `path` (torch.save of {"q": ..., "k": ..., "v": ...}, each (..., tokens, heads, dim)
    from one layer of the model) for the `recorded` distribution; a ValueError saying what is
    wrong with it otherwise."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 -- any unreadable file: one message
        raise ValueError(f"--fmha-activations {path}: expected a file of torch.save({{'q': q, 'k': k, 'v': v}}), "
                         f"could not read it ({type(e).__name__}: {e})") from e
    if not isinstance(data, dict) or not {"q", "k", "v"} <= set(data):
        raise ValueError(f"--fmha-activations {path}: expected a dict with tensors q, k and v, got "
                         f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
    for name in ("q", "k", "v"):
        t = data[name]
        if not isinstance(t, torch.Tensor) or t.dim() < 3 or not t.is_floating_point() or not t.numel():
            raise ValueError(f"--fmha-activations {path}: {name} should be a floating tensor (..., tokens, heads, "
                             f"dim), got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if not bool(torch.isfinite(t).all()):
            raise ValueError(f"--fmha-activations {path}: {name} holds NaN or inf")
        RECORDED[name] = t.float().reshape(-1, *t.shape[-2:])


def recorded(g, q, k, v):
    """The activations recorded from a user's model (--fmha-activations FILE): each request's keys
    a run of consecutive tokens of the recording (from its first token half the time, where a
    model's sink is), its queries the run's last tokens, heads and channels in order where the
    shapes match and drawn where they do not. Without a recording, massive_activations."""
    if not RECORDED:
        return massive_activations(g, q, k, v)
    tokens = RECORDED["k"].shape[0]
    S = k.shape[1]
    starts = [0 if torch.rand(1, generator=g) < 0.5 else int(torch.randint(max(tokens - S, 1), (1,), generator=g))
              for _ in range(k.shape[0])]
    return tuple(_from_recording(g, RECORDED[name], like, starts, S - like.shape[1])
                 for name, like in (("q", q), ("k", k), ("v", v)))


def _from_recording(g, recording: torch.Tensor, like: torch.Tensor, starts: list[int], skip: int) -> torch.Tensor:
    """like's shape (B, L, H, D) filled from `recording` (tokens, heads, dim): request b's tokens
    starts[b] + skip onwards (wrapping), heads and channels in order or drawn."""
    B, L, H, D = like.shape
    heads = torch.arange(H) % recording.shape[1]
    channels = torch.arange(D) if D <= recording.shape[2] else torch.randint(recording.shape[2], (D,), generator=g)
    rows = [recording[(start + skip + torch.arange(L)) % recording.shape[0]][:, heads][..., channels]
            for start in starts]
    return torch.stack(rows)


DISTRIBUTIONS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        normal, peaky, flat, constant_scores, large_logits, negative_logits, rising_max, outlier_key,
        iota_v, upper_half_energy, split_halves_energy, large_v, massive_activations, recorded,
    )
}

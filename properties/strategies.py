"""Hypothesis strategies over the attention contract, drawn inside a kernel's capabilities.

A `Case` is a problem plus how its inputs are made: distribution, seed and storage
(contiguous, strided views, or k/v sliced out of a longer poisoned buffer). Draws stay
inside the kernel's capabilities, so an unsupported combination is never drawn (and never
fills the health check); `cases` also keeps each example's work under a budget so the
CPU tier, which runs kernels through the interpreter, stays fast.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from fmha.capabilities import Capabilities
from fmha.problem import Problem
from oracles.inputs import DISTRIBUTIONS, Inputs, make_inputs

# Sequence lengths at tile sizes +- 1 (16 to 1024), drawn on purpose next to uniform ones.
TILE_EDGES = sorted({n + d for n in (16, 32, 64, 128, 256, 512, 1024) for d in (-1, 0, 1)})
GROUP_SIZES = (1, 2, 3, 4, 5, 7, 8, 16)
STORAGES = ("contiguous", "strided", "sliced")

# Work budget (B * Hq * T * S * D) per example: the interpreter is ~1e3x slower than a GPU.
WORK_BUDGET = {"cpu": 2e7, "cuda": 2e10}


@dataclass(frozen=True)
class Case:
    problem: Problem
    distribution: str = "normal"
    seed: int = 0
    storage: str = "contiguous"

    @property
    def id(self) -> str:
        return f"{self.problem.id}-{self.distribution}-seed{self.seed}-{self.storage}"


def _length(upper: int):
    """1..upper, or a tile edge (clamped to upper). The meaning of each choice never depends
    on other draws, so hypothesis can shrink every size on its own."""
    return st.one_of(st.integers(1, upper), st.sampled_from(TILE_EDGES).map(lambda n: min(n, upper)))


@st.composite
def problems(draw, caps: Capabilities, device: str = "cpu", max_q_len: int = 300, max_kv_len: int = 1100) -> Problem:
    features = caps.features
    dtype = draw(st.sampled_from(caps.dtypes))
    head_dims = [d for d in (caps.head_dims or range(16, 513, 16)) if d % 16 == 0 and d <= 512]
    head_dim = draw(st.sampled_from(head_dims))
    group = draw(st.sampled_from(GROUP_SIZES)) if "gqa" in features else 1
    heads_kv = draw(st.integers(1, 2))
    batch = draw(st.integers(1, 3))
    kv_len = draw(_length(min(max_kv_len, caps.max_kv_len or max_kv_len)))
    q_len = draw(_length(min(max_q_len, caps.max_q_len or max_q_len)))
    # Keep the work under budget by clamping T (not by a T range that depends on the rest).
    q_len = int(max(1, min(q_len, WORK_BUDGET[device] // (batch * heads_kv * group * kv_len * head_dim))))
    causal = "causal" in features and draw(st.booleans())
    window = draw(st.integers(1, kv_len + 1)) if causal and "window" in features and draw(st.booleans()) else None
    if causal and not caps.empty_rows:
        q_len = min(q_len, kv_len)
    return Problem(
        batch=batch, q_len=q_len, kv_len=kv_len, heads_q=heads_kv * group, heads_kv=heads_kv,
        head_dim=head_dim, dtype=dtype, causal=causal, window=window,
        sink="sink" in features and draw(st.booleans()),
        shared_kv="shared_kv" in features and draw(st.booleans()),
    )


@st.composite
def cases(draw, caps: Capabilities, device: str = "cpu", distributions=tuple(DISTRIBUTIONS), storages=STORAGES, **limits) -> Case:
    return Case(
        problem=draw(problems(caps, device, **limits)),
        distribution=draw(st.sampled_from(distributions)),
        seed=draw(st.integers(0, 2**16)),
        storage=draw(st.sampled_from(storages)),
    )


def _strided(t: torch.Tensor) -> torch.Tensor:
    """The same values as a view with a gap between heads (last dim still contiguous)."""
    B, L, H, D = t.shape
    wide = torch.full((B, L, 2 * H, D), float("nan"), dtype=t.dtype, device=t.device)
    wide[:, :, ::2] = t
    return wide[:, :, ::2]


def sliced(t: torch.Tensor, fill: float = float("nan"), hidden: int = 0) -> torch.Tensor:
    """The same values as the first S rows of a longer buffer whose tail holds `fill`; with
    `hidden`, the first `hidden` rows hold `fill` too."""
    B, S, H, D = t.shape
    long = torch.full((B, S + 67, H, D), fill, dtype=t.dtype, device=t.device)
    long[:, hidden:S] = t[:, hidden:]
    return long[:, :S]


def build_inputs(case: Case, device: str, tail_fill: float = float("nan")) -> Inputs:
    x = make_inputs(case.problem, case.distribution, case.seed, device)
    if case.storage == "contiguous":
        return x
    restride = _strided if case.storage == "strided" else (lambda t: sliced(t, tail_fill))
    q = _strided(x.q) if case.storage == "strided" else x.q
    k = restride(x.k)
    v = k if case.problem.shared_kv else restride(x.v)
    return Inputs(q=q, k=k, v=v, sink=x.sink, scale=x.scale)

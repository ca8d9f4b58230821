"""Name a failing kernel's bug by the wrong answer it matches.

When a verdict fails, the output is also compared with references for common mistakes
(top-left causal alignment, a missing 1/sqrt(D), an ignored sink, a window off by one). If
the output is far closer to one of them than to the contract, the failure message says so.
"""

from __future__ import annotations

from typing import Callable

import torch

from fmha.problem import Problem
from oracles import reference
from oracles.inputs import Inputs


def _top_left_causal(problem: Problem, x: Inputs):
    scores = reference.logits(x.q, x.k, x.scale)
    T, S = problem.q_len, problem.kv_len
    visible = torch.ones(T, S, dtype=torch.bool, device=x.q.device).tril()  # row i sees keys <= i
    weights, _ = reference.softmax_with_sink(scores.masked_fill(~visible, float("-inf")), x.sink)
    v = x.v.double().repeat_interleave(problem.group, dim=2)
    return torch.einsum("bhts,bshd->bthd", weights, v)


def _call(problem: Problem, x: Inputs, **changes):
    return reference.attention(x.q, x.k, x.v, **{**x.kwargs(problem), **changes})[0]


# description -> (applies to this problem?, wrong reference)
MISTAKES: dict[str, tuple[Callable[[Problem], bool], Callable]] = {
    "top-left causal alignment (the contract is bottom-right: query row i sits at S - T + i; "
    "SDPA's is_causal is top-left)": (
        lambda p: p.causal and p.window is None and p.q_len != p.kv_len,
        _top_left_causal,
    ),
    "scale not applied (logits are q.k without the 1/sqrt(D))": (
        lambda p: True,
        lambda p, x: _call(p, x, scale=1.0),
    ),
    "sink ignored (exp(sink) missing from the softmax denominator)": (
        lambda p: p.sink,
        lambda p, x: _call(p, x, sink=None),
    ),
    "window one key too wide (contract: exactly `window` keys, the current one included)": (
        lambda p: p.window is not None,
        lambda p, x: _call(p, x, window=p.window + 1),
    ),
    "window one key too narrow": (
        lambda p: p.window is not None and p.window > 1,
        lambda p, x: _call(p, x, window=p.window - 1),
    ),
}


def _rel_l2(o: torch.Tensor, ref: torch.Tensor) -> float:
    o = torch.nan_to_num(o.double(), nan=0.0, posinf=0.0, neginf=0.0)
    return float((o - ref).norm()) / max(float(ref.norm()), 1e-300)


def explain(problem: Problem, inputs: Inputs, o: torch.Tensor, oracle_o: torch.Tensor, floor: float) -> list[str]:
    """Mistakes whose reference the output matches far better than the contract's."""
    error = _rel_l2(o, oracle_o)
    matches = []
    if error < 4 * floor:  # not wrong enough to tell one wrong reference from another
        return matches
    for description, (applies, wrong_reference) in MISTAKES.items():
        if not applies(problem):
            continue
        alternative_error = _rel_l2(o, wrong_reference(problem, inputs))
        if alternative_error < 0.25 * error and alternative_error < 10 * floor:
            matches.append(f"output matches {description}: rel-L2 {alternative_error:.3g} to that, {error:.3g} to the contract")
    return matches

"""fmha.attention and fmha.merge: the public entry points.

    o, lse = fmha.attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None)
    o, lse = fmha.merge([(o_1, lse_1), (o_2, lse_2), ...], sink=None)

`attention` checks the call against the contract (fmha.contract), then runs the first
implementation in IMPLEMENTATIONS that supports it on this device (xformers' dispatch is the
model): the Gluon kernel for bf16 head dim 512 on Hopper, the Triton kernel for everything
else. `implementation="triton"` (or "gluon") runs that one or raises NotSupportedError with
its reasons; `not_supported_reasons` says why each one would not run a call.
"""

from __future__ import annotations

import torch

from fmha import gluon_attention, host, triton_attention, triton_merge
from fmha.contract import NotSupportedError, check_attention_args
from fmha.problem import Problem

# In priority order: the first that supports a call runs it.
IMPLEMENTATIONS: tuple[host.Implementation, ...] = (gluon_attention.IMPLEMENTATION, triton_attention.IMPLEMENTATION)
# What fmha.attention supports: the union, which is the Triton kernel's.
CAPABILITIES = triton_attention.CAPABILITIES


def not_supported_reasons(problem: Problem, device, needs=()) -> dict[str, list[str]]:
    """Per implementation, why it would not run `problem` on `device` (empty: it would)."""
    device = torch.device(device)
    return {impl.name: impl.not_supported_reasons(problem, device, needs) for impl in IMPLEMENTATIONS}


def choose(problem: Problem, device: torch.device, implementations=IMPLEMENTATIONS, needs=()) -> host.Implementation:
    """The first of `implementations` that supports `problem`, or NotSupportedError with each
    one's reasons."""
    reasons = {}
    for impl in implementations:
        reasons[impl.name] = impl.not_supported_reasons(problem, device, needs)
        if not reasons[impl.name]:
            return impl
    raise NotSupportedError("; ".join(f"{name}: {'; '.join(why)}" for name, why in reasons.items()))


def _attend(implementations, q, k, v, *, scale, causal, window, sink, out, **overrides):
    problem = check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out)
    impl = choose(problem, q.device, implementations, needs=("out",) if out is not None else ())
    return host.run(impl, problem, q, k, v, scale=scale, window=problem.window, sink=sink, out=out, **overrides)


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, implementation=None):
    """The contract's attention (docs/contract.md): (o (B, T, Hq, Dv), lse (B, Hq, T) float32).
    `implementation`: the name of the one to run (else the first that supports the call)."""
    chosen = IMPLEMENTATIONS
    if implementation is not None:
        chosen = [impl for impl in IMPLEMENTATIONS if impl.name == implementation]
        if not chosen:
            names = ", ".join(impl.name for impl in IMPLEMENTATIONS)
            raise ValueError(f"implementation: expected one of {names} or None, got {implementation!r}")
    return _attend(chosen, q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out)


def only(impl: host.Implementation, **overrides):
    """fmha.attention restricted to `impl` (which may be a patched copy: regressions'
    mutants); `overrides` are fmha.host.run's (tiles, splits: fmha.tune)."""

    def attention_by(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        return _attend([impl], q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out, **overrides)

    attention_by.__name__ = f"attention_by_{impl.name}"
    return attention_by


def merge(parts, sink=None):
    """The contract's D5 merge of results over disjoint key sets: (o, lse float32)."""
    return triton_merge.merge(parts, sink)

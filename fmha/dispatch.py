"""fmha.attention and fmha.merge: the public entry points.

    o, lse = fmha.attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None)
    o, lse = fmha.attention(q, k_cache, v_cache, *, block_table, kv_lens, cu_seqlens_q=None, ...)  # paged
    o, lse = fmha.attention(q, k_cache, k_cache, *, indices, topk_len=None, extra_k_cache=None, ...)  # sparse
    o, lse = fmha.merge([(o_1, lse_1), (o_2, lse_2), ...], sink=None)

`attention` checks the call against the contract (fmha.contract), then runs the first
implementation in IMPLEMENTATIONS that supports it on this device (xformers' dispatch is the
model): the Gluon kernel for bf16 head dim 512 on Hopper, the Triton kernel for everything
else; contract v2's sources (a block table or indices: docs/contract.md) go to the Gluon
sparse-decode kernel for index-sparse bf16 head dim 512 K = V calls on Hopper (DSV4 decode:
fmha.gluon_sparse) and to fmha.triton_sources for the rest. `implementation="triton"` (or
"gluon") runs that family's kernel or raises NotSupportedError with its reasons;
`not_supported_reasons` says why each one would not run a dense call.
"""

from __future__ import annotations

import dataclasses

import torch

from fmha import gluon_attention, gluon_sparse, host, triton_attention, triton_merge, triton_sources
from fmha.contract import NotSupportedError, check_attention_args
from fmha.problem import Problem

# In priority order: the first that supports a call runs it.
IMPLEMENTATIONS: tuple[host.Implementation, ...] = (gluon_attention.IMPLEMENTATION, triton_attention.IMPLEMENTATION)
# The same for contract v2's sources, by the `implementation` name that picks each.
SOURCE_IMPLEMENTATIONS = {"gluon": gluon_sparse, "triton": triton_sources}
# What fmha.attention supports: the union, the Triton kernels' (dense, and v2's sources).
CAPABILITIES = dataclasses.replace(
    triton_attention.CAPABILITIES, sources=triton_attention.CAPABILITIES.sources | triton_sources.CAPABILITIES.sources,
    cache_layouts=triton_sources.CAPABILITIES.cache_layouts)


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


def _attend_sources(implementations: dict, q, k, v, *, scale, causal, window, sink, out, **source_args):
    problem = check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                                   **source_args)
    del source_args["cache_layout"], source_args["extra_cache_layout"]  # the problem carries them
    reasons = {}
    for name, module in implementations.items():
        reasons[name] = module.not_supported_reasons(problem, q.device, ("out",) if out is not None else ())
        if not reasons[name]:
            return module.attention(problem, q, k, v, scale=scale, sink=sink, out=out, **source_args)
    raise NotSupportedError("; ".join(f"{name}: {'; '.join(why)}" for name, why in reasons.items()))


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, block_table=None, kv_lens=None,
              cu_seqlens_q=None, indices=None, topk_len=None, extra_k_cache=None, extra_indices=None,
              extra_topk_len=None, cache_layout=None, extra_cache_layout=None, implementation=None):
    """The contract's attention (docs/contract.md): (o (B, T, Hq, Dv), lse (B, Hq, T) float32),
    over dense keys or, with a block table or indices, contract v2's sources (ragged: o
    (total_q, Hq, Dv), lse (Hq, total_q)). `implementation`: the name of the one to run (else
    the first that supports the call)."""
    source_args = dict(block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, indices=indices,
                       topk_len=topk_len, extra_k_cache=extra_k_cache, extra_indices=extra_indices,
                       extra_topk_len=extra_topk_len, cache_layout=cache_layout,
                       extra_cache_layout=extra_cache_layout)
    names = [impl.name for impl in IMPLEMENTATIONS]
    if implementation is not None and implementation not in names:
        raise ValueError(f"implementation: expected one of {', '.join(names)} or None, got {implementation!r}")
    if any(a is not None for a in source_args.values()):
        chosen = {name: module for name, module in SOURCE_IMPLEMENTATIONS.items() if implementation in (None, name)}
        return _attend_sources(chosen, q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                               **source_args)
    chosen = [impl for impl in IMPLEMENTATIONS if implementation in (None, impl.name)]
    return _attend(chosen, q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out)


def only(impl: host.Implementation, **overrides):
    """fmha.attention restricted to `impl` (which may be a patched copy: regressions'
    mutants); `overrides` are fmha.host.run's (tiles, splits: fmha.tune)."""

    def attention_by(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
        return _attend([impl], q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out, **overrides)

    attention_by.__name__ = f"attention_by_{impl.name}"
    return attention_by


def only_sources(name: str, module):
    """fmha.attention for contract v2's calls restricted to `module` (fmha.gluon_sparse,
    fmha.triton_sources, or a patched copy: regressions' mutants)."""

    def attention_by(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, block_table=None,
                     kv_lens=None, cu_seqlens_q=None, indices=None, topk_len=None, extra_k_cache=None,
                     extra_indices=None, extra_topk_len=None, cache_layout=None, extra_cache_layout=None):
        return _attend_sources({name: module}, q, k, v, scale=scale, causal=causal, window=window, sink=sink,
                               out=out, block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q,
                               indices=indices, topk_len=topk_len, extra_k_cache=extra_k_cache,
                               extra_indices=extra_indices, extra_topk_len=extra_topk_len, cache_layout=cache_layout,
                               extra_cache_layout=extra_cache_layout)

    attention_by.__name__ = f"attention_by_{name}"
    return attention_by


def merge(parts, sink=None):
    """The contract's D5 merge of results over disjoint key sets: (o, lse float32)."""
    return triton_merge.merge(parts, sink)

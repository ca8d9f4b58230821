"""fmha.attention and fmha.merge: the public entry points.

    o, lse = fmha.attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None)
    o, lse = fmha.attention(q, k_cache, v_cache, *, block_table, kv_lens, cu_seqlens_q=None, ...)  # paged
    o, lse = fmha.attention(q, k_cache, k_cache, *, indices, topk_len=None, extra_k_cache=None, ...)  # sparse
    o, lse = fmha.merge([(o_1, lse_1), (o_2, lse_2), ...], sink=None)

`attention` checks the call against the contract once, then runs the first kernel of
IMPLEMENTATIONS that supports it on this device (xformers' dispatch is the model): every one
is a `KernelEntry`, dense or paged alike. DSV4's sparse decode (index-sparse bf16 head dim 512
K = V) goes to the CUDA kernel on Hopper where it is built, else (and bf16 head dim 512) to the Gluon
kernels, everything else to the Triton kernels. `implementation="triton"` (or "gluon", or one kernel's name) runs only those, or
raises NotSupportedError with each one's reasons; `not_supported_reasons` gives them all.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from fmha.contract import KernelEntry, NotSupportedError, Problem, check_attention_args, plain_scalars
from fmha.contract.kernel import packed_sink, source_tensors
from fmha.kernels import cuda_sparse, gluon_dense, gluon_sparse, triton_dense, triton_merge, triton_paged

# In priority order: the first that supports a call runs it. The CUDA sparse kernel, the fastest
# (BENCHMARKS.md, "the CUDA kernel beside FlashMLA"), runs first where it is built
# (`python -m fmha.kernels.build`) and is skipped where it is not: building it is a minute of nvcc
# that fmha.attention does not make a caller wait unasked. Named (`implementation="cuda"`), it
# builds on its first call.
IMPLEMENTATIONS: tuple[KernelEntry, ...] = (cuda_sparse.BUILT, gluon_sparse.ENTRY, gluon_dense.ENTRY,
                                            triton_paged.ENTRY, triton_dense.ENTRY)
NAMED = {cuda_sparse.ENTRY.name: cuda_sparse.ENTRY}  # what a named implementation runs instead
FAMILIES = {"cuda": ("cuda-sparse",), "gluon": ("gluon-sparse", "gluon"), "triton": ("triton-paged", "triton-dense")}
# What fmha.attention supports: the union, the Triton kernels' (dense keys, and contract v2's).
CAPABILITIES = dataclasses.replace(
    triton_dense.CAPABILITIES, sources=triton_dense.CAPABILITIES.sources | triton_paged.CAPABILITIES.sources,
    cache_layouts=triton_paged.CAPABILITIES.cache_layouts)


def not_supported_reasons(problem: Problem, device, needs=()) -> dict[str, list[str]]:
    """Per implementation, why it would not run `problem` on `device` (empty: it would)."""
    return {entry.name: entry.not_supported_reasons(problem, torch.device(device), needs) for entry in IMPLEMENTATIONS}


def choose(problem: Problem, device, entries: Sequence[KernelEntry] = IMPLEMENTATIONS, needs=()) -> KernelEntry:
    """The first of `entries` that supports `problem`, or NotSupportedError with each one's
    reasons."""
    reasons = {}
    for entry in entries:
        reasons[entry.name] = entry.not_supported_reasons(problem, device, needs)
        if not reasons[entry.name]:
            return entry
    raise NotSupportedError("; ".join(f"{name}: {'; '.join(why)}" for name, why in reasons.items()))


def implementations(name: str | None) -> tuple[KernelEntry, ...]:
    """The entries `implementation=name` runs: all of them, a family's, or one by its name."""
    names = FAMILIES.get(name, (name,))
    chosen = tuple(e if name is None else NAMED.get(e.name, e) for e in IMPLEMENTATIONS if name is None or e.name in names)
    if not chosen:
        known = [*FAMILIES, *(e.name for e in IMPLEMENTATIONS)]
        raise ValueError(f"implementation: expected one of {', '.join(known)} or None, got {name!r}")
    return chosen


def dispatching(entries: Sequence[KernelEntry]):
    """A contract call that checks once and runs the first of `entries` supporting the call."""

    def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, **source_args):
        problem = check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                                       **source_args)
        scale = plain_scalars(scale, causal, window)[0]  # the kernels take the mask from `problem`
        needs = ("out",) if out is not None else ()
        entry = choose(problem, q.device, entries, needs=needs)
        try:
            return entry.apply(problem, q, k, v, scale=scale, sink=packed_sink(sink), out=out, **source_tensors(source_args))
        except NotSupportedError:
            if not entry.availability(q.device):  # a refusal of the call, not a kernel that found it cannot run
                raise
        # The kernel found out at call time that it cannot run here (fmha.kernels.cuda_sparse's build failed).
        entry = choose(problem, q.device, [e for e in entries if e is not entry], needs=needs)
        return entry.apply(problem, q, k, v, scale=scale, sink=packed_sink(sink), out=out, **source_tensors(source_args))

    return attention


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, block_table=None, kv_lens=None,
              cu_seqlens_q=None, indices=None, topk_len=None, extra_k_cache=None, extra_indices=None,
              extra_topk_len=None, cache_layout=None, extra_cache_layout=None, implementation=None):
    """The contract's attention (docs/contract.md): (o (B, T, Hq, Dv), lse (B, Hq, T) float32),
    over dense keys or, with a block table or indices, contract v2's sources (ragged: o
    (total_q, Hq, Dv), lse (Hq, total_q)). `implementation`: a family ("triton", "gluon") or a
    kernel's name to run (else the first that supports the call)."""
    return dispatching(implementations(implementation))(
        q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out, block_table=block_table,
        kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, indices=indices, topk_len=topk_len, extra_k_cache=extra_k_cache,
        extra_indices=extra_indices, extra_topk_len=extra_topk_len, cache_layout=cache_layout,
        extra_cache_layout=extra_cache_layout)


def merge(parts, sink=None):
    """The contract's D5 merge of results over disjoint key sets: (o, lse float32)."""
    return triton_merge.merge(parts, sink)

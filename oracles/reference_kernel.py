"""The float64 oracle as a kernel: the contract's answer over the call's keys (dense, paged,
ragged, index-sparse, quantized), rounded to q's dtype. It is the correct kernel every law and
named case must pass, and the base of the paged mutants (fmha.regressions.paged_mutants).
"""

from __future__ import annotations

from fmha.contract import CACHE_LAYOUTS, SOURCES, Capabilities, KernelEntry, check_attention_args
from fmha.oracles import oracle

CAPABILITIES = Capabilities(sources=frozenset(SOURCES), cache_layouts=frozenset(CACHE_LAYOUTS),
                            promises=frozenset({"bitwise_deterministic", "batch_invariant"}))


def reference(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, **source_args):
    check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                         capabilities=CAPABILITIES, **source_args)
    o, lse = oracle.attention(q, oracle.from_call(k, v, **source_args),
                                   cu_seqlens_q=source_args.get("cu_seqlens_q"), scale=scale, causal=causal,
                                   window=window, sink=sink)
    o = o.to(q.dtype)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse.float()


ENTRY = KernelEntry(name="reference", fn=reference, capabilities=CAPABILITIES, default_devices=(),
                    description="the float64 oracle over the call's keys, rounded to q's dtype (the correct kernel "
                                "of every law and named case)")

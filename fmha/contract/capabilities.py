"""What a kernel implements, as data, and the reasons it gives for what it does not.

Modelled on xformers' `not_supported_reasons` and PyTorch's OpInfo: tests never hold skip
logic of their own; they ask the kernel, and report its reasons as the skip message. The
strategies draw only what a kernel declares, so its limits shape the draws instead of
filling the run with skips.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import torch

from fmha.contract.problem import CACHE_LAYOUTS, DTYPE_NAMES, FEATURES, SOURCES, Problem

ALL_DTYPES = tuple(DTYPE_NAMES)

# Stronger than the contract; a kernel that makes a promise is held to it bitwise, one that
# does not is held to the verdict on the same comparison (properties/dense_laws.py).
PROMISES = {
    "bitwise_deterministic": "the output's bits are a function of the input values: the same values give the "
                             "same bits call after call, in any storage (strides, slices, K is V)",
    "batch_invariant": "a batch row's bits do not depend on the rest of the batch (a row alone gives the bits "
                       "it has in the batch)",
}


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """The part of the contract a kernel implements. The defaults claim the whole contract
    and promise nothing beyond it."""

    # Head dims (of q and k; of v too unless Dv may differ), per dtype where they differ:
    # (64, 128) or {torch.bfloat16: (64, 128, 256), torch.float32: (64, 128)}; None: any.
    head_dims: tuple[int, ...] | Mapping[torch.dtype, tuple[int, ...]] | None = None
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    devices: tuple[str, ...] = ("cpu", "cuda")
    features: frozenset[str] = frozenset(FEATURES)
    requires: frozenset[str] = frozenset()  # features every call must use: {"causal"} for a causal-only kernel
    heads_q: tuple[int, ...] | None = None  # the query head counts it has kernels for; None: any
    max_q_len: int | None = None
    max_kv_len: int | None = None
    q_len_equals_kv_len: bool = False  # T = S (square prefill only)
    q_len_multiple_of: int = 1  # T a multiple of this (a kernel without a masked tail tile)
    kv_len_multiple_of: int = 1
    split_head_dim_v: bool = True  # Dv may differ from D
    empty_rows: bool = True  # rows that see no key give o = 0, lse = -inf / sink (judged per row)
    # Per request (paged and ragged calls; for dense calls T and S): no request with more query
    # rows than keys; requests of a ragged batch with no query rows.
    q_len_at_most_kv_len: bool = False
    empty_query_requests: bool = True
    promises: frozenset[str] = frozenset()  # among PROMISES
    # Contract v2, opt-in: where keys may come from (SOURCES), page sizes (None: any), the
    # largest top-k a row may read, quantized cache layouts (CACHE_LAYOUTS).
    sources: frozenset[str] = frozenset({"dense"})
    block_sizes: tuple[int, ...] | None = None
    max_topk: int | None = None
    topk_multiple_of: int = 1  # each scope's top-k (the indices' last dim) a multiple of this
    cache_layouts: frozenset[str] = frozenset()
    unquantized_caches: bool = True  # paged and sparse caches in q's dtype; False: only `cache_layouts`
    # Why a feature or limit is missing, e.g. {"lse": "SDPA's public API returns no LSE"}; keys
    # are the feature names and "device", "dtype", "head_dim", "head_dim_v", "requires",
    # "max_q_len", "max_kv_len", "q_len_equals_kv_len", "q_len_multiple_of",
    # "kv_len_multiple_of", "empty_rows", "q_len_at_most_kv_len", "empty_query_requests",
    # "heads_q", "block_size", "max_topk", "topk_multiple_of", "cache_layout".
    notes: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self):
        for name, known in (("features", FEATURES), ("requires", FEATURES), ("promises", tuple(PROMISES)),
                            ("sources", SOURCES), ("cache_layouts", CACHE_LAYOUTS)):
            unknown = set(getattr(self, name)) - set(known)
            if unknown:
                raise ValueError(f"{name}: unknown {sorted(unknown)}; expected among {', '.join(known)}")
        if self.topk_multiple_of < 1 or (self.heads_q is not None and not self.heads_q):
            raise ValueError(f"topk_multiple_of, heads_q: expected >= 1 and a non-empty tuple, got "
                             f"{self.topk_multiple_of}, {self.heads_q}")
        if not self.unquantized_caches and not self.cache_layouts:
            raise ValueError("unquantized_caches=False: name the cache_layouts the kernel reads")
        if not self.requires <= self.features:
            raise ValueError(f"requires: {sorted(self.requires - self.features)} not among the features")
        if isinstance(self.head_dims, Mapping) and set(self.head_dims) - set(self.dtypes):
            raise ValueError(f"head_dims: dtypes {sorted(map(str, set(self.head_dims) - set(self.dtypes)))} "
                             "are not among the kernel's dtypes")

    def head_dims_for(self, dtype: torch.dtype) -> tuple[int, ...] | None:
        """The head dims supported in `dtype` (None: any)."""
        if isinstance(self.head_dims, Mapping):
            return self.head_dims.get(dtype, ())
        return self.head_dims

    def _why(self, key: str, default: str) -> str:
        note = self.notes.get(key)
        return f"{default} ({note})" if note else default

    def not_supported_reasons(self, problem: Problem | None, device: str, needs: Iterable[str] = (),
                              any_source: Iterable[str] = ()) -> list[str]:
        """Why this kernel cannot run `problem` on `device` (None: any call there); empty when it can.

        `needs` names what every call of the caller uses beyond the problem: features (``lse``,
        ``out``), sources or cache layouts; `any_source`, sources of which each call uses one
        (a law that draws paged or sparse keys).
        """
        reasons = []
        if device not in self.devices:
            reasons.append(self._why("device", f"no {device} kernel (runs on {', '.join(self.devices)})"))
        any_source = tuple(any_source)
        if any_source and not self.sources & set(any_source):
            reasons.append(f"needs a {' or '.join(any_source)} source; declares {', '.join(sorted(self.sources))} "
                           "(Capabilities.sources)")
        declared = self.sources | self.features | self.cache_layouts
        reasons += [self._why(need, f"no {need} support") for need in needs if need not in declared]
        if problem is None:
            return reasons
        dtype = DTYPE_NAMES[problem.dtype]
        if problem.dtype not in self.dtypes:
            names = ", ".join(DTYPE_NAMES[d] for d in self.dtypes)
            reasons.append(self._why("dtype", f"dtype {dtype} unsupported (supports {names})"))
        else:
            reasons += self._head_dim_reasons(problem, dtype)
        if not self.split_head_dim_v and problem.head_dim_v != problem.head_dim:
            reasons.append(self._why("head_dim_v", f"needs Dv == D, got D={problem.head_dim}, Dv={problem.head_dim_v}"))
        if self.heads_q is not None and problem.heads_q not in self.heads_q:
            reasons.append(self._why("heads_q", f"Hq={problem.heads_q} unsupported (supports {_span(self.heads_q)})"))
        for feature in sorted(problem.features):
            if feature not in self.features:
                reasons.append(self._why(feature, f"no {feature} support"))
        missing = sorted(self.requires - problem.features)
        if missing:
            reasons.append(self._why("requires", f"runs only with {', '.join(missing)}"))
        T, S = problem.q_len, problem.kv_len
        if self.max_q_len is not None and T > self.max_q_len:
            reasons.append(self._why("max_q_len", f"T={T} > max {self.max_q_len}"))
        if self.max_kv_len is not None and S > self.max_kv_len:
            reasons.append(self._why("max_kv_len", f"S={S} > max {self.max_kv_len}"))
        if self.q_len_equals_kv_len and T != S:
            reasons.append(self._why("q_len_equals_kv_len", f"needs T == S, got T={T}, S={S}"))
        if T % self.q_len_multiple_of:
            reasons.append(self._why("q_len_multiple_of", f"needs T a multiple of {self.q_len_multiple_of}, got {T}"))
        if S % self.kv_len_multiple_of:
            reasons.append(self._why("kv_len_multiple_of", f"needs S a multiple of {self.kv_len_multiple_of}, got {S}"))
        if problem.has_empty_rows and not self.empty_rows:
            reasons.append(self._why("empty_rows", "rows with no visible key (causal with more query rows than keys, "
                                                   "or a request with none) unsupported"))
        if self.q_len_at_most_kv_len and (problem.q_len_over_kv_len or (problem.source != "sparse" and T > S)):
            reasons.append(self._why("q_len_at_most_kv_len", "needs each request's query rows <= its keys"))
        if problem.empty_query_requests and not self.empty_query_requests:
            reasons.append(self._why("empty_query_requests", "no request without query rows in a ragged batch"))
        return reasons + self._source_reasons(problem)

    def _source_reasons(self, problem: Problem) -> list[str]:
        reasons = [self._why(source, f"no {_SOURCE_WORDS[source]}") for source in sorted(problem.sources)
                   if source not in self.sources]
        if self.block_sizes is not None:
            bad = [str(b) for b in (problem.block_size, problem.extra_block_size)
                   if b is not None and b not in self.block_sizes]
            if bad:
                reasons.append(self._why("block_size", f"block size {', '.join(bad)} unsupported "
                                                       f"(supports {_span(self.block_sizes)})"))
        topks = [problem.kv_len] if problem.source == "sparse" else []
        topks += [problem.extra_topk] if problem.extra_topk is not None else []
        if self.max_topk is not None and any(k > self.max_topk for k in topks):
            reasons.append(self._why("max_topk", f"top-k {max(topks)} > max {self.max_topk}"))
        off = [str(k) for k in topks if k % self.topk_multiple_of]
        if off:
            reasons.append(self._why("topk_multiple_of", f"top-k {', '.join(off)} not a multiple of "
                                                         f"{self.topk_multiple_of}"))
        missing = sorted(problem.cache_layouts - self.cache_layouts)
        if missing:
            reasons.append(self._why("cache_layout", f"no {', '.join(missing)} cache"))
        if not self.unquantized_caches and problem.unquantized_caches:
            reasons.append(self._why("cache_layout", f"no cache in {DTYPE_NAMES[problem.dtype]} (reads "
                                                     f"{', '.join(sorted(self.cache_layouts))} caches only)"))
        return reasons

    def _head_dim_reasons(self, problem: Problem, dtype: str) -> list[str]:
        allowed = self.head_dims_for(problem.dtype)
        if allowed is None:
            return []
        dims = {"D": problem.head_dim} | ({"Dv": problem.head_dim_v} if problem.head_dim_v != problem.head_dim else {})
        bad = [f"{name}={d}" for name, d in dims.items() if d not in allowed]
        if not bad:
            return []
        where = f" in {dtype}" if isinstance(self.head_dims, Mapping) else ""
        supports = _span(allowed) if allowed else "none"
        return [self._why("head_dim", f"head dim {', '.join(bad)} unsupported{where} (supports {supports})")]


_SOURCE_WORDS = {"dense": "dense keys", "paged": "paged KV cache", "ragged": "ragged (packed) queries",
                 "sparse": "index-sparse keys", "two_scopes": "second key scope"}


def _span(values: tuple[int, ...]) -> str:
    """[64, 128] as is; an evenly spaced run as 'multiples of 8 from 8 to 256'."""
    steps = {b - a for a, b in zip(values, values[1:])}
    if len(values) > 4 and len(steps) == 1:
        return f"multiples of {steps.pop()} from {values[0]} to {values[-1]}"
    return str(list(values))


FULL_CONTRACT = Capabilities()

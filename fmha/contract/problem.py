"""An attention problem: the shapes and contract features of one call, without the data.

Kernels declare what they support against this type, tests name themselves after it, and
the oracles take the tensors it describes. Keyword-only: `Problem(batch=1, q_len=9, ...)`
reads as the case, where `Problem(1, 9, 5, 2, 1, 64)` needs the field order.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fmha.contract.cache_layouts import LAYOUTS

# The optional parts of the contract a kernel may or may not implement (docs/contract.md).
FEATURES = ("causal", "window", "sink", "lse", "gqa", "shared_kv", "out")
# Where the keys come from (contract v2). Opt-in: a kernel that declares nothing reads dense keys.
SOURCES = ("dense", "paged", "ragged", "sparse", "two_scopes")
# Quantized K = V caches (fmha.contract.cache_layouts has their bytes).
CACHE_LAYOUTS = tuple(LAYOUTS)

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# What a paged or sparse call's lengths and indices say about its requests (Problem fields).
# Every logit a row sees, scale * q.k, lies within +-2^127: s * log2(e), what a kernel working in
# base 2 holds, is then an fp32, and so is the LSE. Past it a call is outside the contract.
LOGIT_LIMIT = 2.0 ** 127

PER_REQUEST = ("empty_query_requests", "q_len_over_kv_len", "rows_without_keys")


@dataclass(frozen=True, kw_only=True)
class Problem:
    batch: int
    q_len: int  # T
    kv_len: int  # S
    heads_q: int
    heads_kv: int
    head_dim: int  # D, of q and k
    head_dim_v: int | None = None  # Dv; None means equal to head_dim
    dtype: torch.dtype = torch.bfloat16
    causal: bool = False
    window: int | None = None  # implies causal
    sink: bool = False
    shared_kv: bool = False  # k and v are one tensor (DSV4: K = V)
    # Contract v2 (docs/contract.md). Paged: q_len and kv_len are the longest request's;
    # sparse: kv_len is the top-k, the indices each query row reads.
    source: str = "dense"  # "dense", "paged" or "sparse"
    ragged: bool = False  # paged with q packed (total_q, Hq, D) and cu_seqlens_q
    block_size: int | None = None  # paged and sparse
    cache_layout: str | None = None  # a quantized K = V cache, e.g. "dsv4-fp8"; None: q's dtype
    extra_topk: int | None = None  # sparse: a second scope, its own indices per row
    extra_block_size: int | None = None
    extra_cache_layout: str | None = None
    # Per request (contract v2), from the call's lengths and indices: a ragged request with no
    # query rows; a request with more query rows than keys; a query row that sees no key.
    empty_query_requests: bool = False
    q_len_over_kv_len: bool = False
    rows_without_keys: bool = False

    def __post_init__(self):
        if self.head_dim_v is None:
            object.__setattr__(self, "head_dim_v", self.head_dim)
        if self.window is not None:
            object.__setattr__(self, "causal", True)
        if self.shared_kv and self.head_dim_v != self.head_dim:
            raise ValueError(f"shared_kv needs head_dim_v == head_dim, got {self.head_dim_v} != {self.head_dim}")
        if self.heads_q % self.heads_kv:
            raise ValueError(f"heads_q={self.heads_q} is not a multiple of heads_kv={self.heads_kv}")
        if self.source not in ("dense", "paged", "sparse"):
            raise ValueError(f"source: expected dense, paged or sparse, got {self.source!r}")
        if (self.block_size is None) != (self.source == "dense"):
            raise ValueError(f"block_size: paged and sparse sources have one, dense none; got {self.block_size} "
                             f"for {self.source}")
        if self.ragged and self.source != "paged":
            raise ValueError("ragged: packed queries come with a paged source")
        if self.source == "sparse" and self.causal:
            raise ValueError("causal, window: the indices alone decide an index-sparse row's keys")
        for name in ("cache_layout", "extra_cache_layout"):
            if getattr(self, name) not in (None, *CACHE_LAYOUTS):
                raise ValueError(f"{name}: expected one of {', '.join(CACHE_LAYOUTS)} or None, got {getattr(self, name)!r}")
        if self.cache_layout is not None and (not self.shared_kv or self.source == "dense"):
            raise ValueError("cache_layout: a quantized cache is a paged or sparse K = V cache (shared_kv=True)")
        if self.cache_layouts and (self.dtype != torch.bfloat16 or self.head_dim != 512):
            raise ValueError(f"cache_layout: a quantized cache is read by bf16 queries of head dim 512, got "
                             f"{DTYPE_NAMES[self.dtype]}, head_dim={self.head_dim}")
        if (self.extra_topk is None) != (self.extra_block_size is None) or (
                self.extra_topk is not None and self.source != "sparse"):
            raise ValueError("extra_topk, extra_block_size: a second scope is sparse and has both")

    @property
    def group(self) -> int:
        """Query heads per KV head."""
        return self.heads_q // self.heads_kv

    @property
    def layout(self) -> str:
        if self.heads_kv == self.heads_q:
            return "mha"
        if self.heads_kv == 1:
            return "mqa"
        return f"gqa{self.group}"

    @property
    def features(self) -> frozenset[str]:
        """Contract features this problem exercises (lse and out are per call, not per problem)."""
        used = set()
        if self.causal:
            used.add("causal")
        if self.window is not None:
            used.add("window")
        if self.sink:
            used.add("sink")
        if self.heads_q != self.heads_kv:
            used.add("gqa")
        if self.shared_kv:
            used.add("shared_kv")
        return frozenset(used)

    @property
    def sources(self) -> frozenset[str]:
        """Where this problem's keys come from, in the capabilities' words (SOURCES)."""
        used = {self.source}
        if self.ragged:
            used.add("ragged")
        if self.extra_topk is not None:
            used.add("two_scopes")
        return frozenset(used)

    @property
    def cache_layouts(self) -> frozenset[str]:
        return frozenset(layout for layout in (self.cache_layout, self.extra_cache_layout) if layout is not None)

    @property
    def unquantized_caches(self) -> bool:
        """A paged or sparse cache (of either scope) is in q's dtype."""
        return self.source != "dense" and (self.cache_layout is None or (
            self.extra_topk is not None and self.extra_cache_layout is None))

    @property
    def has_empty_rows(self) -> bool:
        """Some query row sees no key: masked and T > S (row i sits at S - T + i < 0), or a
        request's row that sees none of its keys (rows_without_keys)."""
        return self.rows_without_keys or (self.causal and self.q_len > self.kv_len)

    @property
    def id(self) -> str:
        """Reads as the case, e.g. ``hd512-T4-S640-mqa-kv-shared-window128-sink-bf16``."""
        parts = [f"hd{self.head_dim}"]
        if self.head_dim_v != self.head_dim:
            parts.append(f"dv{self.head_dim_v}")
        if self.source == "sparse":
            parts += [f"T{self.q_len}", f"topk{self.kv_len}"]
        else:
            parts += [f"T{self.q_len}", f"S{self.kv_len}"]
        if self.source != "dense":
            parts.append(f"{'ragged-' if self.ragged else ''}{self.source}{self.block_size}")
        if self.extra_topk is not None:
            parts.append(f"extra-topk{self.extra_topk}-block{self.extra_block_size}")
        if self.batch != 1:
            parts.append(f"B{self.batch}")
        parts.append(f"{self.layout}-h{self.heads_q}")
        if self.shared_kv:
            parts.append("kv-shared")
        if self.window is not None:
            parts.append(f"window{self.window}")
        elif self.causal:
            parts.append("causal")
        if self.sink:
            parts.append("sink")
        parts.append(DTYPE_NAMES[self.dtype])
        parts += [layout for layout in (self.cache_layout, self.extra_cache_layout) if layout]
        return "-".join(parts)

    def replace(self, **changes) -> Problem:
        """A copy with `changes`; where Dv equals D, a new head_dim changes both."""
        if "head_dim" in changes and "head_dim_v" not in changes and self.head_dim_v == self.head_dim:
            changes["head_dim_v"] = None
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        """Only what differs from the defaults: a line to paste into @example or a trap."""
        derived = {name: getattr(self, name) for name in PER_REQUEST}  # from the call's data: not repeated here
        return f"Problem({repr_fields(self, head_dim_v=self.head_dim, causal=self.window is not None, **derived)})"


def repr_fields(obj, **implied) -> str:
    """`name=value` for the dataclass fields of `obj` that differ from their defaults (or from
    what `implied` says they follow from)."""
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        default = implied.get(f.name, f.default)
        if f.default is dataclasses.MISSING or value != default:
            parts.append(f"{f.name}={value!r}")
    return ", ".join(parts)

"""The GPU scale tier (`pytest --fmha-scale`, the nightly workflow's): calls at the sizes serving
runs, judged against the float64 oracle (fmha.oracles.oracle answers 128k keys in passes of
KEY_CHUNK, in bounded memory).

The CPU tier draws each size (fmha.contract.ranges) as far as its interpreter and oracle afford;
many shipped bugs live past that: ids narrowed below their range, 32-bit element offsets, split
counts that saturate, split reductions that drop their tail. Here:

- every size's freedoms past what a CPU run affords and within what one card does
  (`ranges.tier`: "scale") get a call of their own, in the kernel's first source, its other sizes
  as small as the declaration lets them (`freedom_samples`);
- every source (dense, paged, ragged, sparse, two scopes) and cache layout the kernel declares gets
  the production sizes of `Scale` (`headline_samples`): 128k keys, a cache of more than 2^31
  elements (q's dtype), 512 requests, a page id past 2^20, the largest top-k.

Hostile as the CPU tier's draws (every layout hazard the call allows), values fresh each run.
`Scale` holds the production sizes so that the CPU tests run the same logic at small ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fmha.contract import Capabilities, Problem, ranges
from fmha.oracles.hazards import applicable
from fmha.oracles.sample import Sample
from fmha.properties.covering_array import block_size_for, head_dim_for, lengths_for, rows_for

SOURCES = ("dense", "paged", "ragged", "sparse", "two_scopes")


@dataclass(frozen=True)
class Scale:
    """The production sizes every source and layout gets."""

    keys: int = 2**17 + 1  # a request's keys (a sparse row's top-k): 129 splits of 1024
    elements: int = 2**31 + 2**20  # a cache (dense: k) past int32 element offsets
    requests: int = 512  # a decode batch
    page_id: int = 2**20 + 1  # the largest page id a call reads
    topk: int = 2**16 + 1  # a sparse row's indices, or the most the kernel declares


PRODUCTION = Scale()


def scale_samples(caps: Capabilities, seed: int = 0, scale: Scale = PRODUCTION, freedoms: bool = True) -> list[Sample]:
    """Every call of the tier for a kernel of `caps` (before its own limits are asked, as the
    covering set's skeletons), each once (2^16 query heads over one KV head are a group of 2^16)."""
    found = headline_samples(caps, seed, scale) + (freedom_samples(caps, seed) if freedoms else [])
    return list({s.id: s for s in found}.values())


def calls(kernel, device: str, seed: int = 0) -> list[Sample]:
    """The tier's calls `kernel`'s declaration admits on `device` (the others: its reasons), made
    once a process (a sparse row's 2^24 indices are drawn to lay the call out: seconds a kernel)."""
    key = (kernel.name, device, seed)
    if key not in _CALLS:
        _CALLS[key] = [s for s in scale_samples(kernel.capabilities_on(device), seed)
                       if not kernel.not_supported_reasons(s.problem, device)]
    return _CALLS[key]


_CALLS: dict[tuple[str, str, int], list[Sample]] = {}
__judge_state__ = ("_CALLS",)  # fmha.oracles.guard: what a kernel may find, not what judges


def _dtype(caps: Capabilities):
    return next((d for d in (torch.bfloat16, *caps.dtypes) if d in caps.dtypes and caps.head_dims_for(d) != ()), None)


def _call(caps: Capabilities, source: str, seed: int, layout: str | None = None, *, batch: int = 1,
          q_len: int = 1, kv_len: int = 17, heads: tuple[int, int] | None = None, head_dim: int | None = None,
          block_size: int | None = None, num_blocks: int | None = None) -> Sample | None:
    """The smallest call of `source` with these sizes: one query row, 17 keys (a sparse row: 17
    indices), one KV head and one query head (or the kernel's fewest), the head dim nearest 64,
    a sink where the kernel takes one; a second scope of 8 indices."""
    dtype = _dtype(caps)
    if dtype is None or not {"ragged": {"paged", "ragged"}, "two_scopes": {"sparse", "two_scopes"}}.get(
            source, {source}) <= caps.sources:
        return None
    quantized = layout is not None
    head_dim = 512 if quantized else head_dim or head_dim_for(caps, dtype)
    if head_dim is None:
        return None
    heads_q, heads_kv = heads or ((min(caps.heads_q), 1 if "gqa" in caps.features else min(caps.heads_q))
                                  if caps.heads_q else (1, 1))
    q_len = rows_for(caps, q_len)
    # K = V where the call must have it, and in dense calls where it may (2^31 values drawn on the
    # CPU, not twice that); a paged cache's v apart (poison is laid on the device: its values are the keys')
    shared_kv = quantized or source in ("sparse", "two_scopes") or "shared_kv" in caps.requires \
        or (source == "dense" and "shared_kv" in caps.features)
    fields = dict(batch=batch, q_len=q_len, kv_len=kv_len, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                  dtype=torch.bfloat16 if quantized else dtype, shared_kv=shared_kv, sink="sink" in caps.features,
                  causal=bool(caps.requires & {"causal", "window"}), window=5 if "window" in caps.requires else None)
    # Every layout hazard the call allows, laid in at once (a sparse row of 2^24 indices takes a
    # second to lay out: `hostile`'s second Sample doubles it).
    hostile = lambda problem, **more: Sample(problem=problem, seed=seed, **more,  # noqa: E731
                                             hazards=applicable(problem, caps, kinds=("layout",)))
    if source == "dense":
        fields["q_len"], fields["kv_len"] = lengths_for(caps, q_len, kv_len)
        return hostile(Problem(**fields))
    bs = block_size or block_size_for(caps, 16)
    if source in ("paged", "ragged"):
        problem = Problem(**fields, source="paged", ragged=source == "ragged", block_size=bs, cache_layout=layout)
        return hostile(problem, q_lens=(q_len,) * batch if source == "ragged" else None, num_blocks=num_blocks)
    topk = math.ceil(kv_len / caps.topk_multiple_of) * caps.topk_multiple_of
    extra = dict(extra_topk=max(8, caps.topk_multiple_of), extra_block_size=bs) if source == "two_scopes" else {}
    problem = Problem(**fields | dict(kv_len=topk), source="sparse", block_size=bs, cache_layout=layout, **extra)
    return hostile(problem, num_blocks=num_blocks)


def _elements(caps: Capabilities, source: str, seed: int, total: int) -> Sample | None:
    """A call whose cache holds more than `total` elements: pages of poison before the call's own
    (the last ids); dense, k of two requests of S keys of 8 heads."""
    dtype = _dtype(caps)
    head_dim = dtype and head_dim_for(caps, dtype)
    if head_dim is None:
        return None
    if source == "dense":
        heads_kv = 8 if caps.heads_q is None else 1
        heads_q = heads_kv if caps.heads_q is None else min(caps.heads_q)
        return _call(caps, source, seed, batch=2, kv_len=total // (2 * heads_kv * head_dim) + 1,
                     heads=(heads_q, heads_kv))
    bs = block_size_for(caps, 16)
    return _call(caps, source, seed, block_size=bs, num_blocks=total // (bs * head_dim) + 1)


def headline_samples(caps: Capabilities, seed: int = 0, scale: Scale = PRODUCTION) -> list[Sample]:
    """`scale`'s sizes in every source and cache layout the kernel declares."""
    found = []
    topk = min(scale.topk, caps.max_topk or scale.topk)
    for source in SOURCES:
        paged = source in ("paged", "ragged")
        layouts = [None] * caps.unquantized_caches + ([] if source == "dense" else sorted(caps.cache_layouts))
        for layout in layouts:
            found += [_call(caps, source, seed, layout, kv_len=scale.keys),
                      _call(caps, source, seed, layout, batch=scale.requests)]
            if layout is None and source != "dense":  # a cache of pages in q's dtype: its size is the call's
                found += [_elements(caps, source, seed, scale.elements),
                          _call(caps, source, seed, num_blocks=scale.page_id + 1)]
            if not paged and source != "dense":
                found.append(_call(caps, source, seed, layout, kv_len=topk))
        if source == "dense":
            found.append(_elements(caps, source, seed, scale.elements))
    return [s for s in found if s is not None]


def freedom_samples(caps: Capabilities, seed: int = 0) -> list[Sample]:
    """Each size's freedoms of the tier (`ranges.tier`), a call each in the kernel's first source
    that has the size, in its smallest head dim (2^24 query rows: their float64 answer and scales
    are 8 GB at 16)."""
    dtype = _dtype(caps)
    if dtype is None:
        return []
    head_dim = min(caps.head_dims_for(dtype) or (16,))
    found = []
    for symbol, _, value in ranges.freedoms(caps):
        if ranges.applies(symbol, caps) and ranges.tier(symbol, value, caps) == "scale":
            source = next(s for s in ("dense", "paged", "sparse") if s in caps.sources and s in ranges.SIZES[symbol].sources)
            found.append(_call(caps, source, seed, head_dim=head_dim, **_sized(symbol, value, caps)))
    return [s for s in found if s is not None]


def _sized(symbol: str, value: int, caps: Capabilities) -> dict:
    """`_call`'s arguments for a call whose `symbol` is `value` (a cache's pages: of the smallest
    block size, as `ranges.tier` counts them)."""
    gqa = "gqa" in caps.features
    return {"B": dict(batch=value), "T": dict(q_len=value), "S": dict(kv_len=value), "topk": dict(kv_len=value),
            "Hq": dict(heads=(value, 1 if gqa else value)), "Hkv": dict(heads=(value, value)),
            "group": dict(heads=(value, 1)), "block_size": dict(block_size=value, kv_len=value + 1),
            "pages": dict(num_blocks=value, block_size=min(caps.block_sizes or (1,)))}[symbol]

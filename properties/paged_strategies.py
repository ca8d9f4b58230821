"""Hypothesis strategies for contract v2 samples: paged (and ragged) calls and index-sparse
calls over one or two caches, quantized or not, inside a kernel's capabilities.

Built on `strategies.problems` (dtype, head dims, heads, batch, lengths, masks, sink, the
budget), then the source: block sizes where real kernels break (DeepSeek's FlashMLA tests
draw 1, 2, 5, 53, 61, 64, 69, 576), a kv length per request (0 and shorter than the query
rows included), packed query rows per request, pages shared between requests; top-k up to
2048 (not only multiples of 64), -1 anywhere (all of a row too), topk_len shorter than top-k,
a second scope, FP8/FP4 caches (paged ones too). Rare choices are the last of their range, so shrinking turns
them off.

Every draw is hostile: it carries every layout hazard of its problem (fmha.oracles.hazards:
poison in the keys no row sees, a wide block table, padded pages, strided queries, runs of -1,
every code of a quantized format), shared pages, repeated indices and the cache's last slot,
and each tensor argument (the table, indices and lengths too) in a storage form of its own.
A failure names the hazards it needs (properties/law_record.py reruns it without each).
"""

from __future__ import annotations

import dataclasses
import math

import torch
from hypothesis import assume
from hypothesis import strategies as st

from fmha.contract import CACHE_LAYOUTS, Capabilities
from fmha.oracles.distributions import DISTRIBUTIONS
from fmha.oracles.hazards import hostile
from fmha.oracles.sample import Sample
from fmha.properties.strategies import KEY_BUDGET, call_cost, problems, round_up, scalar_forms, scales, storages

BLOCK_SIZES = (1, 2, 5, 16, 53, 61, 64, 576)
INVALID = (0.0, 0.1, 0.5, 1.0)
MAX_TOPK = 2048


def _lengths(draw, batch: int, upper: int, at_least_one: bool = False):
    """A length per request in [0, upper]: all `upper` most often, else each 0 (a request
    with nothing: its own bugs), `upper` or drawn between (with `at_least_one` not all 0)."""
    if draw(st.integers(0, 2)) < 2:
        return None
    length = st.one_of(st.just(0), st.just(upper), st.integers(0, upper))
    lengths = draw(st.lists(length, min_size=batch, max_size=batch))
    if at_least_one and not any(lengths):
        lengths[-1] = upper
    return tuple(lengths)


def _query_lengths(draw, batch: int, upper: int, caps: Capabilities):
    """A ragged batch's query rows per request: decodes (1), prefills (up to `upper`) and,
    where the kernel takes them, requests with none, anywhere in the batch (first, between
    decodes, last: a launch that drops them shifts the requests after them); where the kernel
    takes them, every draw has one with a request after it."""
    hostile = caps.empty_query_requests and batch > 1
    if not hostile and draw(st.integers(0, 2)) == 0:
        return None
    choices = [st.just(1), st.just(upper), st.integers(1, max(upper, 1))]
    if caps.empty_query_requests:
        choices.insert(0, st.just(0))
    lengths = draw(st.lists(st.one_of(*choices), min_size=batch, max_size=batch))
    if hostile:
        lengths[draw(st.integers(0, batch - 2))] = 0
    if not any(lengths):
        lengths[-1] = upper
    return tuple(min(n, upper) for n in lengths)


def _key_lengths(draw, q_lens, upper: int, caps: Capabilities, causal: bool, block_size: int):
    """Each request's keys, drawn with its query rows: all `upper` most often, else each request
    at `upper`, at least its query rows (a prefill over its own keys), on a page's edge (its last
    page full, or one key past or short of it) or anything (fewer keys than rows, none), as far as
    the kernel declares it takes them."""
    if draw(st.integers(0, 2)) < 2:
        return None
    fits = caps.q_len_at_most_kv_len or (causal and not caps.empty_rows)
    lengths = []
    for q in q_lens:
        choices = [st.just(upper), st.integers(min(q, upper), upper)]
        if upper >= block_size:  # a page drawn, then its edge: no list of every page's edges per request
            lowest = min(q, upper)
            choices.append(st.tuples(st.integers(1, upper // block_size), st.sampled_from((-1, 0, 1))).map(
                lambda edge, lowest=lowest: min(max(edge[0] * block_size + edge[1], lowest), upper)))
        if not fits:  # fewer keys than rows, or none at all: rows that see no key
            choices += [st.just(0), st.integers(0, upper)]
        lengths.append(draw(st.one_of(*choices)))
    if not caps.empty_rows:  # no request with rows and no keys
        lengths = [max(n, 1) if q else n for n, q in zip(lengths, q_lens)]
    return tuple(lengths)


@st.composite
def paged_samples(draw, caps: Capabilities, device: str = "cpu", distributions=tuple(DISTRIBUTIONS),
                  kinds=("paged", "sparse"), needs=()) -> Sample:
    """A paged or index-sparse sample (among `kinds`) inside `caps`, which must declare one;
    with `needs` ("ragged", "two_scopes", a cache layout, "lse", ...) every draw uses them.
    What each request holds (no query rows, fewer keys than rows, rows that see no key) is
    drawn only where the kernel declares it takes it."""
    kinds = [kind for kind in kinds if kind in caps.sources]
    if not kinds:
        raise ValueError(f"paged_samples: the capabilities declare no paged or sparse source ({sorted(caps.sources)})")
    kind = draw(st.sampled_from(kinds))
    block_sizes = caps.block_sizes or BLOCK_SIZES
    needed_layout = next((need for need in needs if need in CACHE_LAYOUTS), None)
    if kind == "paged":
        # one paged draw in four over a quantized cache, where the kernel reads one (rare: the last of the range)
        quantized = "shared_kv" in caps.features and (not caps.unquantized_caches or draw(st.integers(0, 3)) == 3)
        layout = needed_layout or (_layout(draw, caps) if quantized else None)
        problem = draw(problems(_quantized(caps) if layout else caps, device))
        block_size = _block_size(draw, block_sizes, problem.kv_len)
        if problem.kv_len >= block_size and draw(st.integers(0, 2)) == 0:  # the last page full, one draw in three
            problem = problem.replace(kv_len=problem.kv_len - problem.kv_len % block_size)
        ragged = "ragged" in caps.sources and ("ragged" in needs or draw(st.booleans()))
        problem = problem.replace(source="paged", block_size=block_size, ragged=ragged)
        if layout:  # DeepSeek-V4's K = V cache, one KV head, paged
            problem = problem.replace(shared_kv=True, heads_kv=1, cache_layout=layout)
        q_lens = _query_lengths(draw, problem.batch, problem.q_len, caps) if ragged else None
        kv_lens = _key_lengths(draw, q_lens or (problem.q_len,) * problem.batch, problem.kv_len, caps, problem.causal,
                               block_size)
        sample_fields = dict(kv_lens=kv_lens, q_lens=q_lens, shared_pages=True)
        sample_fields |= _cache_fields(draw) if layout else {}
    else:
        problem, sample_fields = _sparse(draw, caps, device, draw(st.sampled_from(block_sizes)), block_sizes,
                                         "two_scopes" in needs, needed_layout)
    sample = Sample(problem=problem, scale=draw(scales(problem.head_dim)),
                    distribution=draw(st.sampled_from(distributions)), seed=draw(st.integers(0, 2**16)),
                    scalars=draw(scalar_forms()), **sample_fields)
    assume(not caps.not_supported_reasons(sample.problem, device))
    return hostile(sample.replace(**draw(storages(sample))), caps)


def _block_size(draw, block_sizes, keys: int) -> int:
    """A block size; half the draws one that spreads `keys` over several pages (page
    boundaries, the last partial page and the table's later entries are where paged kernels
    go wrong)."""
    several = [b for b in block_sizes if b < keys]
    if several and draw(st.booleans()):
        return draw(st.sampled_from(several))
    return draw(st.sampled_from(block_sizes))


def _layout(draw, caps: Capabilities) -> str | None:
    """A cache layout the kernel reads, or None (a cache in q's dtype) where it reads those."""
    plain = [None] if caps.unquantized_caches else []
    return draw(st.sampled_from([*plain, *sorted(caps.cache_layouts)])) if caps.cache_layouts else None


def _quantized(caps: Capabilities) -> Capabilities:
    """The capabilities a quantized cache's call is drawn in: bf16 queries of head dim 512, K = V."""
    return dataclasses.replace(caps, head_dims=(512,), dtypes=(torch.bfloat16,), requires=caps.requires | {"shared_kv"})


def _cache_fields(draw) -> dict:
    """The ue8m0 scales toward either end; small (subnormal) codes beside outliers."""
    return dict(cache_exponent=draw(st.sampled_from((0, -96, 96))), outliers=draw(st.booleans()))


def _sparse(draw, caps, device, block_size, block_sizes, two_scopes: bool, needed_layout: str | None):
    """DeepSeek-V4's call: K = V, no mask (the indices decide), top-k keys per query row."""
    layout = needed_layout or _layout(draw, caps)
    # A second scope's layout is its own: quantized beside a first in q's dtype too, one such draw in
    # four (the last of the range; every such call is of head dim 512, which the CPU interpreter pays for)
    extra = two_scopes or ("two_scopes" in caps.sources and draw(st.booleans()))
    extra_layout = _layout(draw, caps) if extra and (layout or draw(st.integers(0, 3)) == 3) else None
    # The capabilities `problems` draws the dense part from: no mask, top-k (its kv_len) in
    # the kernel's multiple; FlashMLA's head dim and dtype for a quantized cache.
    dense = dataclasses.replace(caps, requires=caps.requires - {"causal", "window"},
                                features=caps.features - {"causal", "window"}, kv_len_multiple_of=caps.topk_multiple_of,
                                max_kv_len=min(caps.max_topk or MAX_TOPK, MAX_TOPK))
    quantized = layout is not None or extra_layout is not None
    if quantized:
        dense = _quantized(dense)
    problem = draw(problems(dense, device, max_kv_len=dense.max_kv_len))
    problem = problem.replace(
        source="sparse", block_size=block_size, shared_kv=True, head_dim_v=problem.head_dim, cache_layout=layout,
        heads_kv=1 if quantized else problem.heads_kv,
        extra_topk=round_up(draw(st.integers(1, 1024)), caps.topk_multiple_of) if extra else None,
        extra_block_size=draw(st.sampled_from(block_sizes)) if extra else None, extra_cache_layout=extra_layout)
    # The budget counts both scopes' keys, and every query row's own (the oracle gathers
    # batch * q_len * keys of them): a smaller batch, then fewer queries.
    keys = problem.kv_len + (problem.extra_topk or 0)
    batch, q_len = problem.batch, problem.q_len

    def over(batch, q_len):
        gathered = batch * q_len * keys * 2 * problem.head_dim / KEY_BUDGET[device]
        return max(gathered, call_cost(device, batch, problem.heads_q, q_len, keys, problem.head_dim, problem.head_dim)) > 1

    while over(batch, q_len) and batch > 1:
        batch //= 2
    while over(batch, q_len) and q_len > 1:
        q_len = math.ceil(q_len / 2)
    problem = problem.replace(batch=batch, q_len=q_len)
    fields = dict(topk_lens=_lengths(draw, batch, problem.kv_len), invalid=draw(st.sampled_from(INVALID)),
                  repeats=0.25, last_slot=True)
    if extra:
        fields["extra_topk_lens"] = _lengths(draw, batch, problem.extra_topk)
        # One scope read not at all (topk_len 0) while the other is: each scope's length is its own.
        silent = draw(st.sampled_from((None, "topk_lens", "extra_topk_lens")))
        if silent:
            fields[silent] = (0,) * batch
    return problem, fields | (_cache_fields(draw) if problem.cache_layouts else {})

"""The covering set: draws whose structure is fixed, so that every hazard of the table
(fmha.oracles.hazards) is drawn for every source and dtype a kernel declares, on every run, not
when the dice fall right. Their values (the tensors, the pages' order, which indices are -1)
come from the run's seed; their structure (lengths, masks, layouts, hazards) never changes.

Each agreement law runs the covering samples of its family first (`Law.setup`), then its random
draws; a test (tests/test_hazards.py) fails if a hazard of the table is not carried by the set,
for two seeds. Hazards that interact are listed in INTERACTING, and the set draws each pair in
one sample.
"""

from __future__ import annotations

import torch

from fmha.contract import CACHE_LAYOUTS, Capabilities, Problem
from fmha.contract import ranges
from fmha.oracles.hazards import HAZARDS, UNSAMPLED, hostile, present
from fmha.oracles.sample import OTHER_ARGUMENTS, Sample
from fmha.oracles.storage import record
from fmha.properties import covering_array
from fmha.properties.covering_array import block_size_for, head_dim_for, lengths_for, rows_for, storage_variants
from fmha.properties.strategies import call_cost

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# What a dense skeleton whose rows and keys a declaration moved may cost a request, in draws'
# budgets (fmha.properties.strategies.call_cost): each runs once a law, not a hundred times
_SKELETON_COST = 4
# Pairs of hazards whose interaction is a bug of its own, each drawn together in one sample.
INTERACTING = (
    ("invisible-keys", "shared-pages"),  # a shared page's keys: another request's window sees them
    ("invisible-keys", "zero-query-requests"),  # every key of a request without rows is no row's
    ("padded-pages", "every-code"),  # a padded quantized page's scales sit after its tokens
    ("invalid-runs", "one-scope-empty"),  # a row that reads one scope not at all and a run of -1 in the other
    ("exact-and-partial-pages", "wide-block-table"),  # the entry after a full last page is another row's
    ("rows-without-keys", "odd-gqa-group"),  # a row tile of heads that sees nothing, split across KV heads
    ("strided-queries", "zero-query-requests"),  # packed rows of a strided q, some requests with none
)


def _sink(caps: Capabilities, dtype) -> bool:
    """A sink in the bf16 (and quantized) samples, none in the others: rows without keys both ways."""
    return ("sink" in caps.features and dtype in (torch.bfloat16, None)) or "sink" in caps.requires


def _heads(caps: Capabilities, group: int, kv_heads: int) -> tuple[int, int]:
    if caps.heads_q is None:
        return kv_heads * group, kv_heads if "gqa" in caps.features else kv_heads * group
    heads_q = min(caps.heads_q)
    return heads_q, (1 if "gqa" in caps.features else heads_q)


def _paged(caps, dtype, seed, ragged: bool, distribution: str = "normal") -> Sample | None:
    head_dim = head_dim_for(caps, dtype)
    if head_dim is None:
        return None
    bs = block_size_for(caps, 5 if not ragged else 16)
    heads_q, heads_kv = _heads(caps, 3, 2)
    rows = rows_for(caps, 3)
    empty = caps.empty_rows and not caps.q_len_at_most_kv_len
    if ragged:
        q_lens = (0, 1, rows, 0, 1, 0, 2) if caps.empty_query_requests else (1, 1, rows, 2, 1, 1, 2)
        q_lens = tuple(min(n, rows) for n in q_lens)
        kv_lens = (bs, 2 * bs + 3, 2 if empty else rows, 2 * bs, bs + 1, 4, 0 if caps.empty_rows else 2)
    else:
        q_lens = None
        # a full last page, a partial one (both over the shared first page, whose keys their rows
        # see), rows before their first key, a long request whose first pages are left of every
        # window, a request with no key
        kv_lens = (2 * bs, 2 * bs + 1, 2 if empty else rows, 3 * bs + 1) + ((0,) if caps.empty_rows else ())
    window = 5 if "window" in caps.features else None
    problem = Problem(batch=len(kv_lens), q_len=rows, kv_len=max(kv_lens), heads_q=heads_q, heads_kv=heads_kv,
                      head_dim=head_dim, dtype=dtype, causal="causal" in caps.features, window=window,
                      sink=_sink(caps, dtype), source="paged", block_size=bs, ragged=ragged)
    return Sample(problem=problem, seed=seed, kv_lens=kv_lens, q_lens=q_lens, shared_pages=True,
                  distribution=distribution)


def _quantized_paged(caps, layout, seed) -> Sample | None:
    bs = block_size_for(caps, 16)
    heads_q, _ = _heads(caps, 3, 1)
    rows = rows_for(caps, 2)
    empty = caps.empty_rows and not caps.q_len_at_most_kv_len
    problem = Problem(batch=3, q_len=rows, kv_len=2 * bs + 3, heads_q=heads_q, heads_kv=1, head_dim=512,
                      shared_kv=True, causal="causal" in caps.features, window=5 if "window" in caps.features else None,
                      sink="sink" in caps.features, source="paged", block_size=bs, cache_layout=layout)
    return Sample(problem=problem, seed=seed, kv_lens=(2 * bs, 2 * bs + 3, 1 if empty else bs + 1), shared_pages=True,
                  outliers=True)


def _sparse(caps, dtype, seed, layout=None, extra_layout=None, two_scopes=False, exponent=0,
            distribution="normal", topk=192, few_keys=False, lengths_given=("topk_len", "extra_topk_len")) -> Sample | None:
    """Index-sparse rows (K = V, one cache or two): a request that reads nothing, one that reads
    some of its indices, runs of -1, repeats, the last slot. With `few_keys`: the rows that read
    read all 4 keys, no sink: each key's decoding shows in its rows' logits and LSE. Two scopes
    pass the lengths arguments of `lengths_given` (each scope's is optional on its own)."""
    if few_keys:
        topk = 4
    quantized = bool(layout or extra_layout)
    head_dim = 512 if quantized else head_dim_for(caps, dtype)
    if head_dim is None:
        return None
    topk = max(topk, caps.topk_multiple_of) if topk % caps.topk_multiple_of else topk
    bs = block_size_for(caps, 16)
    heads_q, heads_kv = _heads(caps, 3, 2)
    heads_kv = 1 if quantized else heads_kv
    extra = dict(extra_topk=max(64, caps.topk_multiple_of), extra_block_size=block_size_for(caps, 5),
                 extra_cache_layout=extra_layout) if two_scopes else {}
    problem = Problem(batch=3 if two_scopes else 2, q_len=rows_for(caps, 3), kv_len=topk, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim,
                      dtype=torch.bfloat16 if quantized else dtype, shared_kv=True,
                      sink=_sink(caps, dtype) and not few_keys,
                      source="sparse", block_size=bs, cache_layout=layout, **extra)
    # A request that reads nothing (rows without keys), one that reads one scope alone, one that reads both.
    short = max(topk - 5, 1)  # a request that reads some of its indices
    lengths = dict(topk_lens=(0, short) if caps.empty_rows else (topk, short))
    if few_keys:  # one request reads nothing, the other every key
        lengths = dict(topk_lens=(0, topk)) if caps.empty_rows else {}
    if two_scopes:
        lengths = dict(topk_lens=(0 if caps.empty_rows else topk, short, topk),
                       extra_topk_lens=(0, 0, problem.extra_topk))
        lengths = {name: lengths[name] for name in ("topk_lens", "extra_topk_lens") if name[:-1] in lengths_given}
    return Sample(problem=problem, seed=seed, invalid=0.0 if few_keys else 0.1, repeats=0.25, last_slot=True,
                  cache_exponent=exponent, outliers=quantized, distribution=distribution, **lengths)


def _scopes_of_their_own(caps: Capabilities, seed: int) -> list[Sample]:
    """Each scope's layout and lengths argument its own (fmha.contract.relations): a quantized first
    beside one in q's dtype and the other way round, one layout in both; topk_len given for the
    first scope only, for the second only, for neither."""
    if not caps.cache_layouts:
        return []
    first, last = min(caps.cache_layouts), max(caps.cache_layouts)
    return [_sparse(caps, None, seed, first, None, two_scopes=True, lengths_given=("topk_len",)),
            _sparse(caps, None, seed, None, last, two_scopes=True, lengths_given=("extra_topk_len",)),
            _sparse(caps, None, seed, last, last, two_scopes=True, lengths_given=())]


def _dense(caps, dtype, seed, distribution="normal", q_len=6, kv_len=65, window=9, group=3) -> Sample | None:
    """Dense keys: a group of 3 over 6 causal rows (18: more than a 16-row tile), 65 keys (one
    past a power of two); rows and keys where the kernel's shape relations put them (a square
    prefill of 2048 keys is past what a CPU run affords: the draws' long contexts have it)."""
    head_dim = head_dim_for(caps, dtype)
    if head_dim is None:
        return None
    heads_q, heads_kv = _heads(caps, group, 2)
    fitted = lengths_for(caps, q_len, kv_len)
    if fitted != (q_len, kv_len) and call_cost("cpu", 1, heads_q, *fitted, head_dim, head_dim) > _SKELETON_COST:
        return None
    q_len, kv_len = fitted
    problem = Problem(batch=2, q_len=q_len, kv_len=kv_len, heads_q=heads_q, heads_kv=heads_kv, head_dim=head_dim, dtype=dtype,
                      causal="causal" in caps.features, window=window if "window" in caps.features else None,
                      sink=_sink(caps, dtype))
    return Sample(problem=problem, seed=seed, distribution=distribution)


def _self_attention(caps, seed) -> Sample | None:
    """q, k and v side by side in one buffer, as a fused QKV projection leaves them: T = S, one KV
    head a query head."""
    sample = _dense(caps, torch.bfloat16 if torch.bfloat16 in caps.dtypes else caps.dtypes[0], seed, q_len=17,
                    kv_len=17, window=None, group=1)
    return None if sample is None else sample.replace(q_storage="alias:k+step:B")


def _sizes(caps: Capabilities, seed: int) -> list[Sample]:
    """The sizes' freedoms (fmha.contract.ranges) a CPU run affords, each in some sample of the
    kernel's first source (dense, else paged, else sparse): the head dims a kernel declares or the
    contract allows at their ends, past 8 bits and those of real models (40, 72), with query rows
    and keys at 255 to 257 beside them; 128 and 255 to 257 query heads (KV heads, groups and
    requests past 64 are the GPU scale tier's); a paged or sparse call's block sizes, top-k and
    pages (`_paged_sizes`). Few rows, keys and heads beside the large size: what a call costs is that
    size's alone."""
    dtype = next((d for d in (torch.bfloat16, *caps.dtypes) if d in caps.dtypes and caps.head_dims_for(d) != ()), None)
    source = next((s for s in ("dense", "paged", "sparse") if s in caps.sources), None)
    if dtype is None or source is None:
        return []

    dims, rows, keys = (_affordable(caps, symbol, dtype) for symbol in ("D", "T", "S"))
    split = caps.split_head_dim_v and "shared_kv" not in caps.requires and source != "sparse"
    # groups of 6 and 12 (real models'), of 2 over two KV heads one broadcast head (an even group
    # shows only where the KV heads are one: fmha.oracles.hazards._odd_group), one head, then groups of 3
    grouped = [*([(12, 6), (12, 12), (4, 2)] if "gqa" in caps.features else []), (1, 1)]
    found = []
    for i in range(max(len(dims), len(grouped))):  # each head dim, each grouping (fewer dims: some again)
        head_dim = dims[i % len(dims)]
        heads_q, group = grouped[i] if i < len(grouped) else (3, 3 if "gqa" in caps.features else 1)
        q_len = rows_for(caps, rows[i] if i < len(rows) else 2)
        q_len, kv_len = lengths_for(caps, q_len, max(keys[i] if i < len(keys) else 17, q_len))
        found.append(Problem(batch=1, q_len=q_len, kv_len=kv_len, heads_q=heads_q,
                             heads_kv=heads_q // group, head_dim=head_dim, dtype=dtype,
                             head_dim_v=dims[-1 - i % len(dims)] if split else head_dim, **_required(caps)))
    # (Hq, group, Hkv): 128 heads in groups of 64, 255 to 257 in groups past 16 (16 does not divide
    # them: hostile); one KV head or a few, which a kernel's row tiles pack (256 KV heads, or 256
    # requests, cost the interpreter a program each: the GPU scale tier's, fmha.contract.ranges);
    # two requests in the first (a dense kernel's other samples have them)
    heads = [(128, 64, 2), (255, 17, 15), (256, 256, 1), (257, 257, 1)]
    for heads_q, group, heads_kv in heads:
        if (group == 1 or "gqa" in caps.features) and (caps.heads_q is None or heads_q in caps.heads_q):
            q_len, kv_len = lengths_for(caps, 1, 17)
            found.append(Problem(batch=2 if heads_q == 128 else 1, q_len=q_len, kv_len=kv_len, heads_q=heads_q,
                                 heads_kv=heads_kv, head_dim=dims[0], dtype=dtype, **_required(caps)))
    found = [_in_source(p, caps, source) for p in found]
    samples = [Sample(problem=p, seed=seed, k_storage="zero:Hkv" if p.heads_q == 2 * p.heads_kv == 4 else "contiguous")
               for p in found]
    return samples + _paged_sizes(caps, seed, dtype, dims[0])


def _required(caps: Capabilities) -> dict:
    """The features a kernel requires of every call, as Problem fields (a window of 5 keys)."""
    return dict(causal=bool(caps.requires & {"causal", "window"}), window=5 if "window" in caps.requires else None,
                sink="sink" in caps.requires, shared_kv="shared_kv" in caps.requires)


def _affordable(caps: Capabilities, symbol: str, dtype) -> list[int]:
    """The values of `symbol`'s freedoms (within `caps`, head dims in `dtype`) a CPU run affords."""
    allowed = caps.head_dims_for(dtype) if symbol in ("D", "Dv") else ranges.allowed_by(caps, symbol)
    return sorted({n for n in ranges.values(ranges.SIZES[symbol], allowed).values() if ranges.affordable(symbol, n, caps)})


def _in_source(problem: Problem, caps: Capabilities, source: str) -> Problem:
    """A dense problem's sizes in a call of `source`: pages of 16 (or the kernel's), K = V for sparse
    rows (their top-k the keys)."""
    if source == "dense":
        return problem
    sparse = dict(shared_kv=True, head_dim_v=problem.head_dim) if source == "sparse" else {}
    return problem.replace(source=source, block_size=block_size_for(caps, 16), **sparse)


def smallest_cache(caps: Capabilities) -> int:
    """The fewest pages of the covering calls' caches: a paged call of one page's keys fits a cache
    of that page alone; a sparse call's holds its two requests' keys and a slot of poison (5 pages
    of one key)."""
    if "paged" in caps.sources:
        return 1
    return -(-(2 * 2 + 1) // min(caps.block_sizes or (1,)))


def _paged_sizes(caps: Capabilities, seed: int, dtype, head_dim: int) -> list[Sample]:
    """A paged or sparse call's sizes: each block size and top-k a CPU run affords (a page and one
    key more, one row of 8 or top-k indices), and caches of 1 to 2^16 + 1 pages in pages of the
    smallest block size, the call's own pages the last ids (a kernel that narrows a page id to 8 or
    16 bits reads the wrong page)."""
    source = next((s for s in ("paged", "sparse") if s in caps.sources), None)
    if source is None:
        return []

    def call(block_size: int, keys: int, group: int = 3, source: str = source, **fields) -> Sample:
        heads_q, heads_kv = _heads(caps, group, 1 if group > 1 else 2)  # a group of 3: a tile's heads split
        problem = Problem(batch=1, q_len=rows_for(caps, 1), kv_len=keys, heads_q=heads_q, heads_kv=heads_kv,
                          head_dim=head_dim, dtype=dtype, source=source, block_size=block_size)
        if source == "sparse":  # a request that reads nothing beside one that reads every index, as _sparse's
            problem = problem.replace(shared_kv=True, batch=2)
            fields |= dict(topk_lens=(0, keys) if caps.empty_rows else None, repeats=0.25 if keys > 1 else 0.0,
                           last_slot=True)
        return Sample(problem=problem, seed=seed, **fields)

    smallest = min(caps.block_sizes or (1,))
    found = [call(bs, bs + 1 if source == "paged" else 8, group=1) for bs in _affordable(caps, "block_size", dtype)]
    if "sparse" in caps.sources:
        found += [call(block_size_for(caps, 16), topk, source="sparse") for topk in _affordable(caps, "topk", dtype)]
    found += [call(smallest, 2 if source == "sparse" else smallest, num_blocks=n)
              for n in _affordable(caps, "pages", dtype) if n >= smallest_cache(caps)]
    if source == "paged" and "sparse" in caps.sources:  # a sparse slot's page past 2^16 too
        found.append(call(smallest, 2, source="sparse", num_blocks=2**16 + 1))
    return found


def skeletons(caps: Capabilities, seed: int = 0) -> list[Sample]:
    """Every covering sample for a kernel of `caps` (before the kernel's own limits are asked)."""
    found = []
    if "dense" in caps.sources:
        found += [_dense(caps, dtype, seed) for dtype in DTYPES]
        found += [_dense(caps, torch.bfloat16, seed, distribution) for distribution in ("large_logits", "negative_logits")]
        found += [_dense(caps, torch.float16, seed, "large_v", q_len=1, kv_len=2048, window=None),  # sums past 65504
                  _dense(caps, torch.bfloat16, seed, q_len=2, kv_len=320, window=300),  # a window past 256 keys
                  _self_attention(caps, seed)]
    if "paged" in caps.sources:
        found += [_paged(caps, dtype, seed, ragged=False) for dtype in DTYPES]
        found += [_paged(caps, torch.bfloat16, seed, ragged=False, distribution=d) for d in ("large_logits",
                                                                                             "negative_logits")]
        if "ragged" in caps.sources:
            found += [_paged(caps, dtype, seed, ragged=True) for dtype in DTYPES]
        if "shared_kv" in caps.features:
            found += [_quantized_paged(caps, layout, seed) for layout in CACHE_LAYOUTS]
    if "sparse" in caps.sources:
        found += [_sparse(caps, dtype, seed) for dtype in DTYPES]
        found += [_sparse(caps, torch.bfloat16, seed, distribution="negative_logits")]
        found += [_sparse(caps, None, seed, layout) for layout in CACHE_LAYOUTS]
        # scales at either end and at 2^0 (q meets the outliers at the small codes' weight), a few
        # keys a row: each key's decoding shows in the rows' logits
        found += [_sparse(caps, None, seed, "dsv4-fp8", exponent=e, few_keys=True) for e in (-96, 0, 96)]
        if "two_scopes" in caps.sources:
            found += [_sparse(caps, torch.bfloat16, seed, two_scopes=True),
                      _sparse(caps, None, seed, "dsv4-fp8", "dsv4-fp4", two_scopes=True),
                      # a few keys a row at scales toward the top: each code's decoding shows in the LSE
                      _sparse(caps, None, seed, "dsv4-fp8", "dsv4-fp4", two_scopes=True, exponent=96, few_keys=True)]
            found += _scopes_of_their_own(caps, seed)
    if "dense" in caps.sources:  # a sink token and outlier channels over a few full tiles of keys
        found.append(_dense(caps, torch.bfloat16, seed, "massive_activations", q_len=2, kv_len=320, window=None))
    return [hostile(s, caps) for s in found if s is not None]


def sequences(caps: Capabilities, seed: int = 0) -> list[Sample]:
    """The samples the laws of calls in sequence run first (their three calls each cost more than
    a family's whole set would): a window past 256 keys, fp16 sums past 65504, sizes' edges,
    a ragged batch of requests without rows, without keys and with more rows than keys (without
    ragged queries, requests with a full last page and a partial one), a quantized second scope
    beside a first in q's dtype."""
    found = []
    if "dense" in caps.sources:
        found += [_dense(caps, torch.bfloat16, seed, q_len=2, kv_len=320, window=300),
                  _dense(caps, torch.float16, seed, "large_v", q_len=1, kv_len=2048, window=None)]
        # sizes: a head dim 16 does not divide, 255 and 257 query heads in groups past 16
        sizes = _sizes(caps, seed)
        found += [s for s in sizes if s.problem.head_dim == 40][:1] + [s for s in sizes if s.problem.heads_q in (255, 257)]
    if {"paged", "ragged"} <= caps.sources:
        found.append(_paged(caps, torch.bfloat16, seed, ragged=True))
    elif "paged" in caps.sources:  # a decode kernel's: a full last page beside a partial one
        found.append(_paged(caps, torch.bfloat16, seed, ragged=False))
    if "two_scopes" in caps.sources and caps.unquantized_caches:  # a quantized second scope beside one in q's dtype
        found += _scopes_of_their_own(caps, seed)[1:2]
    return [hostile(s, caps) for s in found if s is not None]


def covering_samples(kernel, device: str, seed: int = 0, pairs: bool = False) -> list[Sample]:
    """The covering set `kernel` runs on `device`: the skeletons inside its limits, laid out so
    that together they give every tensor argument every storage form its record allows
    (`with_every_storage`), and the sizes' samples; with `pairs`, the covering array's calls too,
    in which every pair of freedoms the kernel's declaration allows meets
    (fmha.properties.covering_array)."""
    caps = kernel.capabilities_on(device)
    supported = lambda samples: [s for s in samples if not kernel.not_supported_reasons(s.problem, device)]  # noqa: E731
    members = with_every_storage(with_every_relation(supported(skeletons(caps, seed)), kernel, device))
    # the sizes' samples packed: a size of 1 (one KV head, pages of one key) hides a form handed to it
    members += supported([hostile(s, caps) for s in _sizes(caps, seed)])
    return members + (covering_array.array(kernel, device, seed) if pairs else [])


def with_every_relation(members: list[Sample], kernel, device: str, k_is_v: bool = True) -> list[Sample]:
    """`members` with each relation's forms (fmha.contract.relations) handed out, in each source's
    members: a window passed with causal=False, numpy scalars (a window's too), each with the default
    scale passed as a float, and an integral scale as an int; with `k_is_v`, K = V beside v apart where the kernel takes both (a
    copy of the source's first member)."""
    members = list(members)
    first_source = members[0].problem.source if members else None
    for source in ("dense", "paged", "sparse"):
        mine = [i for i, m in enumerate(members) if m.problem.source == source and m.distribution == "normal"]
        chosen = sorted(mine, key=lambda i: members[i].problem.window is None)[:3]  # those with a window first
        # the default scale passed as a float (the same values: the hazards laid for them still show);
        # an int scale of 1 in one call of the first source (a scale 8x the default there)
        forms = [("causal=False",), ("numpy",), *([("int scale",)] if source == first_source else [])]
        for i, scalars in zip(chosen, forms):
            scale = 1.0 if scalars == ("int scale",) else members[i].problem.head_dim ** -0.5
            members[i] = members[i].replace(scalars=scalars, scale=scale)
        shared = any(m.problem.shared_kv for m in members if m.problem.source == source)
        if k_is_v and source != "sparse" and mine and not shared:
            k_is_v = members[mine[0]].replace(shared_kv=True, head_dim_v=members[mine[0]].problem.head_dim, scalars=())
            if not kernel.not_supported_reasons(k_is_v.problem, device):
                members.append(k_is_v)  # one more: each member keeps the v its storage forms were laid out for
    return members


def with_every_storage(members: list[Sample]) -> list[Sample]:
    """`members` laid out so that each storage form of each argument record is some member's:
    a record's forms handed out in turn to the members whose calls take that argument (any
    family: the run's laws together are handed all of them), one form an argument a member; a
    copy of a member more where a record has more forms than members take it."""
    # a sample with one query row or one request last: a dim of size 1 hides an order or a step along it
    samples = sorted(members, key=lambda s: s.problem.q_len == 1 or s.problem.batch == 1)
    laid = [dict(q_storage=m.q_storage, k_storage=m.k_storage, v_storage=m.v_storage, storage={}) for m in samples]
    # a record -> (member, argument) of the calls that take an argument of it (a second scope's
    # cache is a k cache: either scope's shows its forms)
    takers: dict[str, list[tuple[int, str]]] = {}
    for i, sample in enumerate(samples):
        for name in ("q", "k", "v", *OTHER_ARGUMENTS):
            if sample.takes(name) and not (name == "q" and "alias:k" in sample.q_storage):
                takers.setdefault(record(name, sample.problem).name, []).append((i, name))
    given = set()
    for those in takers.values():
        first, first_name = those[0]
        for j, spec in enumerate(storage_variants(record(first_name, samples[first].problem))):
            able = [(i, name) for i, name in those if _may_take(samples[i], name, spec, laid[i]["k_storage"])]
            free = [taker for taker in able if taker not in given]
            if free:
                i, name = free[0]
            elif able:  # more forms than members: a copy of one more, this argument in that form, the rest packed
                i, name = able[j % len(able)]
                samples.append(samples[i])
                laid.append(dict(q_storage=samples[-1].q_storage, k_storage="contiguous", v_storage="contiguous",
                                 storage={}))
                i = len(samples) - 1
            else:
                continue
            given.add((i, name))
            _give(laid[i], name, spec)
    return [s.replace(q_storage=f["q_storage"], k_storage=f["k_storage"], v_storage=f["v_storage"],
                      storage=tuple(f["storage"].items())) for s, f in zip(samples, laid)]


def _may_take(sample: Sample, name: str, spec: str, k_storage: str) -> bool:
    """A buffer shared with v only where v is not k; q's with k and v only in the sample made for
    it, whose k and v are that buffer's; v's own form only where it is neither k nor in k's buffer
    (`k_storage`, k's form as laid so far)."""
    forms = spec.split("+")
    if name == "q" and "alias:k" in forms or name in ("k", "v") and "alias:k" in sample.q_storage.split("+"):
        return False
    if name == "v" and (sample.problem.shared_kv or "alias:" in k_storage):
        return False
    return not (any(f.startswith("alias:v") for f in forms) and sample.problem.shared_kv)


def _give(fields: dict, name: str, spec: str) -> None:
    if name in ("q", "k", "v"):
        fields[f"{name}_storage"] = spec
    else:
        fields["storage"][name] = spec


def for_law(law, kernel, device: str, seed: int = 0, pairs: bool = True) -> list[Sample]:
    """What a law runs before its draws: an agreement law its family's covering samples (with
    `pairs`, the covering array's too), a law of calls in sequence the sequence samples of its
    draws (`Law.covering`)."""
    if law.covering == "family":
        return [s for s in covering_samples(kernel, device, seed, pairs) if fits(law, s)]
    caps = kernel.capabilities_on(device)
    return with_every_relation([s for s in sequences(caps, seed) if not kernel.not_supported_reasons(s.problem, device)
                                and (s.problem.source == "dense") == (law.draws == "dense")], kernel, device,
                               k_is_v=False)


def fits(law, sample: Sample) -> bool:
    """Whether `sample` belongs to an agreement law's family of calls: one law each, the most
    specific (two scopes', then a quantized cache its layout's, then ragged queries')."""
    p = sample.problem
    if p.source not in law.sources:
        return False
    if p.extra_topk is not None:
        return set(law.needs) == {"two_scopes"}
    if p.cache_layout:
        return set(law.needs) == {p.cache_layout}
    return set(law.needs) == ({"ragged"} if p.ragged else set())


def uncovered(samples: list[Sample]) -> list[str]:
    """Hazards (but those laid by calls, fmha.oracles.hazards.UNSAMPLED) no sample of `samples` carries in its bytes, and interacting pairs
    no sample carries together."""
    carried = [set(present(s.inputs())) for s in samples]
    missing = [name for name, h in HAZARDS.items() if h.kind not in UNSAMPLED and not any(name in c for c in carried)]
    missing += [f"{a} with {b}" for a, b in INTERACTING if not any({a, b} <= c for c in carried)]
    return missing

"""Lay a sample's keys out as contract v2 calls them: pages and block tables, packed queries,
index lists over cache slots, quantized caches.

The values are the sample's dense draw (`Sample.draw`), so a paged or sparse sample holds the
keys a dense one would; where they go is decided by the sample's seed. Every cache slot that
no request reads, every block-table entry past a request's pages (pointed at a page of
poison) and every quantized byte of an unread token holds poison: NaN (the NaN codes of the
quantized formats), or what the caller passes.

A sample's layout hazards (`Sample.hazards`, fmha.oracles.hazards) are laid in here: poison in
the keys no row of a request can see, the block table a slice of a wider one, caches and q as
views with poisoned gaps, runs of -1 a tile long, every code of a quantized format.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from fmha.contract.problem import LOGIT_LIMIT
from fmha.contract.slots import request_slots
from fmha.oracles import oracle, quantization, storage
from fmha.oracles.hazards import HAZARDS, invalid_run, invisible_keys, numeric_codes
from fmha.oracles.inputs import Inputs

if TYPE_CHECKING:  # a Sample lays itself out here
    from fmha.oracles.sample import Sample

# Poison bytes of an unread quantized token: NaN (e2m1 has no NaN code: its tile's scale
# carries it), or else huge finite values: the largest element at a scale of 2^40.
NAN_BYTES = {"e4m3fn": 0x7F, "e2m1": 0x0}
HUGE_BYTES = {"e4m3fn": 0x7E, "e2m1": 0x7}
NAN_SCALE, HUGE_SCALE = 0xFF, 127 + 40


def request_facts(sample: Sample) -> dict:
    """What the sample's requests hold that a kernel may not support (fmha.contract.PER_REQUEST):
    a ragged request with no query rows, a request with more query rows than keys, a query
    row that sees no key (causal past its keys, a request with no keys, a sparse row whose
    indices are all -1 or past topk_len in every scope)."""
    p = sample.problem
    if p.source == "paged":
        pairs = list(zip(*sample.request_lengths()))
        return dict(empty_query_requests=p.ragged and any(q == 0 for q, _ in pairs),
                    q_len_over_kv_len=any(q > kv for q, kv in pairs),
                    rows_without_keys=any(q and (kv == 0 or (p.causal and q > kv)) for q, kv in pairs))
    B, T = p.batch, p.q_len
    sees_a_key = torch.zeros(B, T, dtype=torch.bool)
    for scope, topk, lengths in ((1, p.kv_len, sample.topk_lens), (2, p.extra_topk, sample.extra_topk_lens)):
        if topk:  # the rows' order drawn only where the -1s are drawn after it (2^24 indices: a second)
            invalid = _row_draws(sample, scope, B, T, topk, lengths)[1] if sample.invalid \
                else _invalid(sample, None, (B, T, topk))
            read = torch.arange(topk) < torch.tensor(lengths or (topk,) * B).view(B, 1, 1)
            sees_a_key |= (read & ~invalid).any(-1)
    return dict(empty_query_requests=False, q_len_over_kv_len=False, rows_without_keys=not bool(sees_a_key.all()))


def inputs(sample: Sample, g: torch.Generator, q, k, v, sink, device, fill: float) -> Inputs:
    if sample.problem.source == "paged":
        return _paged(sample, g, q, k, v, sink, device, fill)
    return _sparse(sample, g, q, k, sink, device, fill)


def _base(sample, natural: int) -> int:
    """Pages of poison before the cache's own, so that it holds `sample.num_blocks` in all."""
    if sample.num_blocks is None:
        return 0
    if sample.num_blocks < natural:
        raise ValueError(f"num_blocks: the call's pages are {natural}, more than the {sample.num_blocks} asked for")
    return sample.num_blocks - natural


def _int32(values, device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


def _paged(sample: Sample, g, q, k, v, sink, device, fill) -> Inputs:
    p = sample.problem
    B, bs = p.batch, p.block_size
    kv_lens = sample.kv_lens or (p.kv_len,) * B
    if sample.shared_pages and kv_lens[0] >= bs:
        for b in range(1, B):  # a shared prefix: the same keys in one physical page
            if kv_lens[b] >= bs:
                k[b, :bs] = k[0, :bs]
                if v is not k:
                    v[b, :bs] = v[0, :bs]
    pages_of = [math.ceil(n / bs) for n in kv_lens]
    shared = sample.shared_pages and kv_lens[0] >= bs
    own = [n - (1 if shared and b and kv_lens[b] >= bs else 0) for b, n in enumerate(pages_of)]
    # The last physical page (in shuffled order) is poison only, unless the call asks for a cache of
    # its own pages alone (one page: the smallest cache there is); the table's entries past a
    # request's pages then name a page some request reads, its keys past kv_lens.
    spare_page = sample.num_blocks != sum(own)
    num_blocks = sum(own) + spare_page
    if "padded-pages" in sample.hazards:
        num_blocks = max(num_blocks, 2)  # a page stride shows between two pages
    order = torch.randperm(num_blocks, generator=g).tolist()
    spare, order = order[-1], iter(order[:-1] if spare_page else order)
    base = _base(sample, num_blocks)
    if base:  # the spare the lowest id, the pages read the highest: the largest id read is the last
        spare, order = base, iter(base + 1 + i for i in torch.randperm(num_blocks - 1, generator=g).tolist())
        num_blocks += base
    max_blocks = max(pages_of, default=0) + 1  # one entry past the longest request: poison
    table = [[spare] * max_blocks for _ in range(B)]
    for b in range(B):
        for i in range(pages_of[b]):
            table[b][i] = table[0][0] if shared and b and i == 0 and kv_lens[b] >= bs else next(order)
    # Laid out before the keys: where its rows share memory (stride 0, overlapping rows) a request
    # reads pages the draw gave another, so the keys go where the table the kernel gets says.
    table_tensor = storage.lay_out(_int32(table, device), storage.record("block_table", p),
                                   sample.laid_form("block_table"), spare)
    table = table_tensor.tolist()
    cast = dict(dtype=p.dtype, device=device)
    q_lens = (sample.q_lens or (p.q_len,) * B) if p.ragged else (p.q_len,) * B
    read = slots = _read(table, kv_lens, bs)
    if "invisible-keys" in sample.hazards:  # only the slots some request's rows see (a shared page's may be another's)
        read = torch.cat([request_slots(table[b], n, bs)[invisible_keys(q_lens[b], n, p.window):]
                          for b, n in enumerate(kv_lens)])
    k_cache = _scatter(k, slots, kv_lens, bs, num_blocks, fill, cast, read)
    v_cache = k_cache if v is k else _scatter(v, slots, kv_lens, bs, num_blocks, fill, cast, read)
    hostile = "padded-pages" in sample.hazards
    if hostile and p.cache_layout is None:
        padded = _in_hazard_form("padded-pages", "k", k_cache, p, fill)
        v_cache = padded if v_cache is k_cache else _in_hazard_form("padded-pages", "v", v_cache, p, fill)
        k_cache = padded
    args = dict(block_table=table_tensor, kv_lens=_int32(kv_lens, device))
    q = q.to(**cast)
    if p.ragged:
        q = torch.cat([q[b, :n] for b, n in enumerate(q_lens)])
        args["cu_seqlens_q"] = _int32([0, *torch.tensor(q_lens).cumsum(0).tolist()], device)
    k_call, oracle_k = _quantized(k_cache, p.cache_layout, read, fill, sample.cache_exponent, sample.outliers,
                                  _coder(sample), padded=hostile)
    v_call, oracle_v = (k_call, oracle_k) if v_cache is k_cache else (v_cache, v_cache)
    args["cache_layout"] = p.cache_layout
    source = oracle.Paged(oracle_k, oracle_v, args["block_table"], args["kv_lens"])
    q = _logits_in_range(sample, _meeting_outliers(sample, q), [source], args.get("cu_seqlens_q"))
    if "strided-queries" in sample.hazards:
        q = _in_hazard_form("strided-queries", "q", q, p, fill)
    return Inputs(sample, q, k_call, v_call, sink, _given(args), [source])


def _in_hazard_form(hazard: str, argument: str, t: torch.Tensor, problem, fill) -> torch.Tensor:
    """`t`, the call's `argument`, laid out in storage hazard `hazard`'s form: freedoms of the
    argument's record (fmha.contract.arguments), `fill` in the buffer around the view."""
    return storage.lay_out(t, storage.record(argument, problem), HAZARDS[hazard].form[1], fill)


def _coder(sample: Sample):
    """Where a quantized cache takes every code of its format (the `every-code` hazard): a
    generator of positions of the sample's own, or None."""
    return torch.Generator().manual_seed(sample.values_seed * 8 + 5) if "every-code" in sample.hazards else None


def _read(table, kv_lens, block_size) -> torch.Tensor:
    """The flat slots (page * block_size + offset) a paged call reads, request by request."""
    return torch.cat([request_slots(table[b], n, block_size) for b, n in enumerate(kv_lens)]
                     or [torch.zeros(0, dtype=torch.long)])


def _scatter(x, slots, kv_lens, block_size, num_blocks, fill, cast, keep) -> torch.Tensor:
    """Dense (B, S, H, D) keys into (num_blocks, block_size, H, D) pages at `slots` (`_read`'s, the
    block table's); slots not in `keep` (flat slots) hold `fill`. Of the keys one slot is given
    (requests whose table rows share memory), the last request's."""
    cache = torch.full((num_blocks * block_size, *x.shape[2:]), fill, **cast)
    last = torch.full((cache.shape[0],), -1, dtype=torch.int64).scatter_reduce_(
        0, slots, torch.arange(len(slots)), "amax")
    given = (last >= 0).nonzero().flatten()
    keys = torch.cat([x[b, :n] for b, n in enumerate(kv_lens)])
    cache[given.to(cast["device"])] = keys[last[given].to(keys.device)].to(**cast)
    unkept = torch.ones(cache.shape[0], dtype=torch.bool)
    unkept[keep] = False
    cache[unkept.to(cache.device)] = fill
    return cache.view(num_blocks, block_size, *x.shape[2:])


def _sparse(sample: Sample, g, q, k, sink, device, fill) -> Inputs:
    """Each request's keys in slots of one shared cache (K = V: DeepSeek-V4's one latent
    cache); each query row reads its request's keys in an order of its own, `invalid` of them
    replaced by -1. A second scope draws keys of its own."""
    p = sample.problem
    if not p.shared_kv:
        raise ValueError("a sparse sample holds K = V (DeepSeek-V4's one latent cache): problem.shared_kv")
    cast = dict(dtype=p.dtype, device=device)
    extra_k = sample.draw(g, kv_len=p.extra_topk)[1] if p.extra_topk is not None else None
    args, sources = _scope(sample, g, 1, k, p.block_size, sample.topk_lens, p.cache_layout, fill, cast, "")
    if extra_k is not None:
        extra_args, extra_sources = _scope(sample, g, 2, extra_k, p.extra_block_size, sample.extra_topk_lens,
                                          p.extra_cache_layout, fill, cast, "extra_")
        args |= extra_args
        sources += extra_sources
    cache = args.pop("k_cache")
    q = _logits_in_range(sample, _meeting_outliers(sample, q.to(**cast)), sources)
    if "strided-queries" in sample.hazards:
        q = _in_hazard_form("strided-queries", "q", q, p, fill)
    return Inputs(sample, q, cache, cache, sink, _given(args), sources)


def _scope(sample, g, scope: int, k, block_size, topk_lens, layout, fill, cast, prefix):
    """One scope's call arguments and its oracle source. Which keys a row reads, in which
    order, and which are -1 come from a generator of their own: the same in any block size."""
    p = sample.problem
    B, topk = k.shape[:2]
    T = p.q_len
    num_blocks = math.ceil((B * topk + 1) / block_size)  # at least one slot of poison
    if "padded-pages" in sample.hazards:
        num_blocks = max(num_blocks, 2)  # a page stride shows between two pages
    slots = torch.randperm(num_blocks * block_size, generator=g)[:B * topk].view(B, topk)
    base = _base(sample, num_blocks) if scope == 1 else 0
    slots, num_blocks = slots + base * block_size, num_blocks + base  # the pages read among the highest ids
    order, invalid, (repeated, source) = _row_draws(sample, scope, B, T, topk, topk_lens)
    last = num_blocks * block_size - 1
    if sample.last_slot:  # a key some row reads lives in the cache's last slot, in any block size
        _in_the_last_slot(slots, _a_read_key(order, invalid, repeated, topk_lens), last)
    elif bool((slots == last).any()):  # and otherwise no key does: the slot holds poison
        free = sorted(set(range(base * block_size, num_blocks * block_size)) - set(slots.flatten().tolist()))
        slots[slots == last] = free[0]
    indices = torch.gather(slots[:, None, :].expand(B, T, topk), 2, order) if topk else slots.new_zeros(B, T, 0)
    indices = torch.where(repeated, torch.gather(indices, 2, source), indices)
    indices = torch.where(invalid, -1, indices).to(torch.int32).to(cast["device"])
    cache = torch.full((num_blocks * block_size, *k.shape[2:]), fill, **cast)
    cache[slots.flatten()] = k.flatten(0, 1).to(**cast)
    cache = cache.view(num_blocks, block_size, *k.shape[2:])
    padded = "padded-pages" in sample.hazards
    if padded and layout is None:
        cache = _in_hazard_form("padded-pages", f"{prefix}k_cache" if prefix else "k", cache, p, fill)
    topk_len = None if topk_lens is None else torch.tensor(topk_lens, dtype=torch.int32, device=cast["device"])
    limit = topk if topk_len is None else topk_len.view(-1, 1, 1)
    seen = indices[(indices >= 0) & (torch.arange(topk, device=indices.device) < limit)].long().cpu()
    seen = slots.flatten()[torch.isin(slots.flatten(), seen)]  # in the keys' order: the same in any block size
    k_call, oracle_cache = _quantized(cache, layout, slots.flatten(), fill, sample.cache_exponent, sample.outliers,
                                      _coder(sample), padded, seen)
    args = {f"{prefix}k_cache": k_call, f"{prefix}indices": indices, f"{prefix}topk_len": topk_len,
            f"{prefix}cache_layout": layout}
    return args, [oracle.Sparse(oracle_cache, oracle_cache, indices, topk_len)]


def _a_read_key(order, invalid, repeated, topk_lens) -> tuple[int, int] | None:
    """(request, key) of the last index some row reads (not -1, not a repeat, before topk_len)."""
    B, _, topk = order.shape
    limit = torch.tensor(topk_lens if topk_lens is not None else (topk,) * B)
    read = ~invalid & ~repeated & (torch.arange(topk) < limit.view(-1, 1, 1))
    if not read.any():
        return None
    b, t, j = torch.nonzero(read)[-1].tolist()
    return b, int(order[b, t, j])


def _in_the_last_slot(slots: torch.Tensor, key, last: int) -> None:
    """Key (request, index) moved to slot `last`: swapped with the key there, if any."""
    if key is None:
        return
    held = (slots == last).nonzero()
    if len(held):
        slots[tuple(held[0].tolist())] = slots[key]
    slots[key] = last


def _invalid(sample: Sample, rows: torch.Generator | None, shape: tuple[int, int, int], lengths=None) -> torch.Tensor:
    """(B, T, topk): which entries of the rows are -1; `rows`, the scope's generator after the
    rows' order, draws them (unused where `sample.invalid` is 0: the runs of -1 are fixed).
    `lengths`: each request's topk_len in the scope (None: every entry is read)."""
    B, T, topk = shape
    invalid = (torch.rand(shape, generator=rows) < sample.invalid) if sample.invalid else torch.zeros(shape, dtype=torch.bool)
    run = invalid_run(topk) if "invalid-runs" in sample.hazards else 0
    if run:  # a tile of -1 at the start, in the middle or at the end of each row in turn, valid indices around it
        for row, at in enumerate((0, (topk - run) // 2, topk - run) * -(-B * T // 3)):
            if row < B * T:
                invalid.view(B * T, topk)[row, at:at + run] = True
    if sample.invalid and topk:
        # By construction, not by chance: a row that reads two entries or more reads a -1, its middle
        # entry where the draw left it none (a quarter of 18 entries drew none at 0.6% of run seeds).
        n = torch.tensor(lengths or (topk,) * B).clamp(max=topk)
        read = torch.arange(topk) < n.view(B, 1, 1)
        b, t = ((n.view(B, 1) >= 2) & ~(invalid & read).any(-1)).nonzero(as_tuple=True)
        invalid[b, t, n[b] // 2] = True
    return invalid


def _row_draws(sample: Sample, scope: int, B: int, T: int, topk: int, lengths=None):
    """Which of its request's keys each query row reads, in which order (B, T, topk), which of
    its entries are -1, and which repeat another entry of the row (the mask and the entry):
    from a generator of the scope's own, so the same in any block size. `lengths`: each
    request's topk_len in the scope (None: every entry is read)."""
    rows = torch.Generator().manual_seed(sample.values_seed * 8 + scope)
    order = torch.stack([torch.stack([torch.randperm(topk, generator=rows) for _ in range(T)]) for _ in range(B)]
                        ) if B and T else torch.zeros(B, T, topk, dtype=torch.long)
    shape = (B, T, topk)
    invalid = _invalid(sample, rows, shape, lengths)
    if not sample.repeats or not topk:
        return order, invalid, (torch.zeros(shape, dtype=torch.bool), torch.zeros(shape, dtype=torch.long))
    repeated, source = torch.rand(shape, generator=rows) < sample.repeats, torch.randint(0, topk, shape, generator=rows)
    # By construction, not by chance: in every row that reads two keys or more, the last index
    # it reads repeats the first (a few-key row's random repeats can all land past topk_len or on -1).
    read = ~invalid & (torch.arange(topk) < torch.tensor(lengths or (topk,) * B).view(B, 1, 1))
    b, t = (read.sum(-1) >= 2).nonzero(as_tuple=True)
    first, last = read[b, t].int().argmax(-1), topk - 1 - read[b, t].flip(-1).int().argmax(-1)
    repeated[b, t, first] = False
    repeated[b, t, last], source[b, t, last] = True, first
    return order, invalid, (repeated, source)


def _quantized(cache: torch.Tensor, layout: str | None, read: torch.Tensor, fill: float, exponent: int = 0,
               outliers: bool = False, every_code: torch.Generator | None = None, padded: bool = False,
               seen: torch.Tensor | None = None):
    """The cache as the call passes it and as the oracle reads it: the same tensor, or the
    layout's bytes (num_blocks, block_size, 1, token_bytes) and their exact float64 values.
    The bytes of tokens outside `read` (flat slots) are poison: NaN codes for a NaN `fill`,
    huge values otherwise. With `every_code`, every code of the format sits among the elements
    of the tokens some row reads (`seen`, else `read`); `padded` pages have one more alignment
    unit of poison."""
    if layout is None:
        return cache, cache
    spec = quantization.LAYOUTS[layout]
    num_blocks, block_size = cache.shape[:2]
    clean = torch.where(torch.isfinite(cache), cache, 0.0).double()
    # Tiles of different magnitudes (x 1/4 to x 4), as a real latent cache has: with one
    # magnitude everywhere every tile gets the same scale, and a kernel applying the wrong
    # tile's scale would pass.
    magnitudes = 2.0 ** (torch.arange(spec.tiles, dtype=torch.float64, device=cache.device) % 5 - 2 + exponent)
    clean[..., :spec.quantized_dims] *= magnitudes.repeat_interleave(spec.tile)
    if outliers:  # each tile's first element made its largest times 2^k: the tile's scale, which
        # follows it, leaves the others the element's smallest codes (most of e4m3's at 2^14 below
        # the top are subnormal, exponent bits 0; e2m1's at 2^2 span 0.5 to 6): most of every key's
        # elements sit in the codes a kernel is likeliest to flush or misdecode.
        tiles = clean[..., :spec.quantized_dims].unflatten(-1, (spec.tiles, spec.tile))
        tiles[..., 0] = torch.copysign(tiles.abs().amax(dim=-1) * 2.0 ** _outlier_log2(spec), tiles[..., 0])
    pages = quantization.quantize(clean, spec)
    if every_code is not None:
        _every_code(pages, spec, block_size, read if seen is None else seen, every_code)
    if padded:  # one more alignment unit a page, of NaN codes (0xFF is e4m3's and ue8m0's NaN)
        wider = torch.full((num_blocks, pages.shape[1] + spec.page_alignment), 0xFF, dtype=torch.uint8,
                           device=pages.device)
        wider[:, :pages.shape[1]] = pages
        pages = wider
    unread = torch.ones(num_blocks * block_size, dtype=torch.bool, device=cache.device)
    unread[read.to(cache.device)] = False
    unread = unread.view(num_blocks, block_size)
    data = pages[:, :block_size * spec.data_bytes].view(num_blocks, block_size, spec.data_bytes)
    nan = math.isnan(fill)
    rope = spec.data_bytes - 2 * spec.rope_dims
    element = (NAN_BYTES if nan else HUGE_BYTES)[spec.element.name] * (0x11 if spec.element.bits == 4 else 1)
    rope_bytes = torch.tensor([fill], dtype=torch.bfloat16).view(torch.uint8).repeat(spec.rope_dims)
    data[..., :rope] = torch.where(unread[..., None], element, data[..., :rope])
    data[..., rope:] = torch.where(unread[..., None], rope_bytes.to(cache.device), data[..., rope:])
    scales = pages[:, block_size * spec.data_bytes:block_size * spec.token_bytes].view(num_blocks, block_size,
                                                                                       spec.scale_bytes)
    scales[..., :spec.tiles] = torch.where(unread[..., None], NAN_SCALE if nan else HUGE_SCALE,
                                           scales[..., :spec.tiles])
    call = pages[:, :block_size * spec.token_bytes].view(num_blocks, block_size, 1, spec.token_bytes)
    return call, quantization.dequantize(pages, spec, block_size)


def _outlier_log2(spec) -> int:
    return 2 if spec.element.bits == 4 else 14


def _meeting_outliers(sample: Sample, q: torch.Tensor) -> torch.Tensor:
    """q whose elements facing the cache's outliers (each tile's first) are 2^k smaller, at a
    cache scale of 2^0: q meets an outlier at the other elements' weight, so the small codes
    carry the logits, and a kernel that flushes or misdecodes them moves the LSE by units, not
    by the outlier's rounding. At 2^+-96 q meets them at full weight: logits at fp32's edge."""
    layout = sample.problem.cache_layout
    if not (sample.outliers and layout and sample.cache_exponent == 0):
        return q
    spec = quantization.LAYOUTS[layout]
    q = q.clone()
    q[..., :spec.quantized_dims:spec.tile] *= 2.0 ** -_outlier_log2(spec)
    return q


def _logits_in_range(sample: Sample, q: torch.Tensor, sources, cu_seqlens_q=None) -> torch.Tensor:
    """q scaled down by a power of two (exactly) until every logit is within the contract's
    LOGIT_LIMIT: keys at 2^96 beside outliers reach 1e39, whose fp32 LSE is infinite. Only such
    keys can: other draws are returned as they are."""
    if sample.cache_exponent <= 0:
        return q
    p = sample.problem
    top = oracle.largest_logit(q, sources, cu_seqlens_q=cu_seqlens_q, scale=sample.scale, causal=p.causal,
                               window=p.window)
    return q * 2.0 ** -math.ceil(math.log2(top / LOGIT_LIMIT)) if top > LOGIT_LIMIT else q


def _every_code(pages: torch.Tensor, spec, block_size: int, read: torch.Tensor, g: torch.Generator) -> None:
    """Every number code of the format, once each, at element positions of the read tokens
    (drawn from `g`): negative zero and the subnormals no encoder of rounded values writes."""
    codes = torch.tensor(numeric_codes(spec.name), dtype=torch.long)
    # a shared page's slots are read by each request: a position drawn twice would keep one code
    # (each slot once, in the keys' order: the same codes land on the same keys in any block size)
    read = read.new_tensor(list(dict.fromkeys(read.tolist())))
    # Positions in distinct bytes: two 4-bit codes written into one byte at once would keep one.
    per_token = spec.quantized_dims * spec.element.bits // 8
    if not read.numel() or read.numel() * per_token < len(codes):
        return
    chosen = torch.randperm(read.numel() * per_token, generator=g)[:len(codes)]
    elements = chosen % per_token
    if spec.element.bits == 4:
        elements = elements * 2 + torch.randint(0, 2, elements.shape, generator=g)
    device = pages.device
    slots, elements = read.cpu()[chosen // per_token].to(device), elements.to(device)
    data = pages[:, :block_size * spec.data_bytes].view(pages.shape[0], block_size, spec.data_bytes)
    page, token, codes = slots // block_size, slots % block_size, codes.to(device)
    if spec.element.bits == 8:
        data[page, token, elements] = codes.to(torch.uint8)
        return
    byte = data[page, token, elements // 2].long()
    byte = torch.where(elements % 2 == 1, (byte & 0x0F) | (codes << 4), (byte & 0xF0) | codes)
    data[page, token, elements // 2] = byte.to(torch.uint8)


def _given(args: dict) -> dict:
    return {name: value for name, value in args.items() if value is not None}

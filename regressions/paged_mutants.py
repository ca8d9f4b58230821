"""Kernels with the bugs paged and index-sparse kernels have shipped, for contract v2's laws
and traps to catch. Each is the float64 reference kernel (fmha.oracles.reference_kernel) with one
mistake, so its failures are that mistake's alone; each claims the reference's capabilities
and promises, and its correct twin is the reference. Each is a `Mutant` of
fmha.regressions.mutants (with the trap it proves, where one does), run like any kernel:

    pytest --pyargs fmha.properties --fmha-kernel mutant:topk-len-ignored
"""

from __future__ import annotations

import functools
import inspect
import math

import torch

from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, ENTRY as REFERENCE_ENTRY, reference
from fmha.contract import KernelEntry
from fmha.contract import cache_layouts
from fmha.oracles import quantization
from fmha.oracles.dense_reference import merge
from fmha.regressions.mutation import Mutant


def _bug(fn):
    """The bug lives on one path: a call without the arguments that path reads (a dense call,
    a paged call for a bug in the indices, an unquantized cache for a decoding bug) is the
    reference's, as a kernel with every path would run it, so a law catches the bug and not
    a missing argument."""
    needs = [name for name, p in inspect.signature(fn).parameters.items()
             if p.kind is p.KEYWORD_ONLY and p.default is p.empty]

    @functools.wraps(fn)
    def kernel(q, k, v, **kwargs):
        dense = kwargs.get("block_table") is None and kwargs.get("indices") is None
        if dense or any(kwargs.get(name) is None for name in needs):
            return reference(q, k, v, **kwargs)
        return fn(q, k, v, **kwargs)

    return kernel


def _one_line(doc: str) -> str:
    """A docstring's first paragraph as the kill matrix's one-line bug: "the last page ..."."""
    text = " ".join(doc.split("\n\n")[0].split()).rstrip(".")
    return text[0].lower() + text[1:]


@_bug
def one_table_row(q, k, v, *, block_table, **kw):
    """Every request reads the block table's first row (a row stride of 0)."""
    return reference(q, k, v, block_table=block_table[:1].expand_as(block_table).contiguous(), **kw)


@_bug
def whole_last_page(q, k, v, *, block_table, kv_lens, **kw):
    """A request's last, partial page read whole: the slots past its kv length count too."""
    pages = -(-kv_lens // k.shape[1])
    return reference(q, k, v, block_table=block_table, kv_lens=(pages * k.shape[1]).to(torch.int32), **kw)


@_bug
def contiguous_pages(q, k, v, *, block_table, **kw):
    """Page i of a request assumed at block_table[b, 0] + i: pages allocated in one run."""
    first = block_table[:, :1].long()
    assumed = (first + torch.arange(block_table.shape[1], device=block_table.device)) % k.shape[0]
    return reference(q, k, v, block_table=assumed.to(torch.int32), **kw)


@_bug
def power_of_two_pages(q, k, v, *, block_table, kv_lens, **kw):
    """Slot arithmetic with shifts and masks, j >> log2(block_size) and j & (block_size - 1):
    right for powers of two only.

    Expressed as the slots it reads, remapped into the table."""
    block_size = k.shape[1]
    shift = max(block_size.bit_length() - 1, 0)
    if block_size == 1 << shift:
        return reference(q, k, v, block_table=block_table, kv_lens=kv_lens, **kw)
    # Logical key j lands in page j >> shift at offset j & mask: as if pages held 2**shift keys.
    flat = torch.arange(block_table.shape[1] * block_size, device=k.device)
    wrong = block_table.long()[:, (flat >> shift).clamp(max=block_table.shape[1] - 1)] * block_size + (flat & ((1 << shift) - 1))
    pages = k.flatten(0, 1)[wrong.flatten()].view(-1, block_size, *k.shape[2:])
    values = pages if v is k else v.flatten(0, 1)[wrong.flatten()].view(-1, block_size, *v.shape[2:])
    table = torch.arange(pages.shape[0], device=k.device, dtype=torch.int32).view(block_table.shape[0], -1)
    return reference(q, pages, values, block_table=table, kv_lens=kv_lens, **kw)


@_bug
def batch_drops_last_key(q, k, v, *, kv_lens, **kw):
    """The multi-request path stops one key short (B > 1 only): a request alone is right."""
    if kv_lens.shape[0] > 1:
        kv_lens = (kv_lens - 1).clamp(min=0)
    return reference(q, k, v, kv_lens=kv_lens, **kw)


@_bug
def no_keys_nan(q, k, v, *, kv_lens, **kw):
    """A request with no keys divides 0 by 0."""
    o, lse = reference(q, k, v, kv_lens=kv_lens, **kw)
    if kw.get("cu_seqlens_q") is None:
        o[kv_lens == 0] = float("nan")
    else:
        bounds = kw["cu_seqlens_q"].tolist()
        for b in torch.nonzero(kv_lens == 0).flatten().tolist():
            o[bounds[b]:bounds[b + 1]] = float("nan")
    return o, lse


@_bug
def minus_one_is_slot_0(q, k, v, *, indices, extra_indices=None, **kw):
    """-1 read as slot 0 (an unsigned index, or a clamp before the mask)."""
    extra = {} if extra_indices is None else dict(extra_indices=extra_indices.clamp(min=0))
    return reference(q, k, v, indices=indices.clamp(min=0), **extra, **kw)


@_bug
def minus_one_counts(q, k, v, *, indices, topk_len=None, sink=None, out=None, **kw):
    """A -1 masked to logit 0 instead of -inf: each adds exp(0) to the denominator."""
    o, lse = reference(q, k, v, indices=indices, topk_len=topk_len, sink=sink, **kw)
    read = torch.arange(indices.shape[-1], device=q.device) < (indices.shape[-1] if topk_len is None
                                                               else topk_len.view(-1, 1, 1))
    invalid = ((indices == -1) & read).sum(-1).double()  # (B, T)
    wider = torch.logaddexp(lse.double(), invalid.log().unsqueeze(1))
    o = (o.double() * torch.exp(lse.double() - wider).transpose(1, 2)[..., None]).to(q.dtype)
    return (o if out is None else out.copy_(o)), wider.float()


@_bug
def topk_len_ignored(q, k, v, *, topk_len=None, extra_topk_len=None, **kw):
    """Every index read, past topk_len too."""
    return reference(q, k, v, **kw)


@_bug
def last_index_dropped(q, k, v, *, indices, **kw):
    """One index short per row (a loop bound of topk - 1)."""
    return reference(q, k, v, indices=torch.cat([indices[..., :-1], torch.full_like(indices[..., -1:], -1)], -1), **kw)


@_bug
def sink_per_scope(q, k, v, *, sink=None, extra_k_cache=None, extra_indices=None, extra_topk_len=None,
                   extra_cache_layout=None, out=None, **kw):
    """Each scope's softmax with the sink, merged: the sink joins the denominator twice."""
    if extra_k_cache is None:
        return reference(q, k, v, sink=sink, out=out, **kw)
    main = reference(q, k, v, sink=sink, **kw)
    extra = reference(q, extra_k_cache, extra_k_cache, sink=sink, indices=extra_indices, topk_len=extra_topk_len,
                      cache_layout=extra_cache_layout, scale=kw.get("scale"))
    o, lse = merge([main, extra])
    o = o.to(q.dtype)
    return (o if out is None else out.copy_(o)), lse.float()


def _decoded_as(k, layout, mistake):
    """A quantized cache decoded with one mistake, as a bf16 cache (every value it can
    hold is a bf16 value)."""
    spec = quantization.LAYOUTS[layout]
    num_blocks, block_size = k.shape[:2]
    pages = quantization.pages_of(k).clone()
    scales = pages[:, block_size * spec.data_bytes:block_size * spec.token_bytes].view(num_blocks, block_size,
                                                                                     spec.scale_bytes)
    codes = pages[:, :block_size * spec.data_bytes].view(num_blocks, block_size, spec.data_bytes)
    codes = codes[..., :spec.quantized_dims * spec.element.bits // 8]
    if mistake == "scale of the next tile":
        scales[..., :spec.tiles] = scales[..., :spec.tiles].roll(-1, dims=-1).clone()
    if mistake == "scale clamped":
        scales[..., :spec.tiles] = scales[..., :spec.tiles].clamp(127 - 64, 127 + 63)
    if mistake == "scale one":
        scales[..., :spec.tiles] = 127
    if mistake == "negative zero NaN":  # -0 (e4m3 0x80, e2m1 0x8) read as the NaN of e4m3fnuz's convention
        values = quantization.dequantize(pages, spec, block_size)
        element_codes = codes.long() if spec.element.bits == 8 else torch.stack([codes & 0xF, codes >> 4], -1).flatten(-2).long()
        negative_zero = element_codes == (0x80 if spec.element.bits == 8 else 0x8)
        quantized = values[:, :, 0, :spec.quantized_dims]
        quantized[negative_zero] = math.nan
        return values.to(torch.bfloat16)
    if mistake == "subnormals flushed" and spec.element is cache_layouts.E4M3:
        codes[(codes & 0x78) == 0] = 0
    if mistake == "halves flushed" and spec.element is cache_layouts.E2M1:  # e2m1's one subnormal, 0.5
        low, high = codes & 0xF, codes >> 4
        codes.copy_(torch.where(low & 0x7 == 1, 0, low) | (torch.where(high & 0x7 == 1, 0, high) << 4))
    if mistake != "rope":
        return quantization.dequantize(pages, spec, block_size).to(torch.bfloat16)
    values = quantization.dequantize(pages, spec, block_size)
    data = pages[:, :block_size * spec.data_bytes].view(num_blocks, block_size, spec.data_bytes)
    values[:, :, 0, spec.quantized_dims:] = quantization.decode(data[..., -2 * spec.rope_dims:-spec.rope_dims].long(),
                                                                cache_layouts.E4M3)
    return values.to(torch.bfloat16)


def _misdecoded(name: str, how: str, doc: str):
    """A mutant that decodes its quantized cache `how` (`_decoded_as`) and is otherwise the reference."""
    def mutant(q, k, v, *, cache_layout, **kw):
        cache = _decoded_as(k, cache_layout, how)
        return reference(q, cache, cache, **kw)

    mutant.__name__ = mutant.__qualname__ = name
    mutant.__doc__ = doc
    return _bug(mutant)


fp8_scale_of_the_next_tile = _misdecoded("fp8_scale_of_the_next_tile", "scale of the next tile",
                                         "Tile i's elements times tile i+1's scale.")
rope_read_as_fp8 = _misdecoded("rope_read_as_fp8", "rope", "The bf16 rope dims' bytes read as FP8 like the rest.")
fp8_subnormals_flushed = _misdecoded("fp8_subnormals_flushed", "subnormals flushed",
                                     "e4m3 subnormal codes (exponent bits 0) decoded as 0.")
fp4_halves_flushed = _misdecoded("fp4_halves_flushed", "halves flushed", "e2m1's subnormal code (0.5) decoded as 0.")
scale_exponent_clamped = _misdecoded("scale_exponent_clamped", "scale clamped",
                                     "ue8m0 tile scales clamped to 2^-64 .. 2^63 (an exponent kept in a signed byte).")
kv_scale_ignored = _misdecoded("kv_scale_ignored", "scale one", "A quantized cache's tile scales read as 1.")
negative_zero_read_as_nan = _misdecoded(
    "negative_zero_read_as_nan", "negative zero NaN",
    "Negative zero (e4m3 0x80, e2m1 0x8) read as NaN, the code e4m3fnuz gives NaN: the encoder never writes it, a "
    "cache from another quantizer does.")


@_bug
def table_rows_assumed_packed(q, k, v, *, block_table, **kw):
    """The block table's rows read max_blocks apart: a table that is a slice of a wider one is
    read at the wrong rows."""
    packed = block_table.as_strided(block_table.shape, (block_table.shape[1], 1), block_table.storage_offset())
    return reference(q, k, v, block_table=packed.clone(), **kw)


@_bug
def queries_assumed_packed(q, k, v, *, cache_layout=None, **kw):
    """q's rows and heads read as packed: a strided q is read at the wrong places."""
    packed = q.as_strided(q.shape, torch.empty(q.shape).stride(), q.storage_offset()).clone()
    return reference(packed, k, v, cache_layout=cache_layout, **kw)


@_bug
def shared_page_read_once(q, k, v, *, block_table, kv_lens, **kw):
    """A page a request before it read is read again as a page nothing holds (a page cache that
    hands each page out once)."""
    table, bs = block_table.clone(), k.shape[1]
    used = {int(p) for b, n in enumerate(kv_lens.tolist()) for p in block_table[b, :-(-n // bs)].tolist()}
    spare = next((p for p in range(k.shape[0]) if p not in used), None)
    seen = set()
    for b, n in enumerate(kv_lens.tolist()):
        for i in range(-(-n // bs)):
            page = int(table[b, i])
            if page in seen and spare is not None:
                table[b, i] = spare
            seen.add(page)
    return reference(q, k, v, block_table=table, kv_lens=kv_lens, **kw)


@_bug
def full_last_page_read_empty(q, k, v, *, block_table, kv_lens, **kw):
    """A last page's length taken as kv_len % block_size: 0 for a request whose keys fill it, so
    its last page is read empty."""
    bs = k.shape[1]
    lens = torch.where((kv_lens > 0) & (kv_lens % bs == 0), kv_lens - bs, kv_lens).to(torch.int32)
    return reference(q, k, v, block_table=block_table, kv_lens=lens, **kw)


def group_as_power_of_two(q, k, v, *, cache_layout=None, **kw):
    """Query head h reads KV head h // g', g' the group rounded up to a power of two (a shift in
    place of a division): right only for groups 1, 2, 4, 8, 16.

    Every call, dense ones too: heads map alike whatever the keys' source."""
    group = q.shape[-2] // k.shape[2]
    if cache_layout is not None or kw.get("extra_k_cache") is not None or group & (group - 1) == 0:
        return reference(q, k, v, cache_layout=cache_layout, **kw)
    heads = (torch.arange(q.shape[-2]) // (1 << (group - 1).bit_length())).clamp(max=k.shape[2] - 1).to(k.device)
    k_heads = k.index_select(2, heads)
    return reference(q, k_heads, k_heads if v is k else v.index_select(2, heads), **kw)


@_bug
def masked_row_nan(q, k, v, *, out=None, **kw):
    """A row that sees no key while its request has keys (the mask's or the indices' doing, not
    a kv length of 0) divides 0 by 0."""
    o, lse = reference(q, k, v, **kw)
    sink = kw.get("sink")
    empty = torch.isneginf(lse) if sink is None else lse == sink.view(-1, 1)  # (B, Hq, T) or (Hq, total)
    rows = empty.any(-2 if lse.dim() == 3 else 0)  # (B, T) or (total,)
    if kw.get("kv_lens") is not None:  # not the rows of requests with no keys: no_keys_nan's
        lens, cu = kw["kv_lens"], kw.get("cu_seqlens_q")
        keys = torch.repeat_interleave(lens, torch.diff(cu)) if cu is not None else lens.view(-1, 1).expand(rows.shape)
        rows &= keys > 0
    o = o.clone()
    o[rows] = math.nan
    return (o if out is None else out.copy_(o)), lse


_plans = {}


@_bug
def plan_reused(q, k, v, **kw):
    """The call's plan (its block table, lengths and indices) kept by the shapes of its
    arguments: a second call of the same shapes runs the first call's plan on its own data."""
    metadata = ("block_table", "kv_lens", "cu_seqlens_q", "indices", "topk_len", "extra_indices", "extra_topk_len")
    key = tuple((name, tuple(t.shape)) for name, t in sorted({"q": q, "k": k, "v": v, **kw}.items())
                if isinstance(t, torch.Tensor))
    plan = _plans.setdefault(key, {name: kw[name].clone() for name in metadata if kw.get(name) is not None})
    return reference(q, k, v, **{**kw, **plan})


@_bug
def zero_query_request_shifts_rows(q, k, v, *, block_table, kv_lens, cu_seqlens_q, **kw):
    """Requests with no query rows dropped from the launch: the i-th request that has rows is
    computed with request i's keys (a decode launch whose program i is the i-th request)."""
    rows = torch.diff(cu_seqlens_q).tolist()
    keys_of = list(range(len(rows)))
    for i, b in enumerate(b for b, n in enumerate(rows) if n):
        keys_of[b] = i
    keys_of = torch.tensor(keys_of, device=block_table.device)
    return reference(q, k, v, block_table=block_table[keys_of], kv_lens=kv_lens[keys_of], cu_seqlens_q=cu_seqlens_q,
                     **kw)


@_bug
def window_one_too_wide(q, k, v, *, block_table, window, **kw):
    """The paged path's window admits w + 1 keys, the current one and w before it."""
    return reference(q, k, v, block_table=block_table, window=window + 1, **kw)


@_bug
def causal_from_the_first_key(q, k, v, *, block_table, kv_lens, causal, cu_seqlens_q=None, **kw):
    """A request's query rows aligned top-left, on its first keys (row i sees keys 0 .. i),
    not bottom-right on its own last keys."""
    if not causal:
        return reference(q, k, v, block_table=block_table, kv_lens=kv_lens, cu_seqlens_q=cu_seqlens_q, **kw)
    rows = torch.diff(cu_seqlens_q) if cu_seqlens_q is not None else torch.full_like(kv_lens, q.shape[1])
    return reference(q, k, v, block_table=block_table, kv_lens=torch.minimum(kv_lens, rows).to(torch.int32),
                     cu_seqlens_q=cu_seqlens_q, causal=causal, **kw)


def _first_of_each(indices: torch.Tensor) -> torch.Tensor:
    """Each row's indices with every repeat of an index (after its first) made -1."""
    ordered, order = indices.sort(dim=-1, stable=True)
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[..., 1:] = (ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)
    return torch.where(torch.zeros_like(repeat).scatter(-1, order, repeat), -1, indices)


@_bug
def repeated_index_counted_once(q, k, v, *, indices, extra_indices=None, **kw):
    """An index repeated within a row counted once (the row's slots deduplicated)."""
    extra = {} if extra_indices is None else dict(extra_indices=_first_of_each(extra_indices))
    return reference(q, k, v, indices=_first_of_each(indices), **extra, **kw)


@_bug
def last_slot_unread(q, k, v, *, indices, extra_k_cache=None, extra_indices=None, **kw):
    """The cache's last slot read as no key (a bound check of slot < slots - 1)."""
    def unread(idx, cache):
        return torch.where(idx == cache.shape[0] * cache.shape[1] - 1, -1, idx)

    extra = {} if extra_indices is None else dict(extra_k_cache=extra_k_cache,
                                                  extra_indices=unread(extra_indices, extra_k_cache))
    return reference(q, k, v, indices=unread(indices, k), **extra, **kw)


@_bug
def topk_len_zero_reads_all(q, k, v, *, indices, topk_len, extra_indices=None, extra_topk_len=None, **kw):
    """A topk_len of 0 read as no limit: the request's rows read every index."""
    def limit(lengths, idx):
        return None if lengths is None else torch.where(lengths == 0, idx.shape[-1], lengths).to(torch.int32)

    extra = {} if extra_indices is None else dict(extra_indices=extra_indices,
                                                  extra_topk_len=limit(extra_topk_len, extra_indices))
    return reference(q, k, v, indices=indices, topk_len=limit(topk_len, indices), **extra, **kw)


def softmax_without_the_row_max(q, k, v, **kw):
    """exp(logit) summed in float32 without subtracting the row's max first: a row whose sum
    passes float32's range (its lse above ln(FLT_MAX), about 88.7) is inf / inf = NaN.

    Every call, dense ones too: large logits overflow whatever the keys' source."""
    o, lse = reference(q, k, v, **kw)
    overflow = lse > math.log(torch.finfo(torch.float32).max)  # (B, Hq, T), or (Hq, total_q) ragged
    rows = overflow.transpose(1, 2) if lse.dim() == 3 else overflow.T
    return o.masked_fill_(rows[..., None], math.nan), lse  # in `out` when given


@_bug
def page_ids_in_16_bits(q, k, v, **kw):
    """Page ids held in 16 bits: in a cache of more than 2^16 pages, page p past them is read as page
    p - 2^16 (poison, or another request's keys).

    The block table's ids, and a sparse slot's page, taken modulo 2^16."""
    table, indices = kw.get("block_table"), kw.get("indices")
    if table is not None:
        kw["block_table"] = table % 2**16
    if indices is not None:
        block_size = k.shape[1]
        narrowed = (indices // block_size % 2**16) * block_size + indices % block_size
        kw["indices"] = torch.where(indices >= 0, narrowed, indices).to(torch.int32)
    return reference(q, k, v, **kw)


# mutant -> the name a failure prints, and the trap whose cases it must fail ("" where the laws alone prove it)
_NAMED = {
    one_table_row: ("one-table-row", "block-table-row-stride"),
    whole_last_page: ("whole-last-page", "last-partial-page"),
    contiguous_pages: ("contiguous-pages", "pages-assumed-contiguous"),
    power_of_two_pages: ("power-of-two-pages", "slots-as-powers-of-two"),
    batch_drops_last_key: ("batch-drops-last-key", "batch-drops-last-key"),
    no_keys_nan: ("no-keys-nan", "no-keys-nan"),
    minus_one_is_slot_0: ("minus-one-is-slot-0", "minus-one-is-slot-0"),
    minus_one_counts: ("minus-one-counts", "invalid-index-counted"),
    topk_len_ignored: ("topk-len-ignored", "topk-len-ignored"),
    last_index_dropped: ("last-index-dropped", "last-index-dropped"),
    sink_per_scope: ("sink-per-scope", "sink-per-scope"),
    fp8_scale_of_the_next_tile: ("fp8-scale-of-the-next-tile", "fp8-scale-wrong-tile"),
    rope_read_as_fp8: ("rope-read-as-fp8", "rope-read-as-fp8"),
    fp8_subnormals_flushed: ("fp8-subnormals-flushed", ""),
    fp4_halves_flushed: ("fp4-halves-flushed", ""),
    scale_exponent_clamped: ("scale-exponent-clamped", ""),
    negative_zero_read_as_nan: ("negative-zero-read-as-nan", ""),
    table_rows_assumed_packed: ("table-rows-assumed-packed", ""),
    queries_assumed_packed: ("queries-assumed-packed", ""),
    shared_page_read_once: ("shared-page-read-once", ""),
    full_last_page_read_empty: ("full-last-page-read-empty", ""),
    group_as_power_of_two: ("group-as-power-of-two", ""),
    masked_row_nan: ("masked-row-nan", ""),
    plan_reused: ("plan-reused", ""),
    zero_query_request_shifts_rows: ("zero-query-request-shifts-rows", "zero-query-request"),
    window_one_too_wide: ("window-one-too-wide", ""),
    causal_from_the_first_key: ("causal-from-the-first-key", ""),
    repeated_index_counted_once: ("repeated-index-counted-once", ""),
    last_slot_unread: ("last-slot-unread", ""),
    topk_len_zero_reads_all: ("topk-len-zero-reads-all", ""),
    softmax_without_the_row_max: ("softmax-without-the-row-max", "large-key-scales"),
    page_ids_in_16_bits: ("page-ids-in-16-bits", "page-ids-past-16-bits"),
}


def _entry(fn) -> KernelEntry:
    return KernelEntry(name=fn.__name__, fn=fn, capabilities=REFERENCE, default_devices=())


PAGED_MUTANTS = tuple(Mutant(name, trap, _one_line(fn.__doc__), functools.partial(_entry, fn),
                             twin=lambda: REFERENCE_ENTRY)
                      for fn, (name, trap) in _NAMED.items())


def proving(trap: str) -> tuple[Mutant, ...]:
    """The mutants of this module that trap `trap`'s cases must catch (the trap module's MUTANTS)."""
    return tuple(m for m in PAGED_MUTANTS if m.trap == trap)

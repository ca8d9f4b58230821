"""Bugs that shipped in public attention kernels (FlashInfer, FlashMLA, vLLM, SGLang,
FlashAttention, TensorRT-LLM, xformers, llama.cpp; 2024-2026), each put into the float64
reference kernel (fmha.oracles.reference_kernel), with the issue or pull request that reports it
(`Mutant.source`). The reference is right everywhere else, so a mutant's failures are its bug's
alone; each claims the reference's capabilities and promises, and its correct twin is the
reference. Run one like any kernel:

    pytest --pyargs fmha.properties --fmha-kernel mutant:empty-row-lse-plus-inf

A bug that lives in a kernel's tiling is written as what it does to the answer, with the tile
size of the kernel that shipped it (64 keys, 16 query rows, 512-key splits).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from fmha.contract import KernelEntry, check_attention_args
from fmha.contract.cache_layouts import LAYOUTS
from fmha.oracles import oracle
from fmha.oracles.reference_kernel import CAPABILITIES as REFERENCE, ENTRY as REFERENCE_ENTRY, reference
from fmha.regressions.mutation import Mutant
from fmha.regressions.paged_mutants import kv_scale_ignored

# FlashInfer's -inf before 2026 (math::inf = 5e4, in base 2): the natural-log value a row gets.
SENTINEL = 5e4 * math.log(2)
TILE, ROW_TILE, SPLIT = 64, 16, 512


@dataclass
class Request:
    """One request of a call as the oracle gathers it: its rows and keys, what each row sees,
    the sink; the rows' place in the call's output (`first_row`)."""

    b: int
    q: torch.Tensor  # (T, Hq, D)
    keys: torch.Tensor  # (1 or T, N, Hkv, D): one key set for the rows, or one per row (sparse)
    values: torch.Tensor
    visible: torch.Tensor  # (T, N)
    sink: torch.Tensor | None  # (Hq,), or (T, Hq) a sink per row
    scale: float
    first_row: int  # the request's first row in the call's (B * T or packed) rows
    rows_per_request: int  # the call's T (ragged: the longest request's)
    source: str  # "dense", "paged" or "sparse"
    block_size: int | None  # a paged or sparse cache's

    def logits(self) -> torch.Tensor:
        """(Hq, T, N) float64, -inf where not visible."""
        keys = self.keys.double().repeat_interleave(self.q.shape[1] // self.keys.shape[2], dim=2)
        pattern = "thd,nhd->htn" if self.keys.shape[0] == 1 else "thd,tnhd->htn"
        scores = torch.einsum(pattern, self.q.double(), keys[0] if self.keys.shape[0] == 1 else keys) * self.scale
        return scores.masked_fill(~self.visible[None], -math.inf)


def _answer(r: Request):
    """o (T, Hq, Dv) and lse (Hq, T) of a request, in float64."""
    if r.sink is None or r.sink.dim() == 1:
        return oracle.attend(r.q, r.keys, r.values, r.visible, r.scale, r.sink)
    rows = [oracle.attend(r.q[t:t + 1], r.keys[t:t + 1] if r.keys.shape[0] > 1 else r.keys,
                          r.values[t:t + 1] if r.values.shape[0] > 1 else r.values, r.visible[t:t + 1], r.scale,
                          r.sink[t]) for t in range(r.q.shape[0])]
    return torch.cat([o for o, _ in rows]), torch.cat([lse for _, lse in rows], dim=1)


def by_request(edit=None, finish=None):
    """A contract kernel: the reference, request by request, with `edit(request)` changing what a
    request's rows see before the softmax and `finish(request, o, lse)` what they get after it
    (float64; returning (o, lse))."""

    def kernel(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, **source_args):
        check_attention_args(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
                             capabilities=REFERENCE, **source_args)
        cu = source_args.get("cu_seqlens_q")
        sources = oracle.from_call(k, v, **source_args)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        requests = oracle._requests(q, cu)
        source = ("paged" if source_args.get("block_table") is not None else
                  "sparse" if source_args.get("indices") is not None else "dense")
        block_size = k.shape[1] if source != "dense" else None
        starts = cu.tolist()[:-1] if cu is not None else [b * q.shape[1] for b in range(q.shape[0])]
        longest = max((r.shape[0] for r in requests), default=0)
        outputs = []
        for b, q_b in enumerate(requests):
            keys, values, visible = oracle._gather(sources, b, q_b, causal, window)
            request = Request(b, q_b, keys, values, visible, sink, scale, starts[b], longest, source, block_size)
            if edit is not None:
                request = edit(request)
            o, lse = _answer(request)
            if finish is not None:
                o, lse = finish(request, o, lse)
            outputs.append((o, lse))
        ragged = cu is not None
        o = oracle._stack([o for o, _ in outputs], ragged, 0).to(q.dtype)
        lse = oracle._stack([lse for _, lse in outputs], ragged, 1).float()
        if out is not None:
            out.copy_(o)
            o = out
        return o, lse

    return kernel


def _rows_without_keys(r: Request) -> torch.Tensor:
    return ~r.visible.any(-1)  # (T,)


def _where_rows(rows: torch.Tensor, o, lse, o_value=None, lse_value=None):
    """o and lse with `rows` (T,) set to the values given."""
    if o_value is not None:
        o = torch.where(rows[:, None, None], torch.full_like(o, o_value), o)
    if lse_value is not None:
        lse = torch.where(rows[None, :], torch.full_like(lse, lse_value), lse)
    return o, lse


# -- LSE and empty rows -------------------------------------------------------------------------

def _sentinel_drops_rows(r: Request, o, lse):
    """Rows whose every visible logit is below the finite -inf: never raise the running max,
    so every weight underflows: o = 0 and the sentinel for an LSE."""
    top = r.logits().amax(-1) if r.visible.shape[-1] else torch.full_like(lse, -math.inf)  # (Hq, T)
    drowned = (top < -SENTINEL) & torch.isfinite(top)
    o = torch.where(drowned.T[..., None], torch.zeros_like(o), o)
    return o, torch.where(drowned, torch.full_like(lse, -SENTINEL), lse)


def _empty_rows_lse(value: float):
    def finish(r: Request, o, lse):
        if r.sink is not None:
            return o, lse
        return _where_rows(_rows_without_keys(r), o, lse, lse_value=value)
    return finish


def _leading_empty_rows_nan(r: Request, o, lse):
    """Rows with a sink and no visible key in the batch's first 16-row query tile: NaN."""
    if r.sink is None:
        return o, lse
    leading = (r.first_row + torch.arange(r.q.shape[0])) < ROW_TILE
    return _where_rows(_rows_without_keys(r) & leading, o, lse, o_value=math.nan)


def _sink_outside_the_max(r: Request, o, lse):
    """The sink joins the denominator as exp(sink - m), m the logits' max alone: a row with no
    key gets exp(+inf) (NaN), a sink 89 above every logit overflows fp32 (inf)."""
    if r.sink is None:
        return o, lse
    top = r.logits().amax(-1) if r.visible.shape[-1] else torch.full_like(lse, -math.inf)
    empty = ~torch.isfinite(top)
    overflow = (r.sink.double()[:, None] - top) > math.log(torch.finfo(torch.float32).max)
    o = torch.where(overflow.T[..., None] & ~empty.T[..., None], torch.zeros_like(o), o)
    lse = torch.where(empty, torch.full_like(lse, math.nan), torch.where(overflow, math.inf, lse))
    return o, lse


def _sink_index_per_row(r: Request) -> Request:
    """The sink of head h read at ((b * Hq + h) * T + t) % Hq, right only for one query row."""
    if r.sink is None or r.rows_per_request < 2:
        return r
    T, Hq = r.q.shape[0], r.q.shape[1]
    t = torch.arange(T)[:, None]
    h = torch.arange(Hq)[None, :]
    index = ((r.b * Hq + h) * r.rows_per_request + t) % Hq
    return Request(**{**r.__dict__, "sink": r.sink[index]})


def _leading_tile_nan(r: Request, o, lse):
    """The online softmax starts from -inf: a row whose first 64 keys it visits are all
    invisible computes exp(-inf - (-inf)) = NaN, even with visible keys after them."""
    first = r.visible[:, :TILE]
    later = r.visible[:, TILE:]
    bad = ~first.any(-1) & later.any(-1)
    return _where_rows(bad, o, lse, o_value=math.nan, lse_value=math.nan)


def _visible_rows_count(r: Request) -> int:
    return int(r.visible.shape[-1])


def _empty_splits(r: Request, o, lse):
    """Keys in 8 splits of ceil(n / 8): the splits past the last key are empty and their
    (0, lse 0) partials are merged in: each adds exp(0) to the denominator."""
    n = _visible_rows_count(r)
    if n == 0:
        return o, lse
    chunk = -(-n // 8)
    empty = 8 - -(-n // chunk)
    if empty == 0:
        return o, lse
    wider = torch.logaddexp(lse, torch.full_like(lse, math.log(empty)))
    return o * torch.exp(lse - wider).T[..., None], wider


def _lse_of_the_last_split(r: Request, o, lse):
    """Over 512 keys: the LSE written is the last 512-key split's, not the merged one."""
    n = _visible_rows_count(r)
    if n <= SPLIT or r.keys.shape[0] != 1:
        return o, lse
    start = (n - 1) // SPLIT * SPLIT
    logits = r.logits()[..., start:]
    return o, torch.logsumexp(logits, dim=-1)


def _fp16_accumulator(r: Request, o, lse):
    """fp16 calls: the unnormalised sum of exp(s - m) v held in fp16: past 65504 it is inf."""
    if r.q.dtype != torch.float16 or not r.visible.shape[-1]:
        return o, lse
    top = r.logits().amax(-1)  # (Hq, T)
    scale = torch.exp(torch.where(torch.isfinite(top), lse - top, 0.0)).T[..., None]  # the unnormalised sum's size
    overflow = (o * scale).abs() > torch.finfo(torch.float16).max
    return torch.where(overflow, math.inf * torch.sign(o), o), lse


# -- visibility ---------------------------------------------------------------------------------

def _positions(r: Request) -> torch.Tensor:
    n = r.visible.shape[-1]
    return n - r.q.shape[0] + torch.arange(r.q.shape[0])


def _window_at_tile_granularity(window: int):
    def edit(r: Request) -> Request:
        """The window's left edge enforced per 64-key tile from the 16-row query tile's first row."""
        if r.keys.shape[0] != 1:
            return r
        positions = _positions(r)
        first_of_tile = positions[torch.arange(len(positions)) // ROW_TILE * ROW_TILE]
        edge = torch.div(first_of_tile - window + 1, TILE, rounding_mode="floor") * TILE
        j = torch.arange(r.visible.shape[-1])
        visible = (j[None, :] <= positions[:, None]) & (j[None, :] >= edge[:, None])
        return Request(**{**r.__dict__, "visible": visible})
    return edit


def _values_of_tile_half(r: Request) -> Request:
    """Pages under 64 tokens: V for keys 32-63 of each 64-key tile read from keys 0-31's pages."""
    if r.source != "paged" or r.block_size >= TILE:
        return r
    j = torch.arange(r.values.shape[1])
    source = torch.where(j % TILE >= TILE // 2, j - TILE // 2, j)
    return Request(**{**r.__dict__, "values": r.values[:, source]})


def _invisible_values_weighted(r: Request, o, lse):
    """Keys no row sees are given a weight of 0, not dropped: their values' NaN becomes the rows'."""
    unseen = ~r.visible.any(0)
    if r.values.shape[0] == 1 and bool(unseen.any()) and not bool(torch.isfinite(r.values[0][unseen]).all()):
        return torch.full_like(o, math.nan), lse
    return o, lse


# -- argument transforms --------------------------------------------------------------------------

def through(transform):
    """The reference on the call's arguments as `transform(args)` changes them (the bug's view of the
    call), the arguments' checks the reference's own."""
    def kernel(q, k, v, **kwargs):
        args = transform(dict(q=q, k=k, v=v, **kwargs))
        return reference(args.pop("q"), args.pop("k"), args.pop("v"), **args)
    return kernel


def _window_one_short(args):
    if args.get("window") is not None and args["window"] > 1:
        args["window"] -= 1
    return args


def _causal_dropped(args):
    if args.get("cu_seqlens_q") is not None:
        args.update(causal=False, window=None)
    return args


def _round_up_lengths(args):
    """Not causal: each request's keys read up to a multiple of 64 (the kernel's last tile, unmasked)."""
    if args.get("block_table") is not None and not args.get("causal") and args.get("window") is None:
        capacity = args["block_table"].shape[1] * args["k"].shape[1]
        args["kv_lens"] = ((args["kv_lens"] + TILE - 1) // TILE * TILE).clamp(max=capacity).to(torch.int32)
    return args


def _stale_pages_past_64(args):
    """Pages under 64 tokens: the table is converted 64 pages per 4096 tokens, so a request's
    pages past that hold what the table held before (its first page)."""
    table, bs = args.get("block_table"), args["k"].shape[1]
    if table is None or bs >= TILE:
        return args
    written = TILE * -(-args["kv_lens"].long() // 4096).clamp(min=1)  # pages converted, per request
    column = torch.arange(table.shape[1], device=table.device)[None, :]
    args["block_table"] = torch.where(column < written[:, None], table, table[:, :1]).contiguous()
    return args


def _full_last_page_reads_next(args):
    """A request whose keys fill its last page exactly gets one page more: the next table entry's."""
    table, bs = args.get("block_table"), args["k"].shape[1]
    if table is None:
        return args
    lens = args["kv_lens"]
    exact = (lens > 0) & (lens % bs == 0) & (lens + bs <= table.shape[1] * bs)
    args["kv_lens"] = torch.where(exact, lens + bs, lens).to(torch.int32)
    return args


def _sink_dropped_for_quantized(args):
    if args.get("cache_layout") is not None:
        args["sink"] = None
    return args


def _cache_stride_ignored(args):
    """The caches' page (and token) strides taken as packed: a cache that is a view into a wider
    per-page buffer is read at the wrong places."""
    for name, layout_name in (("k", "cache_layout"), ("v", None), ("extra_k_cache", "extra_cache_layout")):
        cache = args.get(name)
        if cache is None or cache.dim() != 4 or (name == "v" and cache is args["k"]) or (
                args.get("block_table") is None and args.get("indices") is None):
            continue
        layout = args.get(layout_name) if layout_name else None
        if layout is not None:
            nb, bs = cache.shape[:2]
            strides = (LAYOUTS[layout].page_bytes(bs), cache.stride(1), cache.stride(2), 1)
        else:
            strides = torch.empty(cache.shape).stride()
        args[name] = cache.as_strided(cache.shape, strides, cache.storage_offset())
        if name == "k" and args.get("v") is cache:
            args["v"] = args[name]
    return args


def _lse_transposed(kernel):
    """The LSE written (rows, heads) and read as (heads, rows)."""
    def transposed(q, k, v, **kwargs):
        o, lse = kernel(q, k, v, **kwargs)
        if lse.dim() == 2:  # ragged (Hq, total_q)
            return o, lse.T.contiguous().view(lse.shape)
        return o, lse.transpose(1, 2).contiguous().view(lse.shape)
    return transposed


def _out_head_major(q, k, v, *, out=None, **kwargs):
    """out= written in (B, Hq, T, Dv) order: rows scrambled where T > 1 and Hq > 1."""
    o, lse = reference(q, k, v, **kwargs)
    if out is None or o.dim() != 4:
        return (o if out is None else out.copy_(o)), lse
    out.copy_(o.permute(0, 2, 1, 3).contiguous().view(out.shape))
    return out, lse


def _out_assumed_packed(q, k, v, *, out=None, **kwargs):
    """out= written at the offsets of a packed tensor of its shape: its strides ignored."""
    o, lse = reference(q, k, v, **kwargs)
    if out is None:
        return o, lse
    out.as_strided(out.shape, torch.empty(out.shape, device="meta").stride()).copy_(o)
    return out, lse


def _out_unwritten_for_empty_requests(q, k, v, *, out=None, **kwargs):
    """Requests with no keys: their rows of out= are never written."""
    o, lse = reference(q, k, v, **kwargs)
    lens = kwargs.get("kv_lens")
    if out is None or lens is None:
        return (o if out is None else out.copy_(o)), lse
    cu = kwargs.get("cu_seqlens_q")
    bounds = cu.tolist() if cu is not None else [b * q.shape[1] for b in range(q.shape[0] + 1)]
    flat_o, flat_out = o.reshape(-1, *o.shape[-2:]), out.view(-1, *out.shape[-2:])
    for b, n in enumerate(lens.tolist()):
        if n:
            flat_out[bounds[b]:bounds[b + 1]] = flat_o[bounds[b]:bounds[b + 1]]
    return out, lse


def _entry(name: str, fn) -> KernelEntry:
    return KernelEntry(name=name, fn=fn, capabilities=REFERENCE, default_devices=())


def _shipped(name: str, bug: str, fn, source: str, trap: str = "") -> Mutant:
    return Mutant(name, trap, bug, functools.partial(_entry, name, fn), twin=lambda: REFERENCE_ENTRY, source=source)


SHIPPED_MUTANTS = (
    _shipped("neg-inf-sentinel-drops-rows", "a finite -inf (-5e4 in base 2) as the running max's start: a row whose "
             "every logit is below it gets o = 0 and the sentinel for an LSE", by_request(finish=_sentinel_drops_rows),
             "https://github.com/flashinfer-ai/flashinfer/issues/4267"),
    _shipped("empty-row-lse-finite", "a row with no visible key gets a finite LSE (the -inf sentinel) instead of "
             "-inf", by_request(finish=_empty_rows_lse(-SENTINEL)),
             "https://github.com/flashinfer-ai/flashinfer/issues/4452"),
    _shipped("empty-row-lse-plus-inf", "a row with no visible key gets lse = +inf instead of -inf",
             by_request(finish=_empty_rows_lse(math.inf)), "https://github.com/Dao-AILab/flash-attention/pull/978"),
    _shipped("v-tile-reads-wrong-page", "pages under 64 tokens: V for keys 32-63 of every 64-key tile read from the "
             "pages of keys 0-31 (K right)", by_request(edit=_values_of_tile_half),
             "https://github.com/flashinfer-ai/flashinfer/pull/3022"),
    _shipped("cache-page-stride-ignored", "a cache's page stride taken as block_size x its token stride: a cache "
             "that is a view into wider pages is read at the wrong places", through(_cache_stride_ignored),
             "https://github.com/flashinfer-ai/flashinfer/issues/3856"),
    _shipped("window-one-key-short", "the window keeps w - 1 keys (a radius stored where a width was meant)",
             through(_window_one_short), "https://github.com/sgl-project/sglang/pull/32087"),
    _shipped("window-at-tile-granularity", "the window's left edge enforced per 64-key tile from the query tile's "
             "first row, not per key", lambda q, k, v, window=None, **kw: (
                 by_request(edit=_window_at_tile_granularity(window))(q, k, v, window=window, **kw) if window
                 else reference(q, k, v, window=window, **kw)), "https://github.com/sgl-project/sglang/pull/31501"),
    _shipped("causal-dropped-for-ragged", "packed (ragged) queries lose the causal mask", through(_causal_dropped),
             "https://github.com/facebookresearch/xformers/issues/1185"),
    _shipped("fp16-output-accumulator-overflow", "fp16 calls hold the unnormalised sum of exp(s - m) v in fp16: "
             "past 65504 it is inf", by_request(finish=_fp16_accumulator),
             "https://github.com/ggml-org/llama.cpp/pull/13975"),
    _shipped("masked-leading-tile-nan", "a row whose first 64 keys are all invisible computes exp(-inf - -inf) = "
             "NaN, visible keys after them or not", by_request(finish=_leading_tile_nan),
             "https://github.com/ggml-org/llama.cpp/pull/12776"),
    _shipped("leading-empty-rows-nan", "rows with a sink and no visible key in the first 16-row query tile of the "
             "batch come out NaN (elsewhere 0)", by_request(finish=_leading_empty_rows_nan),
             "https://github.com/ikawrakow/ik_llama.cpp/issues/2344"),
    _shipped("noncausal-tail-tile-unmasked", "calls without a mask read each request's keys up to a multiple of 64: "
             "the slots past its kv length enter the softmax", through(_round_up_lengths),
             "https://github.com/flashinfer-ai/flashinfer/issues/3716"),
    _shipped("pages-past-64-stale", "pages under 64 tokens: the table is converted 64 pages per 4096 tokens, so a "
             "request's pages past its 64th are stale (its first page)", through(_stale_pages_past_64),
             "https://github.com/sgl-project/sglang/pull/11985"),
    _shipped("full-last-page-reads-next", "a request whose keys fill its last page exactly reads one page more: the "
             "table's next entry", through(_full_last_page_reads_next),
             "https://github.com/pegainfer-project/pegainfer/issues/291"),
    _shipped("empty-splits-count-one", "keys in 8 splits of ceil(n / 8): the empty splits' (0, lse 0) partials "
             "each add exp(0) to the denominator", by_request(finish=_empty_splits),
             "https://github.com/sgl-project/sglang/pull/2479"),
    _shipped("lse-of-the-last-split", "over 512 keys the LSE written is the last 512-key split's, not the merged "
             "one (o right)", by_request(finish=_lse_of_the_last_split),
             "https://github.com/flashinfer-ai/flashinfer/pull/58"),
    _shipped("sink-outside-the-running-max", "the sink joins as exp(sink - m), m the logits' max alone: NaN for a "
             "row with no key, inf for a sink 89 above the logits", by_request(finish=_sink_outside_the_max),
             "https://github.com/flashinfer-ai/flashinfer/pull/5119"),
    _shipped("sink-index-per-row", "the sink of head h read at ((b * Hq + h) * T + t) % Hq: right for one query row "
             "only", by_request(edit=_sink_index_per_row), "https://github.com/modular/modular/pull/6591"),
    _shipped("sink-dropped-for-quantized-caches", "calls over an FP8 or FP4 cache ignore the sink",
             through(_sink_dropped_for_quantized), "https://github.com/kekzl/imp/issues/1345"),
    _shipped("lse-transposed", "the LSE written (rows, heads) and read as (heads, rows)", _lse_transposed(reference),
             "https://github.com/vllm-project/vllm/pull/57012"),
    _shipped("out-written-head-major", "out= written in (B, Hq, T, Dv) order: rows scrambled where T > 1 and Hq > 1",
             _out_head_major, "https://github.com/flagos-ai/FlagGems/issues/5235"),
    _shipped("out-assumed-packed", "out= written at a packed tensor's offsets, its row strides ignored",
             _out_assumed_packed, "https://github.com/Dao-AILab/flash-attention/pull/2666"),
    _shipped("out-unwritten-for-empty-requests", "a request with no keys: its rows of out= are never written",
             _out_unwritten_for_empty_requests, "https://github.com/flashinfer-ai/flashinfer/issues/2409"),
    _shipped("kv-scale-ignored", "a quantized cache's tile scales read as 1", kv_scale_ignored,
             "https://github.com/NVIDIA/TensorRT-LLM/pull/16916"),
    _shipped("invisible-values-weighted", "keys no row of a request sees (left of every window) are weighted 0, not "
             "skipped: 0 * NaN", by_request(finish=_invisible_values_weighted),
             "https://github.com/vllm-project/vllm/pull/30887"),
)

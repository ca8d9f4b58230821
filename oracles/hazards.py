"""The hazard table: one record per freedom the contract gives a caller, with the hostile value
every draw gives it (docs/contract.md, "Hazards", is generated from these records).

A kernel that is right on gentle inputs and wrong on an input the contract allows has a bug the
suite must find on every run, not when the dice fall right. So a hostile draw carries every
hazard its kernel's capabilities allow, at once (properties/paged_strategies.py,
properties/covering.py). Each record says

- what the contract lets a caller do (`freedom`) and the hostile value drawn for it (`hostile`);
- which calls it applies to (`applies(problem)`) and the capability under which a kernel does
  not get it (`opt_out`, a `Capabilities` field that, False, keeps it out of the kernel's draws);
- how it is laid in: `poison` in every paged and sparse sample (fmha.oracles.paged_inputs);
  `layout` hazards by `Sample.inputs` when named in `Sample.hazards`
  (fmha.oracles.paged_inputs), `draw` hazards by the strategy's choice of lengths and indices,
  `magnitude` hazards by a distribution in draws of their own, `sequence` hazards by a law that
  calls the kernel more than once, `call` hazards by every call (fmha.oracles.kernel_call);
- how its presence is counted: from the bytes the kernel is handed (`present(inputs)`), never
  from the strategy's flags;
- how a failing draw is rerun without it (`remove(sample)`), to name the hazard a failure
  needs (delta debugging);
- the mutant in fmha.regressions that only this hazard exposes.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from fmha.contract.arguments import ARGUMENTS
from fmha.contract.cache_layouts import LAYOUTS
from fmha.contract.slots import request_slots
from fmha.oracles.storage import observed

if TYPE_CHECKING:
    from fmha.contract import Problem
    from fmha.oracles.inputs import Inputs
    from fmha.oracles.sample import Sample

KINDS = ("poison", "layout", "draw", "magnitude", "sequence", "call")
TILE = 64  # the longest key tile of the kernels we know (FlashMLA's, fmha's sparse kernels'): runs of -1 as long


@dataclass(frozen=True)
class Hazard:
    name: str
    freedom: str  # what the contract lets a caller do
    hostile: str  # the value every hostile draw gives it
    kind: str  # among KINDS
    applies: Callable[[Problem], bool]  # to which calls
    present: Callable[[Inputs], bool]  # counted from what the kernel is handed
    remove: Callable[[Sample], Sample] | None  # the same sample without it (None: every sample has it)
    mutant: str  # the mutant only this hazard exposes (fmha.regressions.mutants)
    opt_out: str = ""  # the Capabilities field that, False, keeps it out of a kernel's draws
    exercised_by: str = ""  # a sequence hazard's law; a call hazard's function
    # A storage hazard's form: the call's arguments it lays out and the freedoms of their record
    # (fmha.contract.arguments) that make it, "+"-joined; laid out by fmha.oracles.storage.lay_out.
    form: tuple[tuple[str, ...], str] = ((), "")

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"hazard {self.name}: kind among {KINDS}, got {self.kind!r}")


# -- what the kernel is handed ---------------------------------------------------------------

def _paged(x: Inputs) -> bool:
    return x.problem.source == "paged"


def _sparse(x: Inputs) -> bool:
    return x.problem.source == "sparse"


def _request_rows(x: Inputs) -> list[int]:
    cu = x.source_args.get("cu_seqlens_q")
    if cu is None:
        return [x.q.shape[1]] * x.q.shape[0]
    return torch.diff(cu).tolist()


def _caches(x: Inputs) -> list[tuple[torch.Tensor, str | None]]:
    """(cache, its layout) of every scope the call names."""
    found = [(x.k, x.source_args.get("cache_layout"))]
    if x.v is not x.k:
        found.append((x.v, None))
    if "extra_k_cache" in x.source_args:
        found.append((x.source_args["extra_k_cache"], x.source_args.get("extra_cache_layout")))
    return found


def _read_slots(x: Inputs) -> list[tuple[torch.Tensor, torch.Tensor, str | None]]:
    """Per scope: (cache, flat slots the call reads, layout); none for dense keys."""
    args = x.source_args
    if x.problem.source == "dense":
        return []
    if _paged(x):  # the keys some row sees
        table, lens, bs = args["block_table"].cpu(), args["kv_lens"].cpu().tolist(), x.k.shape[1]
        slots = [request_slots(table[b], n, bs)[invisible_keys(rows, n, x.problem.window):]
                 for b, (rows, n) in enumerate(zip(_request_rows(x), lens))]
        return [(x.k, torch.cat(slots) if slots else torch.zeros(0, dtype=torch.long), args.get("cache_layout"))]
    found = []
    for prefix, cache in (("", x.k), ("extra_", args.get("extra_k_cache"))):
        if cache is None:
            continue
        indices, lengths = args[f"{prefix}indices"].cpu().long(), args.get(f"{prefix}topk_len")
        read = indices >= 0
        if lengths is not None:
            read &= torch.arange(indices.shape[-1]) < lengths.cpu().view(-1, 1, 1)
        found.append((cache, indices[read], args.get(f"{prefix}cache_layout")))
    return found


def _invisible_keys_poisoned(x: Inputs) -> bool:
    """A key of a request that none of its rows can see holds NaN (a quantized cache: a NaN scale)."""
    p = x.problem
    if p.source == "dense":
        hidden = invisible_keys(p.q_len, p.kv_len, p.window)
        return bool(hidden) and bool(torch.isnan(x.k[:, :hidden]).any() and torch.isnan(x.v[:, :hidden]).any())
    if not _paged(x):
        return False
    args, bs = x.source_args, x.k.shape[1]
    table, lens = args["block_table"].cpu(), args["kv_lens"].cpu().tolist()
    layout = args.get("cache_layout")
    for b, (rows, n) in enumerate(zip(_request_rows(x), lens)):
        hidden = invisible_keys(rows, n, x.problem.window)
        if not hidden:
            continue
        if bool(_poisoned(x.k, layout, request_slots(table[b], hidden, bs)).any()):
            return True
    return False


def _poisoned(cache: torch.Tensor, layout: str | None, slots: torch.Tensor) -> torch.Tensor:
    """Per slot of `slots`: whether it holds poison (NaN; a quantized token: a NaN scale)."""
    if layout:
        return (_scale_codes(cache, LAYOUTS[layout])[slots] == 0xFF).any(-1)
    return torch.isnan(cache.flatten(0, 1)[slots.to(cache.device)].cpu()).flatten(1).any(-1)


def invisible_keys(rows: int, keys: int, window: int | None) -> int:
    """How many of a request's first keys none of its `rows` query rows can see: all of them
    without rows; left of the first row's window with one (bottom-right aligned, row i sits at
    keys - rows + i and sees the `window` keys up to it)."""
    if rows == 0:
        return keys
    if window is None:
        return 0
    return max(0, min(keys - rows - window + 1, keys))


def _wide_table(x: Inputs) -> bool:
    table = x.source_args.get("block_table")
    return table is not None and table.shape[0] > 1 and table.stride(0) > table.shape[1]


def _padded_pages(x: Inputs) -> bool:
    if x.problem.source == "dense":
        return False
    for cache, layout in _caches(x):
        if layout is None:  # a gap after pages or tokens, in whatever order the dims are laid
            if {"step:num_blocks", "step:block_size"} & observed(cache, ARGUMENTS["k cache"], size_one=True):
                return True
        elif cache.stride(0) > LAYOUTS[layout].page_bytes(cache.shape[1]):
            return True
    return False


def _strided_queries(x: Inputs) -> bool:
    return x.problem.source != "dense" and x.q.dim() >= 3 and x.q.shape[-2] > 1 and x.q.stride(-2) > x.q.shape[-1]


def _invalid_runs(x: Inputs) -> bool:
    """Some row of a scope starts with a run of -1 as long as a tile (or a third of a shorter
    row), with valid indices after it."""
    if not _sparse(x):
        return False
    indices = x.source_args["indices"].cpu()
    run = invalid_run(indices.shape[-1])
    if not run:
        return False
    head = (indices[..., :run] == -1).all(-1)
    after = (indices[..., run:] >= 0).any(-1)
    return bool((head & after).any())


def invalid_run(topk: int) -> int:
    """The length of a hostile run of -1 in a row of `topk` indices (0: the row is too short)."""
    return TILE if topk >= 3 * TILE else topk // 3


def _codes(x: Inputs) -> list[tuple[set[int], str]]:
    """Per quantized scope: the element codes its read tokens hold, and the layout."""
    found = []
    for cache, slots, layout in _read_slots(x):
        if layout is None or not slots.numel():
            continue
        spec = LAYOUTS[layout]
        data = _data_bytes(cache, spec)[slots.cpu()][..., :spec.quantized_dims * spec.element.bits // 8].long()
        codes = data.flatten() if spec.element.bits == 8 else torch.cat([(data & 0xF).flatten(), (data >> 4).flatten()])
        found.append((set(codes.unique().tolist()), layout))
    return found


def numeric_codes(layout: str) -> list[int]:
    """Every code of the layout's element format that stands for a number."""
    return [c for c, v in enumerate(LAYOUTS[layout].element.values) if not math.isnan(v)]


def _every_code(x: Inputs) -> bool:
    found = _codes(x)
    return bool(found) and all(set(numeric_codes(layout)) <= codes for codes, layout in found)


def _data_bytes(cache: torch.Tensor, spec) -> torch.Tensor:
    """(slots, data_bytes) of a quantized cache."""
    num_blocks, block_size = cache.shape[:2]
    pages = cache.as_strided((num_blocks, block_size * spec.token_bytes), (cache.stride(0), 1)).cpu()
    return pages[:, :block_size * spec.data_bytes].reshape(num_blocks * block_size, spec.data_bytes)


def _scale_codes(cache: torch.Tensor, spec) -> torch.Tensor:
    num_blocks, block_size = cache.shape[:2]
    pages = cache.as_strided((num_blocks, block_size * spec.token_bytes), (cache.stride(0), 1)).cpu()
    scales = pages[:, block_size * spec.data_bytes:block_size * spec.token_bytes]
    return scales.reshape(num_blocks * block_size, spec.scale_bytes)[:, :spec.tiles]


def _scales_at_both_ends(x: Inputs) -> bool:
    codes = set()
    for cache, slots, layout in _read_slots(x):
        if layout is not None and slots.numel():
            codes |= set(_scale_codes(cache, LAYOUTS[layout])[slots.cpu()].unique().tolist())
    return any(c <= 127 - 64 for c in codes) or any(c >= 127 + 64 for c in codes)


def _shared_pages(x: Inputs) -> bool:
    if not _paged(x):
        return False
    table, lens, bs = x.source_args["block_table"].cpu(), x.source_args["kv_lens"].cpu().tolist(), x.k.shape[1]
    pages = [set(table[b, :-(-n // bs)].tolist()) for b, n in enumerate(lens)]
    return any(pages[a] & pages[b] for a in range(len(pages)) for b in range(a + 1, len(pages)))


def _exact_and_partial_pages(x: Inputs) -> bool:
    if not _paged(x):
        return False
    bs, lens = x.k.shape[1], x.source_args["kv_lens"].tolist()
    return any(n and n % bs == 0 for n in lens) and any(n % bs for n in lens)


def _zero_query_requests(x: Inputs) -> bool:
    """A request with no query rows that has requests with rows after it."""
    rows = _request_rows(x) if x.source_args.get("cu_seqlens_q") is not None else []
    return any(n == 0 and any(rows[b + 1:]) for b, n in enumerate(rows))


def _rows_without_keys(x: Inputs) -> bool:
    """A query row that sees no key for a reason other than its request's kv length of 0: the
    causal mask (more rows than keys), or every index -1 or past topk_len in every scope."""
    if _paged(x):
        return any(n and 0 < keys < n for n, keys in zip(_request_rows(x), x.source_args["kv_lens"].tolist())) \
            and (x.problem.causal or x.problem.window is not None)
    if _sparse(x):
        return bool(x.problem.rows_without_keys)
    return False


def _repeated_indices(x: Inputs) -> bool:
    """A row that reads one key twice (both entries before its request's topk_len)."""
    if not _sparse(x):
        return False
    indices, lengths = x.source_args["indices"].cpu(), x.source_args.get("topk_len")
    if lengths is not None:  # entries past topk_len are not read: -1 for the comparison
        past = torch.arange(indices.shape[-1]) >= lengths.cpu().view(-1, 1, 1)
        indices = indices.masked_fill(past, -1)
    ordered = indices.sort(-1).values
    return bool(((ordered[..., 1:] == ordered[..., :-1]) & (ordered[..., 1:] >= 0)).any())


def _last_slot(x: Inputs) -> bool:
    for cache, slots, _ in _read_slots(x):
        if _sparse(x) and slots.numel() and int(slots.max()) == cache.shape[0] * cache.shape[1] - 1:
            return True
    return False


def _one_scope_empty(x: Inputs) -> bool:
    args = x.source_args
    if "extra_indices" not in args:
        return False
    lengths = [args.get(name) for name in ("topk_len", "extra_topk_len")]
    topk = [args["indices"].shape[-1], args["extra_indices"].shape[-1]]
    read = [(lengths[i].cpu() if lengths[i] is not None else torch.full((x.q.shape[0],), topk[i])) for i in (0, 1)]
    return bool((((read[0] == 0) & (read[1] > 0)) | ((read[1] == 0) & (read[0] > 0))).any())


def _odd_group(x: Inputs) -> bool:
    """An odd group over KV heads that differ (at stride 0 along them, every head is one)."""
    p = x.problem
    distinct = p.heads_kv > 1 and (x.k.stride(2) != 0 or x.v.stride(2) != 0)
    return p.heads_q != p.heads_kv and 16 % p.group != 0 and (distinct or p.heads_kv == 1)


def _distribution(name: str) -> Callable[[Inputs], bool]:
    return lambda x: x.sample.distribution == name


def _past_kv_len_poisoned(x: Inputs) -> bool:
    """A referenced page's slot past its request's kv length holds NaN (a NaN scale when quantized)."""
    if not _paged(x):
        return False
    args, bs = x.source_args, x.k.shape[1]
    table, lens = args["block_table"].cpu(), args["kv_lens"].cpu().tolist()
    layout = args.get("cache_layout")
    for b, n in enumerate(lens):
        if n % bs and bool(_poisoned(x.k, layout, table[b, n // bs] * bs + torch.arange(n % bs, bs)).all()):
            return True
    return False


def _table_tail_poisoned(x: Inputs) -> bool:
    """A block-table entry past a request's pages names a page no request reads."""
    if not _paged(x):
        return False
    table, lens, bs = x.source_args["block_table"].cpu(), x.source_args["kv_lens"].cpu().tolist(), x.k.shape[1]
    used = {int(page) for b, n in enumerate(lens) for page in table[b, :-(-n // bs)]}
    return any(int(page) not in used for b, n in enumerate(lens) for page in table[b, -(-n // bs):])


def _unread_slots_poisoned(x: Inputs) -> bool:
    """A sparse cache's slot no index reads holds NaN (NaN codes when quantized)."""
    for cache, slots, layout in _read_slots(x) if _sparse(x) else ():
        unread = torch.ones(cache.shape[0] * cache.shape[1], dtype=torch.bool)
        unread[slots] = False
        if unread.any():
            return bool(_poisoned(cache, layout, torch.nonzero(unread).flatten()).any())
    return False


# -- how a draw is rerun without one ----------------------------------------------------------

def _without(name: str) -> Callable[[Sample], Sample]:
    return lambda sample: sample.replace(hazards=tuple(h for h in sample.hazards if h != name))


def _storage_hazard(name: str, freedom: str, hostile: str, applies: Callable[[Problem], bool],
                    present: Callable[[Inputs], bool], mutant: str, arguments: tuple[str, ...], form: str) -> Hazard:
    """A hazard that is a storage form of `arguments` (freedoms of their record): removed, those
    arguments are packed, whatever other form the draw gave them (fmha.oracles.storage)."""
    def remove(sample: Sample) -> Sample:
        own = {f"{a}_storage": "contiguous" for a in arguments if a in ("q", "k", "v")}
        kept = tuple((a, f) for a, f in sample.storage if a not in arguments)
        return sample.replace(hazards=tuple(h for h in sample.hazards if h != name), storage=kept, **own)
    return Hazard(name, freedom, hostile, "layout", applies, present, remove, mutant, form=(arguments, form))


def _reset(**fields) -> Callable[[Sample], Sample]:
    return lambda sample: sample.replace(**fields)


def _no_zero_query_requests(sample: Sample) -> Sample:
    return sample.replace(q_lens=tuple(max(n, 1) for n in sample.q_lens)) if sample.q_lens else sample


def _keys_for_every_row(sample: Sample) -> Sample:
    """Each request with at least its rows' keys (paged), or no row without a valid index (sparse)."""
    p = sample.problem
    if p.source == "paged":
        rows = sample.q_lens or (p.q_len,) * p.batch
        lens = sample.kv_lens or (p.kv_len,) * p.batch
        return sample.replace(kv_lens=tuple(max(n, min(r, p.kv_len)) for n, r in zip(lens, rows)))
    return sample.replace(invalid=0.0, topk_lens=None, extra_topk_lens=None,
                          hazards=tuple(h for h in sample.hazards if h != "invalid-runs"))


def _partial_last_pages_only(sample: Sample) -> Sample:
    """Each request whose keys fill its last page exactly one key short of it."""
    p = sample.problem
    lens = sample.kv_lens or (p.kv_len,) * p.batch
    return sample.replace(kv_lens=tuple(n - 1 if n > 1 and n % p.block_size == 0 else n for n in lens))


def _even_group(sample: Sample) -> Sample:
    p = sample.problem
    return sample.replace(heads_q=p.heads_kv * 2 if p.heads_kv * 2 <= 64 else p.heads_kv)


def _quantized(p: Problem) -> bool:
    return bool(p.cache_layouts)


HAZARDS: dict[str, Hazard] = {h.name: h for h in (
    # -- unread bytes hold poison, in every paged and sparse draw --
    Hazard("poison-past-kv-len", "a request's last page only partly its", "the slots of a request's last page past "
           "its kv length hold NaN (a NaN scale in a quantized cache)", "poison", lambda p: p.source == "paged",
           _past_kv_len_poisoned, None, "whole-last-page"),
    Hazard("poison-past-the-pages", "block-table entries past a request's pages", "they name a page of NaN no request "
           "reads", "poison", lambda p: p.source == "paged", _table_tail_poisoned, None, "full-last-page-reads-next"),
    Hazard("poison-in-unread-slots", "cache slots no index names", "NaN (NaN codes in a quantized cache)", "poison",
           lambda p: p.source == "sparse", _unread_slots_poisoned, None, "minus-one-is-slot-0"),
    Hazard("invisible-keys", "a window over a request's (or a dense call's) keys; requests with no query rows",
           "every key of a "
           "request that none of its rows can see (left of every row's window; all of a request without rows) holds "
           "NaN (NaN codes in a quantized cache): a kernel that multiplies its value by a weight of 0 gets NaN",
           "layout", lambda p: (p.source == "paged" and (p.window is not None or p.empty_query_requests)) or (
               p.source == "dense" and invisible_keys(p.q_len, p.kv_len, p.window) > 0),
           _invisible_keys_poisoned, _without("invisible-keys"), "invisible-values-weighted"),
    _storage_hazard("wide-block-table", "block_table's row stride (only its last dim must be contiguous)", "every "
                    "other row of a taller table, the rows between naming a page of poison",
                    lambda p: p.source == "paged" and p.batch > 1, _wide_table, "table-rows-assumed-packed",
                    ("block_table",), "step:B"),
    _storage_hazard("padded-pages", "a cache's page and token strides", "every other page, and in it every other slot, "
                    "of a larger buffer, the pages and slots between holding poison (a quantized cache: one "
                    "more 576-byte unit of NaN codes a page)", lambda p: p.source != "dense", _padded_pages,
                    "cache-page-stride-ignored", ("k", "v", "extra_k_cache"), "step:num_blocks+step:block_size"),
    _storage_hazard("strided-queries", "q's head and row strides", "q a view with a poisoned head between every "
                    "two of its heads", lambda p: p.source != "dense" and p.heads_q > 1, _strided_queries,
                    "queries-assumed-packed", ("q",), "step:Hq"),
    Hazard("invalid-runs", "-1 anywhere in a row of indices", "runs of -1 as long as a 64-key tile at the start, in "
           "the middle and at the end of rows, with valid indices after them", "layout",
           lambda p: p.source == "sparse" and invalid_run(p.kv_len) > 0, _invalid_runs, _without("invalid-runs"), "masked-leading-tile-nan"),
    Hazard("every-code", "any byte of a quantized cache's elements", "every code of the element format among the "
           "keys read: negative zero, every subnormal, the largest (the encoder alone never writes -0)", "layout",
           _quantized, _every_code, _without("every-code"), "negative-zero-read-as-nan"),
    # -- lengths, tables and indices --
    Hazard("exact-and-partial-pages", "each request's kv length", "one request whose keys fill their last page "
           "exactly and one whose last page is partial", "draw", lambda p: p.source == "paged" and p.batch > 1,
           _exact_and_partial_pages, _partial_last_pages_only, "full-last-page-read-empty"),
    Hazard("shared-pages", "pages shared between requests", "requests sharing a first page", "draw",
           lambda p: p.source == "paged" and p.batch > 1, _shared_pages, _reset(shared_pages=False),
           "shared-page-read-once"),
    Hazard("zero-query-requests", "requests with no query rows in a ragged batch", "such requests first, between "
           "decodes and last", "draw", lambda p: p.ragged and p.batch > 1, _zero_query_requests,
           _no_zero_query_requests, "zero-query-request-shifts-rows", opt_out="empty_query_requests"),
    Hazard("rows-without-keys", "rows that see no key", "rows with nothing visible for a reason other than a kv "
           "length of 0: causal rows before their request's first key, sparse rows whose every index is -1",
           "draw", lambda p: p.source != "dense" and (p.causal or p.source == "sparse"), _rows_without_keys,
           _keys_for_every_row, "masked-row-nan", opt_out="empty_rows"),
    Hazard("repeated-indices", "an index repeated within a row", "a quarter of each row's indices repeat another of "
           "its indices", "draw", lambda p: p.source == "sparse" and max(p.kv_len, p.extra_topk or 0) > 1,
           _repeated_indices, _reset(repeats=0.0),
           "repeated-index-counted-once"),
    Hazard("last-slot", "any slot of the cache", "a key in the cache's last slot (the last page's last offset)",
           "draw", lambda p: p.source == "sparse", _last_slot, _reset(last_slot=False), "last-slot-unread"),
    Hazard("one-scope-empty", "each scope's own topk_len", "a request that reads one scope not at all (topk_len 0) "
           "and the other", "draw", lambda p: p.extra_topk is not None, _one_scope_empty,
           _reset(topk_lens=None, extra_topk_lens=None), "topk-len-zero-reads-all"),
    Hazard("odd-gqa-group", "Hq / Hkv query heads a KV head", "a group that does not divide a 16-row tile "
           "(3, 5, 6, 7)", "draw", lambda p: p.heads_q != p.heads_kv, _odd_group, _even_group,
           "group-as-power-of-two"),
    # -- magnitudes at the format's edge, in draws of their own --
    Hazard("large-logits", "the logits' range", "|logit| ~ 1e3, past 88 (where fp32 exp overflows)", "magnitude",
           lambda p: True, _distribution("large_logits"), _reset(distribution="normal"),
           "softmax-without-the-row-max"),
    Hazard("negative-logits", "the logits' range", "every logit below -4e4 (every key turned away from every "
           "query), where a finite stand-in for -inf stops being below them", "magnitude", lambda p: True,
           _distribution("negative_logits"), _reset(distribution="normal"), "neg-inf-sentinel-drops-rows"),
    Hazard("large-values", "the values' range", "|v| up to 1e5 (1e4 in fp16), sums near fp16's 65504", "magnitude",
           lambda p: not p.cache_layouts, _distribution("large_v"), _reset(distribution="normal"),
           "fp16-output-accumulator-overflow"),
    Hazard("massive-activations", "the activations' shape", "outlier channels 20x the others in q and k, and a "
           "first token taking ~88% of every row's weight with many keys of small weight beside it (as language "
           "models' activations are)", "magnitude", lambda p: not p.cache_layouts,
           _distribution("massive_activations"), _reset(distribution="normal"), "skip-far-tiles"),
    Hazard("scales-at-both-ends", "a quantized tile's ue8m0 scale", "keys scaled by 2^-96 and 2^96: scale codes "
           "near either end of the range", "magnitude", _quantized, _scales_at_both_ends,
           _reset(cache_exponent=0), "scale-exponent-clamped"),
    # -- call sequences --
    Hazard("refilled-buffers", "calling again with the same buffers", "the same tensors refilled in place with "
           "another draw's values: the second answer must be the new one", "sequence", lambda p: True,
           lambda x: False, lambda sample: sample, "cached-by-address", exercised_by="refilled_buffers_give_the_new_answer"),
    Hazard("second-call-new-data", "calling again, after a larger call, with other values of the same shapes",
           "a call with one request more, then the drawn call, then its shapes again with new tensors", "sequence", lambda p: True, lambda x: False,
           lambda sample: sample, "plan-reused", exercised_by="calls_in_sequence_agree"),
    # -- every call --
    Hazard("poison-around-out", "out= as any view whose last dim is contiguous (kernels that take out=)",
           "a view into a buffer of poison, 8 elements of it before and after each row: the kernel must write "
           "through out's strides and nowhere else", "call", lambda p: True, lambda x: False, None,
           "out-assumed-packed", exercised_by="run_kernel"),
)}

# Counted where they are laid, not in a sample's bytes.
UNSAMPLED = ("sequence", "call")

# Laid in by Sample.inputs when a sample names them (Sample.hazards).
LAYOUT_HAZARDS = tuple(name for name, h in HAZARDS.items() if h.kind == "layout")


def applicable(problem: Problem, capabilities=None, kinds=("layout", "draw")) -> tuple[str, ...]:
    """The hazards of `kinds` a draw of `problem` carries for a kernel of `capabilities`."""
    return tuple(name for name, h in HAZARDS.items() if h.kind in kinds and h.applies(problem)
                 and not (h.opt_out and capabilities is not None and not getattr(capabilities, h.opt_out)))


def hostile(sample: Sample, capabilities=None) -> Sample:
    """`sample` with every layout hazard its problem (and the kernel's `capabilities`) allow."""
    return sample.replace(hazards=applicable(sample.problem, capabilities, kinds=("layout",)))


def present(inputs: Inputs) -> tuple[str, ...]:
    """The hazards the bytes of `inputs` carry."""
    return tuple(name for name, h in HAZARDS.items() if h.kind not in UNSAMPLED and h.present(inputs))


# Hazard -> how many inputs made in this process carried it (Sample.inputs counts them; the pytest
# plugin reports the session's, fmha.ci.hazard_report).
DRAWN: Counter = Counter()
__judge_state__ = ("DRAWN",)  # fmha.oracles.guard: not a part of what judges


def tally(inputs: Inputs) -> None:
    DRAWN.update(present(inputs))


def markdown() -> str:
    """The hazard table of docs/contract.md, from the records."""
    from fmha.tables import Table

    table = Table(["hazard", "kind", "the freedom", "the hostile value every draw gives it", "opt-out", "its mutant"])
    for h in HAZARDS.values():
        opt_out = f"`{h.opt_out}=False`" if h.opt_out else "—"
        kind = h.kind + (f" (`{h.exercised_by}`)" if h.exercised_by else "")
        hostile = h.hostile + (f" (`{'`, `'.join(h.form[0])}` as `{h.form[1]}`)" if h.form[0] else "")
        table.add(f"`{h.name}`", kind, h.freedom, hostile, opt_out, f"`mutant:{h.mutant}`")
    return table.markdown() + "\n"


if __name__ == "__main__":
    print(markdown(), end="")

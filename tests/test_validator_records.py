"""The validator and the records hold each other (issue: the contract's whole world, item 6): a call
built outside the records (random shapes, strides, offsets, dtypes, ids, scalars of any type; dense
and contract v2: paged, ragged, index-sparse over one or two caches, quantized caches) that
check_attention_args accepts falls inside some record's freedoms (fmha.contract.arguments and
fmha.contract.relations); every freedom's draws are accepted (tests/test_arguments.py). A rule
added to the validator without its record, or a record that allows what the validator refuses,
fails here."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmha.contract import ContractError, check_attention_args
from fmha.contract.arguments import ARGUMENTS, storage_freedoms
from fmha.contract.cache_layouts import LAYOUTS
from fmha.contract.relations import RELATIONS, shown
from fmha.oracles.storage import record

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32)


def _mostly(valid, invalid):
    """`valid` fifteen times in sixteen: a call of a dozen random parts is still accepted often."""
    return st.integers(0, 15).flatmap(lambda n: invalid if n == 15 else valid)


@st.composite
def strided(draw, shape, dtype, low=-3, high=3, values=None, packed_last=None):
    """A tensor of `shape` with strides drawn per dim (0, 1, packed, twice packed, anything; the
    last dim mostly packed where `packed_last`, by default with more than one dim), a storage
    offset, in a buffer just large enough of values in [low, high] (`values` instead where the
    view's elements each have memory of their own)."""
    packed_last = len(shape) > 1 if packed_last is None else packed_last
    strides, packed = [], 1
    for i, size in enumerate(reversed(shape)):
        steps = [packed] if i == 0 and packed_last else [packed, 2 * packed]
        strides.append(draw(_mostly(st.sampled_from(steps), st.sampled_from([0, 1, 3, 40]))))
        packed *= max(size, 1)
    strides.reverse()
    offset = draw(st.sampled_from([0, 0, 3]))
    buffer = torch.arange(_span(shape, strides, offset), dtype=torch.float64).remainder(high - low + 1).add(low).to(dtype)
    t = buffer.as_strided(shape, strides, offset)
    if values is not None and not _overlaps(t) and all(s or n <= 1 for s, n in zip(t.stride(), t.shape)):
        t.copy_(values)
    return t


@st.composite
def quantized_cache(draw, blocks: int, block_size: int, layout: str):
    """A `layout` cache's bytes, (blocks, block_size, 1, token_bytes): pages at a stride drawn
    (the padded page, twice it, or one the layout refuses), tokens at one drawn the same way."""
    spec = LAYOUTS[layout]
    page, token = spec.page_bytes(block_size), spec.token_bytes
    strides = (draw(_mostly(st.sampled_from([page, 2 * page]), st.sampled_from([0, block_size * token]))),
               draw(_mostly(st.just(token), st.sampled_from([0, 2 * token]))), token, 1)
    offset = draw(st.sampled_from([0, 0, spec.page_alignment]))
    shape = (blocks, block_size, 1, token)
    return torch.zeros(_span(shape, strides, offset), dtype=torch.uint8).as_strided(shape, strides, offset)


def _span(shape, strides, offset: int) -> int:
    """The elements a buffer holds for a view of `shape` and `strides` from `offset` (none past it)."""
    return offset + sum(max(n - 1, 0) * s for n, s in zip(shape, strides)) + 1


_ANY = st.one_of(st.none(), st.floats(-1, 2), st.integers(-1, 3), st.booleans(),
                 st.sampled_from([np.float32(0.5), np.float64(0.25), np.int64(2), np.int32(0), np.bool_(True), "0.5",
                                  math.inf, math.nan]))
SCALE = _mostly(st.sampled_from([None, 0.5, 1, np.float32(0.25), np.float64(2.0)]), _ANY)
CAUSAL = _mostly(st.sampled_from([False, True, np.bool_(True), np.bool_(False)]), _ANY)
WINDOW = _mostly(st.sampled_from([None, None, 1, 3, np.int64(2), np.int32(5), np.uint8(2)]), _ANY)


@st.composite
def calls(draw):
    B, T, Hq, S, D = (draw(st.integers(1, 3)) for _ in range(5))
    Hkv = draw(st.sampled_from([1, Hq, 2]))
    Dv = draw(st.sampled_from([D, D + 1]))
    dtype = draw(_mostly(st.sampled_from(DTYPES[:3]), st.sampled_from(DTYPES)))
    other = draw(_mostly(st.just(dtype), st.sampled_from(DTYPES)))
    q = draw(strided((B, T, Hq, D), dtype))
    k = draw(strided((B, S, Hkv, D), other))
    v = k if draw(st.booleans()) and Dv == D else draw(strided((B, S, Hkv, Dv), dtype))
    call = dict(q=q, k=k, v=v, scale=draw(SCALE), causal=draw(CAUSAL), window=draw(WINDOW))
    if draw(st.booleans()):
        call["sink"] = draw(strided((draw(_mostly(st.just(Hq), st.just(Hq + 1))),),
                                    draw(_mostly(st.just(torch.float32), st.sampled_from(DTYPES)))))
    if draw(st.booleans()):
        out = draw(strided((B, T, Hq, Dv), dtype))
        call["out"] = q if draw(st.integers(0, 3)) == 0 and Dv == D else out
    return call


def _ids(low: int, high: int):
    """Bounds of ids or lengths, one past either end one time in sixteen."""
    return _mostly(st.just((low, high)), st.sampled_from([(low - 1, high), (low, high + 1)]))


def lengths(B: int, low: int, high: int):
    """(B,) int32 lengths in [low, high] (mostly)."""
    return _ids(low, high).flatmap(lambda bounds: strided((B,), torch.int32, *bounds, packed_last=True))


@st.composite
def v2_calls(draw):
    """A contract-v2 call: a paged cache (queries ragged or not) or index-sparse slots over one or two
    caches, each cache in q's dtype or a quantized layout."""
    source = draw(st.sampled_from(["paged", "ragged", "sparse", "two scopes"]))
    B, T, Hkv, D, blocks, max_blocks = (draw(st.integers(1, 3)) for _ in range(6))
    Hq, block_size = Hkv * draw(_mostly(st.sampled_from([1, 2]), st.just(3))), draw(st.sampled_from([1, 2, 16]))
    layout = draw(st.sampled_from([None, None, None, *LAYOUTS]))
    dtype = torch.bfloat16 if layout else draw(_mostly(st.sampled_from(DTYPES[:3]), st.sampled_from(DTYPES)))
    D = LAYOUTS[layout].head_dim if layout else D

    def cache(blocks, block_size, layout, D=D):
        if layout:
            return draw(quantized_cache(blocks, block_size, layout))
        return draw(strided((blocks, block_size, Hkv, D), draw(_mostly(st.just(dtype), st.sampled_from(DTYPES)))))

    k = cache(blocks, block_size, layout)
    v = k if layout or draw(st.booleans()) else cache(blocks, block_size, None, draw(st.sampled_from([D, D + 1])))
    call = dict(k=k, v=v, scale=draw(SCALE), cache_layout=layout)
    if source in ("paged", "ragged"):
        call.update(causal=draw(CAUSAL), window=draw(WINDOW),
                    block_table=draw(strided((B, max_blocks), torch.int32, *draw(_ids(0, blocks - 1)))),
                    kv_lens=draw(lengths(B, 0, max_blocks * block_size)))
    else:
        call.update(causal=draw(_mostly(st.just(False), CAUSAL)), window=draw(_mostly(st.none(), WINDOW)))
        topk = draw(st.integers(1, 4))
        call["indices"] = draw(strided((B, T, topk), torch.int32, *draw(_ids(-1, blocks * block_size - 1))))
        if draw(st.booleans()):
            call["topk_len"] = draw(lengths(B, 0, topk))
    if source == "two scopes":
        blocks2, block_size2 = draw(st.integers(1, 3)), draw(st.sampled_from([1, 2, 64]))
        layout2 = draw(st.sampled_from([None, *LAYOUTS])) if layout else None
        topk2 = draw(st.integers(1, 4))
        call.update(extra_k_cache=cache(blocks2, block_size2, layout2), extra_cache_layout=layout2,
                    extra_indices=draw(strided((B, T, topk2), torch.int32, *draw(_ids(-1, blocks2 * block_size2 - 1)))))
        if draw(st.booleans()):
            call["extra_topk_len"] = draw(lengths(B, 0, topk2))
    rows = [draw(st.integers(0, 3)) for _ in range(B)] if source == "ragged" else [T] * B
    q_shape = (sum(rows), Hq, D) if source == "ragged" else (B, T, Hq, D)
    call["q"] = draw(strided(q_shape, dtype))
    if source == "ragged":
        bounds = torch.tensor([0, *itertools.accumulate(rows)], dtype=torch.int32)
        call["cu_seqlens_q"] = draw(strided((B + 1,), torch.int32, values=bounds, packed_last=True))
    if draw(st.booleans()):
        call["sink"] = draw(strided((draw(_mostly(st.just(Hq), st.just(Hq + 1))),),
                                    draw(_mostly(st.just(torch.float32), st.sampled_from(DTYPES)))))
    if draw(st.booleans()):
        Dv = v.shape[-1] if v is not k and not layout else D
        call["out"] = draw(strided(q_shape[:-1] + (Dv,), dtype))
    return call


def _overlaps(t: torch.Tensor) -> bool:
    """Two elements at one address, other than along a dim at stride 0."""
    dims = sorted((s, n) for s, n in zip(t.stride(), t.shape) if n > 1 and s > 0)
    span = 0  # the last element's offset of the dims inside, packed from the innermost
    for s, n in dims:
        if s <= span:
            return True
        span += (n - 1) * s
    return False


def _meet(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Some element of a at the address of some element of b."""
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    addresses = [set((t.storage_offset() + sum(i * s for i, s in zip(index, t.stride()))) * t.element_size()
                     for index in np.ndindex(*t.shape)) for t in (a, b)]
    return bool(addresses[0] & addresses[1])


def _dtype(argument, problem) -> torch.dtype:
    """The dtype `argument`'s record names, in `problem`'s call."""
    return {"float32": torch.float32, "uint8 in a cache_layout": torch.uint8}.get(
        argument.dtype, torch.int32 if argument.dtype.startswith("int32") else problem.dtype)


def outside_the_records(call: dict, problem) -> list[str]:
    """What of `call` no record allows."""
    found = []
    for name, t in call.items():
        if not isinstance(t, torch.Tensor) or (name == "v" and t is call["k"]):
            continue
        argument = record(name, problem)
        if t.dtype != _dtype(argument, problem):
            found.append(f"{name}: dtype {t.dtype}, its record {argument.dtype}")
        if argument.contiguous_last and t.numel() and t.shape[-1] > 1 and t.stride(-1) != 1:
            found.append(f"{name}: last stride {t.stride(-1)}, its record a contiguous last dim")
        if argument.fixed_format and t.shape[1] > 1 and t.stride(1) != t.shape[-1]:
            found.append(f"{name}: token stride {t.stride(1)}, its record a page format (tokens packed)")
        if not argument.broadcast and any(s == 0 and n > 1 for s, n in zip(t.stride(), t.shape)):
            found.append(f"{name}: stride 0, its record none")
        if _overlaps(t) and not any(f.startswith("overlap:") for f in storage_freedoms(argument)):
            found.append(f"{name}: elements overlap (strides {t.stride()}), its record: none")
    out = call.get("out")
    if out is not None and any(_meet(out, t) for n, t in call.items() if n != "out" and isinstance(t, torch.Tensor)):
        found.append("out: memory an input also uses, its record: no alias with an input")
    forms = {(r.name, f) for r in RELATIONS.values() for f in r.forms}
    found += [f"{relation}: {form}, not among its forms" for relation, form in shown(call) - forms]
    return found


KINDS = {"dense": calls(), "v2": v2_calls()}
# every record a call of each kind may be handed (the merge's parts have laws of their own)
RECORDS = {"dense": {"q", "k", "v", "sink", "out"},
           "v2": {"q", "q (ragged)", "k cache", "v cache", "quantized cache", "sink", "out", "out (ragged)",
                  "block_table", "kv_lens", "cu_seqlens_q", "indices", "topk_len", "extra_indices", "extra_topk_len"}}


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_the_validator_accepts_falls_inside_the_records(kind):
    @settings(max_examples=500, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(call=KINDS[kind])
    def check(call):
        try:
            problem = check_attention_args(**call)
        except ContractError:
            return
        assert not outside_the_records(call, problem), outside_the_records(call, problem)

    check()


@pytest.mark.parametrize("kind", KINDS)
def test_the_random_calls_reach_both_sides(kind):
    """The strategy is not a strategy of refusals only: some of its calls are valid, and every record
    of a call of its kind is handed something."""
    accepted, names = 0, set()

    @settings(max_examples=500, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(call=KINDS[kind])
    def count(call):
        nonlocal accepted
        try:
            problem = check_attention_args(**call)
        except ContractError:
            return
        accepted += 1
        names.update(record(n, problem).name for n, t in call.items() if isinstance(t, torch.Tensor))

    count()
    assert accepted >= 20 and names == RECORDS[kind], (accepted, RECORDS[kind] - names, names - RECORDS[kind])
    assert ARGUMENTS["sink"].contiguous_last is False

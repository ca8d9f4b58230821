"""The validator and the records hold each other (issue: the contract's whole world, item 6): a call
built outside the records (random shapes, strides, offsets, dtypes, scalars of any type) that
check_attention_args accepts falls inside some record's freedoms (fmha.contract.arguments and
fmha.contract.relations); every freedom's draws are accepted (tests/test_arguments.py). A rule
added to the validator without its record, or a record that allows what the validator refuses,
fails here."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fmha.contract import ContractError, check_attention_args
from fmha.contract.arguments import ARGUMENTS, storage_freedoms
from fmha.contract.relations import RELATIONS, shown
from fmha.oracles.storage import record

DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int32)


def _mostly(valid, invalid):
    """`valid` fifteen times in sixteen: a call of a dozen random parts is still accepted often."""
    return st.integers(0, 15).flatmap(lambda n: invalid if n == 15 else valid)


@st.composite
def strided(draw, shape, dtype):
    """A tensor of `shape` with strides drawn per dim (0, 1, packed, twice packed, anything),
    a storage offset, in a buffer just large enough."""
    strides, packed = [], 1
    for i, size in enumerate(reversed(shape)):
        steps = [packed] if i == 0 and len(shape) > 1 else [packed, 2 * packed]  # a last dim of stride 1
        strides.append(draw(_mostly(st.sampled_from(steps), st.sampled_from([0, 1, 3, 40]))))
        packed *= max(size, 1)
    strides.reverse()
    offset = draw(st.sampled_from([0, 0, 3]))
    span = offset + sum((n - 1) * s for n, s in zip(shape, strides)) + 1
    buffer = torch.arange(span, dtype=torch.float64).remainder(7).sub(3).to(dtype)
    return buffer.as_strided(shape, strides, offset)


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


def outside_the_records(call: dict, problem) -> list[str]:
    """What of `call` no record allows."""
    found = []
    for name, t in call.items():
        if not isinstance(t, torch.Tensor) or (name == "v" and t is call["k"]):
            continue
        argument = record(name, problem)
        want = torch.float32 if argument.dtype == "float32" else problem.dtype
        if t.dtype != want:
            found.append(f"{name}: dtype {t.dtype}, its record {argument.dtype}")
        if argument.contiguous_last and t.numel() and t.shape[-1] > 1 and t.stride(-1) != 1:
            found.append(f"{name}: last stride {t.stride(-1)}, its record a contiguous last dim")
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


@settings(max_examples=500, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(call=calls())
def test_a_call_the_validator_accepts_falls_inside_the_records(call):
    try:
        problem = check_attention_args(**call)
    except ContractError:
        return
    assert not outside_the_records(call, problem), outside_the_records(call, problem)


def test_the_random_calls_reach_both_sides():
    """The strategy is not a strategy of refusals only: some of its calls are valid, and every record
    of a dense call is handed something."""
    accepted, names = 0, set()

    @settings(max_examples=500, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(call=calls())
    def count(call):
        nonlocal accepted
        try:
            problem = check_attention_args(**call)
        except ContractError:
            return
        accepted += 1
        names.update(record(n, problem).name for n, t in call.items() if isinstance(t, torch.Tensor))

    count()
    assert accepted >= 20 and names == {"q", "k", "v", "sink", "out"}, (accepted, names)
    assert ARGUMENTS["sink"].contiguous_last is False

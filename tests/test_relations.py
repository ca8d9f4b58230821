"""The relation records (fmha.contract.relations), the scalar forms drawn from them
(Sample.scalars), what the audit reads back from a call, and the adapters' plain scalars."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fmha.ci import coverage
from fmha.contract import Problem, check_attention_args, plain_scalars
from fmha.contract.relations import RELATIONS, markdown, scope_layouts, shown
from fmha.oracles.sample import SCALAR_FORMS, Sample
from fmha.properties import covering
from fmha.regressions.selection import resolve_kernel

DOC = Path(__file__).resolve().parents[1] / "docs" / "contract.md"


def test_the_relations_table_in_docs_contract_md_is_the_records():
    table = DOC.read_text().split("<!-- relations: generated -->\n", 1)[1].split("<!-- relations: end -->", 1)[0]
    assert table == markdown(), "docs/contract.md's relations table is out of date: python -m fmha.contract.relations"


def _dense_call(sample: Sample) -> dict:
    x = sample.inputs()
    return {"q": x.q, "k": x.k, "v": x.v, **x.kwargs()}


WINDOWED = Sample(problem=Problem(batch=1, q_len=3, kv_len=9, heads_q=2, heads_kv=1, head_dim=16, window=4), scale=1.0)


@pytest.mark.parametrize("scalars, expected", [
    ((), {("window implies causal", "causal=True"), ("causal's type", "bool"), ("window's type", "int"),
          ("scale's type", "float")}),
    (("causal=False",), {("window implies causal", "causal=False")}),
    (("numpy",), {("causal's type", "numpy bool"), ("window's type", "numpy integer"), ("scale's type", "numpy float")}),
    (("int scale",), {("scale's type", "int")}),
])
def test_each_scalar_form_is_read_back_from_the_call(scalars, expected):
    """What the audit counts is what the kernel was handed: each form of Sample.scalars shows as its
    relation's form, read from the call's values and their types, and the validator accepts it."""
    sample = WINDOWED.replace(scalars=scalars)
    call = _dense_call(sample)
    assert expected <= shown(call), shown(call)
    check_attention_args(**call)


def test_a_form_a_call_has_no_room_for_passes_python_scalars():
    """causal=False without a window, an int scale of 0.5: the call as Python gives it (hypothesis
    draws forms before it knows the problem)."""
    sample = WINDOWED.replace(window=None, causal=True, scale=0.5, scalars=("causal=False", "int scale"))
    assert sample.scalar_arguments() == dict(scale=0.5, causal=True, window=None)
    with pytest.raises(ValueError, match="scalars: \\['numpy float'\\] are not among"):
        WINDOWED.replace(scalars=("numpy float",))
    assert set(SCALAR_FORMS) == {"causal=False", "numpy", "int scale"}


def test_a_numpy_scale_is_the_same_value():
    """float32 where it holds the scale exactly, else float64: the oracle's scale is the kernel's."""
    for scale in (0.25, 0.1):
        passed = WINDOWED.replace(scale=scale, scalars=("numpy",)).scalar_arguments()["scale"]
        assert type(passed).__module__ == "numpy" and float(passed) == scale


def test_scope_layouts_name_each_form():
    assert [scope_layouts(a, b) for a, b in ((None, None), ("dsv4-fp8", None), (None, "dsv4-fp4"),
                                             ("dsv4-fp8", "dsv4-fp8"), ("dsv4-fp8", "dsv4-fp4"))] == list(
        RELATIONS["each scope's cache layout"].forms)


def test_plain_scalars_are_what_the_contract_means():
    assert plain_scalars(np.float32(0.5), np.bool_(False), np.int64(3)) == (0.5, True, 3)
    assert [type(x) for x in plain_scalars(1, np.bool_(True), None)] == [float, bool, type(None)]
    assert plain_scalars(None, False, None) == (None, False, None)


@pytest.mark.parametrize("name", ["sdpa-math", "sdpa-paged"])
def test_an_adapter_masks_a_window_passed_with_causal_false(name):
    """A window implies causal: the adapters' libraries take causal=False beside a window as no mask
    (SDPA's math adapter did, 0.66 cosine), so they are handed plain_scalars. (Flex, whose block
    mask took causal from the caller too, compiles for a minute: the draws judge it.)"""
    kernel = resolve_kernel(name)
    if kernel.not_supported_reasons(WINDOWED.problem, "cpu"):
        pytest.skip(kernel.not_supported_reasons(WINDOWED.problem, "cpu")[0])
    x = WINDOWED.inputs()
    expected, _ = kernel(x.q, x.k, x.v, **x.kwargs())
    o, _ = kernel(x.q, x.k, x.v, **WINDOWED.replace(scalars=("causal=False", "numpy")).inputs().kwargs())
    assert torch.equal(o, expected)


def test_the_audit_names_a_relation_form_the_draws_lost(monkeypatch):
    """The covering samples without numpy scalars (as if the records had no numpy form): the audit
    fails and names the three forms only they show."""
    hand_out = covering.with_every_relation

    def without_numpy(members, kernel, device):
        return [m.replace(scalars=tuple(f for f in m.scalars if f != "numpy")) for m in hand_out(members, kernel, device)]

    monkeypatch.setattr(covering, "with_every_relation", without_numpy)
    kernel = resolve_kernel("reference")
    counts = coverage.reached_by(covering.covering_samples(kernel, "cpu"), kernel, "cpu")
    missing = coverage.unreached(coverage.audit(kernel.capabilities_on("cpu"), *counts))
    assert {(r.argument, r.freedom) for r in missing} == {
        ("relation: causal's type", "numpy bool"), ("relation: window's type", "numpy integer"),
        ("relation: scale's type", "numpy float")}


def test_a_second_scope_quantized_beside_a_first_in_qs_dtype_is_covered():
    """Each scope's layout its own: the covering samples of a kernel that reads both kinds of cache
    show every form, and a kernel of one layout is not asked for two that differ."""
    import dataclasses

    from fmha.oracles.reference_kernel import CAPABILITIES, ENTRY

    for layouts, excluded in ((frozenset({"dsv4-fp8", "dsv4-fp4"}), set()), (frozenset({"dsv4-fp8"}), {"both differ"})):
        caps = dataclasses.replace(CAPABILITIES, cache_layouts=layouts)
        kernel = dataclasses.replace(ENTRY, capabilities=caps, device_capabilities={})
        rows = coverage.audit(caps, *coverage.reached_by(covering.covering_samples(kernel, "cpu"), kernel, "cpu"))
        scopes = {r.freedom: r for r in rows if r.argument == "relation: each scope's cache layout"}
        assert {f for f, r in scopes.items() if r.why_not} == excluded
        assert all(r.reached for f, r in scopes.items() if f not in excluded), coverage.table("reference", rows)

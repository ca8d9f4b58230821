"""The argument records (fmha.contract.arguments), the storage forms drawn from them
(fmha.oracles.storage) and the coverage audit (fmha.ci.coverage)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from fmha.ci import coverage
from fmha.contract import check_attention_args
from fmha.contract.arguments import ARGUMENTS, markdown, storage_freedoms
from fmha.contract.errors import ContractError
from fmha.oracles import storage
from fmha.properties import covering, covering_array, strategies
from fmha.regressions.selection import resolve_kernel

DOC = Path(__file__).resolve().parents[1] / "docs" / "contract.md"


def test_the_arguments_table_in_docs_contract_md_is_the_records():
    table = DOC.read_text().split("<!-- arguments: generated -->\n", 1)[1].split("<!-- arguments: end -->", 1)[0]
    assert table == markdown(), "docs/contract.md's arguments table is out of date: python -m fmha.contract.arguments"


@pytest.mark.parametrize("name", [n for n, a in ARGUMENTS.items() if not a.fixed_format])
def test_each_form_keeps_the_values_and_shows_its_freedom(name):
    """Laid out in each form of its record, a tensor holds the same values (the last element's
    along a dim at stride 0), and reading its strides back names the form: what the audit counts
    is what a kernel gets."""
    argument = ARGUMENTS[name]
    shape = (2, 3, 4, 5)[-len(argument.shape):]
    t = torch.arange(math.prod(shape), dtype=torch.float32).view(shape)
    for form in storage_freedoms(argument):
        if form.startswith(("alias:", "overlap:")):
            continue
        laid = storage.lay_out(t, argument, form, float("nan"))
        expected = t
        if form.startswith("zero:"):
            d = argument.shape.index(form[5:])
            expected = t.narrow(d, t.shape[d] - 1, 1).expand(t.shape)
        assert torch.equal(laid, expected), f"{name} {form}"
        assert storage.observed(laid, argument) == {form}, f"{name} {form}: read back {storage.observed(laid, argument)}"


@pytest.mark.parametrize("name", ["q", "k", "k cache", "q (ragged)"])
def test_shared_elements_are_laid_out_read_back_and_keep_poison_from_what_rows_read(name):
    """A stride smaller than what the dims inside it span (an unfolded window's chunks), or stride 0:
    laid out, read back as overlap:<dim> or zero:<dim>; elements that share memory hold one of their
    values, a finite one where any had one (poison where no row may read never reaches a value a
    row reads)."""
    argument = ARGUMENTS[name]
    shape = (2, 3, 4, 6)[-len(argument.shape):]
    t = torch.arange(math.prod(shape), dtype=torch.float32).view(shape)
    t[(0,) * (t.dim() - 1)] = float("nan")  # a poisoned first row of the last dim
    t[(-1,) * (t.dim() - 1)] = float("-inf")  # and the last, where stride 0 would take its value
    for form in [f for f in storage_freedoms(argument) if f.startswith(("overlap:", "zero:"))]:
        laid = storage.lay_out(t, argument, form, float("-inf"))
        assert storage.observed(laid, argument) == {form}, f"{name} {form}: read back {storage.observed(laid, argument)}"
        assert set(laid[torch.isfinite(laid)].tolist()) <= set(t[torch.isfinite(t)].tolist()), f"{name} {form}"
        assert torch.isfinite(laid[torch.isfinite(t)]).all(), f"{name} {form}: poison spread to a drawn value"
        assert not torch.equal(laid.nan_to_num(-1), t.nan_to_num(-1)), f"{name} {form}: no element shares memory"


@pytest.mark.parametrize("name", ["block_table", "indices"])
def test_overlapping_ids_are_read_back_and_drawn(name):
    """Ids that share memory name pages and keys the draw gave another request or row (the keys go
    where the ids say: oracles/tests/test_paged_inputs.py): the audit reads them back, and no
    declaration that takes the argument excludes them."""
    argument = ARGUMENTS[name]
    shape = (2, 3, 4, 5)[-len(argument.shape):]
    packed = torch.empty(shape).stride()
    for form in [f for f in storage_freedoms(argument) if f.startswith("overlap:")]:
        d = argument.shape.index(form.split(":")[1])
        strides = list(packed)
        strides[d] = 1 if d == len(shape) - 2 and argument.contiguous_last else packed[d + 1]
        t = torch.zeros(math.prod(shape)).as_strided(shape, strides)
        assert form in storage.observed(t, argument), f"{name} {form}: read back {storage.observed(t, argument)}"
        assert not coverage.excluded(argument, form, resolve_kernel("reference").capabilities), f"{name} {form}"
    assert [f for f in storage_freedoms(argument) if f.startswith("overlap:")], name


def test_every_drawn_form_is_one_the_validator_accepts():
    """Item 6, one way: every storage form of every argument the covering set lays out, for a
    kernel that declares every source, is a call check_attention_args accepts."""
    kernel = resolve_kernel("reference")
    for sample in covering.covering_samples(kernel, "cpu"):
        x = sample.inputs()
        check_attention_args(x.q, x.k, x.v, **x.kwargs())


def test_the_validator_refuses_what_no_record_allows():
    """Item 6, the other way, at the one rule every record states: a last dim that is not
    contiguous is refused for every argument whose record says so (and a strided sink, whose
    record allows any strides, is not)."""
    q = torch.randn(1, 2, 2, 8)[..., ::2]
    with pytest.raises(ContractError, match="q: expected a contiguous last dim"):
        check_attention_args(q, torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 4))
    sink = torch.randn(4)[::2]
    assert not ARGUMENTS["sink"].contiguous_last
    check_attention_args(torch.randn(1, 2, 2, 8), torch.randn(1, 3, 2, 8), torch.randn(1, 3, 2, 8), sink=sink)


@pytest.mark.parametrize("name", ["reference", "sdpa-math", "fmha", "triton"])
def test_the_covering_set_reaches_every_freedom_a_declaration_allows(name, device):
    """The audit over the covering set alone (no dice): every freedom the kernel's declaration
    allows is in some call it is handed, on every run."""
    kernel = resolve_kernel(name)
    if kernel.not_supported_reasons(None, device):
        pytest.skip(f"{name}: {kernel.not_supported_reasons(None, device)[0]}")
    caps = kernel.capabilities_on(device)
    rows = coverage.audit(caps, *coverage.reached_by(covering.covering_samples(kernel, device), kernel, device))
    assert not coverage.unreached(rows), coverage.table(name, rows)


NARROW = {  # a declaration, and what each of its covering samples' problems must then be
    "paged decode, one row, pages of 16": (
        dict(sources=frozenset({"paged"}), max_q_len=1, block_sizes=(16,)),
        lambda p: p.q_len == 1 and p.block_size == 16),
    "the README's flash_fwd: square causal prefill in tiles of 128": (
        dict(head_dims={torch.bfloat16: (64, 128, 256), torch.float32: (64, 128)}, dtypes=(torch.bfloat16, torch.float32),
             features=frozenset({"causal", "lse", "gqa", "shared_kv"}), requires=frozenset({"causal"}),
             q_len_equals_kv_len=True, kv_len_multiple_of=128, sources=frozenset({"dense"})),
        lambda p: p.q_len == p.kv_len and p.kv_len % 128 == 0 and p.causal),
}


@pytest.mark.parametrize("declaration", NARROW)
def test_a_narrow_declaration_gets_every_form_in_calls_of_its_own_shape(declaration):
    """A narrow declaration gets covering samples of its own shape, not the general kernel's minus
    the ones it cannot take (a decode kernel: 3 query rows each; a square prefill in whole tiles:
    6 rows over 65 keys; each got none), and every freedom its declaration allows."""
    import dataclasses

    from fmha.oracles.reference_kernel import CAPABILITIES, ENTRY

    fields, shaped = NARROW[declaration]
    caps = dataclasses.replace(CAPABILITIES, **fields)
    kernel = dataclasses.replace(ENTRY, name=declaration, capabilities=caps, device_capabilities={})
    samples = covering.covering_samples(kernel, "cpu")
    assert samples and all(shaped(s.problem) for s in samples)
    rows = coverage.audit(caps, *coverage.reached_by(samples, kernel, "cpu"))
    assert not coverage.unreached(rows), coverage.table(kernel.name, rows)


@pytest.mark.parametrize("argument, freedom", [("q", "order:Hq.B.T"), ("sink", "step:Hq"), ("out", "order:Hq.T.B"),
                                               ("indices", "zero:T"), ("k cache", "zero:num_blocks")])
def test_the_audit_names_a_freedom_the_draws_lost(monkeypatch, argument, freedom):
    """One freedom taken out of the draws (as a strategy that forgot it would): the audit fails and names it."""
    def forgetting(record):
        return tuple(f for f in storage_freedoms(record) if (record.name, f) != (argument, freedom))

    for drawing in (strategies, covering_array):
        monkeypatch.setattr(drawing, "storage_freedoms", forgetting)
    kernel = resolve_kernel("reference")
    counts = coverage.reached_by(covering.covering_samples(kernel, "cpu"), kernel, "cpu")
    missing = coverage.unreached(coverage.audit(kernel.capabilities_on("cpu"), *counts))
    assert [(r.argument, r.freedom) for r in missing] == [(argument, freedom)]


def test_the_audit_names_a_size_the_covering_samples_lost(monkeypatch):
    """The covering samples with head dim 48 where they had 40 (as if the records had no =40): the
    audit fails and names it."""
    sizes = covering._sizes

    def without_40(caps, seed):
        return [s.replace(problem=s.problem.replace(head_dim=48, head_dim_v=48 if s.problem.head_dim_v == 40 else
                                                    s.problem.head_dim_v)) if s.problem.head_dim == 40 else s
                for s in sizes(caps, seed)]

    monkeypatch.setattr(covering, "_sizes", without_40)
    kernel = resolve_kernel("reference")
    counts = coverage.reached_by(covering.covering_samples(kernel, "cpu"), kernel, "cpu")
    missing = coverage.unreached(coverage.audit(kernel.capabilities_on("cpu"), *counts))
    assert [(r.argument, r.freedom) for r in missing] == [("size D", "=40 (40)")]

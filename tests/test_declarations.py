"""An honest declaration never gets a false failure: for a finite, representative set of
declarations (every registered kernel's, each single block size the strategies draw, each head
size with Dv = D, feature subsets, decode only), every law either skips up front saying why, or
its draws reach a call of the kernel inside the declaration (a law that can do neither would end
as hypothesis's "Unsatisfiable", a red test for a kernel that did nothing wrong); and every named
case either skips saying why or is laid out inside the declaration, its inputs built.

The kernel never runs: a stub stands in and stops a law at its first call (the named cases'
re-layouts run their traps' mutants), so this takes seconds."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _pytest.outcomes import Skipped
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable

from fmha.contract import Capabilities, KernelEntry, NotSupportedError
from fmha.properties.catalog import LAWS
from fmha.properties.paged_strategies import BLOCK_SIZES
from fmha.registry import KERNELS
from fmha.regressions.trap import laid_out_for
from fmha.regressions.traps import TRAPS, in_process_mutants

pytestmark = pytest.mark.cpu_tier  # draws only, on the CPU

PAGED = dict(sources=frozenset({"paged", "ragged"}))
SPARSE_FP8 = dict(sources=frozenset({"sparse"}), head_dims=(512,), dtypes=(torch.bfloat16,), split_head_dim_v=False,
                  features=frozenset({"sink", "lse", "gqa", "shared_kv", "out"}), requires=frozenset({"shared_kv"}),
                  cache_layouts=frozenset({"dsv4-fp8"}), unquantized_caches=False)

DECLARATIONS = {
    **{f"registered {name}": dataclasses.replace(entry.capabilities, devices=("cpu", "cuda"))
       for name, entry in KERNELS.items()},
    **{f"pages of {b}": Capabilities(block_sizes=(b,), **PAGED) for b in BLOCK_SIZES},
    **{f"paged, head size {d}": Capabilities(head_dims=(d,), split_head_dim_v=False, **PAGED) for d in (64, 128, 256, 512)},
    "pages of 16 and 64, one head size": Capabilities(block_sizes=(16, 64), head_dims=(128,), split_head_dim_v=False,
                                                      **PAGED),
    "paged decode, no sink, no window": Capabilities(max_q_len=1, sources=frozenset({"paged"}),
                                                     features=frozenset({"causal", "lse", "gqa", "shared_kv"})),
    "paged, causal only, bf16": Capabilities(requires=frozenset({"causal"}), dtypes=(torch.bfloat16,), **PAGED),
    "sparse fp8, pages of 64, top-k in 64s": Capabilities(block_sizes=(64,), topk_multiple_of=64, **SPARSE_FP8),
    "dense, one head-size pair": Capabilities(head_dims=(64,), split_head_dim_v=False),
    "dense, causal only": Capabilities(requires=frozenset({"causal"})),
    # the README's two declarations
    "README flash_fwd": Capabilities(
        head_dims={torch.bfloat16: (64, 128, 256), torch.float32: (64, 128)}, dtypes=(torch.bfloat16, torch.float32),
        features=frozenset({"causal", "lse", "gqa", "shared_kv"}), requires=frozenset({"causal"}),
        q_len_equals_kv_len=True, kv_len_multiple_of=128, promises=frozenset({"bitwise_deterministic"})),
    "README paged_fwd": Capabilities(block_sizes=(16, 64), split_head_dim_v=False, q_len_at_most_kv_len=True,
                                     empty_query_requests=False, **PAGED),
    "dense, square prefill, no lse": Capabilities(q_len_equals_kv_len=True,
                                                  features=frozenset({"causal", "window", "sink", "gqa", "shared_kv"})),
}


class Reached(Exception):
    """The law called the kernel with a call its declaration accepts."""


def _stub(q, k, v, **kwargs):
    raise Reached


QUICK = settings(max_examples=40, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
                 suppress_health_check=list(HealthCheck))


def _outcome(law, kernel) -> str | None:
    """None when the law skips or reaches the kernel; else what went wrong."""
    try:
        strategy, operands, pinned = law.setup("cpu", kernel)
    except Skipped:
        return None
    refused = []
    for sample in pinned:
        if kernel.not_supported_reasons(sample.problem, "cpu"):
            return f"runs {sample.id}, outside the declaration"

    @QUICK
    @given(sample=strategy)
    def draw(sample):
        try:
            law.check(*operands, sample, "cpu")
        except NotSupportedError as e:  # a call the declaration refuses: the draw was outside it
            refused.append(str(e))

    try:
        draw()
    except Reached:
        return None
    except Unsatisfiable:
        return "no draw got as far as a kernel call (Unsatisfiable)"
    if refused:
        return f"its draws call outside the declaration: {refused[0]}"
    return "no draw called the kernel"


@pytest.mark.parametrize("declaration", DECLARATIONS)
def test_every_law_skips_or_reaches_the_kernel(declaration):
    kernel = KernelEntry(name=declaration, fn=_stub, capabilities=DECLARATIONS[declaration])
    laws = [law for law in LAWS.values() if law.operands != "merge"]
    wrong = {law.name: why for law in laws if (why := _outcome(law, kernel))}
    assert not wrong, "\n".join(f"{name}: {why}" for name, why in wrong.items())


def test_without_the_up_front_skip_a_one_block_size_kernel_would_be_unsatisfiable(monkeypatch):
    """The check above can fail: the block-size law without its `unstatable` reason."""
    law = LAWS["block_size_changes_nothing"]
    monkeypatch.setitem(LAWS, law.name, dataclasses.replace(law, unstatable=None))
    kernel = KernelEntry(name="pages of 16", fn=_stub, capabilities=DECLARATIONS["pages of 16"])
    assert _outcome(LAWS[law.name], kernel) == "no draw got as far as a kernel call (Unsatisfiable)"


@pytest.mark.parametrize("declaration", DECLARATIONS)
def test_every_named_case_skips_saying_why_or_is_laid_out_inside_the_declaration(declaration):
    kernel = KernelEntry(name=declaration, fn=_stub, capabilities=DECLARATIONS[declaration])
    wrong = []
    for trap in TRAPS.values():
        mutants = in_process_mutants(trap.id)
        for case in trap.cases:
            laid, why = laid_out_for(kernel, case, "cpu", mutants)
            if laid is None:
                wrong += [] if why else [f"{trap.id}/{case.id}: skipped without a reason"]
            elif reasons := kernel.not_supported_reasons(laid.problem, "cpu"):
                wrong.append(f"{trap.id}/{case.id}: laid out as {laid.id}, outside the declaration: {reasons}")
            else:
                laid.inputs("cpu")  # a layout whose inputs cannot be built would fail the test, not skip
    assert not wrong, "\n".join(wrong)

"""The covering array (fmha.properties.covering_array): every pair of freedoms a declaration
allows meets in some call, each call inside the declaration and as its row says, and a bug only
a pair shows is caught by it and by nothing before it."""

from __future__ import annotations

import dataclasses

import pytest

from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import CAPABILITIES, ENTRY
from fmha.oracles.sample import OTHER_ARGUMENTS
from fmha.properties import covering_array
from fmha.properties.catalog import LAWS
from fmha.properties.covering import for_law
from fmha.regressions.mutants import MUTANTS
from fmha.regressions.selection import resolve_kernel

DECODE = dataclasses.replace(ENTRY, name="decode-one-row", device_capabilities={}, capabilities=dataclasses.replace(
    CAPABILITIES, sources=frozenset({"paged"}), max_q_len=1, block_sizes=(16,)))


def _kernel(name: str):
    return DECODE if name == DECODE.name else resolve_kernel(name)


@pytest.mark.parametrize("name", ["fmha", "reference", "sdpa-math", DECODE.name])
def test_every_pair_a_declaration_allows_meets_in_some_call(name):
    kernel = _kernel(name)
    sources = [s for s in ("dense", "paged", "sparse") if s in kernel.capabilities_on("cpu").sources]
    for source in sources:
        assert not covering_array.uncovered(kernel, "cpu", source), (name, source)
    samples = covering_array.array(kernel, "cpu", seed=7)
    assert len(samples) == sum(covering_array.size(kernel, "cpu").values())
    outside = [s.problem for s in samples if kernel.not_supported_reasons(s.problem, "cpu")]
    assert not outside, f"{name}: {len(outside)} calls its declaration excludes, the first {outside[0]}"


def test_each_call_is_its_row():
    """The structure and every argument's form a row names is the call's (a form dropped on the
    way from row to call would be a pair claimed and never drawn)."""
    kernel = resolve_kernel("reference")
    for source in ("dense", "paged", "sparse"):
        rows = covering_array._rows_of(kernel, "cpu", source)
        samples = [s for s in covering_array.array(kernel, "cpu") if s.problem.source == source]
        assert len(rows) == len(samples)
        for row, sample in zip(rows, samples):
            named = {name: form for name, form in row.items() if name in ("q", "k", "v", *OTHER_ARGUMENTS) and form}
            assert sample.storages == named, (row, sample.storages)
            assert list(sample.scalars) == ([row["scalars"]] if row["scalars"] else [])
            assert (sample.problem.window is not None) == (row.get("mask") == "window")


def test_a_narrow_declaration_gets_an_array_of_its_own():
    """A decode kernel of one query row and pages of 16 gets rows of its shape, not the general
    kernel's minus the ones it cannot take: no ragged or sparse factor, every call one row a
    request."""
    factors = covering_array.factors(DECODE, "cpu", "paged")
    assert factors["queries"] == ["padded"] and "cu_seqlens_q" not in factors
    samples = covering_array.array(DECODE, "cpu")
    assert samples and all(s.problem.q_len == 1 and s.problem.block_size == 16 for s in samples)


@pytest.mark.parametrize("mutant, the_set_misses_it", [("sink-read-packed-outside-bf16", True),
                                                       ("k-read-packed-when-v-is-k", True)])
def test_a_bug_only_a_pair_shows_is_caught_by_the_array(mutant, the_set_misses_it):
    """A bug on a pair of freedoms, each right alone: the covering array fails it in the dense
    agreement law by construction. The covering set (each freedom in some call) meets a pair only
    where its forms happen to land: it passes both here (k's head-major form lands on the massive
    activations' call, not on the K = V one; before that call was added it caught the second)."""
    kernel = MUTANTS[mutant].kernel()
    law = next(law for law in LAWS.values() if law.test == "test_agrees_with_the_oracle")

    def fails(sample) -> bool:
        try:
            return not check_sample(kernel, sample, "cpu").passed
        except Exception:  # noqa: BLE001 -- a kernel that raises (it read poison: a NaN sink) fails the law
            return True

    assert bool([s for s in for_law(law, kernel, "cpu", seed=3, pairs=False) if fails(s)]) is not the_set_misses_it
    assert [s for s in for_law(law, kernel, "cpu", seed=3, pairs=True) if fails(s)]

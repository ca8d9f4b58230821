"""The GPU scale tier's draws (fmha.properties.scale) at small sizes on the CPU: every size it
owns has a call, every source and cache layout gets the production sizes, no call outgrows a
card, and its calls agree with the oracle answered in passes of keys. The GPU runs the same code
at production sizes (pytest --fmha-scale)."""

import math
from collections import defaultdict

import pytest

from fmha.contract import ranges
from fmha.oracles.check import check_sample
from fmha.properties import scale
from fmha.registry import resolve_kernel

CARD_BYTES = 80 * 2**30


def _sizes(sample) -> set:
    """(symbol, value) of every size the sample's call has."""
    p = sample.problem
    found = set(ranges.of_problem(p).items())
    if p.source != "dense":
        found |= {("block_size", p.block_size)} | ({("pages", sample.num_blocks)} if sample.num_blocks else set())
    if p.source == "sparse":
        found.add(("topk", p.kv_len))
    return found


def _cache_elements(sample) -> int:
    """The elements of the call's keys: a dense k, or its cache of pages (at least the call's own)."""
    p = sample.problem
    if p.source == "dense":
        return p.batch * p.kv_len * p.heads_kv * p.head_dim
    pages = sample.num_blocks or p.batch * math.ceil(p.kv_len / p.block_size) * (p.q_len if p.source == "sparse" else 1)
    return pages * p.block_size * p.heads_kv * p.head_dim


def _kind(sample) -> tuple:
    p = sample.problem
    kind = "two_scopes" if p.extra_topk else "ragged" if p.ragged else p.source
    return kind, p.cache_layout


@pytest.mark.parametrize("name", ["fmha", "triton", "reference"])
def test_every_size_the_tier_owns_has_a_call_of_its_own(name):
    kernel = resolve_kernel(name)
    caps = kernel.capabilities_on("cuda")
    owned = {(symbol, value) for symbol, _, value in ranges.freedoms(caps)
             if ranges.applies(symbol, caps) and ranges.tier(symbol, value, caps) == "scale"}
    shown = set().union(*(_sizes(s) for s in scale.calls(kernel, "cuda")))
    assert owned and not owned - shown, f"{name}: the tier's sizes without a call: {sorted(owned - shown)}"


def test_every_source_and_layout_gets_the_production_sizes():
    kernel = resolve_kernel("fmha")
    caps = kernel.capabilities_on("cuda")
    groups = defaultdict(list)
    for s in scale.calls(kernel, "cuda"):
        groups[_kind(s)].append(s)
    sources = {"dense", "paged", "ragged", "sparse", "two_scopes"}
    assert {kind for kind, _ in groups} == sources
    assert {layout for _, layout in groups} == {None, *caps.cache_layouts}
    at = scale.PRODUCTION
    for (kind, layout), samples in groups.items():
        where = f"{kind} {layout or 'in q dtype'}"
        assert max(s.problem.kv_len for s in samples) >= at.keys >= 2**17, where
        assert max(s.problem.batch for s in samples) >= at.requests >= 512, where
        if layout is None:
            assert max(_cache_elements(s) for s in samples) > 2**31, where
        if layout is None and kind != "dense":
            assert max(s.num_blocks or 0 for s in samples) - 1 >= at.page_id >= 2**20, where
        if kind in ("sparse", "two_scopes"):
            assert at.topk in {s.problem.kv_len for s in samples}, where


@pytest.mark.parametrize("name", ["fmha", "triton"])
def test_no_call_of_the_tier_outgrows_a_card(name):
    """Its keys and values in bf16 (doubled: a padded page's poison), its queries and the float64
    answer with the three scales the verdict reads, within half an 80 GB card."""
    kernel = resolve_kernel(name)
    for s in scale.calls(kernel, "cuda"):
        p = s.problem
        rows = p.batch * p.q_len * p.heads_q
        caches = 1 if p.shared_kv else 2
        used = caches * 2 * 2 * _cache_elements(s) + 2 * rows * p.head_dim + 4 * 8 * rows * (p.head_dim_v or p.head_dim)
        assert used <= CARD_BYTES // 2, f"{s.id}: {used / 2**30:.1f} GiB"


SMALL = scale.Scale(keys=300, elements=2**14, requests=9, page_id=2**9 + 1, topk=100)


@pytest.mark.parametrize("name", ["reference", "fmha"])
def test_the_tier_agrees_with_the_oracle_at_small_sizes(name):
    """The production sizes scaled down, every source and layout: the draws lay out, the oracle
    answers, the kernel agrees (the oracle's passes of keys, which the GPU's 128k keys take, are
    oracles/tests/test_oracle.py's: the judge refuses a call whose oracle was rebound)."""
    kernel = resolve_kernel(name)
    samples = [s for s in scale.scale_samples(kernel.capabilities_on("cpu"), 0, SMALL, freedoms=False)
               if not kernel.not_supported_reasons(s.problem, "cpu")]  # the same logic, small sizes
    assert {_kind(s)[0] for s in samples} == {"dense", "paged", "ragged", "sparse", "two_scopes"}
    for s in samples:
        verdict = check_sample(kernel, s, "cpu")
        assert verdict.passed, verdict.message(f"{name} {s.id}")


def test_the_scale_mutants_build_and_are_no_kill_matrix_rows():
    """Each is fmha's paged kernel with its patch (the patch's text still in the kernel), proven by
    the GPU tier: the CPU tier passes it by design, so no kill-matrix row asks 3 tests to catch it."""
    from fmha.regressions import kill_matrix, scale_mutants

    rows = kill_matrix.matrix_mutants()
    for m in scale_mutants.SCALE_MUTANTS:
        assert m.tier == "scale" and m.kernel().name == f"mutant:{m.name}" and m.name not in rows, m.name


def test_the_plugin_collects_a_test_a_call_on_cuda_with_fmha_scale_and_one_skipped_test_a_kernel_else(monkeypatch):
    """The GPU-only collection, seen on the CPU: with --fmha-scale on CUDA, one test per (kernel,
    call) the declaration admits, each id unique; without it, or on the CPU, one per kernel."""
    from fmha.ci import plugin
    from fmha.properties.run_settings import DEVICE

    reference = resolve_kernel("reference")
    monkeypatch.setattr(plugin, "_selection", lambda config: ([reference], []))

    class Config:
        def __init__(self, scale_on, device):
            self.scale_on, self.stash = scale_on, {DEVICE: device}

        def getoption(self, name):
            assert name == "--fmha-scale", name
            return self.scale_on

    pairs, ids = plugin._scale_calls(Config(True, "cuda"))
    assert len(pairs) == len(scale.calls(reference, "cuda")) > 40 and len(set(ids)) == len(ids)
    assert all(k is reference and not k.not_supported_reasons(s.problem, "cuda") for k, s in pairs)
    assert plugin._scale_calls(Config(True, "cpu")) == plugin._scale_calls(Config(False, "cuda")) == \
        ([(reference, None)], ["reference"])

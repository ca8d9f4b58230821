"""The sizes' records (fmha.contract.ranges): each range's freedoms, narrowed by a declaration, and
what a call is counted as showing."""

import dataclasses
from collections import Counter
from pathlib import Path

import pytest

from fmha.contract import ranges
from fmha.oracles import storage
from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import CAPABILITIES, ENTRY
from fmha.oracles.sample import Sample
from fmha.contract import Problem
from fmha.registry import resolve_kernel


def test_the_sizes_table_in_docs_contract_md_is_the_records():
    doc = Path(__file__).resolve().parents[1] / "docs" / "contract.md"
    table = doc.read_text().split("<!-- sizes: generated -->\n", 1)[1].split("<!-- sizes: end -->", 1)[0]
    assert table == ranges.markdown(), "docs/contract.md's sizes table is out of date: python -m fmha.contract.ranges"


def test_a_range_lists_its_ends_their_neighbours_the_width_boundaries_inside_and_model_values():
    found = ranges.values(ranges.SIZES["D"])
    assert {found[k] for k in ("min", "min+1", "max-1", "max")} == {1, 2, 511, 512}
    assert (found["2^8-1"], found["2^8"], found["2^8+1"]) == (255, 256, 257) and "2^16" not in found
    assert {found["=40"], found["=72"]} == {40, 72}
    assert ranges.values(ranges.SIZES["B"])["2^31-1"] == 2**31 - 1


def test_a_declaration_narrows_the_range_to_what_it_declares():
    """fmha's head dims, 16 to 512 in steps of 16: min + 1 is 32, no 255 or 40; a kernel without GQA
    has groups of 1 only; a decode kernel, one query row; a square prefill in whole tiles of 128
    rows and keys in multiples of 128 (no 1, 2, 255 or 257: it was told to reach them)."""
    caps = resolve_kernel("fmha").capabilities_on("cpu")
    fmha = dict((label, n) for symbol, label, n in ranges.freedoms(caps) if symbol == "D")
    assert (fmha["min"], fmha["min+1"], fmha["max-1"], fmha["max"], fmha["2^8"]) == (16, 32, 496, 512, 256)
    assert "2^8-1" not in fmha and "=40" not in fmha and fmha["=80"] == 80
    plain = dataclasses.replace(CAPABILITIES, features=CAPABILITIES.features - {"gqa"})
    assert {n for symbol, _, n in ranges.freedoms(plain) if symbol == "group"} == {1}
    decode = dataclasses.replace(CAPABILITIES, max_q_len=1)
    assert {n for symbol, _, n in ranges.freedoms(decode) if symbol == "T"} == {1}
    square = dataclasses.replace(CAPABILITIES, q_len_equals_kv_len=True, kv_len_multiple_of=128, max_kv_len=4096)
    for symbol in ("T", "S"):
        found = {label: n for s, label, n in ranges.freedoms(square) if s == symbol}
        assert found == {"min": 128, "min+1": 256, "max-1": 3968, "max": 4096, "2^8": 256}, (symbol, found)


def test_a_call_is_counted_by_the_sizes_it_was_handed():
    storage.SIZES_SEEN.clear()
    problem = Problem(batch=1, q_len=3, kv_len=33, heads_q=4, heads_kv=2, head_dim=40, head_dim_v=72)
    assert check_sample(ENTRY, Sample(problem=problem)).passed
    assert storage.SIZES_SEEN[("D", 40)] == 1 and storage.SIZES_SEEN[("Dv", 72)] == 1
    assert storage.SIZES_SEEN[("group", 2)] == 1 and storage.SIZES_SEEN[("S", 33)] == 1


def test_head_dims_declared_for_one_dtype_give_that_dtypes_size_samples():
    """head_dims declared per dtype, bf16 left out: the sizes' covering samples are fp16's, not an
    IndexError over bf16's empty range."""
    import torch

    from fmha.properties import covering
    caps = dataclasses.replace(CAPABILITIES, dtypes=(torch.bfloat16, torch.float16), head_dims={torch.float16: (64,)})
    assert ranges.values(ranges.SIZES["D"], ()) == {}
    samples = covering._sizes(caps, 0)
    assert samples and {(s.problem.dtype, s.problem.head_dim) for s in samples} == {(torch.float16, 64)}


def test_a_paged_and_a_sparse_call_are_counted_by_their_block_sizes_top_k_and_pages():
    """A paged or sparse call's sizes are read from the call: each scope's block size and top-k,
    and each cache's pages."""
    storage.SIZES_SEEN.clear()
    paged = Problem(batch=2, q_len=1, kv_len=9, heads_q=2, heads_kv=1, head_dim=16, source="paged", block_size=3)
    assert check_sample(ENTRY, Sample(problem=paged, num_blocks=300)).passed
    sparse = Problem(batch=1, q_len=1, kv_len=5, heads_q=2, heads_kv=1, head_dim=16, shared_kv=True, source="sparse",
                     block_size=2, extra_topk=7, extra_block_size=4)
    assert check_sample(ENTRY, Sample(problem=sparse)).passed
    seen = storage.SIZES_SEEN
    assert seen[("block_size", 3)] == seen[("pages", 300)] == 1
    assert seen[("block_size", 2)] == seen[("block_size", 4)] == seen[("topk", 5)] == seen[("topk", 7)] == 1


def test_a_cache_of_num_blocks_pages_holds_the_calls_own_in_its_last_ids():
    """Sample.num_blocks: poison in the first pages (the spare the lowest of the call's), the pages
    read the highest ids, so that the largest id read is num_blocks - 1; fewer than the call needs is
    an error naming it."""
    import pytest

    problem = Problem(batch=2, q_len=1, kv_len=4, heads_q=2, heads_kv=1, head_dim=16, source="paged", block_size=1)
    x = Sample(problem=problem, num_blocks=2**16 + 1).inputs()
    table, lens = x.source_args["block_table"], x.source_args["kv_lens"].tolist()
    read = {int(table[b, i]) for b, n in enumerate(lens) for i in range(n)}
    assert x.k.shape[0] == 2**16 + 1 and max(read) == 2**16 and min(read) >= 2**16 + 1 - 8
    with pytest.raises(ValueError, match="num_blocks: the call's pages are"):
        Sample(problem=problem, num_blocks=3).inputs()


def test_a_cache_of_the_calls_own_pages_alone_holds_no_page_of_poison():
    """num_blocks equal to the pages the call reads: every page is some request's, the table's entries
    past a request's pages name one of them; a cache of one page gives up the padded pages it has no
    second page to show."""
    problem = Problem(batch=2, q_len=1, kv_len=4, heads_q=2, heads_kv=1, head_dim=16, source="paged", block_size=2)
    x = Sample(problem=problem, num_blocks=4).inputs()
    table = x.source_args["block_table"]
    assert x.k.shape[0] == 4 and sorted(table[:, :2].flatten().tolist()) == [0, 1, 2, 3]
    assert set(table[:, 2].tolist()) <= {0, 1, 2, 3}
    one = problem.replace(batch=1, kv_len=2)
    sample = Sample(problem=one, num_blocks=1, hazards=("padded-pages", "strided-queries"))
    assert sample.hazards == ("strided-queries",) and "padded-pages" in sample.given_up
    x = sample.inputs()
    assert x.k.shape[0] == 1 and x.source_args["block_table"].tolist() == [[0, 0]]


def test_a_sparse_only_declaration_of_small_pages_names_why_a_cache_of_one_page_is_not_drawn():
    from fmha.ci import coverage

    def pages_excluded(block_sizes):
        caps = dataclasses.replace(CAPABILITIES, sources=frozenset({"sparse"}), block_sizes=block_sizes)
        return {r.freedom: r.why_not for r in coverage.audit(caps, Counter(), Counter(), Counter())
                if r.argument == "size pages" and r.why_not.startswith("not drawn")}

    assert pages_excluded((64,)) == {}
    assert set(pages_excluded((1,))) == {"min (1)", "min+1 (2)"}
    assert "5 pages of 1" in pages_excluded((1,))["min (1)"]


@pytest.mark.parametrize("pages, freedom", [(2**16 + 1, "2^16+1 (65537)"), (1, "min (1)")])
def test_the_audit_names_a_page_count_the_covering_samples_lost(pages, freedom, monkeypatch):
    """The covering samples' caches without 2^16 + 1 pages (as if the records stopped at 16 bits), or
    without a cache of one page (as if every draw kept a page of poison): the audit fails and names it."""
    from fmha.ci import coverage
    from fmha.properties import covering

    sizes = covering._paged_sizes

    def without(*args):
        return [s for s in sizes(*args) if s.num_blocks != pages]

    monkeypatch.setattr(covering, "_paged_sizes", without)
    kernel = resolve_kernel("reference")
    counts = coverage.reached_by(covering.covering_samples(kernel, "cpu"), kernel, "cpu")
    missing = coverage.unreached(coverage.audit(kernel.capabilities_on("cpu"), *counts))
    assert [(r.argument, r.freedom) for r in missing] == [("size pages", freedom)]

"""The sizes' records (fmha.contract.ranges): each range's freedoms, narrowed by a declaration, and
what a call is counted as showing."""

import dataclasses

from fmha.contract import ranges
from fmha.oracles import storage
from fmha.oracles.check import check_sample
from fmha.oracles.reference_kernel import CAPABILITIES, ENTRY
from fmha.oracles.sample import Sample
from fmha.contract import Problem
from fmha.registry import resolve_kernel


def test_a_range_lists_its_ends_their_neighbours_the_width_boundaries_inside_and_model_values():
    found = ranges.values(ranges.SIZES["D"])
    assert {found[k] for k in ("min", "min+1", "max-1", "max")} == {1, 2, 511, 512}
    assert (found["2^8-1"], found["2^8"], found["2^8+1"]) == (255, 256, 257) and "2^16" not in found
    assert {found["=40"], found["=72"]} == {40, 72}
    assert ranges.values(ranges.SIZES["B"])["2^31-1"] == 2**31 - 1


def test_a_declaration_narrows_the_range_to_what_it_declares():
    """fmha's head dims, 16 to 512 in steps of 16: min + 1 is 32, no 255 or 40; a kernel without GQA
    has groups of 1 only; a decode kernel, one query row."""
    caps = resolve_kernel("fmha").capabilities_on("cpu")
    fmha = dict((label, n) for symbol, label, n in ranges.freedoms(caps) if symbol == "D")
    assert (fmha["min"], fmha["min+1"], fmha["max-1"], fmha["max"], fmha["2^8"]) == (16, 32, 496, 512, 256)
    assert "2^8-1" not in fmha and "=40" not in fmha and fmha["=80"] == 80
    plain = dataclasses.replace(CAPABILITIES, features=CAPABILITIES.features - {"gqa"})
    assert {n for symbol, _, n in ranges.freedoms(plain) if symbol == "group"} == {1}
    decode = dataclasses.replace(CAPABILITIES, max_q_len=1)
    assert {n for symbol, _, n in ranges.freedoms(decode) if symbol == "T"} == {1}


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

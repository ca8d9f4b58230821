"""The strategies' draws fit the memory of the float64 oracle on each device: on a GPU sixteen
workers share one device, so no tensor the oracle builds may pass 1 GiB (2^27 float64s)."""

import dataclasses

import pytest
from hypothesis import given, settings, target
from hypothesis import strategies as st

from fmha.contract import FULL_CONTRACT
from fmha.properties.paged_strategies import paged_samples
from fmha.properties.strategies import problems

ORACLE_ELEMENTS = {"cpu": 2**26, "cuda": 2**27}


def _largest_oracle_tensor(p) -> int:
    """Elements of the largest float64 tensor `reference.oracle` builds for `p`: the logits,
    K and V repeated for every query head, or Q and O."""
    logits = p.batch * p.heads_q * p.q_len * p.kv_len
    keys = p.batch * p.kv_len * p.heads_q * max(p.head_dim, p.head_dim_v)
    rows = p.batch * p.heads_q * p.q_len * max(p.head_dim, p.head_dim_v)
    return max(logits, keys, rows)


# A kernel that takes few keys: the queries and outputs, not the logits, are then what is large.
FEW_KEYS = dataclasses.replace(FULL_CONTRACT, max_kv_len=4)


@pytest.mark.parametrize("caps", [pytest.param(FULL_CONTRACT, id="full"), pytest.param(FEW_KEYS, id="few-keys")])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@settings(max_examples=300, derandomize=True, database=None, deadline=None)
@given(data=st.data())
def test_a_drawn_problem_fits_the_oracle_in_memory(device, caps, data):
    p = data.draw(problems(caps, device, long_context=data.draw(st.booleans())))
    elements = _largest_oracle_tensor(p)
    target(elements)  # toward the largest draws
    assert elements <= ORACLE_ELEMENTS[device], (
        f"{p!r}: the oracle holds {elements * 8 / 2**30:.2f} GiB in one float64 tensor on {device}, "
        f"over {ORACLE_ELEMENTS[device] * 8 / 2**30:.1f} GiB")


# FlashMLA's limits: two head counts, each scope's top-k a multiple of 64, quantized caches only.
BUILT_FOR_SOME_SHAPES = dataclasses.replace(
    FULL_CONTRACT, sources=frozenset({"sparse", "two_scopes"}), heads_q=(64, 128), topk_multiple_of=64,
    cache_layouts=frozenset({"dsv4-fp8"}), unquantized_caches=False, head_dims=(512,))


@settings(max_examples=40, derandomize=True, database=None, deadline=None)
@given(sample=paged_samples(BUILT_FOR_SOME_SHAPES, "cuda"))
def test_draws_stay_inside_a_kernels_head_counts_top_k_step_and_cache_layouts(sample):
    p = sample.problem
    assert p.heads_q in (64, 128) and p.kv_len % 64 == 0 and (p.extra_topk or 0) % 64 == 0, p
    assert p.cache_layout == "dsv4-fp8" and p.extra_cache_layout in (None, "dsv4-fp8") and not p.unquantized_caches, p


@settings(max_examples=20, derandomize=True, database=None, deadline=None)
@given(sample=paged_samples(dataclasses.replace(FULL_CONTRACT, sources=frozenset({"paged"}),
                                                cache_layouts=frozenset({"dsv4-fp8", "dsv4-fp4"})),
                            "cpu", needs=("dsv4-fp8",)))
def test_the_fp8_cache_law_draws_paged_calls_over_an_fp8_cache(sample):
    """A kernel with a paged source and the FP8 layout gets paged calls over that cache (they
    were drawn for index-sparse calls only)."""
    p = sample.problem
    assert p.source == "paged" and p.cache_layout == "dsv4-fp8" and p.heads_kv == 1 and p.shared_kv, p

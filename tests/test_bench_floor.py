"""The roofline floors `python -m fmha.bench` divides by (the timings themselves need a GPU)."""

import pytest

from fmha.bench import dense as bench
from fmha.bench import sparse as sparse_bench
from fmha.contract.cache_layouts import DSV4_FP8


@pytest.mark.parametrize("name", sparse_bench.SHAPES)
def test_a_sparse_decode_does_the_flops_of_the_dense_call_over_its_keys(name):
    """Each query row over its own top-k keys: the dense call with one row per request and
    S = top-k does the same multiply-adds."""
    p = sparse_bench.SHAPES[name]
    dense = p.replace(source="dense", batch=p.batch * p.q_len, q_len=1, kv_len=sparse_bench.keys_per_row(p),
                      block_size=None, cache_layout=None, extra_topk=None, extra_block_size=None,
                      extra_cache_layout=None)
    assert sparse_bench.flops(p) == bench.flops(dense)


@pytest.mark.parametrize("name", sparse_bench.SHAPES)
def test_a_sparse_decode_moves_its_fp8_keys_once_per_query_row(name):
    """The bytes are the FP8 keys each row gathers (data, rope and scales), not bf16 keys."""
    p = sparse_bench.SHAPES[name]
    rows = p.batch * p.q_len
    q_o_lse = rows * p.heads_q * (2 * (p.head_dim + p.head_dim_v) + 4)
    assert sparse_bench.bytes_moved(p) - q_o_lse == rows * sparse_bench.keys_per_row(p) * DSV4_FP8.token_bytes
    assert DSV4_FP8.token_bytes == 448 + 2 * 64 + 8

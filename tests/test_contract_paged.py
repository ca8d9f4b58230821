"""Contract v2 calls (paged, ragged, index-sparse, two scopes, quantized caches) are described
as the Problem they are, and bad ones refused naming the argument, what was expected and
what came in."""

import re

import pytest
import torch

from fmha import ContractError, NotSupportedError, check_attention_args
from fmha.contract import FULL_CONTRACT, Capabilities
from fmha.contract.cache_layouts import DSV4_FP8
from fmha.oracles.quantization import quantize

I32 = dict(dtype=torch.int32)


def _paged(B=3, T=2, Hq=4, Hkv=2, D=16, num_blocks=6, block_size=4):
    q = torch.randn(B, T, Hq, D)
    k_cache = torch.randn(num_blocks, block_size, Hkv, D)
    v_cache = torch.randn(num_blocks, block_size, Hkv, 8)
    block_table = torch.tensor([[5, 0], [2, 2], [1, 3]], **I32)
    kv_lens = torch.tensor([5, 0, 8], **I32)
    return q, k_cache, v_cache, dict(block_table=block_table, kv_lens=kv_lens)


def _sparse(B=2, T=1, Hq=8, topk=6):
    page = quantize(torch.randn(3, 64, 1, 512).to(torch.bfloat16), DSV4_FP8)  # (3, page bytes)
    cache = page[:, :64 * DSV4_FP8.token_bytes].view(3, 64, 1, DSV4_FP8.token_bytes)
    q = torch.randn(B, T, Hq, 512).to(torch.bfloat16)
    indices = torch.randint(-1, 3 * 64, (B, T, topk), **I32)
    return q, cache, dict(indices=indices, topk_len=torch.tensor([6, 2], **I32), cache_layout="dsv4-fp8")


def test_a_paged_call_is_the_problem_of_its_longest_request():
    q, k, v, kw = _paged()
    p = check_attention_args(q, k, v, causal=True, **kw)
    assert (p.source, p.block_size, p.batch, p.q_len, p.kv_len, p.heads_kv, p.head_dim_v) == ("paged", 4, 3, 2, 8, 2, 8)
    assert p.sources == {"paged"} and p.causal


def test_ragged_queries_are_described_by_their_longest_request():
    q, k, v, kw = _paged()
    packed = torch.randn(7, 4, 16)
    p = check_attention_args(packed, k, v, cu_seqlens_q=torch.tensor([0, 1, 1, 7], **I32), **kw)
    assert p.ragged and p.q_len == 6 and p.sources == {"paged", "ragged"}


def test_a_sparse_call_over_a_quantized_cache_and_a_second_scope():
    q, cache, kw = _sparse()
    extra = torch.randn(5, 2, 1, 512).to(torch.bfloat16)
    p = check_attention_args(q, cache, cache, sink=torch.zeros(8), extra_k_cache=extra,
                             extra_indices=torch.full((2, 1, 3), -1, **I32), **kw)
    assert (p.source, p.kv_len, p.block_size, p.cache_layout, p.extra_topk, p.extra_block_size) == (
        "sparse", 6, 64, "dsv4-fp8", 3, 2)
    assert p.head_dim == p.head_dim_v == 512 and p.shared_kv and p.sources == {"sparse", "two_scopes"}


def _refused(match, *args, **kwargs):
    with pytest.raises(ContractError, match=re.escape(match)):
        check_attention_args(*args, **kwargs)


@pytest.mark.parametrize("change, message", [
    (dict(kv_lens=torch.tensor([5, 0, 9], **I32)),
     "kv_lens: expected lengths (block_table holds max_blocks x block_size) in [0, 8], got 9 at (2,)"),
    (dict(block_table=torch.tensor([[5, 6], [2, 2], [1, 3]], **I32)),
     "block_table: expected page numbers of the blocks kv_lens uses in [0, 5], got 6"),
    (dict(kv_lens=torch.tensor([5, 0], **I32)), "kv_lens: expected int32 (B,) = (3,) on cpu, got torch.int32 (2,)"),
    (dict(block_table=torch.tensor([[5, 0], [2, 2], [1, 3]])), "block_table: expected int32 (B, max_blocks)"),
    (dict(indices=torch.zeros(3, 2, 4, **I32)), "block_table, indices: a call reads a paged cache through"),
    (dict(topk_len=torch.zeros(3, **I32)), "topk_len, extra_*: they describe an index-sparse call"),
    (dict(block_table=torch.tensor([[5, 5, 0, 0], [2, 2, 2, 2], [1, 1, 3, 3]], **I32)[:, ::2]),
     "block_table: expected a contiguous last dim (stride 1), got strides (4, 2)"),
    (dict(kv_lens=torch.tensor([5, 5, 0, 0, 8, 8], **I32)[::2]),
     "kv_lens: expected a contiguous last dim (stride 1), got strides (2,)"),
])
def test_paged_calls_refused(change, message):
    q, k, v, kw = _paged()
    _refused(message, q, k, v, **(kw | change))


def test_ragged_cu_seqlens_must_run_from_zero_to_total_q():
    q, k, v, kw = _paged()
    packed = torch.randn(7, 4, 16)
    _refused("cu_seqlens_q: expected 0, then non-decreasing, ending at total_q=7, got [0, 4, 1, 7]",
             packed, k, v, cu_seqlens_q=torch.tensor([0, 4, 1, 7], **I32), **kw)
    _refused("q: expected rank 3 (total_q, Hq, D), got rank 4", q, k, v,
             cu_seqlens_q=torch.tensor([0, 1, 1, 2], **I32), **kw)
    _refused("out: expected shape (7, 4, 8) (total_q, Hq, Dv), got (3, 2, 4, 8)", packed, k, v,
             cu_seqlens_q=torch.tensor([0, 1, 1, 7], **I32), out=torch.empty(3, 2, 4, 8), **kw)


@pytest.mark.parametrize("change, message", [
    (dict(indices=torch.full((2, 1, 6), 192, **I32)),
     "indices: expected cache slots (block * block_size + offset) or -1 in [-1, 191], got 192 at (0, 0, 0)"),
    (dict(indices=torch.full((2, 1, 6), -2, **I32)), "got -2 at (0, 0, 0) (12 of 12 values out of range)"),
    (dict(topk_len=torch.tensor([7, 0], **I32)), "topk_len: expected index counts in [0, 6], got 7 at (0,)"),
    (dict(causal=True), "causal, window: the indices alone decide an index-sparse row's keys"),
    (dict(extra_indices=torch.zeros(2, 1, 3, **I32)), "extra_indices, extra_topk_len, extra_cache_layout: a second "
                                                      "scope needs extra_k_cache"),
    (dict(cache_layout="dsv4-fp4"), "k: a dsv4-fp4 cache is uint8 (num_blocks, block_size, 1, 368), got torch.uint8 "
                                    "(3, 64, 1, 584)"),
    (dict(cache_layout="int8"), "k: cache_layout expected one of dsv4-fp8, dsv4-fp4, got 'int8'"),
    (dict(indices=torch.zeros(2, 1, 12, **I32)[:, :, ::2]),
     "indices: expected a contiguous last dim (stride 1), got strides (12, 12, 2)"),
])
def test_sparse_calls_refused(change, message):
    q, cache, kw = _sparse()
    _refused(message, q, cache, cache, **(kw | change))


def test_a_quantized_cache_is_k_is_v_read_by_bf16_queries_of_its_head_dim():
    q, cache, kw = _sparse()
    _refused("v: a dsv4-fp8 cache holds K = V: pass the same tensor as k and v", q, cache, cache.clone(), **kw)
    _refused("q: a dsv4-fp8 cache is read by bf16 queries of head dim 512, got fp32 head dim 512",
             q.float(), cache, cache, **kw)


def test_a_kernel_that_declares_no_source_refuses_paged_and_sparse_calls_with_reasons():
    q, k, v, kw = _paged()
    with pytest.raises(NotSupportedError, match=r"^no paged KV cache$"):
        check_attention_args(q, k, v, capabilities=FULL_CONTRACT, **kw)
    q, cache, kw = _sparse()
    caps = Capabilities(sources=frozenset({"dense", "sparse"}), max_topk=4, cache_layouts=frozenset())
    with pytest.raises(NotSupportedError, match=re.escape("top-k 6 > max 4; no dsv4-fp8 cache")):
        check_attention_args(q, cache, cache, capabilities=caps, **kw)


def test_a_quantized_cache_keeps_its_pages_padded():
    """The layout pads each page to a multiple of 576 bytes; a cache whose block stride is not
    (a copy that packed the pages together) is refused, naming the stride it needs: kernels
    load a page's rows 16 bytes at a time from its start."""
    q, cache, kw = _sparse()
    packed = torch.zeros(cache.shape[0], cache.shape[1] * 584, dtype=torch.uint8).view(cache.shape)
    _refused("k: a dsv4-fp8 page of 64 tokens takes 37440 bytes (padded to a multiple of 576), so the block stride "
             "is a multiple of 576 of at least that; got 37376", q, packed, packed, **kw)


@pytest.mark.parametrize("token_stride", [0, 2 * 584])
def test_a_quantized_cache_keeps_its_tokens_packed(token_stride):
    """A page is one format (every token's data, then every token's scales): kernels read it as one
    run of bytes from the page's start, whatever the token stride says. A cache whose tokens are not
    584 bytes apart (a broadcast token, every other token of a wider buffer) is refused."""
    q, cache, kw = _sparse()
    strided = torch.zeros(3 * 2 * cache.stride(0), dtype=torch.uint8).as_strided(
        cache.shape, (2 * cache.stride(0), token_stride, 584, 1))
    _refused(f"k: a dsv4-fp8 page's tokens are packed, 584 bytes apart (the page is one format: "
             f"fmha.contract.cache_layouts), so the token stride is 584; got {token_stride}", q, strided, strided, **kw)


def test_a_kernel_built_for_some_head_counts_and_top_k_steps_says_so():
    q, cache, kw = _sparse(Hq=4)  # top-k 6
    caps = Capabilities(sources=frozenset({"dense", "sparse"}), heads_q=(64, 128), topk_multiple_of=64,
                        cache_layouts=frozenset({"dsv4-fp8"}), unquantized_caches=False)
    with pytest.raises(NotSupportedError, match=re.escape("Hq=4 unsupported (supports [64, 128]); top-k 6 not a "
                                                          "multiple of 64")):
        check_attention_args(q, cache, cache, capabilities=caps, **kw)
    with pytest.raises(ValueError, match="unquantized_caches=False: name the cache_layouts"):
        Capabilities(unquantized_caches=False)

"""The float64 oracle over contract-v2 sources (paged, ragged, index-sparse, two scopes) equals
independent scalar loops written from the contract's words, on tiny shapes whose caches hold
shuffled and shared pages and NaN wherever no key should be read."""

import pytest
import torch

from fmha.oracles import dense_reference
from fmha.oracles.oracle import Dense, Paged, Sparse, attention, oracle_over
from fmha.oracles.tests import bruteforce

F64 = dict(rtol=1e-12, atol=1e-12)
NAN = float("nan")


def _cache(num_blocks, block_size, heads, dim, generator, poison=()):
    cache = torch.randn(num_blocks, block_size, heads, dim, dtype=torch.float64, generator=generator)
    for block, offset in poison:
        cache[block, offset] = NAN
    return cache


def _paged_case(generator, block_size=2):
    """Three requests of 5, 0 and 7 keys over shuffled pages; requests 0 and 2 share their
    first page; every slot no request reads is NaN."""
    kv_lens = torch.tensor([5, 0, 7], dtype=torch.int32)
    pages = torch.randperm(12, generator=generator).tolist()
    per_request = [-(-int(n) // block_size) for n in kv_lens]
    table = torch.full((3, max(per_request) + 1), 7_000, dtype=torch.int32)  # entries past a request's pages: never read
    table[0, :per_request[0]] = torch.tensor(pages[:per_request[0]])
    table[2, 0] = table[0, 0]
    table[2, 1:per_request[2]] = torch.tensor(pages[per_request[0]:per_request[0] + per_request[2] - 1])
    read = {(int(table[b, j // block_size]), j % block_size) for b in range(3) for j in range(int(kv_lens[b]))}
    poison = [(p, o) for p in range(12) for o in range(block_size) if (p, o) not in read]
    k_cache = _cache(12, block_size, 2, 4, generator, poison)
    v_cache = _cache(12, block_size, 2, 3, generator, poison)
    return k_cache, v_cache, table, kv_lens


def _tensor(nested):
    return torch.tensor(nested, dtype=torch.float64)


@pytest.mark.parametrize("block_size", [1, 2, 3])
@pytest.mark.parametrize("mask", [dict(), dict(causal=True), dict(window=2)], ids=["full", "causal", "window2"])
@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
def test_paged_oracle_matches_scalar_loops(block_size, mask, with_sink):
    g = torch.Generator().manual_seed(block_size)
    k_cache, v_cache, table, kv_lens = _paged_case(g, block_size)
    q = torch.randn(3, 2, 4, 4, dtype=torch.float64, generator=g)
    sink = torch.randn(4, dtype=torch.float64, generator=g) if with_sink else None
    o, lse = attention(q, [Paged(k_cache, v_cache, table, kv_lens)], sink=sink, **mask)
    assert not o.isnan().any(), "a poisoned slot leaked"
    o_bf, lse_bf = bruteforce.paged_attention(q.tolist(), k_cache.tolist(), v_cache.tolist(), table.tolist(),
                                              kv_lens.tolist(), sink=None if sink is None else sink.tolist(), **mask)
    torch.testing.assert_close(o, _tensor(o_bf), **F64)
    torch.testing.assert_close(lse, _tensor(lse_bf), **F64)


def test_ragged_queries_each_aligned_on_their_own_kv_length_match_scalar_loops():
    g = torch.Generator().manual_seed(7)
    k_cache, v_cache, table, kv_lens = _paged_case(g, block_size=3)
    cu_seqlens_q = torch.tensor([0, 2, 3, 6], dtype=torch.int32)  # 2, 1 (no keys) and 3 query rows
    q = torch.randn(6, 4, 4, dtype=torch.float64, generator=g)
    for mask in (dict(), dict(causal=True), dict(window=2)):
        o, lse = attention(q, [Paged(k_cache, v_cache, table, kv_lens)],
                                   cu_seqlens_q=cu_seqlens_q, **mask)
        assert o.shape == (6, 4, 3) and lse.shape == (4, 6)
        o_bf, lse_bf = bruteforce.paged_attention(q.tolist(), k_cache.tolist(), v_cache.tolist(), table.tolist(),
                                                  kv_lens.tolist(), cu_seqlens_q=cu_seqlens_q.tolist(), **mask)
        torch.testing.assert_close(o, _tensor(o_bf), **F64)
        torch.testing.assert_close(lse, _tensor(lse_bf), **F64)
        assert (o[2] == 0).all() and (lse[:, 2] == -torch.inf).all(), "a request with no keys"


def _sparse_scope(generator, num_blocks, block_size, topk, topk_len):
    """Indices (2, 2, topk) into shuffled slots with -1s, a repeated index, an all-invalid row;
    every slot they do not read is NaN."""
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:2 * 2 * topk].view(2, 2, topk)
    indices = slots.clone().to(torch.int32)
    indices[0, 0, 1] = -1
    indices[0, 1, 2] = indices[0, 1, 0]  # read twice: counts twice
    indices[1, 1, :] = -1  # a row with no key in this scope
    visible = (indices != -1) & (torch.arange(topk) < torch.tensor(topk_len).view(2, 1, 1))
    read = {int(s) for s in indices[visible]}
    poison = [(s // block_size, s % block_size) for s in range(num_blocks * block_size) if s not in read]
    k_cache = _cache(num_blocks, block_size, 1, 4, generator, poison)
    return k_cache, indices, torch.tensor(topk_len, dtype=torch.int32)


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("two_scopes", [False, True], ids=["one-scope", "two-scopes"])
def test_sparse_oracle_matches_scalar_loops(with_sink, two_scopes):
    """K = V (one cache, as DeepSeek-V4), one KV head for 3 query heads; the second scope has
    its own block size, top-k and lengths."""
    g = torch.Generator().manual_seed(11)
    scopes = [_sparse_scope(g, 6, 5, 4, [3, 4])]
    if two_scopes:
        scopes.append(_sparse_scope(g, 7, 2, 3, [3, 0]))
    q = torch.randn(2, 2, 3, 4, dtype=torch.float64, generator=g)
    sink = torch.randn(3, dtype=torch.float64, generator=g) if with_sink else None
    o, lse = attention(q, [Sparse(c, c, i, n) for c, i, n in scopes], sink=sink, causal=True)
    assert not o.isnan().any(), "a poisoned slot leaked"
    o_bf, lse_bf = bruteforce.sparse_attention(q.tolist(), [(c.tolist(), c.tolist(), i.tolist(), n.tolist())
                                                            for c, i, n in scopes],
                                               sink=None if sink is None else sink.tolist())
    torch.testing.assert_close(o, _tensor(o_bf), **F64)
    torch.testing.assert_close(lse, _tensor(lse_bf), **F64)
    if not two_scopes:
        assert (o[1, 1] == 0).all(), "the all-invalid row"
        assert (lse[1, :, 1] == (sink if with_sink else -torch.inf)).all()


def test_paged_and_sparse_over_the_same_keys_equal_the_dense_oracle():
    """One request's dense keys laid out on reversed pages, and as indices of exactly the keys
    each causal row sees: both equal contract v1's oracle."""
    g = torch.Generator().manual_seed(3)
    T, S, block_size = 3, 7, 2
    q = torch.randn(1, T, 4, 8, dtype=torch.float64, generator=g)
    k = torch.randn(1, S, 2, 8, dtype=torch.float64, generator=g)
    v = torch.randn(1, S, 2, 5, dtype=torch.float64, generator=g)
    o, lse = dense_reference.attention(q, k, v, causal=True)
    pages = 4
    padded = lambda x: torch.cat([x[0], x[0].new_zeros(pages * block_size - S, *x.shape[2:])])  # noqa: E731
    k_cache = padded(k).view(pages, block_size, 2, 8).flip(0)
    v_cache = padded(v).view(pages, block_size, 2, 5).flip(0)
    table = torch.arange(pages - 1, -1, -1, dtype=torch.int32)[None]
    paged = Paged(k_cache, v_cache, table, torch.tensor([S], dtype=torch.int32))
    o_paged, lse_paged = attention(q, [paged], causal=True)
    slot = lambda j: int(table[0, j // block_size]) * block_size + j % block_size  # noqa: E731
    indices = torch.tensor([[[slot(j) if j <= S - T + i else -1 for j in range(S)] for i in range(T)]],
                           dtype=torch.int32)
    o_sparse, lse_sparse = attention(q, [Sparse(k_cache, v_cache, indices)])
    for got in ((o_paged, lse_paged), (o_sparse, lse_sparse)):
        torch.testing.assert_close(got[0], o, **F64)
        torch.testing.assert_close(got[1], lse, **F64)


def test_the_oracles_scales_over_pages_equal_the_dense_oracles():
    """Everything the verdict measures against (o over |v|, the logits' RMS and magnitude,
    the underflow allowance) is the dense call's when the pages hold the dense keys, and the
    answer is the plain reference's."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 3, 4, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 6, 2, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, 6, 2, 5, dtype=torch.float64, generator=g)
    sink = torch.randn(4, dtype=torch.float64, generator=g)
    dense = oracle_over(q, [Dense(k, v)], sink=sink, scale=0.3)
    table = torch.tensor([[1, 0, 2], [4, 5, 3]], dtype=torch.int32)  # pages of 2: request b, keys 2i, 2i+1
    k_cache, v_cache = torch.empty(6, 2, 2, 8, dtype=torch.float64), torch.empty(6, 2, 2, 5, dtype=torch.float64)
    for b in range(2):
        for i in range(3):
            k_cache[table[b, i]], v_cache[table[b, i]] = k[b, 2 * i:2 * i + 2], v[b, 2 * i:2 * i + 2]
    paged = oracle_over(q, [Paged(k_cache, v_cache, table, torch.tensor([6, 6], dtype=torch.int32))],
                           sink=sink, scale=0.3)
    for name in ("o", "lse", "o_abs", "o_squares", "logit_magnitude", "underflow"):
        torch.testing.assert_close(getattr(paged, name), getattr(dense, name), **F64, msg=name)
    assert paged.logit_rms == pytest.approx(dense.logit_rms, rel=1e-12)
    o, lse = dense_reference.attention(q, k, v, sink=sink, scale=0.3)
    torch.testing.assert_close(dense.o, o, **F64)
    torch.testing.assert_close(dense.lse, lse, **F64)


def _samples_of_every_source():
    from fmha.contract.problem import Problem
    from fmha.oracles.sample import Sample

    dense = Problem(batch=2, q_len=5, kv_len=23, heads_q=4, heads_kv=2, head_dim=16, causal=True, window=9, sink=True)
    paged = Problem(batch=3, q_len=4, kv_len=21, heads_q=6, heads_kv=2, head_dim=16, causal=True,
                    source="paged", ragged=True, block_size=4)
    sparse = Problem(batch=2, q_len=2, kv_len=19, heads_q=4, heads_kv=1, head_dim=512, shared_kv=True, sink=True,
                     source="sparse", block_size=64, cache_layout="dsv4-fp8", extra_topk=13, extra_block_size=4,
                     extra_cache_layout="dsv4-fp4")
    return [Sample(problem=dense, seed=3), Sample(problem=paged, seed=4, kv_lens=(21, 0, 9), q_lens=(4, 1, 0)),
            Sample(problem=sparse, seed=5, invalid=0.25, repeats=0.25),
            Sample(problem=dense.replace(window=None), seed=6, distribution="large_logits")]


@pytest.mark.parametrize("sample", _samples_of_every_source(), ids=lambda s: s.problem.source)
def test_the_oracle_in_passes_of_keys_equals_it_in_one(sample, monkeypatch):
    """The GPU scale tier's requests of 128k keys are answered in passes of KEY_CHUNK keys: the
    same answer and scales as one pass, on every source, with a sink, a window, rows without keys."""
    from fmha.oracles import oracle
    from fmha.oracles.check import oracle_of

    x = sample.inputs("cpu")
    whole = oracle_of(x)
    monkeypatch.setattr(oracle, "KEY_CHUNK", 3)
    passes = oracle_of(x)
    for name in ("o", "lse", "o_abs", "o_squares", "logit_magnitude", "underflow"):
        want = getattr(whole, name)  # sums that cancel: within their terms' rounding, not their own
        torch.testing.assert_close(getattr(passes, name), want, rtol=1e-12, atol=1e-13 * float(want.abs().max()), msg=name)
    assert passes.logit_rms == pytest.approx(whole.logit_rms, rel=1e-12)
    if sample.problem.source == "paged":
        assert whole.lse.isinf().any(), "a request without keys was meant to be drawn"


def test_passes_of_keys_weigh_tied_keys_past_1e17_by_their_count():
    """Logits near -5e37: lse rounds to the largest logit, so passes merged by exp(lse_i - lse)
    would give each pass's tied keys one pass's weight; o is the mean of the values either way."""
    from fmha.oracles.oracle import attend

    g = torch.Generator().manual_seed(0)
    q = torch.full((1, 1, 4), -2.0**62, dtype=torch.float64)
    keys = torch.full((1, 7, 1, 4), 2.0**62, dtype=torch.float64)
    values = torch.randn(1, 7, 1, 3, dtype=torch.float64, generator=g)
    visible = torch.ones(1, 7, dtype=torch.bool)
    o, _ = attend(q, keys, values, visible, 1.0, None, key_chunk=3)  # passes of 3, 3 and 1 keys
    torch.testing.assert_close(o[0, 0], values[0, :, 0].mean(0), **F64)

"""Contract-v2 samples hold the keys their dense draw holds, where their block tables and
indices say, with poison everywhere else; the bytes a kernel gets decode to what the oracle
reads."""

import math

import pytest
import torch

from fmha.oracles import quantization, dense_reference, storage
from fmha.oracles.oracle import attention, from_call, largest_logit, oracle_over
from fmha.oracles.sample import Sample
from fmha.contract import Problem
from fmha.contract.problem import LOGIT_LIMIT

F64 = dict(rtol=1e-12, atol=1e-12)
PAGED = Problem(batch=3, q_len=2, kv_len=9, heads_q=4, heads_kv=2, head_dim=16, head_dim_v=8, dtype=torch.float32,
                causal=True, source="paged", block_size=4)
SPARSE = Problem(batch=2, q_len=2, kv_len=7, heads_q=4, heads_kv=1, head_dim=16, dtype=torch.float32, sink=True,
                 shared_kv=True, source="sparse", block_size=3)


def _dense(sample):
    """The sample as a dense contract-v1 call: the same draw."""
    dense = sample.problem.replace(source="dense", block_size=None, ragged=False)
    return sample.replace(problem=dense, kv_lens=None, q_lens=None, topk_lens=None, invalid=0.0,
                          shared_pages=False).inputs()


@pytest.mark.parametrize("block_size", [1, 4, 5, 16])
def test_full_length_pages_hold_the_dense_draw(block_size):
    sample = Sample(problem=PAGED.replace(block_size=block_size), seed=4)
    x, dense = sample.inputs(), _dense(sample)
    got = oracle_over(x.q, x.oracle_sources, causal=True)
    want_o, want_lse = dense_reference.attention(dense.q, dense.k, dense.v, causal=True)
    torch.testing.assert_close(got.o, want_o, **F64)
    torch.testing.assert_close(got.lse, want_lse, **F64)


def test_every_slot_and_table_entry_no_request_reads_is_poison():
    sample = Sample(problem=PAGED, kv_lens=(9, 0, 5), shared_pages=True, seed=2)
    x = sample.inputs()
    table, kv_lens = x.source_args["block_table"], x.source_args["kv_lens"]
    read = {(int(table[b, j // 4]), j % 4) for b in range(3) for j in range(int(kv_lens[b]))}
    for block in range(x.k.shape[0]):
        for offset in range(4):
            assert x.k[block, offset].isnan().all() == ((block, offset) not in read), (block, offset)
    for b in range(3):
        for i in range(-(-int(kv_lens[b]) // 4), table.shape[1]):
            assert x.k[int(table[b, i])].isnan().all(), f"request {b}'s entry {i} past its pages is not poison"
    assert int(table[2, 0]) == int(table[0, 0]), "request 2 shares request 0's first page"


@pytest.mark.parametrize("laid_out", [("block_table", "zero:B"), ("block_table", "overlap:B"),
                                     ("k", "zero:num_blocks"), ("k", "zero:block_size"), ("indices", "overlap:B"),
                                     ("indices", "overlap:T")])
def test_ids_and_pages_that_share_memory_read_drawn_keys_only(laid_out):
    """A block table whose requests share memory (one row for all; a row running into the next),
    a cache whose pages or slots are one, rows of indices running into the next: every key a row
    sees is a drawn one (never the poison of a page the draw gave no request), the kernel is handed
    the form, and the oracle judges what the kernel reads."""
    name, form = laid_out
    problem = SPARSE if name == "indices" else PAGED.replace(window=3)
    lengths = dict(topk_lens=(7, 4)) if name == "indices" else dict(kv_lens=(9, 3, 6))
    laid = dict(k_storage=form) if name == "k" else dict(storage=((name, form),))
    sample = Sample(problem=problem, seed=3, **laid, **lengths).replace(
        hazards=("invisible-keys", "padded-pages", "wide-block-table", "invalid-runs"))
    x = sample.inputs()
    got = x.k if name == "k" else x.source_args[name]
    assert form in storage.observed(got, storage.record(name, sample.problem)), f"{form}: not what the kernel gets"
    mask = dict(causal=problem.causal, window=problem.window, sink=x.sink)
    o = oracle_over(x.q, x.oracle_sources, **mask).o
    assert torch.isfinite(o).all(), f"{form}: a row read poison"
    want = oracle_over(x.q, from_call(x.k, x.v, **x.source_args), **mask).o
    torch.testing.assert_close(o, want, **F64)


def test_ragged_queries_are_each_requests_rows_packed():
    sample = Sample(problem=PAGED.replace(ragged=True), kv_lens=(9, 0, 5), q_lens=(2, 1, 0), seed=1)
    x, dense = sample.inputs(), _dense(sample)
    assert x.source_args["cu_seqlens_q"].tolist() == [0, 2, 3, 3]
    torch.testing.assert_close(x.q, torch.cat([dense.q[0], dense.q[1, :1]]), rtol=0, atol=0)


def test_sparse_indices_read_exactly_the_requests_keys_in_every_row():
    sample = Sample(problem=SPARSE, seed=3)
    x, dense = sample.inputs(), _dense(sample)
    got = oracle_over(x.q, x.oracle_sources, sink=x.sink)
    want_o, want_lse = dense_reference.attention(dense.q, dense.k, dense.v, sink=dense.sink)
    torch.testing.assert_close(got.o, want_o, **F64)
    torch.testing.assert_close(got.lse, want_lse, **F64)
    slots = x.k.shape[0] * x.k.shape[1]
    read = set(x.source_args["indices"].flatten().tolist())
    unread = [s for s in range(slots) if s not in read]
    assert unread and x.k.flatten(0, 1)[unread].isnan().all()


def test_invalid_indices_and_topk_lengths_take_keys_away():
    sample = Sample(problem=SPARSE, seed=3, invalid=0.3, topk_lens=(7, 2))
    x = sample.inputs()
    indices = x.source_args["indices"]
    # some entries -1, not all (a share drawn at 0.3 of 28 entries: 0.14-0.54 over run seeds)
    assert 0 < int((indices == -1).sum()) < indices.numel() and x.source_args["topk_len"].tolist() == [7, 2]
    got_o, _ = attention(x.q, x.oracle_sources, sink=x.sink)
    dense = _dense(sample)
    b, t = 1, 0  # request 1 reads its first two indices only
    keys = [int(s) for s in indices[b, t, :2] if s != -1]
    k = x.k.flatten(0, 1)[keys][None]
    o, _ = dense_reference.attention(dense.q[b:b + 1, t:t + 1], k, k, sink=dense.sink)
    torch.testing.assert_close(got_o[b, t], o[0, 0], **F64)


@pytest.mark.parametrize("layout, extra_layout", [("dsv4-fp8", None), ("dsv4-fp8", "dsv4-fp4")])
def test_quantized_bytes_decode_to_what_the_oracle_reads_and_unread_tokens_to_nan(layout, extra_layout):
    problem = Problem(batch=2, q_len=1, kv_len=5, heads_q=4, heads_kv=1, head_dim=512, shared_kv=True,
                      source="sparse", block_size=3, cache_layout=layout,
                      **(dict(extra_topk=2, extra_block_size=2, extra_cache_layout=extra_layout) if extra_layout else {}))
    x = Sample(problem=problem, seed=5).inputs()
    scopes = [(x.k, layout, x.oracle_sources[0])]
    if extra_layout:
        scopes.append((x.source_args["extra_k_cache"], extra_layout, x.oracle_sources[1]))
    for cache, name, oracle_source in scopes:
        spec = quantization.LAYOUTS[name]
        assert cache.dtype == torch.uint8 and cache.shape[2:] == (1, spec.token_bytes)
        decoded = from_call(cache, cache, indices=oracle_source.indices, cache_layout=name)[0].k_cache
        assert torch.equal(decoded.nan_to_num(7.0), oracle_source.k_cache.nan_to_num(7.0))
        read = set(oracle_source.indices.flatten().tolist()) - {-1}
        flat = decoded.flatten(0, 1)
        assert all(flat[s].isnan().all() == (s not in read) for s in range(flat.shape[0]))
        assert math.isfinite(float(flat[sorted(read)].abs().max()))


@pytest.mark.parametrize("source", ["paged", "sparse"])
def test_a_quantized_caches_drawn_scale_and_outliers_reach_its_bytes(source):
    """cache_exponent multiplies every key the call reads by 2^e exactly (ue8m0 scales are powers
    of two); outliers make each tile's first element 2^14 times the others, and at 2^0 make q's
    elements facing them 2^14 smaller, so the small codes carry the logits."""
    problem = Problem(batch=2, q_len=2, kv_len=5, heads_q=4, heads_kv=1, head_dim=512, shared_kv=True, source=source,
                      block_size=3, cache_layout="dsv4-fp8")
    plain, shifted, outlying = (Sample(problem=problem, seed=5, **fields).inputs()
                                for fields in ({}, dict(cache_exponent=96), dict(outliers=True)))

    def read_keys(x):
        keys = x.oracle_sources[0].k_cache.flatten(0, 2)
        return keys[keys.isfinite().all(-1)][:, :448]

    assert torch.equal(read_keys(shifted), read_keys(plain) * 2.0 ** 96)
    tiles = read_keys(outlying).unflatten(-1, (7, 64)).abs()
    assert (tiles[..., 0] >= tiles[..., 1:].amax(-1) * 2.0 ** 13).all()
    facing = torch.zeros(512, dtype=torch.bool)
    facing[:448:64] = True
    torch.testing.assert_close(outlying.q[..., facing], plain.q[..., facing] * 2.0 ** -14, rtol=0, atol=0)
    assert torch.equal(outlying.q[..., ~facing], plain.q[..., ~facing])


@pytest.mark.parametrize("source", ["paged", "sparse"])
def test_keys_at_two_to_the_96_beside_outliers_reach_the_logit_limit_and_never_pass_it(source):
    """Every logit ends within the contract's +-2^127 (past it the fp32 LSE is infinite, and a
    kernel's -inf is the right rounding): the draws get close to the edge, not over it."""
    problem = Problem(batch=2, q_len=2, kv_len=5, heads_q=4, heads_kv=1, head_dim=512, shared_kv=True, source=source,
                      block_size=3, cache_layout="dsv4-fp8")
    tops = []
    for seed in range(6):
        x = Sample(problem=problem, seed=seed, scale=1.0, distribution="negative_logits", cache_exponent=96,
                   outliers=True).inputs()
        tops.append(largest_logit(x.q, x.oracle_sources, scale=1.0))
    assert max(tops) <= LOGIT_LIMIT and max(tops) > LOGIT_LIMIT / 2, tops

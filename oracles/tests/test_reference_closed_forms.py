"""Closed forms the oracle must reproduce exactly (up to float64 rounding), one per test."""

import math

import torch

from fmha.contract import Problem
from fmha.oracles import dense_reference
from fmha.oracles.sample import Sample

F64 = dict(rtol=1e-12, atol=1e-12)


def _attend(problem, x, **changes):
    kw = x.kwargs()
    kw.update(changes)
    return dense_reference.attention(x.q, x.k, x.v, **kw)


def test_constant_scores_give_the_mean_of_the_visible_v_rows():
    problem = Problem(batch=1, q_len=3, kv_len=7, heads_q=2, heads_kv=1, head_dim=8, dtype=torch.float32, window=4)
    x = Sample(problem=problem, distribution="constant_scores", seed=0).inputs()
    o, lse = _attend(problem, x)
    visible = dense_reference.visibility_mask(3, 7, True, 4)
    for i in range(3):
        keys = visible[i].nonzero().flatten()
        expected = x.v[0, keys, 0].double().mean(dim=0)
        for h in range(2):
            torch.testing.assert_close(o[0, i, h], expected, **F64)
            assert lse[0, h, i] == math.log(len(keys))


def test_keys_tied_at_a_logit_past_float64s_log_resolution_give_their_mean():
    """At s ~ -5e37 the log of the sum is below half an ulp of the max, so lse rounds to it: the
    weights must still sum to 1 (the oracle once gave each of n tied keys a weight of 1)."""
    q = torch.ones(1, 1, 1, 4, dtype=torch.float64)
    k = torch.full((1, 6, 1, 4), -2.5e37, dtype=torch.float64)  # every logit -5e37 at scale 1
    v = torch.arange(24, dtype=torch.float64).view(1, 6, 1, 4)
    o, lse = dense_reference.attention(q, k, v, scale=0.5)
    torch.testing.assert_close(o[0, 0, 0], v[0, :, 0].mean(dim=0), **F64)
    assert lse[0, 0, 0] == -5e37


def test_one_visible_key_gives_that_row():
    problem = Problem(batch=2, q_len=4, kv_len=6, heads_q=4, heads_kv=2, head_dim=8, dtype=torch.float32, window=1)
    x = Sample(problem=problem, distribution="peaky", seed=1).inputs()
    o, _ = _attend(problem, x)
    for i in range(4):
        key = 6 - 4 + i  # bottom-right: the row's own position
        torch.testing.assert_close(o[:, i], x.v[:, key].double().repeat_interleave(2, dim=1), **F64)


def test_sink_minus_infinity_equals_no_sink():
    problem = Problem(batch=1, q_len=5, kv_len=9, heads_q=4, heads_kv=1, head_dim=8, dtype=torch.float32, causal=True, sink=True)
    x = Sample(problem=problem, distribution="normal", seed=2).inputs()
    with_sink = _attend(problem, x, sink=torch.full((4,), -math.inf))
    without = _attend(problem, x, sink=None)
    for a, b in zip(with_sink, without):
        torch.testing.assert_close(a, b, **F64)


def test_window_at_least_s_equals_causal():
    problem = Problem(batch=1, q_len=5, kv_len=9, heads_q=2, heads_kv=2, head_dim=8, dtype=torch.float32, causal=True)
    x = Sample(problem=problem, distribution="normal", seed=3).inputs()
    causal = _attend(problem, x)
    for window in (9, 10, 100):
        for a, b in zip(_attend(problem, x, window=window), causal):
            torch.testing.assert_close(a, b, **F64)


def test_rows_before_the_first_key_are_empty_when_t_exceeds_s():
    problem = Problem(batch=1, q_len=7, kv_len=3, heads_q=2, heads_kv=1, head_dim=8, dtype=torch.float32, causal=True)
    x = Sample(problem=problem, distribution="normal", seed=4).inputs()
    o, lse = _attend(problem, x)
    empty = 7 - 3  # rows 0..3 sit at positions -4..-1
    assert torch.equal(o[:, :empty], torch.zeros_like(o[:, :empty]))
    assert torch.isneginf(lse[..., :empty]).all()
    assert torch.isfinite(lse[..., empty:]).all() and torch.isfinite(o).all()


def test_empty_rows_with_a_sink_have_lse_equal_to_the_sink():
    problem = Problem(batch=1, q_len=7, kv_len=3, heads_q=2, heads_kv=1, head_dim=8, dtype=torch.float32, causal=True, sink=True)
    x = Sample(problem=problem, distribution="normal", seed=4).inputs()
    o, lse = _attend(problem, x)
    assert torch.equal(o[:, :4], torch.zeros_like(o[:, :4]))
    torch.testing.assert_close(lse[0, :, :4], x.sink.double()[:, None].expand(2, 4), **F64)

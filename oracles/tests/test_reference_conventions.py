"""Conventions of the contract the oracle must follow: natural-log LSE including the sink,
o reproducible from lse, and the D5 merge rules."""

import math

import torch

from fmha.contract import Problem
from fmha.oracles import dense_reference
from fmha.oracles.sample import Sample

F64 = dict(rtol=1e-12, atol=1e-12)


def test_lse_is_the_natural_log_of_the_denominator_including_the_sink():
    problem = Problem(batch=1, q_len=1, kv_len=2, heads_q=1, heads_kv=1, head_dim=4, dtype=torch.float32, sink=True)
    x = Sample(problem=problem, distribution="normal", seed=0).inputs()
    _, lse = dense_reference.attention(x.q, x.k, x.v, sink=x.sink)
    s = (x.q[0, 0, 0].double() @ x.k[0, :, 0].double().T) / 2  # scale 4 ** -0.5
    expected = math.log(math.exp(s[0]) + math.exp(s[1]) + math.exp(float(x.sink[0])))
    assert abs(float(lse[0, 0, 0]) - expected) < 1e-12


def test_o_is_reproducible_from_lse():
    problem = Problem(batch=2, q_len=4, kv_len=11, heads_q=4, heads_kv=2, head_dim=8, dtype=torch.float32, window=6, sink=True)
    x = Sample(problem=problem, distribution="peaky", seed=1).inputs()
    o, lse = dense_reference.attention(x.q, x.k, x.v, window=6, sink=x.sink)
    scores = dense_reference.logits(x.q, x.k)
    visible = dense_reference.visibility_mask(4, 11, True, 6)
    weights = torch.exp(scores - lse[..., None]) * visible  # (B, H, T, S)
    o_from_lse = torch.einsum("bhts,bshd->bthd", weights, x.v.double().repeat_interleave(2, dim=2))
    torch.testing.assert_close(o_from_lse, o, **F64)


def _split_and_merge(x, problem, cut, sink):
    parts = [
        dense_reference.attention(x.q, x.k[:, lo:hi], x.v[:, lo:hi])
        for lo, hi in ((0, cut), (cut, problem.kv_len))
    ]
    return dense_reference.merge(parts, sink=sink)


def test_merge_of_disjoint_key_sets_equals_attention_over_all_keys():
    problem = Problem(batch=1, q_len=3, kv_len=10, heads_q=2, heads_kv=1, head_dim=8, dtype=torch.float32, sink=True)
    x = Sample(problem=problem, distribution="normal", seed=2).inputs()
    o, lse = dense_reference.attention(x.q, x.k, x.v, sink=x.sink)
    for cut in (0, 1, 5, 10):  # 0 and 10 leave one part empty
        o_m, lse_m = _split_and_merge(x, problem, cut, x.sink)
        torch.testing.assert_close(o_m, o, **F64)
        torch.testing.assert_close(lse_m, lse, **F64)


def test_merge_ignores_empty_parts_and_never_gives_nan():
    o = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    empty = (torch.zeros_like(o), torch.full((1, 3, 2), -math.inf, dtype=torch.float64))
    lse = torch.randn(1, 3, 2, dtype=torch.float64)
    merged_o, merged_lse = dense_reference.merge([empty, (o, lse), empty])
    torch.testing.assert_close(merged_o, o, **F64)
    torch.testing.assert_close(merged_lse, lse, **F64)
    all_empty_o, all_empty_lse = dense_reference.merge([empty, empty])
    assert torch.equal(all_empty_o, torch.zeros_like(o)) and torch.isneginf(all_empty_lse).all()
    sink = torch.tensor([0.5, -1.0, 2.0])
    sink_o, sink_lse = dense_reference.merge([empty], sink=sink)
    assert torch.equal(sink_o, torch.zeros_like(o))
    torch.testing.assert_close(sink_lse, sink.double().view(1, 3, 1).expand(1, 3, 2), **F64)

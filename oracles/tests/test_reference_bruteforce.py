"""The float64 oracle equals an independent scalar-loop implementation on tiny shapes."""

import pytest
import torch

from fmha.contract import Problem
from fmha.oracles import dense_reference
from fmha.oracles.sample import Sample
from fmha.oracles.tests import bruteforce

TINY = [
    Problem(batch=2, q_len=3, kv_len=5, heads_q=4, heads_kv=2, head_dim=4, head_dim_v=3, dtype=torch.float32),
    Problem(batch=2, q_len=3, kv_len=5, heads_q=4, heads_kv=2, head_dim=4, head_dim_v=3, dtype=torch.float32, causal=True),
    Problem(batch=1, q_len=4, kv_len=6, heads_q=3, heads_kv=1, head_dim=4, dtype=torch.float32, window=2, sink=True),
    Problem(batch=1, q_len=5, kv_len=3, heads_q=2, heads_kv=2, head_dim=4, dtype=torch.float32, causal=True, sink=True),  # T > S: empty rows
    Problem(batch=1, q_len=5, kv_len=3, heads_q=2, heads_kv=1, head_dim=4, dtype=torch.float32, causal=True),  # empty rows, no sink
    Problem(batch=1, q_len=2, kv_len=4, heads_q=2, heads_kv=1, head_dim=4, dtype=torch.float32, shared_kv=True, causal=True),
]


@pytest.mark.parametrize("problem", TINY, ids=lambda p: p.id)
@pytest.mark.parametrize("distribution", ["normal", "peaky", "large_logits"])
def test_oracle_matches_scalar_loops(problem, distribution):
    x = Sample(problem=problem, distribution=distribution, seed=3).inputs()
    o, lse = dense_reference.attention(x.q, x.k, x.v, causal=problem.causal, window=problem.window, sink=x.sink)
    sink = None if x.sink is None else x.sink.tolist()
    o_bf, lse_bf = bruteforce.attention(
        x.q.double().tolist(), x.k.double().tolist(), x.v.double().tolist(),
        causal=problem.causal, window=problem.window, sink=sink,
    )
    torch.testing.assert_close(o, torch.tensor(o_bf, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.tensor(lse_bf, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_ksplit_attention_equals_attention():
    problem = Problem(batch=1, q_len=4, kv_len=9, heads_q=4, heads_kv=2, head_dim=16, dtype=torch.float32, window=5, sink=True)
    x = Sample(problem=problem, distribution="split_halves_energy", seed=1).inputs()
    kw = dict(causal=True, window=5, sink=x.sink)
    o, lse = dense_reference.attention(x.q, x.k, x.v, **kw)
    for splits in (2, 4):
        o_s, lse_s = dense_reference.ksplit_attention(x.q, x.k, x.v, splits=splits, **kw)
        torch.testing.assert_close(o_s, o, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse_s, lse, rtol=1e-12, atol=1e-12)


def test_merging_per_half_softmaxes_is_not_ksplit_attention():
    """Seed 000 §2: k_sub halves are additive in logit space; the D5 merge of their
    softmaxes is a different function (this is what the logit-vs-weight-merge trap checks)."""
    problem = Problem(batch=1, q_len=4, kv_len=9, heads_q=2, heads_kv=2, head_dim=16, dtype=torch.float32)
    x = Sample(problem=problem, distribution="split_halves_energy", seed=1).inputs()
    scale = 16 ** -0.5
    halves = [
        dense_reference.attention(qh, kh, x.v, scale=scale)
        for qh, kh in zip(x.q.chunk(2, -1), x.k.chunk(2, -1))
    ]
    o_wrong, _ = dense_reference.merge(halves)
    o, _ = dense_reference.ksplit_attention(x.q, x.k, x.v, splits=2)
    assert (o_wrong - o).norm() / o.norm() > 0.05

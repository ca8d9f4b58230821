"""The float64 oracle equals an independent scalar-loop implementation on tiny shapes."""

import pytest
import torch

from fmha.problem import Problem
from oracles import reference
from oracles.inputs import make_inputs
from oracles.tests import bruteforce

TINY = [
    Problem(2, 3, 5, 4, 2, 4, head_dim_v=3, dtype=torch.float32),
    Problem(2, 3, 5, 4, 2, 4, head_dim_v=3, dtype=torch.float32, causal=True),
    Problem(1, 4, 6, 3, 1, 4, dtype=torch.float32, window=2, sink=True),
    Problem(1, 5, 3, 2, 2, 4, dtype=torch.float32, causal=True, sink=True),  # T > S: empty rows
    Problem(1, 5, 3, 2, 1, 4, dtype=torch.float32, causal=True),  # empty rows, no sink
    Problem(1, 2, 4, 2, 1, 4, dtype=torch.float32, shared_kv=True, causal=True),
]


@pytest.mark.parametrize("problem", TINY, ids=lambda p: p.id)
@pytest.mark.parametrize("distribution", ["normal", "peaky", "large_logits"])
def test_oracle_matches_scalar_loops(problem, distribution):
    x = make_inputs(problem, distribution, seed=3)
    o, lse = reference.attention(x.q, x.k, x.v, causal=problem.causal, window=problem.window, sink=x.sink)
    sink = None if x.sink is None else x.sink.tolist()
    o_bf, lse_bf = bruteforce.attention(
        x.q.double().tolist(), x.k.double().tolist(), x.v.double().tolist(),
        causal=problem.causal, window=problem.window, sink=sink,
    )
    torch.testing.assert_close(o, torch.tensor(o_bf, dtype=torch.float64), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, torch.tensor(lse_bf, dtype=torch.float64), rtol=1e-12, atol=1e-12)


def test_ksplit_attention_equals_attention():
    problem = Problem(1, 4, 9, 4, 2, 16, dtype=torch.float32, window=5, sink=True)
    x = make_inputs(problem, "split_halves_energy", seed=1)
    kw = dict(causal=True, window=5, sink=x.sink)
    o, lse = reference.attention(x.q, x.k, x.v, **kw)
    for splits in (2, 4):
        o_s, lse_s = reference.ksplit_attention(x.q, x.k, x.v, splits=splits, **kw)
        torch.testing.assert_close(o_s, o, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(lse_s, lse, rtol=1e-12, atol=1e-12)


def test_merging_per_half_softmaxes_is_not_ksplit_attention():
    """Seed 000 §2: k_sub halves are additive in logit space; the D5 merge of their
    softmaxes is a different function (this is what the logit-vs-weight-merge trap checks)."""
    problem = Problem(1, 4, 9, 2, 2, 16, dtype=torch.float32)
    x = make_inputs(problem, "split_halves_energy", seed=1)
    scale = 16 ** -0.5
    halves = [
        reference.attention(qh, kh, x.v, scale=scale)
        for qh, kh in zip(x.q.chunk(2, -1), x.k.chunk(2, -1))
    ]
    o_wrong, _ = reference.merge(halves)
    o, _ = reference.ksplit_attention(x.q, x.k, x.v, splits=2)
    assert (o_wrong - o).norm() / o.norm() > 0.05

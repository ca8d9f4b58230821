"""Every selected merge callable implements the D5 merge: parts over disjoint key sets (empty
ones included) merge to attention over all keys, with the sink added at the merge."""

import math

import pytest
import torch

from fmha.contract import Problem
from fmha.oracles import dense_reference
from fmha.oracles.sample import Sample
from fmha.oracles.metrics import measure
from fmha.oracles.verdict import judge

CASES = [
    (problem.replace(dtype=dtype), cuts)
    for problem, cuts in [
        # empty parts at both ends
        (Problem(batch=2, q_len=3, kv_len=200, heads_q=4, heads_kv=1, head_dim=64, sink=True), (0, 0, 77, 128, 200, 200)),
        # DSV4: SWA | sparse
        (Problem(batch=1, q_len=1, kv_len=640, heads_q=8, heads_kv=1, head_dim=512, sink=True, shared_kv=True),
         (0, 128, 640)),
        (Problem(batch=1, q_len=4, kv_len=96, heads_q=2, heads_kv=2, head_dim=64), (0, 1, 95, 96)),
    ]
    for dtype in (torch.bfloat16, torch.float16, torch.float32)
]


def _parts(problem, x, cuts):
    """Each part: attention over keys [lo, hi) without sink, rounded as a kernel returns it."""
    parts = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        o, lse = dense_reference.attention(x.q, x.k[:, lo:hi], x.v[:, lo:hi])
        parts.append((o.to(problem.dtype), lse.float()))
    return parts


@pytest.mark.parametrize("problem, cuts", CASES, ids=[f"{p.id}-cuts{'_'.join(map(str, c))}" for p, c in CASES])
def test_merge_of_key_splits_equals_attention_over_all_keys(merge_kernel, problem, cuts, device):
    x = Sample(problem=problem).inputs(device)
    o, lse = merge_kernel(_parts(problem, x, cuts), sink=x.sink)
    oracle_o, oracle_lse = dense_reference.attention(x.q, x.k, x.v, sink=x.sink)
    # Parts arrive rounded to the dtype (as kernels return them): within the verdict's margin.
    verdict = judge(measure(o, oracle_o, lse, oracle_lse))
    assert verdict.passed, verdict.message(f"{merge_kernel.name} {problem.id}")


def test_all_parts_empty_gives_zero_and_minus_infinity_or_the_sink(merge_kernel, device):
    o_part = torch.full((1, 2, 3, 64), float("nan"), device=device)  # an empty part's o may hold anything
    lse_part = torch.full((1, 3, 2), -math.inf, device=device)
    o, lse = merge_kernel([(o_part, lse_part), (o_part, lse_part)])
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(lse).all(), (o, lse)
    sink = torch.tensor([0.5, -1.0, 2.0], device=device)
    o, lse = merge_kernel([(o_part, lse_part)], sink=sink)
    assert torch.equal(o, torch.zeros_like(o))
    assert torch.equal(lse, sink.view(1, 3, 1).expand(1, 3, 2)), lse

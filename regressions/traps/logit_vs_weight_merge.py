"""logit-vs-weight-merge (seed 000, section 2): at head dim 512 the QK GEMM is split into
two k_sub halves. The halves are additive in logit space (S = S_0 + S_1); merging two
attention outputs computed from the halves with the D5 (LSE) formula is a different
operation, and wrong. Only accumulating S_0 + S_1 before the softmax is correct."""

import dataclasses

import torch

from fmha.kernels.torch_merge import merge
from fmha.contract import Problem
from fmha.dispatch import attention
from fmha.regressions.mutation import Mutant, wrapped_kernel
from fmha.regressions.trap import Trap, reproducer
from fmha.kernels.triton_dense import CAPABILITIES  # dense calls only: the mutant wraps fmha.attention's

TRAP = Trap(
    id="logit-vs-weight-merge", seed_logs=("000",),
    symptom="hd 512 outputs are visibly wrong whenever the head-dim halves disagree about which keys matter",
    root_cause="the two head-dim halves of QK^T were attended separately and merged with the LSE (weight-space) formula",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=64, heads_q=8, heads_kv=1, head_dim=512, shared_kv=True),
                      "split_halves_energy", why="DSV4-like decode; the halves carry different logit patterns"),
           reproducer(Problem(batch=1, q_len=16, kv_len=48, heads_q=2, heads_kv=1, head_dim=512, causal=True),
                      why="prefill, N(0,1)")),
)


def _merge_k_sub_halves(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
    half = q.shape[-1] // 2
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    parts = [attention(q[..., part], k[..., part], v, scale=scale, causal=causal, window=window)
             for part in (slice(0, half), slice(half, None))]
    o, lse = merge(parts, sink)
    if out is not None:
        out.copy_(o)
        o = out
    return o, lse.to(torch.float32)


MUTANTS = (
    Mutant(
        "logit-vs-weight-merge", TRAP.id,
        "attends the two head-dim halves separately and merges them with the D5 formula",
        lambda: wrapped_kernel("logit-vs-weight-merge", _merge_k_sub_halves, dataclasses.replace(
            CAPABILITIES, head_dims=(512,), notes={"head_dim": "the k_sub split exists at head dim 512"})),
    ),
)

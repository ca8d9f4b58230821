"""missing-scale (seed 003): the MMA computes the unscaled dot product; 1/sqrt(hd) must be
applied in the softmax, and was forgotten."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="missing-scale", seed_logs=("003",),
    symptom="the softmax is far too peaky (logits sqrt(hd) times too large); the LSE is off even with one key",
    root_cause="the softmax used the raw QK^T dot products without 1/sqrt(head_dim)",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=64, heads_q=4, heads_kv=1, head_dim=128), why="decode, N(0,1)"),
           reproducer(Problem(batch=1, q_len=8, kv_len=32, heads_q=2, heads_kv=2, head_dim=64, causal=True),
                      "flat", why="flat scores: the missing scale is the only signal")),
)

MUTANTS = (
    Mutant(
        "missing-scale", TRAP.id, "scales the logits by log2(e) only, without 1/sqrt(head_dim)",
        lambda: patched_triton_kernel("missing-scale", ("s = s * qk_scale", "s = s * 1.4426950408889634")),
    ),
)

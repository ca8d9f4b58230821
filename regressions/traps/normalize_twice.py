"""normalize-twice (seed 002): P was already normalised in the softmax step, and the
epilogue divided by the row sum again: O = O_correct / row_sum, 128x too small on uniform
data over 128 keys. Every row still points the right way, so cosine alone is blind to it;
the magnitude check is not."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="normalize-twice", seed_logs=("002",),
    symptom="the output is row_sum times too small (128x on uniform scores over 128 keys); cosine is still ~1",
    root_cause="the epilogue divides by the softmax row sum although P was already normalised",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=128, heads_q=4, heads_kv=1, head_dim=64),
                      "constant_scores", why="uniform weights: row sum = 128"),
           reproducer(Problem(batch=1, q_len=32, kv_len=64, heads_q=2, heads_kv=2, head_dim=128, causal=True),
                      why="prefill; rows sum different numbers of keys")),
)

MUTANTS = (
    Mutant(
        "normalize-twice", TRAP.id, "the epilogue divides the accumulator by the row sum twice",
        lambda: patched_triton_kernel("normalize-twice", (
            "o = acc / tl.where(empty, 1.0, l_i)[:, None]",
            "o = acc / tl.where(empty, 1.0, l_i)[:, None] / tl.where(empty, 1.0, l_i)[:, None]",
        )),
    ),
)

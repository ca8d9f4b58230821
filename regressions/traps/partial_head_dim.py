"""partial-head-dim (seeds 000, 003): the QK GEMM covered 64 of the 128 (256, 512) head
dims (seed 000), and a K staging routine read the source with stride 16 where K's stride
was 64 (seed 003): the dot products were partial, the scores wrong."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="partial-head-dim", seed_logs=("000", "003"),
    symptom="correct at head dim 64, wrong above it; with energy only in the upper head dims the scores are all zero",
    root_cause="QK^T summed over the first 64 head dims only",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=64, heads_q=4, heads_kv=1, head_dim=128),
                      "upper_half_energy", why="all the logit signal sits in dims 64-127"),
           reproducer(Problem(batch=1, q_len=1, kv_len=64, heads_q=8, heads_kv=1, head_dim=512, shared_kv=True),
                      "upper_half_energy", why="DSV4-like decode")),
)

MUTANTS = (
    Mutant(
        "partial-head-dim", TRAP.id, "q's head dims 64 and above are masked out of QK^T",
        lambda: patched_triton_kernel(
            "partial-head-dim", ('EVEN_D=D == num_d * tiles["BLOCK_D"]', "EVEN_D=False"),  # masks always on
            ("(cols < D)", "(cols < 64)")),
    ),
)

"""multi-tile-rescale (seeds 000, 002): with more than one KV tile the running output must
be rescaled by exp(m_old - m_new) whenever the running maximum rises. The seed kernel's
rescale was wrong for n > 128 (000) and, before the fix, missing (002); a single tile (the
only case first tested) needs no rescale, so it hid."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="multi-tile-rescale", seed_logs=("000", "002"),
    symptom="exact with one KV tile, wrong with several whenever a later tile holds a larger logit",
    root_cause="the output accumulator was not rescaled when the running maximum changed between KV tiles",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=256, heads_q=4, heads_kv=1, head_dim=64),
                      "rising_max", why="the maximum rises in every KV tile"),
           reproducer(Problem(batch=1, q_len=16, kv_len=200, heads_q=2, heads_kv=1, head_dim=128),
                      "rising_max", why="prefill rows, a partial last tile")),
)

MUTANTS = (
    Mutant(
        "multi-tile-rescale", TRAP.id, "skips the accumulator rescale when the running maximum rises",
        lambda: patched_triton_kernel("multi-tile-rescale", ("acc = acc * alpha[:, None]", "acc = acc")),
    ),
)

"""unmasked-padding (seed 002): the softmax loop was hard-coded to SK_TILE = 128, so K and
V were padded to 128 keys when S < 128, and the pad was not masked: the padded keys (logit
0, value 0) took softmax weight from the real ones."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="unmasked-padding", seed_logs=("002",),
    symptom="wrong (shrunk) outputs whenever S is not a multiple of the KV tile, exact when it is",
    root_cause="keys past S in the last KV tile were not masked out of the softmax",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=100, heads_q=4, heads_kv=1, head_dim=64),
                      why="S = 100: the last tile of 64 or 128 keys is part padding"),
           reproducer(Problem(batch=1, q_len=4, kv_len=100, heads_q=8, heads_kv=1, head_dim=128, shared_kv=True),
                      "flat", why="MTP decode, flat scores: pad weight is large")),
)

MUTANTS = (Mutant("unmasked-padding", TRAP.id, "the softmax sees every column of the last KV tile, including the pad",
                  lambda: patched_triton_kernel("unmasked-padding", ("visible = (cols < hi)[None, :]",
                                                                     "visible = (cols >= 0)[None, :]"))),)

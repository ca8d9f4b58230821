"""gqa-head-mapping (seed 002, not in the trap table of docs/contract.md): the MQA launch shares one K/V
head across query heads through k_head_stride = 0. Generalising that to GQA is where the
classic mapping bug lives: query head h must read KV head h // group; reading h % Hkv
(interleaved) is right for MHA and MQA and wrong for every other group size."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="gqa-head-mapping", seed_logs=("002",),
    source="seed 002: the MQA launch (k_head_stride = 0), generalised to GQA",
    symptom="MHA and MQA pass; GQA heads attend to another head's keys",
    root_cause="query head h mapped to KV head h % Hkv instead of h // (Hq / Hkv)",
    cases=(reproducer(Problem(batch=1, q_len=4, kv_len=64, heads_q=8, heads_kv=2, head_dim=64),
                      why="GQA group 4 over 2 KV heads"),
           reproducer(Problem(batch=2, q_len=1, kv_len=96, heads_q=6, heads_kv=3, head_dim=128, shared_kv=True),
                      why="decode, group 2, K = V")),
)

MUTANTS = (
    Mutant(
        "gqa-head-mapping", TRAP.id, "query head g * Hkv + kvh reads KV head kvh (interleaved instead of grouped)",
        lambda: patched_triton_kernel("gqa-head-mapping", ("h = kvh * G + rows % G", "h = (rows % G) * HKV + kvh")),
    ),
)

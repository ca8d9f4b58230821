"""cores-mn-layout (seed 002): V's canonical shared-memory layout was built with
CORES_MN = 16 instead of 2 (V is the B operand with block_mn = 16), so the P.V MMA read V
through the wrong core-matrix indexing: garbage P.V. The mutant reads V transposed inside
each 8 x 8 core matrix (key and head-dim index swapped within a core)."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="cores-mn-layout", seed_logs=("002",),
    symptom="P.V is garbage (cosine far below 1) while QK^T and the softmax are right",
    root_cause="the canonical layout of V used the wrong number of core matrices along MN (16 instead of 2)",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=64, heads_q=4, heads_kv=1, head_dim=64),
                      "iota_v", why="v[s, d] = s + d/Dv: a permuted read shows as a wrong ramp"),
           reproducer(Problem(batch=1, q_len=16, kv_len=128, heads_q=2, heads_kv=2, head_dim=128),
                      why="prefill, two KV tiles")),
)

MUTANTS = (
    Mutant(
        "cores-mn-layout", TRAP.id, "reads V transposed inside each 8 x 8 core matrix",
        lambda: patched_triton_kernel("cores-mn-layout", (
            "v = V.load([b, start, kvh, dv0]).reshape(BLOCK_N, BLOCK_DV)\n",
            "v = V.load([b, start, kvh, dv0]).reshape(BLOCK_N, BLOCK_DV)\n"
            "        v = v.reshape(BLOCK_N // 8, 8, BLOCK_DV // 8, 8).permute(0, 3, 2, 1).reshape(BLOCK_N, BLOCK_DV)\n",
        )),
    ),
)

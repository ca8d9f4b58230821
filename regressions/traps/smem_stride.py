"""smem-stride (seed 002): write_smem_canonical strided by NTHREADS = 192 while only the
load warp (32 threads) ran it, so 32 of 2048 elements of the K tile were written; the MMA
read stale shared memory for the rest. The mutant stages 1 in 64 elements of each K tile
and leaves the rest zero."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="smem-stride", seed_logs=("002",),
    symptom="scores are mostly garbage: the K tile in shared memory is mostly unwritten",
    root_cause="a cooperative shared-memory copy strided by the CTA size (192) while one warp (32 threads) ran it",
    cases=(reproducer(Problem(batch=1, q_len=8, kv_len=128, heads_q=2, heads_kv=1, head_dim=64),
                      why="two KV tiles of N(0,1) keys"),
           reproducer(Problem(batch=2, q_len=1, kv_len=96, heads_q=4, heads_kv=1, head_dim=128, shared_kv=True),
                      "peaky", why="decode, K = V, peaky scores")),
)

MUTANTS = (
    Mutant(
        "smem-stride", TRAP.id, "stages only every 64th element of each K tile",
        lambda: patched_triton_kernel("smem-stride", (
            "ka = K.load([b, start, kvh, ca]).reshape(BLOCK_N, BLOCK_D)\n",
            "ka = K.load([b, start, kvh, ca]).reshape(BLOCK_N, BLOCK_D)\n"
            "        ka = tl.where((tl.arange(0, BLOCK_N)[:, None] * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]) % 64 == 0, ka, 0.0)\n",
        )),
    ),
)

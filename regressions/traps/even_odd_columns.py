"""even-odd-columns (seed 003, not in the trap table of docs/contract.md): "offset descriptors DON'T WORK
for (128,64) SMEM with K-tile offsets. Even/odd column corruption." An MMA descriptor offset
into the staged K tile read adjacent head-dim columns swapped in every K-tile after the
first. The mutant swaps each even/odd pair of K's head dims from dim 64 on."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="even-odd-columns", seed_logs=("003",),
    source="seed 003, 'Key lessons': offset descriptors, even/odd column corruption",
    symptom="correct at head dim 64, wrong above it (the first K-tile is right)",
    root_cause="a shared-memory descriptor offset for K-tiles after the first swapped even and odd head-dim columns",
    cases=(reproducer(Problem(batch=1, q_len=1, kv_len=64, heads_q=4, heads_kv=1, head_dim=128),
                      why="the second half of the head dim is a later K-tile"),
           reproducer(Problem(batch=1, q_len=8, kv_len=64, heads_q=2, heads_kv=1, head_dim=256),
                      "peaky", why="several K-tiles, peaky scores")),
)

MUTANTS = (
    Mutant(
        "even-odd-columns", TRAP.id, "reads K's head dims 64 and above with each even/odd pair swapped",
        lambda: patched_triton_kernel("even-odd-columns", (
            "ka = K.load([b, start, kvh, ca]).reshape(BLOCK_N, BLOCK_D)\n",
            "ka = K.load([b, start, kvh, ca]).reshape(BLOCK_N, BLOCK_D)\n"
            "        even, odd = tl.split(ka.reshape(BLOCK_N, BLOCK_D // 2, 2))\n"  # not tl.flip: 20x slower interpreted
            "        ka = tl.where((ca + tl.arange(0, BLOCK_D) >= 64)[None, :],\n"
            "                      tl.join(odd, even).reshape(BLOCK_N, BLOCK_D), ka)\n",
        )),
    ),
)

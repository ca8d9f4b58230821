"""illegal-memory-access (seed 003, not in the DESIGN.md table): "tcgen05.mma TS crashed
with illegal memory access -- likely TMEM A operand addressing". The P.V operand was
addressed wrong. On a GPU the kernel raises an illegal memory access, which also poisons
the CUDA context for every later call in the process; through the CPU interpreter it is a
segmentation fault. Either way the framework must report it against this case and go on."""

from fmha.problem import Problem
from regressions.mutation import Mutant, patched_triton_kernel
from regressions.trap import Trap, reproducer

TRAP = Trap(
    id="illegal-memory-access",
    seeds=("003",),
    source="seed 003, 'Next steps': tcgen05.mma TS crashed with illegal memory access",
    symptom="CUDA error: an illegal memory access was encountered (a segmentation fault when interpreted)",
    root_cause="the P.V operand's address was computed wrong and the load was not masked",
    cases=(reproducer(Problem(1, 16, 64, 2, 1, 64), why="any launch that reaches P.V"),),
)

MUTANTS = (
    Mutant(
        "illegal-memory-access", TRAP.id, "loads V from 2^40 elements past its base, unmasked",
        lambda: patched_triton_kernel("illegal-memory-access", (
            "v_base + cols[:, None] * stride_vs + offs_dv[None, :],\n"
            "            mask=col_ok[:, None] & dv_ok[None, :], other=0.0,",
            "v_base + 1099511627776 + cols[:, None] * stride_vs + offs_dv[None, :],",
        )),
        isolate="crash",
    ),
)

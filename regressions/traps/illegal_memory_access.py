"""illegal-memory-access (seed 003, not in the trap table of docs/contract.md): "tcgen05.mma TS crashed
with illegal memory access -- likely TMEM A operand addressing". The P.V operand was
addressed wrong. Our K and V come through TMA descriptors, which zero-fill what lies out
of bounds instead of faulting, so the mutant addresses the one operand still loaded through
pointers, q. On a GPU the kernel raises an illegal memory access, which also poisons
the CUDA context for every later call in the process; through the CPU interpreter it is a
segmentation fault. Either way the framework must report it against this case and go on."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="illegal-memory-access", seed_logs=("003",),
    source="seed 003, 'Next steps': tcgen05.mma TS crashed with illegal memory access",
    symptom="CUDA error: an illegal memory access was encountered (a segmentation fault when interpreted)",
    root_cause="the P.V operand's address was computed wrong and the load was not masked",
    cases=(reproducer(Problem(batch=1, q_len=16, kv_len=64, heads_q=2, heads_kv=1, head_dim=64),
                      why="any launch that reaches P.V"),),
)

MUTANTS = (
    Mutant(
        "illegal-memory-access", TRAP.id, "loads q from 2^40 elements past its base, unmasked",
        lambda: patched_triton_kernel("illegal-memory-access", (
            "qa = _load_columns(q_base, ca + offs_d, row_ok, D, EVEN_D)",
            "qa = tl.load(q_base + 1099511627776 + (ca + offs_d)[None, :])",
        )),
        isolate="crash",
    ),
)

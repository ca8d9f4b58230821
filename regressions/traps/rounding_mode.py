"""rounding-mode (seed 003, not in the trap table of docs/contract.md): float-to-narrow conversions were
emulated with threshold comparisons, and "2.75 must use >= (not >) to match round(5.5) = 6
RNE": a conversion that does not round to nearest even. For attention outputs the same bug
is a bf16 cast that truncates (Triton 3.6's interpreter does exactly this: fmha.kernels.triton_utils
round_for_bf16 exists because of it). Each element is off by under one ulp, inside every
per-element tolerance; only the bias, half an ulp toward zero on average, gives it away."""

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, patched_triton_kernel
from fmha.regressions.symptoms import rounding_bias
from fmha.regressions.trap import Trap, reproducer

TRAP = Trap(
    id="rounding-mode", seed_logs=("003",),
    source="seed 003: threshold RNE, '2.75 must use >= (not >)'",
    symptom="outputs are biased toward zero by half a bf16 ulp; cosine, error ratio and ulp bounds all pass",
    root_cause="the fp32 -> bf16 output conversion truncates instead of rounding to nearest even",
    cases=(reproducer(Problem(batch=1, q_len=32, kv_len=64, heads_q=4, heads_kv=2, head_dim=128),
                      why="16384 outputs: the mean error in ulps resolves a bias of a few hundredths"),
    ),
    symptoms=(rounding_bias,),
)

MUTANTS = (
    Mutant(
        "rounding-mode", TRAP.id, "truncates the fp32 output to bf16 (round toward zero)",
        lambda: patched_triton_kernel("rounding-mode", (
            "if UPCAST and O.dtype.element_ty == tl.bfloat16:\n        o = round_for_bf16(o)",
            "if O.dtype.element_ty == tl.bfloat16:\n        o = ((o.to(tl.uint32, bitcast=True) >> 16) << 16).to(tl.float32, bitcast=True)",
        )),
    ),
)

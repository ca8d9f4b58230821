"""Symptom checks the verdict's tolerances cannot see, one function per symptom."""

from __future__ import annotations

import torch

from fmha.contract import DTYPE_NAMES, Problem
from fmha.oracles.metrics import MANTISSA_BITS

# Round-to-nearest-even leaves a median error of 0 ulp, truncation -0.5 ulp toward zero. The
# median, because elements near zero (cancellation) carry errors of tens of ulps in a correct
# kernel (CPU SDPA flash: mean +0.43, std 57, median -0.002 ulp on the rounding-mode case).
# Measured medians of correct kernels on that case, seeds 0-2, CPU: triton,
# sdpa-math and sdpa-flash all within ±0.01 ulp; the truncating mutant -0.5.
MAX_ROUNDING_BIAS_ULP = 0.15


def rounding_bias(o: torch.Tensor, oracle: torch.Tensor, problem: Problem) -> str | None:
    """The median signed error in output ulps, toward zero negative: a kernel that truncates
    (or rounds toward zero) when casting to bf16/fp16 is biased by half an ulp."""
    if problem.dtype == torch.float32:
        return None
    ref = oracle.double()
    ok = torch.isfinite(o) & (ref != 0)
    if not ok.any():
        return None
    spacing = torch.exp2(torch.floor(torch.log2(ref.abs())) - MANTISSA_BITS[problem.dtype])
    error_ulp = ((o.double() - ref) * ref.sign() / spacing)[ok]
    bias = float(error_ulp.median())
    if abs(bias) <= MAX_ROUNDING_BIAS_ULP:
        return None
    direction = "toward zero (truncation?)" if bias < 0 else "away from zero"
    return (f"rounding bias: median signed error {bias:+.3f} {DTYPE_NAMES[problem.dtype]} ulp {direction} over "
            f"{error_ulp.numel()} elements, allowed ±{MAX_ROUNDING_BIAS_ULP} (round-to-nearest-even is unbiased)")

"""Small pieces shared by the Triton kernels."""

import os

import triton
import triton.language as tl


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@triton.jit
def round_for_bf16(x):
    """fp32 -> fp32 rounded to nearest-even at bf16 precision. The interpreter's fp32 -> bf16
    cast truncates (Triton 3.6), which shrinks outputs by ~0.2% on average; after this the
    truncating cast is exact. Only used when interpreting."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)

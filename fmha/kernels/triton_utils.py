"""Small pieces shared by the Triton kernels."""

import math
import os

import torch
import triton
import triton.language as tl

from fmha.kernels import interpreter


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


if interpreting():
    interpreter.install()


def upcast_under_interpreter(dtype: torch.dtype) -> bool:
    """Whether `mma` computes in fp32 (UPCAST): bf16 and fp16 under the interpreter, whose bf16
    arithmetic works on the bits and whose fp16 dot sums in fp16."""
    return interpreting() and dtype in (torch.bfloat16, torch.float16)


def triton_availability(device) -> str | None:
    """Why fmha's Triton kernels cannot take tensors on `device` in this process, or None: a
    process that compiles for the GPU cannot run them on CPU tensors."""
    if getattr(device, "type", device) == "cpu" and not interpreting():
        return ("CPU tensors need Triton's interpreter, and this process compiles for the GPU (set "
                "TRITON_INTERPRET=1 before importing fmha; fmha sets it only where CUDA is absent)")
    return None


@triton.jit
def round_for_bf16(x):
    """fp32 -> bf16, rounded to nearest-even, built from the bits. The interpreter's own casts
    between fp32 and bf16 truncate, and get subnormals wrong (Triton 3.6: 5.5e-40 stored as
    6.1e-39), so an interpreted kernel stores this instead. Only used when interpreting."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return bits.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def pow2(exponent):
    """2^exponent in fp32, exactly, for integer exponents in [-126, 127]."""
    return ((exponent + 127) << 23).to(tl.float32, bitcast=True)


# The online softmax holds a row's running sum l and accumulator sum(p v) at 2^-e of their value,
# e = floor(log2(l)) as of the previous key tile (0 before any): the accumulator then stays
# within (2 + BLOCK_N) |v|max instead of growing to (keys) |v|max. Without it a hundred keys tied
# at a row's max logit, with values near 3e36 (a quantized cache at scale 2^96 with an outlier
# channel, whose logit the ties come from), summed past fp32's 3.4e38 and the row came back NaN
# where its answer was 700. Powers of two: the held values are the old ones scaled exactly, so o
# keeps its bits; p is multiplied by 2^-e rather than 2^-e taken inside exp2's argument, where a
# logit of -7e37 absorbs it. A weight p 2^-e flushed to zero is below 2^-126 l: within the
# oracle's underflow allowance. fp16 P keeps e = 0: 2^-e would push its weights below fp16's
# normals, and fp16 values cannot overflow the sum.
@triton.jit
def renormalize(held, e):
    """(2^-k, e + k): the power of two that brings `held` (a row's running sum, held at 2^-e of
    its value, rescaled to the tile's max) into [1, 2), and the exponent the row is then held at,
    never below 0 (the tile's own weights reach 1). k from held's exponent bits: exact, and a
    held sum of 0 (nothing yet) or below the normals goes back to e = 0."""
    k = tl.maximum(((held.to(tl.int32, bitcast=True) >> 23) & 255) - 127, -e)
    return pow2(-k), e + k


# Below the scores' scale, the room q.k's partial sums get: they can exceed the logit itself where
# terms cancel (keys at scale 2^96, scale 1: a logit of 1.5e38 summed through partial sums of
# 1.3e39, past fp32's 3.4e38, and the row came back NaN).
QK_HEADROOM_LOG2 = 8


def q_unit(qk_scale: float, dtype: torch.dtype) -> float:
    """The power of two q is scaled by before q.k: 2^-8 of the largest not above the scores'
    scale (at most 2^-8, at least 2^-64), so that the fp32 accumulator holds well under the logit,
    not the dot product, which overflows first (keys of a quantized cache at scale 2^96: a logit of
    -9e37 is a dot of -2e39, and the row read as empty). Exact in bf16 and fp32 (q's values below
    2^-110 aside); fp16 keeps 1 (its keys are fp16: no overflow, and q's small values would fall
    below fp16's normals)."""
    if dtype == torch.float16:
        return 1.0
    return 2.0 ** max(-64, min(0, math.floor(math.log2(qk_scale))) - QK_HEADROOM_LOG2)


def pv_mode(dtype: torch.dtype) -> int:
    """How `mma` multiplies in `dtype`: 1 bf16 (P as hi + lo), 0 fp16, 2 IEEE fp32."""
    return {torch.bfloat16: 1, torch.float16: 0, torch.float32: 2}[dtype]


@triton.jit
def mma(a, b, acc, PV_MODE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + a @ b: IEEE fp32 for fp32 operands (never TF32), in fp32 when UPCAST (bf16 and fp16
    under the interpreter, whose bf16 arithmetic works on the bits and whose fp16 dot sums in fp16)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif PV_MODE == 2:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)

"""The D5 merge of partial attention results as a Triton kernel (fmha.merge runs it).

    L = log(sum_i exp(lse_i) + exp(sink));  o = sum_i exp(lse_i - L) * o_i

A program merges a block of output rows (b, h, t). Parts are combined in fp32 relative to their maximum
LSE, so no exp overflows; an empty part (lse = -inf) is skipped, not multiplied by 0 (its o
may hold anything); with every part empty o = 0 and L = -inf (or the sink). Also used by
fmha.attention to combine its KV splits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fmha.contract import check_merge_args
from fmha.kernels.triton_utils import interpreting, round_for_bf16


# Sizes are runtime values, never specialised: one compile per tile shape, not per problem.
@triton.jit(do_not_specialize=("stride_lp", "stride_lb", "stride_lh", "stride_Lb", "stride_Lh",
                               "N_ROWS", "NUM_PARTS", "HQ", "T", "DV"))
def _merge_kernel(
    O_PART, LSE_PART, SINK, O, LSE,
    stride_op, stride_ob, stride_ot, stride_oh,
    stride_lp, stride_lb, stride_lh,
    stride_Ob, stride_Ot, stride_Oh,
    stride_Lb, stride_Lh,
    N_ROWS, NUM_PARTS, HQ, T, DV,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr, EVEN_DV: tl.constexpr,  # EVEN_DV: DV == BLOCK_DV
    HAS_SINK: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)  # output rows (b, h, t), flattened
    row_ok = rows < N_ROWS
    b = rows // (HQ * T)
    h = (rows // T) % HQ
    t = rows % T
    lse_base = LSE_PART + b * stride_lb + h * stride_lh + t
    o_base = O_PART + b * stride_ob + t * stride_ot + h * stride_oh
    offs = tl.arange(0, BLOCK_DV)
    dv_ok = (offs < BLOCK_DV) if EVEN_DV else (offs < DV)

    m = tl.full([BLOCK_R], float("-inf"), tl.float32)
    for i in range(NUM_PARTS):
        m = tl.maximum(m, tl.load(lse_base + i * stride_lp, mask=row_ok, other=float("-inf")))
    if HAS_SINK:
        sink = tl.load(SINK + h, mask=row_ok, other=float("-inf"))
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)

    total = tl.full([BLOCK_R], 0.0, tl.float32)
    acc = tl.full([BLOCK_R, BLOCK_DV], 0.0, tl.float32)
    for i in range(NUM_PARTS):
        lse_i = tl.load(lse_base + i * stride_lp, mask=row_ok, other=float("-inf"))
        live = lse_i > float("-inf")
        w = tl.where(live, tl.exp(lse_i - m_safe), 0.0)
        total += w
        # An empty part's o is never read: it may hold anything (0 * NaN would be NaN).
        part = tl.load(o_base[:, None] + i * stride_op + offs[None, :],
                       mask=(row_ok & live)[:, None] & dv_ok[None, :], other=0.0)
        acc += w[:, None] * part.to(tl.float32)
    if HAS_SINK:
        total += tl.exp(sink - m_safe)
    empty = total == 0.0
    o = acc / tl.where(empty, 1.0, total)[:, None]
    lse = tl.where(empty, float("-inf"), m_safe + tl.log(tl.where(empty, 1.0, total)))
    if ROUND_BF16:
        o = round_for_bf16(o)
    o_ptrs = O + b[:, None] * stride_Ob + t[:, None] * stride_Ot + h[:, None] * stride_Oh + offs[None, :]
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & dv_ok[None, :])
    tl.store(LSE + b * stride_Lb + h * stride_Lh + t, lse, mask=row_ok)


ELEMENTS_PER_PROGRAM = 4096  # rows x Dv per program: many rows per program when Dv is small


def merge_into(o, lse, o_parts, lse_parts, sink=None) -> None:
    """Merge stacked parts o_parts (P, B, T, H, Dv), lse_parts (P, B, H, T) into o, lse."""
    P, B, T, H, DV = o_parts.shape
    if o.numel() == 0:
        return
    if sink is not None:  # the kernel reads Hq floats one after another; the contract allows any strides
        sink = sink.contiguous()
    rows = B * H * T
    block_dv = triton.next_power_of_2(DV)
    block_r = min(max(1, ELEMENTS_PER_PROGRAM // block_dv), triton.next_power_of_2(rows))
    _merge_kernel[(triton.cdiv(rows, block_r),)](
        o_parts, lse_parts, sink if sink is not None else lse_parts, o, lse,
        o_parts.stride(0), o_parts.stride(1), o_parts.stride(2), o_parts.stride(3),
        lse_parts.stride(0), lse_parts.stride(1), lse_parts.stride(2),
        o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1),
        rows, P, H, T, DV,
        BLOCK_R=block_r, BLOCK_DV=block_dv, EVEN_DV=DV == block_dv, HAS_SINK=sink is not None,
        ROUND_BF16=interpreting() and o.dtype == torch.bfloat16,
        num_warps=4,
    )


def merge(parts, sink=None):
    """The contract's merge: parts = [(o_i (B, T, H, Dv), lse_i (B, H, T) float32), ...]."""
    B, T, H, DV = check_merge_args(parts, sink)
    dtype, device = parts[0][0].dtype, parts[0][0].device
    o_parts = torch.stack([o.float() for o, _ in parts])
    lse_parts = torch.stack([lse for _, lse in parts]).contiguous()
    o = torch.empty(B, T, H, DV, dtype=dtype, device=device)
    lse = torch.empty(B, H, T, dtype=torch.float32, device=device)
    merge_into(o, lse, o_parts, lse_parts, sink)
    return o, lse


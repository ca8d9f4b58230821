"""fmha.attention: one Triton forward kernel for the whole contract.

Tiling. A program owns BLOCK_M query rows of one (batch, KV head) and loops over keys in
tiles of BLOCK_N with an online softmax (running max and sum, base 2). Its rows are packed
(t, g) pairs, g the query head within the KV head's group: for decode (T = 1, many heads on
one KV head, DSV4) a tile holds the heads; for prefill it holds positions; GQA mixes both.
Each row keeps its own position S - T + t for the causal and window masks, and the key range
a program visits is cut to the keys its rows can see.

Head dims above 256 (up to 512): QK^T is accumulated over head-dim chunks of BLOCK_D before
the softmax (logits are additive over head-dim chunks; softmaxes are not: seed 000, §2).

Precision of P.V (DESIGN.md: bf16 P costs ~1e-6 of cosine, below the 0.999998 gate):
- bf16: P = P_hi + P_lo, both bf16, two MMAs against bf16 V. P keeps ~16 bits; V stays in
  its own dtype, so |V| up to bf16's range neither overflows nor loses accuracy.
- fp16: P in fp16 (11 bits) against fp16 V: one MMA.
- fp32: IEEE fp32 dots throughout.
Under the CPU interpreter bf16 is upcast to fp32 before any arithmetic (Triton interpreter
issues 11584, 11604), so the same tiling and masking run with fp32 dots.

Split-KV: decode-like problems split key ranges longer than 1024 into fixed-size chunks
across programs; each writes a normalised fp32 partial and its LSE, and fmha.triton_merge
combines them (adding the sink there), exactly as the contract's D5 merge. The chunk size
does not depend on the batch, so results are batch-invariant.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from fmha.capabilities import Capabilities, KernelEntry
from fmha.contract import check_attention_args
from fmha.triton_merge import merge_into
from fmha.triton_utils import interpreting, round_for_bf16

LOG2E = 1.4426950408889634  # the kernel works in base 2; inside it the literals carry the names

HEAD_DIMS = tuple(range(16, 513, 16))


@triton.jit
def _attention_fwd(
    Q, K, V, SINK, O, LSE,
    stride_qb, stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_os, stride_ob, stride_ot, stride_oh,
    stride_ls, stride_lb, stride_lh,
    T, S, HQ, G, WINDOW, qk_scale, keys_per_split,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, HAS_SINK: tl.constexpr,
    SPLIT: tl.constexpr,
    PV_MODE: tl.constexpr,  # 0: one MMA in the input dtype, 1: bf16 hi + lo, 2: fp32
    UPCAST: tl.constexpr,  # interpreter: compute in fp32
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    NUM_DV_BLOCKS: tl.constexpr = (DV + BLOCK_DV - 1) // BLOCK_DV
    pid_split = tl.program_id(2) // NUM_DV_BLOCKS
    dv0 = (tl.program_id(2) % NUM_DV_BLOCKS) * BLOCK_DV  # this program's slice of the output columns
    HKV = HQ // G
    b = pid_bh // HKV
    kvh = pid_bh % HKV

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # packed (t, g): row = t * G + g
    row_ok = rows < T * G
    t = rows // G
    h = kvh * G + rows % G
    position = S - T + t

    # The keys this program visits: its split, cut to what its rows can see.
    lo = pid_split * keys_per_split
    hi = tl.minimum(S, lo + keys_per_split)
    if CAUSAL:
        last_t = tl.minimum(pid_m * BLOCK_M + BLOCK_M - 1, T * G - 1) // G
        hi = tl.minimum(hi, S - T + last_t + 1)
    if WINDOWED:
        first_t = (pid_m * BLOCK_M) // G
        lo = tl.maximum(lo, S - T + first_t - WINDOW + 1)

    q_base = Q + b * stride_qb + t[:, None] * stride_qt + h[:, None] * stride_qh
    k_base = K + b * stride_kb + kvh * stride_kh
    v_base = V + b * stride_vb + kvh * stride_vh
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = dv0 + tl.arange(0, BLOCK_DV)
    if D <= BLOCK_D:  # one head-dim chunk: load q once
        q_whole = tl.load(q_base + offs_d[None, :], mask=row_ok[:, None] & (offs_d < D)[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)

    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        s = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32)
        for d0 in tl.static_range(0, D, BLOCK_D):
            d_ok = (d0 + offs_d) < D
            if D <= BLOCK_D:
                q = q_whole
            else:
                q = tl.load(q_base + (d0 + offs_d)[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            k = tl.load(
                k_base + cols[None, :] * stride_ks + (d0 + offs_d)[:, None],
                mask=col_ok[None, :] & d_ok[:, None], other=0.0,
            )
            if UPCAST:
                s += tl.dot(q.to(tl.float32), k.to(tl.float32), input_precision="ieee")
            elif PV_MODE == 2:
                s += tl.dot(q, k, input_precision="ieee")
            else:
                s += tl.dot(q, k)
        s = s * qk_scale
        visible = col_ok[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= position[:, None])
        if WINDOWED:
            visible = visible & (cols[None, :] > position[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new

        dv_ok = offs_dv < DV
        v = tl.load(
            v_base + cols[:, None] * stride_vs + offs_dv[None, :],
            mask=col_ok[:, None] & dv_ok[None, :], other=0.0,
        )
        if UPCAST:
            acc = tl.dot(p, v.to(tl.float32), acc, input_precision="ieee")
        elif PV_MODE == 2:
            acc = tl.dot(p, v, acc, input_precision="ieee")
        elif PV_MODE == 1:
            p_hi = p.to(tl.bfloat16)
            p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
            acc = tl.dot(p_hi, v, acc)
            acc = tl.dot(p_lo, v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)

    if HAS_SINK:
        # The sink joins the denominator (never a value); take the max with it first so a
        # large sink cannot overflow exp2.
        sink = tl.load(SINK + h, mask=row_ok, other=0.0) * 1.4426950408889634  # log2(e)
        m_final = tl.maximum(m_i, sink)
        m_final_safe = tl.where(m_final == float("-inf"), 0.0, m_final)  # nothing visible, sink -inf
        scale_old = tl.exp2(m_i - m_final_safe)
        l_i = l_i * scale_old + tl.exp2(sink - m_final_safe)
        acc = acc * scale_old[:, None]
        m_i = m_final

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)  # ln(2)

    # With SPLIT, O and LSE are the fp32 partials (splits, B, T, HQ, DV) and (splits, B, HQ, T).
    o_ptrs = O + pid_split * stride_os + b * stride_ob + t[:, None] * stride_ot + h[:, None] * stride_oh + offs_dv[None, :]
    lse_ptrs = LSE + pid_split * stride_ls + b * stride_lb + h * stride_lh + t
    if UPCAST and O.dtype.element_ty == tl.bfloat16:
        o = round_for_bf16(o)
    tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_dv < DV)[None, :])
    tl.store(lse_ptrs, lse, mask=row_ok)


def _pv_mode(dtype: torch.dtype) -> int:
    return {torch.bfloat16: 1, torch.float16: 0, torch.float32: 2}[dtype]


# Tile table for Hopper, keyed by max(D, Dv): (BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, warps, stages).
# Chosen by `python -m fmha.tune` on an H200 (BENCHMARKS.md); BLOCK_DV < Dv splits the output
# columns across programs (each recomputes QK^T for its slice) to stay within registers.
GPU_TILES = {
    64: (64, 64, 64, 64, 4, 3),
    128: (64, 64, 128, 128, 4, 3),
    256: (64, 64, 64, 128, 4, 2),
    512: (128, 32, 128, 256, 8, 2),
}


def _tiles(problem, device_type: str, override: tuple | None = None) -> dict:
    """Tile sizes by head dim and device."""
    D, DV = problem.head_dim, problem.head_dim_v
    if device_type == "cpu":
        # The interpreter: few, large steps, but head dims above 128 still go in chunks and
        # Dv above 256 across programs, so the CPU tier runs the hd512 code paths.
        block_d, block_dv = min(triton.next_power_of_2(D), 128), min(triton.next_power_of_2(DV), 256)
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_D=block_d, BLOCK_DV=block_dv, num_warps=4, num_stages=1)
    key = next(k for k in sorted(GPU_TILES) if max(D, DV) <= k)
    m, n, d, dv, warps, stages = override or GPU_TILES[key]
    if problem.dtype == torch.float32:  # twice the bytes per element: smaller tiles
        m, n, d, dv, stages = min(m, 64), min(n, 32), min(d, 64), min(dv, 128), min(stages, 2)
    return dict(BLOCK_M=m, BLOCK_N=n, BLOCK_D=min(d, triton.next_power_of_2(D)),
                BLOCK_DV=min(dv, triton.next_power_of_2(DV)), num_warps=warps, num_stages=stages)


def _keys_per_split(problem, device_type: str) -> int:
    """Split long key ranges of decode-like problems into fixed-size chunks (merged after).

    The chunk size never depends on the batch size or the number of heads, so a row's
    arithmetic does not either: a batch row computed alone equals the same row in a batch,
    bitwise. On an H200 splitting DSV4 decode (S = 640) lost (63 µs unsplit, 87-129 µs in
    2-5 splits, fmha.tune 2026-11-29), so only ranges past 1024 keys are split. Interpreted,
    speed is moot: chunks of 256 keys make the CPU tier run the split-and-merge path.
    """
    if device_type != "cuda":
        return 256
    decode_like = problem.q_len * problem.group <= 128
    return 1024 if decode_like else max(problem.kv_len, 1)


def attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None):
    """The contract's attention (see fmha.contract) in one Triton kernel launch (two when
    the keys are split)."""
    return _attention(q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out)


def _attention(q, k, v, *, scale=None, causal=False, window=None, sink=None, out=None, tiles=None, splits=None):
    problem = check_attention_args(
        q, k, v, scale=scale, causal=causal, window=window, sink=sink, out=out,
        capabilities=ENTRY.capabilities_on(q.device.type),
    )
    B, T, HQ, D = q.shape
    S, HKV, DV = k.shape[1], k.shape[2], v.shape[3]
    G = HQ // HKV
    scale = D**-0.5 if scale is None else scale
    o = torch.empty(B, T, HQ, DV, dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(B, HQ, T, dtype=torch.float32, device=q.device)
    if o.numel() == 0 or lse.numel() == 0:
        return o, lse.fill_(float("-inf"))

    tiles = _tiles(problem, q.device.type, tiles)
    row_blocks = triton.cdiv(T * G, tiles["BLOCK_M"])
    dv_blocks = triton.cdiv(DV, tiles["BLOCK_DV"])
    keys_per_split = _keys_per_split(problem, q.device.type) if splits is None else triton.cdiv(max(S, 1), splits)
    keys_per_split = triton.cdiv(keys_per_split, tiles["BLOCK_N"]) * tiles["BLOCK_N"]
    splits = triton.cdiv(max(S, 1), keys_per_split)
    if splits > 1:
        target = torch.empty(splits, B, T, HQ, DV, dtype=torch.float32, device=q.device)
        target_lse = torch.empty(splits, B, HQ, T, dtype=torch.float32, device=q.device)
    else:
        target, target_lse = o.unsqueeze(0), lse.unsqueeze(0)
    upcast = interpreting() and q.dtype == torch.bfloat16
    grid = (row_blocks, B * HKV, splits * dv_blocks)
    _attention_fwd[grid](
        q, k, v, sink if sink is not None else q, target, target_lse,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        target.stride(0), target.stride(1), target.stride(2), target.stride(3),
        target_lse.stride(0), target_lse.stride(1), target_lse.stride(2),
        T, S, HQ, G, window or 0, scale * LOG2E, keys_per_split,
        D=D, DV=DV, CAUSAL=problem.causal, WINDOWED=window is not None,
        HAS_SINK=sink is not None and splits == 1, SPLIT=splits > 1,
        PV_MODE=_pv_mode(q.dtype), UPCAST=upcast,
        **tiles,
    )
    if splits > 1:
        merge_into(o, lse, target, target_lse, sink)
    return o, lse


ENTRY = KernelEntry(
    name="triton",
    fn=attention,
    capabilities=Capabilities(
        head_dims=HEAD_DIMS,
        notes={"head_dim": "multiples of 16 up to 512 (tiles are powers of two, masked)"},
    ),
    description="fmha's Triton forward kernel (compiled on CUDA, TRITON_INTERPRET=1 on CPU)",
)

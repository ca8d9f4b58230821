"""The Triton kernel for contract v2's key sources: paged caches (any block size), ragged
queries, index-sparse slots (-1 and `topk_len`) over one or two caches with a sink, and the
DeepSeek-V4 FP8 and FP4 caches dequantized in the kernel. Interpreted on the CPU, compiled
on GPUs.

Tiling. Paged: a program owns BLOCK_M packed (t, g) rows of one request and KV head, as the
dense kernel does, and walks the request's keys through its block table; each row keeps its
own position kv_len - T_b + t for the causal and window masks. Sparse: a query row's keys
are its own indices, so a program owns BLOCK_M query heads of one (request, query row, KV
head): DeepSeek-V4 decode's heads all read one row's indices (FlashMLA's layout). A second
scope continues the same online softmax; the sink joins its denominator once, at the end.

Keys. The whole head dim is one tile (BLOCK_D, BLOCK_DV: powers of two up to 512), gathered
by slot: slot = page * block_size + offset, a page from the block table or the slot from the
indices. A quantized cache is bytes (`fmha.oracles.quantization`'s layouts): a page holds its
tokens' data (quantized dims, then 64 bf16 rope dims), then their tile scales. Each element
is decoded from its bits into fp32 exactly (e4m3 and e2m1 values times a power-of-two scale
fit bf16's 8 mantissa bits), then rounded to the compute dtype, so QK^T and P.V see the
same numbers the float64 oracle does.

Precision: as the dense kernel (fmha.kernels.triton_dense): bf16 P as hi + lo against bf16 V,
fp16 one MMA, fp32 IEEE dots; the interpreter computes in fp32.

Splits. A paged call's keys split into fixed chunks of KEYS_PER_SPLIT positions (its block
table's capacity decides how many, not its lengths: a request alone splits as it does in the
batch), each chunk a program of its own writing fp32 partials that the D5 merge
(fmha.kernels.triton_merge) combines with the sink: long contexts get more programs than
requests x KV heads. Index-sparse rows have at most their top-k keys and many heads, so they
are one loop: padding a row with -1 then changes nothing, bitwise.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fmha.contract import CACHE_LAYOUTS, Capabilities, implemented_by
from fmha.kernels.host import LOG2E
from fmha.kernels.triton_dense import HEAD_DIMS
from fmha.kernels.triton_merge import merge_into
from fmha.kernels.triton_utils import (mma, pow2, pv_mode, q_unit, renormalize, round_for_bf16, triton_availability,
                                       upcast_under_interpreter)

# The window a causal call without one gets: a runtime value past every key distance, so
# causal calls with and without a window share one compile.
NO_WINDOW = 2**30

# Layout codes for the kernel (0: a cache of q's dtype).
LAYOUT_CODES = {None: 0, "dsv4-fp8": 1, "dsv4-fp4": 2}


@triton.jit
def _online_softmax(s, m_i, l_i, e_i, acc, RENORMALIZE: tl.constexpr):
    """A key tile's logits `s` (base 2, -inf where masked) into the running max m_i, the sum
    l_i and the rescaled accumulator, both held at 2^-e_i of their value
    (triton_utils.renormalize): (p, m_i, l_i, e_i, acc)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    if RENORMALIZE:
        factor, e_i = renormalize(l_i * alpha, e_i)
        alpha = alpha * factor
        p = p * pow2(-e_i)[:, None]
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    return p, m_new, l_i, e_i, acc


@triton.jit
def _accumulate_pv(acc, p, v, PV_MODE: tl.constexpr, UPCAST: tl.constexpr):
    """acc + P.V: bf16 P as hi + lo against bf16 V (two MMAs: P in bf16 alone loses 8 bits),
    fp16 one MMA, fp32 IEEE; the interpreter in fp32."""
    if UPCAST or PV_MODE == 2:
        return mma(p, v, acc, PV_MODE, UPCAST)
    elif PV_MODE == 1:
        p_hi = p.to(tl.bfloat16)
        p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
        acc = tl.dot(p_hi, v, acc)
        return tl.dot(p_lo, v, acc)
    else:
        return tl.dot(p.to(v.dtype), v, acc)


@triton.jit
def _join_sink(SINK, h, row_ok, m_i, l_i, e_i, acc):
    """The sink of heads h joins the denominator (never a value), once; the max is taken with
    it first so a large sink cannot overflow exp2."""
    sink = tl.load(SINK + h, mask=row_ok, other=0.0) * 1.4426950408889634  # log2(e)
    m_final = tl.maximum(m_i, sink)
    m_final_safe = tl.where(m_final == float("-inf"), 0.0, m_final)  # nothing visible, sink -inf
    scale_old = tl.exp2(m_i - m_final_safe)
    l_i = l_i * scale_old + tl.exp2(sink - m_final_safe) * pow2(-e_i)
    acc = acc * scale_old[:, None]
    return m_final, l_i, acc


@triton.jit
def _normalize(m_i, l_i, e_i, acc):
    """(o, lse in natural log); a row that saw nothing (and no sink) gets o = 0, lse = -inf."""
    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    # the sum itself (exact: at most the key count), so the lse does not depend on where e_i stands
    log_sum = tl.log2(tl.where(empty, 1.0, l_i) * pow2(e_i))
    lse = tl.where(empty, float("-inf"), (m_i + log_sum) * 0.6931471805599453)  # ln(2)
    return o, lse


@triton.jit
def _decode_e4m3(code):
    """fp32 value of FP8 e4m3fn codes (int32 0..255): 0x7F and 0xFF are NaN."""
    exponent = (code >> 3) & 15
    mantissa = code & 7
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.001953125,  # m * 2^-9
                         (8 + mantissa).to(tl.float32) * pow2(exponent - 10))
    value = tl.where((code & 128) != 0, -magnitude, magnitude)
    return tl.where((code & 127) == 127, float("nan"), value)


@triton.jit
def _decode_e2m1(code):
    """fp32 value of FP4 e2m1 codes (int32 0..15)."""
    exponent = (code >> 1) & 3
    mantissa = code & 1
    magnitude = tl.where(exponent == 0, mantissa.to(tl.float32) * 0.5, (2 + mantissa).to(tl.float32) * pow2(exponent - 2))
    return tl.where((code & 8) != 0, -magnitude, magnitude)


@triton.jit
def decode_ue8m0(code):
    """fp32 value 2^(code - 127) of scale codes (int32 0..255): 0xFF is NaN, 0 is 2^-127."""
    value = tl.where(code == 0, 5.877471754111438e-39, ((code.to(tl.int32)) << 23).to(tl.float32, bitcast=True))
    return tl.where(code == 255, float("nan"), value)


@triton.jit
def _load_keys(K, page, offset, kvh, cols, key_ok, stride_kb, stride_ks, stride_kh, D, block_size,
               LAYOUT: tl.constexpr, EVEN_D: tl.constexpr):
    """The key tile [BLOCK_N, BLOCK_D] of the slots (page, offset) as fp32; keys not in key_ok
    and columns past D as 0."""
    if LAYOUT == 0:
        ptrs = K + page[:, None].to(tl.int64) * stride_kb + offset[:, None] * stride_ks + kvh * stride_kh + cols[None, :]
        if EVEN_D:
            return tl.load(ptrs, mask=key_ok[:, None], other=0.0).to(tl.float32)
        return tl.load(ptrs, mask=key_ok[:, None] & (cols < D)[None, :], other=0.0).to(tl.float32)
    # A page: block_size tokens' data (quantized dims, then the rope dims in bf16), then
    # their scales (the page stride is the padded page size).
    if LAYOUT == 1:  # dsv4-fp8: e4m3 in 7 tiles of 64, 576 data and 8 scale bytes a token
        DATA_BYTES: tl.constexpr = 576
        SCALE_BYTES: tl.constexpr = 8
        TILE: tl.constexpr = 64
        PACKED: tl.constexpr = 448
    else:  # dsv4-fp4: e2m1 two a byte in 14 tiles of 32, 352 data and 16 scale bytes a token
        DATA_BYTES: tl.constexpr = 352
        SCALE_BYTES: tl.constexpr = 16
        TILE: tl.constexpr = 32
        PACKED: tl.constexpr = 224
    QUANTIZED: tl.constexpr = 448
    page_base = K + page[:, None].to(tl.int64) * stride_kb
    token = page_base + offset[:, None] * DATA_BYTES
    quantized = (cols < QUANTIZED)[None, :]
    ok = key_ok[:, None]
    if LAYOUT == 1:
        code = tl.load(token + cols[None, :], mask=ok & quantized, other=0).to(tl.int32)
        element = _decode_e4m3(code)
    else:
        byte = tl.load(token + cols[None, :] // 2, mask=ok & quantized, other=0).to(tl.int32)
        element = _decode_e2m1(tl.where((cols % 2 == 0)[None, :], byte & 15, byte >> 4))
    scale_code = tl.load(page_base + block_size * DATA_BYTES + offset[:, None] * SCALE_BYTES + cols[None, :] // TILE,
                         mask=ok & quantized, other=127).to(tl.int32)
    rope_col = PACKED + 2 * (cols - QUANTIZED)
    low = tl.load(token + rope_col[None, :], mask=ok & ~quantized, other=0).to(tl.int32)
    high = tl.load(token + rope_col[None, :] + 1, mask=ok & ~quantized, other=0).to(tl.int32)
    rope = ((high << 24) | (low << 16)).to(tl.float32, bitcast=True)  # bf16 bits are fp32's top half
    return tl.where(quantized, element * decode_ue8m0(scale_code), rope)


@triton.jit
def _scope_loop(
    qs, K, V, m_i, l_i, e_i, acc, b, t_idx, kvh, first, last, n_keys, position, qk_scale, WINDOW,
    BT, IDX, stride_btb, stride_ib, stride_it,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, D, DV, block_size,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPARSE: tl.constexpr, CAUSAL: tl.constexpr, LAYOUT: tl.constexpr,
    V_IS_K: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    COMPUTE: tl.constexpr, PV_MODE: tl.constexpr, UPCAST: tl.constexpr,
):
    """The online softmax (base 2) carried on over one scope's keys [first, last) of
    [0, n_keys): a request's pages (SPARSE=0) or one query row's indices (SPARSE=1). `first`
    is a multiple of BLOCK_N."""
    cols_d = tl.arange(0, BLOCK_D)
    cols_dv = tl.arange(0, BLOCK_DV)
    zero = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32) * qk_scale
    lo = first
    hi = tl.minimum(n_keys, last)
    # The first key a row of the block sees: the keys of its first tile before it are no row's,
    # and may hold anything (NaN): they are not loaded, or 0 * NaN would reach the output.
    first_seen = first * 0
    if CAUSAL:  # and the window (NO_WINDOW without one)
        hi = tl.minimum(hi, tl.max(tl.where(position >= 0, position, -1)) + 1)
        first_seen = tl.maximum(0, tl.min(tl.where(position >= 0, position, n_keys)) - WINDOW + 1)
        lo = tl.maximum(lo, first_seen // BLOCK_N * BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        j = start + tl.arange(0, BLOCK_N)
        in_range = j < hi
        if SPARSE:
            slot = tl.load(IDX + b * stride_ib + t_idx * stride_it + j, mask=in_range, other=-1)
            key_ok = in_range & (slot >= 0)
            slot = tl.where(key_ok, slot, 0)
            page = slot // block_size
            offset = slot % block_size
        else:
            key_ok = in_range & (j >= first_seen)
            page = tl.load(BT + b * stride_btb + j // block_size, mask=key_ok, other=0)
            offset = j % block_size
        k = _load_keys(K, page, offset, kvh, cols_d, key_ok, stride_kb, stride_ks, stride_kh, D, block_size,
                       LAYOUT, EVEN_D)
        if COMPUTE == 1 and not UPCAST:  # a quantized cache's values are bf16 numbers, exactly
            k = k.to(tl.bfloat16)
        elif COMPUTE == 2:
            k = k.to(tl.float16)
        s = mma(qs, tl.trans(k), zero, PV_MODE, UPCAST) * qk_scale
        visible = key_ok[None, :]
        if CAUSAL:  # and the window (NO_WINDOW without one)
            visible = visible & (j[None, :] <= position[:, None]) & (j[None, :] > position[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))
        p, m_i, l_i, e_i, acc = _online_softmax(s, m_i, l_i, e_i, acc, PV_MODE != 0)

        if V_IS_K:
            v = k
        else:
            v = _load_keys(V, page, offset, kvh, cols_dv, key_ok, stride_vb, stride_vs, stride_vh, DV, block_size,
                           0, EVEN_DV)
            if COMPUTE == 1 and not UPCAST:
                v = v.to(tl.bfloat16)
            elif COMPUTE == 2:
                v = v.to(tl.float16)
        acc = _accumulate_pv(acc, p, v, PV_MODE, UPCAST)
    return m_i, l_i, e_i, acc


# Sizes, strides, lengths, block sizes and top-k are runtime values: a compile per tile
# shape, dtype, layout and feature, not per problem.
RUNTIME_ARGS = ("stride_qb", "stride_qt", "stride_qh", "stride_os", "stride_ob", "stride_ot", "stride_oh", "stride_ls",
                "stride_lb", "stride_lh", "stride_lt", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs", "stride_vh",
                "stride_k2b", "stride_k2s", "stride_k2h", "stride_btb", "stride_ib", "stride_it", "stride_i2b", "stride_i2t",
                "T", "HQ", "G", "WINDOW", "D", "DV", "block_size", "block_size2", "topk", "topk2", "keys_per_split", "has_sink",
                "has_topk_len", "has_topk_len2")


@triton.jit(do_not_specialize=RUNTIME_ARGS)
def _sources_fwd(
    Q, K, V, K2, SINK, O, LSE, BT, KV_LENS, CU_Q, IDX, TOPK_LEN, IDX2, TOPK_LEN2,
    stride_qb, stride_qt, stride_qh, stride_os, stride_ob, stride_ot, stride_oh, stride_ls, stride_lb, stride_lh,
    stride_lt,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_k2b, stride_k2s, stride_k2h,
    stride_btb, stride_ib, stride_it, stride_i2b, stride_i2t,
    T, HQ, G, WINDOW, qk_scale, q_unit, D, DV, block_size, block_size2, topk, topk2, keys_per_split,
    has_sink, has_topk_len, has_topk_len2,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    SPARSE: tl.constexpr, RAGGED: tl.constexpr, TWO_SCOPES: tl.constexpr,
    CAUSAL: tl.constexpr, LAYOUT: tl.constexpr, LAYOUT2: tl.constexpr,
    V_IS_K: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    COMPUTE: tl.constexpr, PV_MODE: tl.constexpr, UPCAST: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid = tl.program_id(1)
    split = tl.program_id(2)  # 0 but for a split paged call: then O and LSE are its fp32 partials
    first = split * keys_per_split
    HKV = HQ // G
    kvh = pid % HKV
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if SPARSE:  # rows are the query heads of one (request, query row)
        bt = pid // HKV
        b = bt // T
        t_idx = bt % T
        row_ok = rows < G
        t = tl.zeros([BLOCK_M], tl.int32) + t_idx
        h = kvh * G + rows
        q_row = b * stride_qb + t * stride_qt
        o_row = b * stride_ob + t * stride_ot
        lse_row = b * stride_lb + t * stride_lt
        n_keys = topk
        if has_topk_len:
            n_keys = tl.load(TOPK_LEN + b)
        position = t  # unused: no causal or window
    else:  # rows are packed (t, g) of one request
        b = pid // HKV
        t_idx = 0
        start = 0
        T_b = T
        if RAGGED:
            start = tl.load(CU_Q + b)
            T_b = tl.load(CU_Q + b + 1) - start
        t = rows // G
        row_ok = rows < T_b * G
        h = kvh * G + rows % G
        q_row = b * stride_qb + (start + t) * stride_qt
        o_row = b * stride_ob + (start + t) * stride_ot
        lse_row = b * stride_lb + (start + t) * stride_lt
        n_keys = tl.load(KV_LENS + b)
        position = tl.where(row_ok, n_keys - T_b + t, -1)

    cols_d = tl.arange(0, BLOCK_D)
    cols_dv = tl.arange(0, BLOCK_DV)
    q_ptrs = Q + q_row[:, None] + h[:, None] * stride_qh + cols_d[None, :]
    if EVEN_D:
        qs = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    else:
        qs = tl.load(q_ptrs, mask=row_ok[:, None] & (cols_d < D)[None, :], other=0.0)
    if UPCAST:
        qs = qs.to(tl.float32)
    qs = (qs.to(tl.float32) * q_unit).to(qs.dtype)  # triton_utils.q_unit; qk_scale is over it
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    e_i = tl.full([BLOCK_M], 0, tl.int32)
    acc = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)
    if SPARSE or pid_m * BLOCK_M < T_b * G:  # a paged program past its request's rows has nothing to do
        m_i, l_i, e_i, acc = _scope_loop(
            qs, K, V, m_i, l_i, e_i, acc, b, t_idx, kvh, first, first + keys_per_split, n_keys, position, qk_scale, WINDOW,
            BT, IDX, stride_btb, stride_ib, stride_it,
            stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, D, DV, block_size,
            BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, SPARSE, CAUSAL, LAYOUT, V_IS_K, EVEN_D, EVEN_DV,
            COMPUTE, PV_MODE, UPCAST)
        if TWO_SCOPES:
            n_keys2 = topk2
            if has_topk_len2:
                n_keys2 = tl.load(TOPK_LEN2 + b)
            m_i, l_i, e_i, acc = _scope_loop(
                qs, K2, K2, m_i, l_i, e_i, acc, b, t_idx, kvh, 0, n_keys2, n_keys2, position, qk_scale, WINDOW,
                BT, IDX2, stride_btb, stride_i2b, stride_i2t,
                stride_k2b, stride_k2s, stride_k2h, stride_k2b, stride_k2s, stride_k2h, D, DV, block_size2,
                BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, SPARSE, CAUSAL, LAYOUT2, True, EVEN_D, EVEN_DV,
                COMPUTE, PV_MODE, UPCAST)

    if has_sink:  # once, over every scope
        m_i, l_i, acc = _join_sink(SINK, h, row_ok, m_i, l_i, e_i, acc)
    o, lse = _normalize(m_i, l_i, e_i, acc)
    if UPCAST and O.dtype.element_ty == tl.bfloat16:
        o = round_for_bf16(o)
    o_ptrs = O + split * stride_os + o_row[:, None] + h[:, None] * stride_oh + cols_dv[None, :]
    if EVEN_DV:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (cols_dv < DV)[None, :])
    tl.store(LSE + split * stride_ls + lse_row + h * stride_lh, lse, mask=row_ok)


def _tiles(problem, device_type: str) -> dict:
    block_d = max(16, triton.next_power_of_2(problem.head_dim))
    block_dv = max(16, triton.next_power_of_2(problem.head_dim_v))
    if device_type == "cpu":
        # Not sized by the batch's longest request (a paged call's q_len): a request's rows would
        # be tiled, and their dots summed by numpy, differently alone than in a batch, and the
        # kernel promises batch invariance. A sparse program's rows are one row's heads.
        rows = problem.group if problem.source == "sparse" else 64
        return dict(BLOCK_M=max(16, min(64, triton.next_power_of_2(rows))), BLOCK_N=64, BLOCK_D=block_d,
                    BLOCK_DV=block_dv, num_warps=4, num_stages=1)
    # Whole head dims in registers: fmha.kernels.compile_check for sm_90 spilled 7 KB a
    # thread at 64 x 16 for head dim 512, 112 B at 16 x 16; 632 B at 64 x 32 for 128.
    # fp32 (FMA dots) spilled 1.5 KB at 32 x 32 for head dim 128, 7.5 KB for 256: local memory
    # the driver reserves per process (fmha.kernels.triton_dense.FP32_TILES).
    small = max(block_d, block_dv) > 256 or (problem.dtype == torch.float32 and max(block_d, block_dv) > 64)
    return dict(BLOCK_M=16 if small else 32, BLOCK_N=16 if small else 32, BLOCK_D=block_d, BLOCK_DV=block_dv,
                num_warps=4, num_stages=1)


def specialization(problem, tiles: dict, upcast: bool) -> dict:
    """The kernel's compile-time arguments for `problem` with `tiles` (warps and stages too)."""
    return dict(SPARSE=problem.source == "sparse", RAGGED=problem.ragged, TWO_SCOPES=problem.extra_topk is not None,
                CAUSAL=problem.causal,  # the window is a runtime value
                LAYOUT=LAYOUT_CODES[problem.cache_layout], LAYOUT2=LAYOUT_CODES[problem.extra_cache_layout],
                V_IS_K=problem.shared_kv, EVEN_D=problem.head_dim == tiles["BLOCK_D"],
                EVEN_DV=problem.head_dim_v == tiles["BLOCK_DV"],
                COMPUTE={torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}[problem.dtype],
                PV_MODE=pv_mode(problem.dtype), UPCAST=upcast, **tiles)


def attend(problem, q, k, v, *, scale=None, sink=None, out=None, block_table=None, kv_lens=None, cu_seqlens_q=None,
           indices=None, topk_len=None, extra_k_cache=None, extra_indices=None, extra_topk_len=None):
    """`problem` (a checked paged or sparse call: its window and cache layouts come from it)
    in one launch, or a split launch and the merge: (o, lse float32) in the contract's layouts
    (ragged: o (total_q, Hq, Dv), lse (Hq, total_q))."""
    sparse = problem.source == "sparse"
    ragged = problem.ragged
    HQ, G, D, DV = problem.heads_q, problem.group, problem.head_dim, problem.head_dim_v
    B = problem.batch
    T = problem.q_len
    if ragged:
        o_shape, lse_shape = (q.shape[0], HQ, DV), (HQ, q.shape[0])
    else:
        o_shape, lse_shape = (B, T, HQ, DV), (B, HQ, T)
    o = torch.empty(o_shape, dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    tiles = _tiles(problem, q.device.type)
    per_split, n_splits = _splits(problem, block_table, tiles["BLOCK_N"], q.device.type)
    target, target_lse = o.unsqueeze(0), lse.unsqueeze(0)
    if n_splits > 1:
        target = torch.empty(n_splits, *o_shape, dtype=torch.float32, device=q.device)
        target_lse = torch.empty(n_splits, *lse_shape, dtype=torch.float32, device=q.device)
    if ragged:  # (total_q, Hq, D): a row's place is cu_seqlens_q[b] + t
        stride_qb, stride_qt, stride_qh = 0, q.stride(0), q.stride(1)
        stride_ob, stride_ot, stride_oh = 0, target.stride(1), target.stride(2)
        stride_lb, stride_lh, stride_lt = 0, target_lse.stride(1), target_lse.stride(2)
    else:
        stride_qb, stride_qt, stride_qh = q.stride(0), q.stride(1), q.stride(2)
        stride_ob, stride_ot, stride_oh = target.stride(1), target.stride(2), target.stride(3)
        stride_lb, stride_lh, stride_lt = target_lse.stride(1), target_lse.stride(2), target_lse.stride(3)
    dummy = torch.zeros(1, dtype=torch.int32, device=q.device)  # for the arguments a call does not use
    given = lambda t: dummy if t is None else t  # noqa: E731
    two = extra_k_cache is not None
    k2 = extra_k_cache if two else k
    grid_m = triton.cdiv(G if sparse else T * G, tiles["BLOCK_M"])
    grid = (grid_m, (B * T if sparse else B) * problem.heads_kv, n_splits)
    upcast = upcast_under_interpreter(q.dtype)
    qk_scale = (D**-0.5 if scale is None else float(scale)) * LOG2E
    unit = q_unit(qk_scale, q.dtype)
    _sources_fwd[grid](
        q, k, v, k2, sink if sink is not None else q, target, target_lse,
        given(block_table), given(kv_lens), given(cu_seqlens_q), given(indices), given(topk_len),
        given(extra_indices), given(extra_topk_len),
        stride_qb, stride_qt, stride_qh, target.stride(0), stride_ob, stride_ot, stride_oh, target_lse.stride(0),
        stride_lb, stride_lh, stride_lt, k.stride(0), k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), k2.stride(0), k2.stride(1), k2.stride(2),
        block_table.stride(0) if block_table is not None else 0,
        indices.stride(0) if sparse else 0, indices.stride(1) if sparse else 0,
        extra_indices.stride(0) if two else 0, extra_indices.stride(1) if two else 0,
        T, HQ, G, problem.window or NO_WINDOW, qk_scale / unit, unit, D, DV,
        problem.block_size, problem.extra_block_size or 1, problem.kv_len if sparse else 0, problem.extra_topk or 0,
        per_split, int(sink is not None and n_splits == 1), int(topk_len is not None), int(extra_topk_len is not None),
        **specialization(problem, tiles, upcast),
    )
    if n_splits > 1:  # the merge wants (B, T, H, Dv) and (B, H, T): a ragged call is one request of total_q rows
        batched = (lambda t: t.unsqueeze(0), lambda t: t.unsqueeze(1)) if ragged else (lambda t: t, lambda t: t)
        merge_into(batched[0](o), batched[0](lse), batched[1](target), batched[1](target_lse), sink)
    return o, lse


# Keys per split of a paged call: on a GPU a decode over one chunk is a program per request
# and KV head, as the dense kernel's split (fmha.kernels.host.keys_per_split); interpreted, small
# chunks make the CPU tier run the split and the merge.
KEYS_PER_SPLIT = {"cuda": 1024, "cpu": 256}


def _splits(problem, block_table, block_n: int, device_type: str) -> tuple[int, int]:
    """(keys per split, splits): a paged call's block-table capacity in fixed chunks (a
    multiple of the key tile); a sparse call in one."""
    if problem.source == "sparse":
        return max(problem.kv_len, 1), 1
    capacity = block_table.shape[1] * problem.block_size
    per_split = triton.cdiv(KEYS_PER_SPLIT[device_type], block_n) * block_n
    return per_split, max(1, triton.cdiv(capacity, per_split))


CAPABILITIES = Capabilities(
    head_dims=HEAD_DIMS,
    devices=("cpu", "cuda"),
    sources=frozenset({"paged", "ragged", "sparse", "two_scopes"}),
    cache_layouts=frozenset(CACHE_LAYOUTS),
    promises=frozenset({"bitwise_deterministic", "batch_invariant"}),
    notes={"head_dim": "multiples of 16 up to 512 (tiles are powers of two, masked)",
           "dense": "dense calls go to fmha.kernels.triton_dense"},
)


ENTRY = implemented_by("triton-paged", attend, CAPABILITIES, availability=triton_availability,
                       description="fmha's Triton kernel for contract v2: paged caches, ragged queries, index-sparse "
                                   "slots over one or two caches, FP8/FP4 caches (compiled on CUDA, interpreted on CPU)")

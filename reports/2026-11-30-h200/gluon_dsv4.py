"""Experiment record, not product code (nothing imports it): DSV4 decode (B, T=1, HQ=128,
HKV=1, D=512, K is V, bf16; no LSE, no masks but S) in Gluon, Triton's lower-level language,
to test whether an explicit schedule beats fmha's Triton kernel. Same decomposition (two
programs per batch row, one per Dv half; 128 rows x 8 warps; q resident; K in two head-dim
chunks through TMA, V = this program's chunk of the key tile; P as bf16 hi + lo) but with
QK^T of tile j+1 issued asynchronously before tile j's softmax (FA3's intra-warpgroup
overlap, which Triton 3.6 does not emit) and one CTA barrier per tile instead of three.

Measured on an H200, 2026-11-30 (gluon_bench.py; gluon-v1.txt, gluon-v2.txt): cosine equal
to the Triton kernel's (0.99999862) but slower, 54.3 us (v1: the chunks chained into one
accumulator) and 55.7 us (this v2: chunk order follows the Dv slice, summed order-free, as the
Triton kernel does), against 50.7-51.0 us. Keeping P.V in flight across the loop's back edge
made ptxas serialise every wgmma (C7514: the loop-carried accumulators are copied), so P.V
still waits at the end of each tile.
"""
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor


@gluon.jit
def _load_tile(k_desc, k_a, k_b, ready, key0, ca, cb, t, BLOCK_N: gl.constexpr, STAGES: gl.constexpr, pred):
    stage = t % STAGES
    bar = ready.index(stage)
    mbarrier.expect(bar, 2 * k_desc.block_type.nbytes, pred=pred)
    tma.async_copy_global_to_shared(k_desc, [key0 + t * BLOCK_N, ca], bar, k_a.index(stage), pred=pred)
    tma.async_copy_global_to_shared(k_desc, [key0 + t * BLOCK_N, cb], bar, k_b.index(stage), pred=pred)


@gluon.jit
def dsv4_kernel(q_desc, k_desc, O, S, stride_o, qk_scale,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr,
                num_warps: gl.constexpr):
    dv = gl.program_id(0)
    b = gl.program_id(1)
    row0 = b * BLOCK_M
    key0 = b * S
    n_tiles = gl.cdiv(S, BLOCK_N)

    qk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_N, 16])
    pv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, BLOCK_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=pv_layout, k_width=2)
    row_qk: gl.constexpr = gl.SliceLayout(1, qk_layout)
    row_pv: gl.constexpr = gl.SliceLayout(1, pv_layout)
    col_qk: gl.constexpr = gl.SliceLayout(0, qk_layout)
    col_pv: gl.constexpr = gl.SliceLayout(0, pv_layout)

    # this program's Dv slice is head-dim chunk ca: q's and K's chunk ca go in the "a" buffers,
    # so the value tile is always k_a; the logits add the two chunks order-free
    ca = dv * BLOCK_D
    cb = BLOCK_D - ca
    q_a = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_D], q_desc.layout)
    q_b = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_D], q_desc.layout)
    k_a = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_D], k_desc.layout)
    k_b = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_D], k_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
    mbarrier.init(qbar, count=1)

    mbarrier.expect(qbar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, ca], qbar, q_a)
    tma.async_copy_global_to_shared(q_desc, [row0, cb], qbar, q_b)
    for i in gl.static_range(STAGES):
        _load_tile(k_desc, k_a, k_b, ready, key0, ca, cb, i, BLOCK_N, STAGES, i < n_tiles)
    mbarrier.wait(qbar, 0)

    mbarrier.wait(ready.index(0), 0)
    zero_s = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, qk_layout)
    sa_tok = warpgroup_mma(q_a, k_a.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    sb_tok = warpgroup_mma(q_b, k_b.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_a, s_b = warpgroup_mma_wait(num_outstanding=0, deps=(sa_tok, sb_tok))

    m_i = gl.full([BLOCK_M], float("-inf"), gl.float32, row_qk)
    l_i = gl.zeros([BLOCK_M], gl.float32, row_qk)
    acc = gl.zeros([BLOCK_M, BLOCK_D], gl.float32, pv_layout)
    for j in range(n_tiles):
        # QK^T of the next tile runs on the tensor cores while this tile's softmax runs
        nxt = gl.minimum(j + 1, n_tiles - 1)
        nstage = nxt % STAGES
        mbarrier.wait(ready.index(nstage), (nxt // STAGES) & 1)
        sa_tok = warpgroup_mma(q_a, k_a.index(nstage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        sb_tok = warpgroup_mma(q_b, k_b.index(nstage).permute((1, 0)), zero_s, use_acc=False, is_async=True)

        cols = j * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_qk)
        s = gl.where((cols < S)[None, :], (s_a + s_b) * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        alpha = gl.exp2(m_i - m_new)
        p = gl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + gl.sum(p, axis=1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, row_pv)[:, None]

        p_hi_f = p.to(gl.bfloat16)
        p_lo_f = (p - p_hi_f.to(gl.float32)).to(gl.bfloat16)
        p_hi = gl.convert_layout(p_hi_f, p_layout)
        p_lo = gl.convert_layout(p_lo_f, p_layout)
        v = k_a.index(j % STAGES)
        acc_tok = warpgroup_mma(p_hi, v, acc, is_async=True)
        acc_tok = warpgroup_mma(p_lo, v, acc_tok, is_async=True)
        acc, s_a, s_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, sa_tok, sb_tok))
        # every warp is past tile j's buffers: refill them
        gl.thread_barrier()
        refill = j + STAGES
        _load_tile(k_desc, k_a, k_b, ready, key0, ca, cb, refill, BLOCK_N, STAGES, refill < n_tiles)

    o = acc / gl.convert_layout(l_i, row_pv)[:, None]
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_pv)
    ocols = dv * BLOCK_D + gl.arange(0, BLOCK_D, layout=col_pv)
    gl.store(O + rows[:, None] * stride_o + ocols[None, :], o.to(gl.bfloat16))




def dsv4(q, k, out, BLOCK_N=32, STAGES=3, num_warps=8):
    B, T, HQ, D = q.shape
    S = k.shape[1]
    BLOCK_M, BLOCK_D = HQ, D // 2
    q2 = q.reshape(B * T * HQ, D)
    k2 = k.reshape(B * S, D)
    q_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_D], gl.bfloat16)
    k_layout = gl.NVMMASharedLayout.get_default_for([BLOCK_N, BLOCK_D], gl.bfloat16)
    q_desc = TensorDescriptor(q2, list(q2.shape), list(q2.stride()), [BLOCK_M, BLOCK_D], q_layout)
    k_desc = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [BLOCK_N, BLOCK_D], k_layout)
    o2 = out.view(B * T * HQ, D)
    dsv4_kernel[(2, B)](q_desc, k_desc, o2, S, o2.stride(0), D ** -0.5 * 1.4426950408889634,
                        BLOCK_M, BLOCK_N, BLOCK_D, STAGES, num_warps=num_warps)
    return out

"""Experiment record, not product code (nothing imports it): DSV4 decode in Gluon,
warp-specialized. The decomposition of fmha's Triton kernel (one CTA per batch row and Dv
half, 128 rows), but as a 1-warp TMA producer and two 4-warp consumer warpgroups of 64 rows
that synchronise only through mbarriers, so they drift apart and one's softmax can run under
the other's MMAs. H200, 2026-11-30, same cosine as the Triton kernel throughout: the first
version (QK^T issued and waited at the top of each tile) measured 48.8 us against the Triton
kernel's 50.4-51.1 (gluon-ws-1.txt); this file's rewrite of it (LOOKAHEAD=False: the first
tile's QK^T peeled off the loop) 54.5-54.7 (gluon-ws-2.txt, gluon.txt), and with QK^T
look-ahead inside each consumer (LOOKAHEAD=True) 50.5. gluon_mla.py is the decomposition
that pays.
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
def _producer(q_desc, k_desc, q_a, q_b, k_a, k_b, ready, empty, qbar, row0, key0, ca, cb, n_tiles,
              BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    mbarrier.expect(qbar, 2 * q_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(q_desc, [row0, ca], qbar, q_a)
    tma.async_copy_global_to_shared(q_desc, [row0, cb], qbar, q_b)
    for t in range(n_tiles):
        stage = t % STAGES
        # a fresh barrier counts as having completed the phase before 0: the first round passes
        mbarrier.wait(empty.index(stage), ((t // STAGES) & 1) ^ 1)
        bar = ready.index(stage)
        mbarrier.expect(bar, 2 * k_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [key0 + t * BLOCK_N, ca], bar, k_a.index(stage))
        tma.async_copy_global_to_shared(k_desc, [key0 + t * BLOCK_N, cb], bar, k_b.index(stage))


@gluon.jit
def _consumer(WG: gl.constexpr, q_a, q_b, k_a, k_b, ready, empty, qbar, O, S, stride_o, qk_scale, row0, dv, n_tiles,
              BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr, LOOKAHEAD: gl.constexpr):
    ROWS: gl.constexpr = 64
    qk_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_N, 16])
    pv_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BLOCK_D, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=pv_layout, k_width=2)
    row_qk: gl.constexpr = gl.SliceLayout(1, qk_layout)
    row_pv: gl.constexpr = gl.SliceLayout(1, pv_layout)
    col_qk: gl.constexpr = gl.SliceLayout(0, qk_layout)
    col_pv: gl.constexpr = gl.SliceLayout(0, pv_layout)

    qa = q_a.slice(WG * ROWS, ROWS, dim=0)
    qb = q_b.slice(WG * ROWS, ROWS, dim=0)
    zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, qk_layout)
    m_i = gl.full([ROWS], float("-inf"), gl.float32, row_qk)
    l_i = gl.zeros([ROWS], gl.float32, row_qk)
    acc = gl.zeros([ROWS, BLOCK_D], gl.float32, pv_layout)
    mbarrier.wait(qbar, 0)
    mbarrier.wait(ready.index(0), 0)
    sa_tok = warpgroup_mma(qa, k_a.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    sb_tok = warpgroup_mma(qb, k_b.index(0).permute((1, 0)), zero_s, use_acc=False, is_async=True)
    s_a, s_b = warpgroup_mma_wait(num_outstanding=0, deps=(sa_tok, sb_tok))
    for t in range(n_tiles):
        stage = t % STAGES
        if LOOKAHEAD:
            # QK^T of the next tile (the last tile again at the end) runs under this softmax
            nxt = gl.minimum(t + 1, n_tiles - 1)
            nstage = nxt % STAGES
            mbarrier.wait(ready.index(nstage), (nxt // STAGES) & 1)
            sa_tok = warpgroup_mma(qa, k_a.index(nstage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            sb_tok = warpgroup_mma(qb, k_b.index(nstage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        else:
            if t > 0:
                mbarrier.wait(ready.index(stage), (t // STAGES) & 1)
                sa_tok = warpgroup_mma(qa, k_a.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                sb_tok = warpgroup_mma(qb, k_b.index(stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
                s_a, s_b = warpgroup_mma_wait(num_outstanding=0, deps=(sa_tok, sb_tok))

        cols = t * BLOCK_N + gl.arange(0, BLOCK_N, layout=col_qk)
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
        v = k_a.index(stage)
        acc_tok = warpgroup_mma(p_hi, v, acc, is_async=True)
        acc_tok = warpgroup_mma(p_lo, v, acc_tok, is_async=True)
        if LOOKAHEAD:
            acc, s_a, s_b = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok, sa_tok, sb_tok))
        else:
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc_tok,))
        mbarrier.arrive(empty.index(stage), count=1)

    o = acc / gl.convert_layout(l_i, row_pv)[:, None]
    rows = row0 + WG * ROWS + gl.arange(0, ROWS, layout=row_pv)
    ocols = dv * BLOCK_D + gl.arange(0, BLOCK_D, layout=col_pv)
    gl.store(O + rows[:, None] * stride_o + ocols[None, :], o.to(gl.bfloat16))


@gluon.jit
def dsv4_ws_kernel(q_desc, k_desc, O, S, stride_o, qk_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, BLOCK_D: gl.constexpr, STAGES: gl.constexpr,
                   CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, LOOKAHEAD: gl.constexpr,
                   num_warps: gl.constexpr):
    dv = gl.program_id(0)
    b = gl.program_id(1)
    row0 = b * BLOCK_M
    key0 = b * S
    n_tiles = gl.cdiv(S, BLOCK_N)
    ca = dv * BLOCK_D
    cb = BLOCK_D - ca
    q_a = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_D], q_desc.layout)
    q_b = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_M, BLOCK_D], q_desc.layout)
    k_a = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_D], k_desc.layout)
    k_b = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_N, BLOCK_D], k_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    qbar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
    mbarrier.init(qbar, count=1)
    gl.warp_specialize([
        (_consumer, (0, q_a, q_b, k_a, k_b, ready, empty, qbar, O, S, stride_o, qk_scale, row0, dv, n_tiles,
                     BLOCK_N, BLOCK_D, STAGES, LOOKAHEAD)),
        (_consumer, (1, q_a, q_b, k_a, k_b, ready, empty, qbar, O, S, stride_o, qk_scale, row0, dv, n_tiles,
                     BLOCK_N, BLOCK_D, STAGES, LOOKAHEAD)),
        (_producer, (q_desc, k_desc, q_a, q_b, k_a, k_b, ready, empty, qbar, row0, key0, ca, cb, n_tiles, BLOCK_N, STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


def dsv4_ws(q, k, out, BLOCK_N=32, STAGES=3, consumer_regs=232, producer_regs=40, lookahead=False):
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
    dsv4_ws_kernel[(2, B)](q_desc, k_desc, o2, S, o2.stride(0), D ** -0.5 * 1.4426950408889634,
                           BLOCK_M, BLOCK_N, BLOCK_D, STAGES, consumer_regs, producer_regs, lookahead, num_warps=4)
    return out

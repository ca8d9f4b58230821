"""Head dim 512 in bf16 on Hopper: the contract's attention in Gluon (Triton's tile-level
dialect: explicit layouts, shared memory, mbarriers and warp specialization), FlashMLA-style.

Why not the Triton kernel. One warpgroup cannot hold a 64 x 512 fp32 accumulator, so
fmha.kernels.triton_dense splits Dv = 512 across two programs, each recomputing QK^T over all 512
head-dim columns: on DSV4 decode (B64 Hq128 T1 S640, K is V) that is 50-52 us, 3.3x the
roofline floor. Here a CTA owns 64 rows and all of Dv, and QK^T is computed once per row:
- warpgroup 0 (the default partition) computes QK^T (two 256-column chunks chained into one
  accumulator), the masks and the online softmax, hands P (bf16 hi + lo) and the rescale
  factor to warpgroup 1 through double-buffered shared memory, then does P.V for Dv[0:256];
- warpgroup 1 does P.V for Dv[256:512] with P from shared memory;
- a one-warp producer streams key (and value) tiles in by TMA.
Warpgroups meet only at mbarriers, never at a CTA-wide barrier.

Rows are packed (t, g) pairs per (batch, KV head) as in the Triton kernel, so decode puts a
KV head's query heads in one tile, and causal, window, sink, LSE, split-KV partials and any
output strides work the same way; the P.V precision scheme is the Triton kernel's (P as
bf16 hi + lo, fp32 accumulation). The bits differ from the Triton kernel's (chained chunks,
64 keys to a tile), not the accuracy (the nightly gate: the same cosines).

K is V loads each key tile once and reads both P.V halves from it; separate V has its own
tiles, fetched into a one-stage ring, and the arithmetic is the same instruction for
instruction, so the two layouts give the same bits (the k-is-v law checks it).

Gluon has no interpreter: only the GPU tier runs this kernel; `fmha.kernels.compile_check` compiles
it for sm_90 on any machine.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from fmha.contract import Capabilities, implemented_by
from fmha.kernels import host
from fmha.kernels.host import key_operand
from fmha.kernels.triton_utils import pow2, renormalize

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    IMPORT_ERROR = None
except ImportError as e:  # an older Triton: the Triton kernel runs everything
    IMPORT_ERROR = e

# Kernel constants (constexpr so the kernel may read them; `.value` on the host).
ROWS = tl.constexpr(64)  # rows per CTA: one wgmma M per warpgroup
CHUNK = tl.constexpr(256)  # head-dim chunk: a TMA box is at most 256 wide
BLOCK_N = tl.constexpr(64)  # keys per tile
HEAD_DIM = 512
# (key stages, value stages) in shared memory: q takes 64 KiB, P 32 KiB, a 64-key tile 64 KiB.
STAGES_K_IS_V = (2, 2)  # the value tile is the key tile
STAGES_SEPARATE_V = (1, 1)
# Registers per thread: the two consumer warpgroups hold 64 x 256 fp32 accumulators, the
# producer only addresses.
CONSUMER_REGS, PRODUCER_REGS = tl.constexpr(232), tl.constexpr(40)


if IMPORT_ERROR is None:
    # The consumer warpgroups' register layouts: S = QK^T (ROWS x BLOCK_N) and the P.V
    # accumulator (ROWS x CHUNK) as wgmma writes them, P as its A operand, and their rows.
    QK_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N.value, 16]))
    PV_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, CHUNK.value, 16]))
    P_LAYOUT = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=PV_LAYOUT.value, k_width=2))
    ROW_QK = gl.constexpr(gl.SliceLayout(1, QK_LAYOUT.value))
    ROW_PV = gl.constexpr(gl.SliceLayout(1, PV_LAYOUT.value))

    @gluon.jit
    def _tile(ring, j):
        """Tile j of a key or value ring as a (BLOCK_N, CHUNK) MMA operand."""
        return ring.index(j).reshape([BLOCK_N, CHUNK])

    @gluon.jit
    def _fetch(desc, ring, ready, free, i, b, key, kvh, STAGES: gl.constexpr):
        """Tile i (keys from `key`, both head-dim chunks) into its ring slot once it is free."""
        s = i % STAGES
        mbarrier.wait(free.index(s), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(s), 2 * desc.block_type.nbytes)
        for c in gl.static_range(2):
            tma.async_copy_global_to_shared(desc, [b, key, kvh, c * CHUNK], ready.index(s), ring.index(2 * s + c))

    @gluon.jit
    def _producer(k_desc, v_desc, k_s, v_s, kready, kfree, vready, vfree, b, kvh, lo, n_tiles,
                  K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, V_FROM_K: gl.constexpr):
        for i in range(n_tiles):
            key = lo + i * BLOCK_N
            _fetch(k_desc, k_s, kready, kfree, i, b, key, kvh, K_STAGES)
            if not V_FROM_K:
                _fetch(v_desc, v_s, vready, vfree, i, b, key, kvh, V_STAGES)

    @gluon.jit
    def _store_rows(O, o, split, b, kvh, row0, T, G, col0, stride_os, stride_ob, stride_ot, stride_oh,
                    layout: gl.constexpr):
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        cols = col0 + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, layout))
        t = rows // G
        h = kvh * G + rows % G
        ptrs = O + split * stride_os + b * stride_ob + t[:, None] * stride_ot + h[:, None] * stride_oh + cols[None, :]
        gl.store(ptrs, o.to(O.dtype.element_ty), mask=(rows < T * G)[:, None])

    @gluon.jit
    def _handoff_barriers():
        """Warpgroup 0 to warpgroup 1: P full and P free (two slots each), and the row factors done."""
        pfull = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        pfree = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(2):
            mbarrier.init(pfull.index(s), count=1)
            mbarrier.init(pfree.index(s), count=1)
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(done, count=1)
        return pfull, pfree, done

    @gluon.jit
    def _online_softmax(s, m_i, l_i, e_i, p_s, a_s, pfull, pfree, i):
        """A key tile's logits `s` (base 2, -inf where masked) into the running max and sum,
        the sum and the accumulators held at 2^-e_i of their value (as
        fmha.kernels.triton_utils.renormalize's, which says why); P (bf16 hi + lo) and the
        rescale handed to warpgroup 1 in slot i % 2 once it has finished with it:
        (p_hi, p_lo, alpha, m_i, l_i, e_i)."""
        slot = i % 2
        m_new = gl.maximum(m_i, gl.max(s, axis=1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        alpha = gl.exp2(m_i - m_safe)
        factor, e_i = renormalize(l_i * alpha, e_i)
        alpha = alpha * factor
        p = gl.exp2(s - m_safe[:, None]) * pow2(-e_i)[:, None]
        l_i = l_i * alpha + gl.sum(p, axis=1)
        p_hi = p.to(gl.bfloat16)
        p_lo = (p - p_hi.to(gl.float32)).to(gl.bfloat16)
        mbarrier.wait(pfree.index(slot), ((i // 2) & 1) ^ 1)
        p_s.index(2 * slot).store(p_hi)
        p_s.index(2 * slot + 1).store(p_lo)
        a_s.index(slot).store(alpha)
        fence_async_shared()
        mbarrier.arrive(pfull.index(slot), count=1)
        return p_hi, p_lo, alpha, m_new, l_i, e_i

    @gluon.jit
    def _pv_half(acc, p_hi, p_lo, v):
        """acc + P.V for warpgroup 0's half of Dv: P as bf16 hi + lo, two MMAs."""
        acc = warpgroup_mma(gl.convert_layout(p_hi, P_LAYOUT), v, acc, is_async=True)
        acc = warpgroup_mma(gl.convert_layout(p_lo, P_LAYOUT), v, acc, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(acc,))

    @gluon.jit
    def _finish_rows(m_i, l_i, e_i, sink, f_s, done, HAS_SINK: gl.constexpr):
        """(the accumulator's rescale, the softmax denominator, the LSE in natural log) of each
        row; warpgroup 1 gets the first two through f_s once `done` fires. With HAS_SINK,
        `sink` (the rows' sinks, base 2) joins the denominator, never a value; the max is
        taken with it first so a large sink cannot overflow exp2."""
        scale_old = gl.full(m_i.shape, 1.0, gl.float32, m_i.type.layout)
        if HAS_SINK:
            m_final = gl.maximum(m_i, sink)
            m_final_safe = gl.where(m_final == float("-inf"), 0.0, m_final)  # nothing visible, sink -inf
            scale_old = gl.exp2(m_i - m_final_safe)
            l_i = l_i * scale_old + gl.exp2(sink - m_final_safe) * pow2(-e_i)
            m_i = m_final
        empty = l_i == 0.0
        denominator = gl.where(empty, 1.0, l_i)
        # the sum itself (exact: at most the key count), so the lse does not depend on where e_i stands
        log_sum = gl.log2(denominator * pow2(e_i))
        lse = gl.where(empty, float("-inf"), (m_i + log_sum) * 0.6931471805599453)  # ln(2)
        f_s.index(0).store(scale_old)
        f_s.index(1).store(denominator)
        mbarrier.arrive(done, count=1)
        return scale_old, denominator, lse

    @gluon.jit
    def _softmax_partition(q_s, k_s, v_s, p_s, a_s, f_s, kready, kfree, vready, vfree, pfull, pfree, done,
                           SINK, O, LSE, stride_os, stride_ob, stride_ot, stride_oh, stride_ls, stride_lb, stride_lh,
                           split, b, kvh, row0, T, S, G, WINDOW, qk_scale, lo, hi, n_tiles,
                           K_STAGES: gl.constexpr, V_STAGES: gl.constexpr, V_FROM_K: gl.constexpr,
                           CAUSAL: gl.constexpr, WINDOWED: gl.constexpr, HAS_SINK: gl.constexpr):
        rows = row0 + gl.arange(0, ROWS, layout=ROW_QK)
        position = S - T + rows // G  # each row's query position, for the masks
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, QK_LAYOUT)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, ROW_QK)
        l_i = gl.zeros([ROWS], gl.float32, ROW_QK)
        e_i = gl.zeros([ROWS], gl.int32, ROW_QK)
        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)
        for i in range(n_tiles):
            ks = i % K_STAGES
            vs = i % V_STAGES
            mbarrier.wait(kready.index(ks), (i // K_STAGES) & 1)
            s = warpgroup_mma(q_s.index(0), _tile(k_s, 2 * ks).permute((1, 0)), zero_s, use_acc=False, is_async=True)
            s = warpgroup_mma(q_s.index(1), _tile(k_s, 2 * ks + 1).permute((1, 0)), s, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s,))
            if not V_FROM_K:
                mbarrier.arrive(kfree.index(ks), count=1)
            cols = lo + i * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, QK_LAYOUT))
            visible = (cols < hi)[None, :]
            if CAUSAL:
                visible = visible & (cols[None, :] <= position[:, None])
            if WINDOWED:
                visible = visible & (cols[None, :] > position[:, None] - WINDOW)
            s = gl.where(visible, s * qk_scale, float("-inf"))
            p_hi, p_lo, alpha, m_i, l_i, e_i = _online_softmax(s, m_i, l_i, e_i, p_s, a_s, pfull, pfree, i)
            acc = acc * gl.convert_layout(alpha, ROW_PV)[:, None]
            mbarrier.wait(vready.index(vs), (i // V_STAGES) & 1)
            acc = _pv_half(acc, p_hi, p_lo, _tile(v_s, 2 * vs))
            mbarrier.arrive(vfree.index(vs), count=1)

        sink = m_i
        if HAS_SINK:
            sink = gl.load(SINK + kvh * G + rows % G, mask=rows < T * G, other=0.0).to(gl.float32) * 1.4426950408889634
        scale_old, denominator, lse = _finish_rows(m_i, l_i, e_i, sink, f_s, done, HAS_SINK)
        lse_ptrs = LSE + split * stride_ls + b * stride_lb + (kvh * G + rows % G) * stride_lh + rows // G
        gl.store(lse_ptrs, lse, mask=rows < T * G)
        o = acc * gl.convert_layout(scale_old, ROW_PV)[:, None] / gl.convert_layout(denominator, ROW_PV)[:, None]
        _store_rows(O, o, split, b, kvh, row0, T, G, 0, stride_os, stride_ob, stride_ot, stride_oh, PV_LAYOUT)

    @gluon.jit
    def _second_half_partition(v_s, p_s, a_s, f_s, vready, vfree, pfull, pfree, done,
                               O, stride_os, stride_ob, stride_ot, stride_oh, split, b, kvh, row0, T, G, n_tiles,
                               V_STAGES: gl.constexpr):
        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)
        for i in range(n_tiles):
            vs = i % V_STAGES
            slot = i % 2
            mbarrier.wait(pfull.index(slot), (i // 2) & 1)
            acc = acc * a_s.index(slot).load(ROW_PV)[:, None]
            mbarrier.wait(vready.index(vs), (i // V_STAGES) & 1)
            v = _tile(v_s, 2 * vs + 1)
            acc = warpgroup_mma(p_s.index(2 * slot), v, acc, is_async=True)
            acc = warpgroup_mma(p_s.index(2 * slot + 1), v, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(pfree.index(slot), count=1)
            mbarrier.arrive(vfree.index(vs), count=1)
        mbarrier.wait(done, 0)
        o = acc * f_s.index(0).load(ROW_PV)[:, None] / f_s.index(1).load(ROW_PV)[:, None]
        _store_rows(O, o, split, b, kvh, row0, T, G, CHUNK, stride_os, stride_ob, stride_ot, stride_oh, PV_LAYOUT)

    # Sizes are runtime values, never specialised: one compile per feature set, not per problem.
    @gluon.jit(do_not_specialize=("stride_ls", "stride_lb", "stride_lh", "T", "S", "HQ", "G", "WINDOW",
                                  "keys_per_split"))
    def _attention_fwd(
        Q, k_desc, v_desc, SINK, O, LSE,
        stride_qb, stride_qt, stride_qh,
        stride_os, stride_ob, stride_ot, stride_oh,
        stride_ls, stride_lb, stride_lh,
        T, S, HQ, G, WINDOW, qk_scale, keys_per_split,
        CAUSAL: gl.constexpr, WINDOWED: gl.constexpr, HAS_SINK: gl.constexpr, V_FROM_K: gl.constexpr,
        K_STAGES: gl.constexpr, V_STAGES: gl.constexpr,
    ):
        row0 = gl.program_id(0) * ROWS
        HKV = HQ // G
        b = gl.program_id(1) // HKV
        kvh = gl.program_id(1) % HKV
        split = gl.program_id(2)

        # The keys this CTA visits: its split, cut to what its rows can see.
        lo = split * keys_per_split
        hi = gl.minimum(S, lo + keys_per_split)
        if CAUSAL:
            last_t = gl.minimum(row0 + ROWS - 1, T * G - 1) // G
            hi = gl.minimum(hi, S - T + last_t + 1)
        if WINDOWED:
            lo = gl.maximum(lo, S - T + row0 // G - WINDOW + 1)
        n_tiles = gl.maximum(hi - lo + BLOCK_N - 1, 0) // BLOCK_N

        # q (rows packed (t, g), any strides) into shared memory once, in two head-dim chunks.
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, CHUNK], gl.bfloat16)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, CHUNK], tile_layout)
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, q_layout))
        q_rows = Q + b * stride_qb + (rows // G)[:, None] * stride_qt + (kvh * G + rows % G)[:, None] * stride_qh
        for c in gl.static_range(2):
            cols = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, q_layout))
            q_s.index(c).store(gl.load(q_rows + cols[None, :], mask=(rows < T * G)[:, None], other=0.0))
        fence_async_shared()

        # Key and value tiles as TMA writes them: (1, BLOCK_N, 1, CHUNK) boxes of (B, S, HKV, D).
        k_s = gl.allocate_shared_memory(gl.bfloat16, [2 * K_STAGES, 1, BLOCK_N, 1, CHUNK], k_desc.layout)
        if V_FROM_K:
            v_s = k_s
        else:
            v_s = gl.allocate_shared_memory(gl.bfloat16, [2 * V_STAGES, 1, BLOCK_N, 1, CHUNK], v_desc.layout)
        p_s = gl.allocate_shared_memory(gl.bfloat16, [4, ROWS, BLOCK_N],
                                        gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], gl.bfloat16))
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        a_s = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_layout)
        f_s = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_layout)
        kready = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
        kfree = gl.allocate_shared_memory(gl.int64, [K_STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(K_STAGES):
            mbarrier.init(kready.index(s), count=1)
            # With K is V both warpgroups free a tile after P.V; else warpgroup 0 after QK^T.
            mbarrier.init(kfree.index(s), count=2 if V_FROM_K else 1)
        if V_FROM_K:
            vready = kready
            vfree = kfree
        else:
            vready = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
            vfree = gl.allocate_shared_memory(gl.int64, [V_STAGES, 1], mbarrier.MBarrierLayout())
            for s in gl.static_range(V_STAGES):
                mbarrier.init(vready.index(s), count=1)
                mbarrier.init(vfree.index(s), count=2)
        pfull, pfree, done = _handoff_barriers()

        gl.warp_specialize([
            (_softmax_partition, (q_s, k_s, v_s, p_s, a_s, f_s, kready, kfree, vready, vfree, pfull, pfree, done,
                                  SINK, O, LSE, stride_os, stride_ob, stride_ot, stride_oh,
                                  stride_ls, stride_lb, stride_lh, split, b, kvh, row0, T, S, G, WINDOW, qk_scale,
                                  lo, hi, n_tiles, K_STAGES, V_STAGES, V_FROM_K, CAUSAL, WINDOWED, HAS_SINK)),
            (_second_half_partition, (v_s, p_s, a_s, f_s, vready, vfree, pfull, pfree, done,
                                      O, stride_os, stride_ob, stride_ot, stride_oh, split, b, kvh, row0, T, G,
                                      n_tiles, V_STAGES)),
            (_producer, (k_desc, v_desc, k_s, v_s, kready, kfree, vready, vfree, b, kvh, lo, n_tiles,
                         K_STAGES, V_STAGES, V_FROM_K)),
        ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


CAPABILITIES = Capabilities(
    head_dims=(HEAD_DIM,),
    dtypes=(torch.bfloat16,),
    devices=("cuda",),
    split_head_dim_v=False,
    promises=frozenset({"bitwise_deterministic", "batch_invariant"}),
    notes={"head_dim": "fmha.attention runs the Triton kernel for the others",
           "dtype": "bf16 only (P as bf16 hi + lo, like the Triton kernel's bf16 path)",
           "device": "a Hopper GPU: wgmma, TMA and warp specialization, no interpreter"},
)


@functools.cache
def availability(device) -> str | None:
    """Why the Gluon kernel cannot run on `device` ("cuda", a torch.device) at all, or None.
    Cached: fmha.attention asks on every call."""
    if IMPORT_ERROR is not None:
        return f"no Gluon in this Triton ({IMPORT_ERROR})"
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA GPU"
    major, minor = torch.cuda.get_device_capability(device)
    if major != 9:
        return f"needs a Hopper GPU (sm_90), this one is sm_{major}{minor}"
    return None


def key_layout():
    """The shared-memory layout of a key or value tile as TMA writes it (1, BLOCK_N, 1, CHUNK)."""
    return gl.NVMMASharedLayout.get_default_for([1, BLOCK_N, 1, CHUNK], gl.bfloat16)


def launch(problem, q, k, v, sink, o, lse, *, window, qk_scale, keys_per_split, split, tiles=None):
    """One launch into o (B, T, HQ, 512) and lse (B, HQ, T), or with `split` into the fp32
    partials o (splits, B, T, HQ, 512) and lse (splits, B, HQ, T) (fmha.kernels.host.run)."""
    if tiles is not None:
        raise ValueError("tiles: the Gluon kernel has one tile shape; tile overrides are the Triton kernel's")
    B, T, HQ, _ = q.shape
    G = problem.group
    k_operand = key_operand(k)
    v_operand = k_operand if problem.shared_kv else key_operand(v)
    descriptors = [TensorDescriptor(t, shape, strides, [1, BLOCK_N.value, 1, CHUNK.value], key_layout())
                   for t, shape, strides in (k_operand, v_operand)]
    grid = (triton.cdiv(T * G, ROWS.value), B * (HQ // G), o.shape[0])
    _attention_fwd[grid](
        q, *descriptors, sink if sink is not None else q, o, lse,
        q.stride(0), q.stride(1), q.stride(2),
        o.stride(0), o.stride(1), o.stride(2), o.stride(3),
        lse.stride(0), lse.stride(1), lse.stride(2),
        T, problem.kv_len, HQ, G, window or 0, qk_scale, keys_per_split,
        num_warps=4,
        **specialization(causal=problem.causal, windowed=window is not None, sink=sink is not None, split=split,
                         k_is_v=problem.shared_kv),
    )


def specialization(*, causal: bool, windowed: bool, sink: bool, split: bool, k_is_v: bool) -> dict:
    """The kernel's compile-time arguments (also for fmha.kernels.compile_check)."""
    k_stages, v_stages = STAGES_K_IS_V if k_is_v else STAGES_SEPARATE_V
    return dict(CAUSAL=causal, WINDOWED=windowed, HAS_SINK=sink and not split, V_FROM_K=k_is_v,
                K_STAGES=k_stages, V_STAGES=v_stages)


def attend(problem, q, k, v, *, scale=None, sink=None, out=None):
    """A checked dense call (fmha.contract.check_attention_args) the capabilities cover."""
    return host.run(problem, q, k, v, launch=launch, key_tile=lambda problem, device_type, tiles: BLOCK_N.value,
                    scale=scale, sink=sink, out=out)


ENTRY = implemented_by("gluon", attend, CAPABILITIES, availability=availability, default_devices=("cuda",),
                       description="fmha's Gluon kernel alone: bf16 head dim 512 on Hopper (FlashMLA-style); "
                                   "fmha.attention runs it there")

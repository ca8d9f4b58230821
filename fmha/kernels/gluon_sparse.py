"""DeepSeek-V4's sparse decode on Hopper in Gluon: each query row's keys by index over one or
two caches (bf16, or the dsv4-fp8 / dsv4-fp4 bytes), K = V of head dim 512, a sink, in bf16.

The shape of fmha.kernels.gluon_dense (FlashMLA's too), with a gather in place of TMA:
- a CTA owns 64 query heads of one (request, query row, KV head): DSV4's heads all read the
  row's indices, so a key tile serves 64 rows and QK^T is computed once per row;
- a gathering warpgroup reads each 32-key tile's slots (-1 and slots past `topk_len` are no
  key; the slots of the tile after the next are in flight meanwhile), loads a quantized tile's
  bytes with vector loads before it waits for a free stage (FP4: the next tile's bytes are
  asked of L2 meanwhile), dequantizes them (e4m3 by the hardware conversion, e2m1 placed as an
  fp16's bits, a byte's two codes in one 32-bit word, times the power-of-two scale: exact in
  bf16) and stores the bf16 tile into shared memory in one store (FP4: two), four stages deep,
  with a row of 0 / -inf per key. A key that is not read is zeros, so no byte of it (NaN
  poison included) reaches a sum;
- warpgroup 0 issues QK^T of tile i + 1 before the softmax of tile i (so the tensor cores
  work during it), adds the key row, runs the online softmax and hands P (bf16 hi + lo) to
  warpgroup 1; both do P.V, each for half of Dv; the second scope's tiles follow the first's
  in the same softmax, and the sink joins its denominator once, at the end.

Where the time goes (H200, DSV4 B64 T1 top-k 128+512 FP8, 49 us; the variants timed in
BENCHMARKS.md, "Where the sparse kernel's time goes"): the consumers alone take
41.3 us and the gatherer alone 36.8; together they slow each other by about 8. The consumers are
bound by their MMAs at the margin (without P.V's low half, 35.0 us; with QK^T over half the
dims, 36.9) plus per-tile bubbles. The gatherer is bound by its own work, not by the latency of
its reads (with the next tile prefetched into L2 it takes 34.6), and each key is read and
dequantized by both CTAs of an Hq 128 row: the whole kernel with P hi only (FlashMLA's
precision) still takes 46.3. Sharing a dequantized tile between the two needs a CTA cluster's
distributed shared memory (FlashMLA's "crossover"), which Gluon in Triton 3.6 does not have.

Index-sparse rows are one CTA each, never split: a row padded with -1 then gives the same bits
(the -1 law), and DSV4 decode already has B x T x Hq / 64 CTAs. Gluon has no interpreter: the
CPU tier runs fmha.kernels.triton_paged; `fmha.kernels.compile_check --sources` compiles this for sm_90.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from fmha.kernels import gluon_dense as dense
from fmha.contract import CACHE_LAYOUTS, Capabilities, implemented_by
from fmha.kernels.host import LOG2E
from fmha.kernels.triton_paged import LAYOUT_CODES, decode_ue8m0
from fmha.kernels.triton_utils import q_unit

if dense.IMPORT_ERROR is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

ROWS, CHUNK = dense.ROWS, dense.CHUNK
HEAD_DIM = dense.HEAD_DIM
BLOCK_N = tl.constexpr(32)  # keys per tile: a tile is 32 KiB of bf16, so four fit beside q (64 KiB) and P (16 KiB)
STAGES = tl.constexpr(4)
GATHER_WARPS = tl.constexpr(4)
# Registers per thread (12 warps: 168 each at launch; 16 warps leave 128, fewer than a 64 x 256
# fp32 accumulator's wgmma needs): warpgroup 1 holds one, the gathering warpgroup an FP8 tile's
# bytes (36 a thread); warpgroup 0 (an accumulator, two QK^T tiles and P) gets the 224 left.
SECOND_HALF_REGS, GATHER_REGS = tl.constexpr(168), tl.constexpr(112)


if dense.IMPORT_ERROR is None:
    PV_LAYOUT, ROW_PV = dense.PV_LAYOUT, dense.ROW_PV
    QK_LAYOUT = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                       instr_shape=[16, BLOCK_N.value, 16]))
    ROW_QK = gl.constexpr(gl.SliceLayout(1, QK_LAYOUT.value))
    # The gather's tiles: 16 bytes a thread, four threads a key's 64 columns, 32 keys.
    GATHER_LAYOUT = gl.constexpr(gl.BlockedLayout([1, 16], [8, 4], [GATHER_WARPS.value, 1], [1, 0]))
    GATHER_COLS = gl.constexpr(gl.SliceLayout(0, GATHER_LAYOUT.value))
    GATHER_KEYS = gl.constexpr(gl.SliceLayout(1, GATHER_LAYOUT.value))
    # An FP8 tile as [group, key, column]: a thread holds 16 columns of one key in all 8 groups.
    FP8_TILE = gl.constexpr(gl.BlockedLayout([1, 1, 16], [1, 8, 4], [1, GATHER_WARPS.value, 1], [2, 1, 0]))
    GROUP_KEYS = gl.constexpr(gl.SliceLayout(2, FP8_TILE.value))
    KEY_COLS = gl.constexpr(gl.SliceLayout(0, FP8_TILE.value))
    # An FP4 tile's bytes [group, key, byte]: a thread's 8 bytes are the 16 columns it holds in FP8_TILE.
    FP4_BYTES = gl.constexpr(gl.BlockedLayout([1, 1, 8], [1, 8, 4], [1, GATHER_WARPS.value, 1], [2, 1, 0]))
    FP4_KEYS = gl.constexpr(gl.SliceLayout(2, FP4_BYTES.value))
    # A stage of the ring as the 8 swizzled [keys, 64] blocks its two [keys, 256] chunks are made of.
    STAGE_LAYOUT = gl.constexpr(gl.NVMMASharedLayout(128, 16, rank=3))
    # The L2 prefetch of a tile's keys as [key, probe]: 8 probes a key, 2 a thread (its four column threads').
    PROBES = gl.constexpr(gl.BlockedLayout([1, 2], [8, 4], [GATHER_WARPS.value, 1], [1, 0]))

    @gluon.jit
    def _put(k_s, stage, group: gl.constexpr, x):
        """Columns [64 group, 64 group + 64) of the stage's key tile (two 256-column chunks)."""
        k_s.index(2 * stage + group // 4).slice((group % 4) * 64, 64, dim=1).store(x.to(gl.bfloat16))

    @gluon.jit
    def _e4m3(codes, scale_codes):
        """fp32 values of e4m3 codes (uint8) times their ue8m0 scales (broadcast to the codes)."""
        return codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * decode_ue8m0(scale_codes.to(gl.int32))

    @gluon.jit
    def _claim(kfree, bias_s, i, read):
        """Wait until both consumer warpgroups are done with tile i's stage, then write its key row:
        0 for a key, -inf for a slot that is none."""
        stage = i % STAGES
        mbarrier.wait(kfree.index(stage), ((i // STAGES) & 1) ^ 1)
        bias_s.index(stage).store(gl.where(read, 0.0, float("-inf")))
        return stage

    @gluon.jit
    def _slots(IDX, keys, n_keys):
        """The scope's slots at `keys` (-1 past its n_keys)."""
        return gl.load(IDX + keys, mask=keys < n_keys, other=-1)

    @gluon.jit
    def _locate(slot, keys, n_keys, block_size):
        """(the keys that are read: in the scope and not -1, their pages, their offsets in them)."""
        read = (keys < n_keys) & (slot >= 0)
        slot = gl.where(read, slot, 0)
        return read, (slot // block_size).to(gl.int64), slot % block_size

    @gluon.jit
    def _prefetch(K, slot, keys, n_keys, block_size, stride_kb, TOKEN: gl.constexpr, SCALES: gl.constexpr):
        """Ask L2 for the keys' bytes (every 128-byte line of a token, and its scales) a tile before
        they are loaded, so that the gather's loads wait on L2 rather than on memory."""
        read, page, offset = _locate(slot, keys, n_keys, block_size)
        KEYS: gl.constexpr = gl.SliceLayout(1, PROBES)
        page_base = gl.convert_layout(K + page * stride_kb, KEYS)
        offset = gl.convert_layout(offset, KEYS)
        probe = gl.arange(0, 8, layout=gl.SliceLayout(0, PROBES))
        token = (page_base + offset * TOKEN)[:, None] + gl.minimum(probe * 128, TOKEN - 1)[None, :]
        scales = (page_base + block_size * TOKEN + offset * SCALES)[:, None] + ((probe - 6) * (SCALES - 1))[None, :]
        wanted = gl.convert_layout(read, KEYS)[:, None] & (probe >= 0)[None, :]
        gl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.b32 $0, 0; }",
                                  "=r,l,r", [gl.where((probe < 6)[None, :], token, scales), wanted.to(gl.int32)],
                                  dtype=gl.int32, is_pure=False, pack=1)

    @gluon.jit
    def _fp4_half(page_base, token, offset, read, block_size, half: gl.constexpr):
        """Groups [4 half, 4 half + 4) of the keys' dsv4-fp4 tokens: (codes [4, keys, 32] bytes,
        low and high scale codes [4, keys]), in the bytes' layout."""
        KEYS: gl.constexpr = gl.SliceLayout(0, FP4_KEYS)
        groups = 4 * half + gl.arange(0, 4, layout=gl.SliceLayout(1, FP4_KEYS))
        code = gl.convert_layout(read, KEYS)[None, :] & (groups < 7)[:, None]
        scales = gl.convert_layout(page_base + block_size * 352 + offset * 16, KEYS)[None, :] + 2 * groups[:, None]
        pairs = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(0, FP4_BYTES)))
        at = gl.convert_layout(token, KEYS)[None, :] + 32 * groups[:, None]
        codes = gl.load(at[:, :, None] + pairs[None, :][None, :, :], mask=code[:, :, None], other=0)
        return codes, gl.load(scales, mask=code, other=127), gl.load(scales + 1, mask=code, other=127)

    @gluon.jit
    def _fp4_values(codes, low, high):
        """bf16 values [4, keys, 64] (FP8_TILE) of _fp4_half's bytes: e2m1 low nibble first,
        columns 0-31 of a group scaled by its low scale, 32-63 by its high one."""
        pairs = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(0, FP4_BYTES)))
        scale = gl.where((pairs < 16)[None, :][None, :, :], decode_ue8m0(low.to(gl.int32))[:, :, None],
                         decode_ue8m0(high.to(gl.int32))[:, :, None])
        first, second = _e2m1_pair(codes.to(gl.int32))
        value = gl.join((first * scale).to(gl.bfloat16), (second * scale).to(gl.bfloat16))
        return gl.convert_layout(gl.reshape(value, [4, BLOCK_N, 64]), FP8_TILE)

    @gluon.jit
    def _e2m1_pair(byte):
        """fp32 values of the two e2m1 codes in `byte` (int32, 0-255), low nibble first. A code's
        sign, exponent and mantissa bits placed as an fp16's are its value times 2^-14 (normal
        or subnormal); the byte times 4097 holds its high nibble 16 bits above its low one, so
        one 32-bit word is built for both fp16s: half the bit operations of a nibble at a time
        (the FP4 gather is bound by its instructions), and fewer registers than
        fmha.kernels.triton_paged' _decode_e2m1 (with which the gatherer spilled)."""
        both = byte * 4097
        halves = ((both & 0x70007) << 9) | ((both & 0x80008) << 12)
        first = halves.to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        second = (halves >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
        return first * 16384.0, second * 16384.0

    @gluon.jit
    def _gather_quantized(K, IDX, n_keys, block_size, stride_kb, k_s, bias_s, kready, kfree, first_tile,
                          LAYOUT: gl.constexpr):
        """dsv4-fp8 (LAYOUT 1) or dsv4-fp4 (2) keys. A token is 7 groups of 64 dims (e4m3, or e2m1
        two a byte), then 64 bf16 rope dims: 576 or 352 data bytes; the page's scales (8 or 16
        bytes a token: one a group, or one a half group) follow its tokens. A tile's bytes are
        all loaded before the gatherer waits for its stage, so their latency overlaps the
        consumers' work, and the tile is stored as one [group, key, column] tensor (FP4: two
        halves, for registers): a store per group was a warpgroup barrier each (Triton orders
        stores into one allocation)."""
        keys = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, GROUP_KEYS))
        groups = gl.arange(0, 8, layout=gl.SliceLayout(1, GROUP_KEYS))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, KEY_COLS))
        if LAYOUT == 1:
            stages = k_s._reinterpret(gl.bfloat16, [STAGES, 8, BLOCK_N, 64], STAGE_LAYOUT)
        else:
            halves = k_s._reinterpret(gl.bfloat16, [2 * STAGES, 4, BLOCK_N, 64], STAGE_LAYOUT)
        TOKEN: gl.constexpr = 576 if LAYOUT == 1 else 352
        slot = _slots(IDX, keys, n_keys)
        following = _slots(IDX, keys + BLOCK_N, n_keys)
        for tile in range(gl.cdiv(n_keys, BLOCK_N)):
            read, page, offset = _locate(slot, keys, n_keys, block_size)
            page_base = K + page * stride_kb
            token = page_base + offset * TOKEN
            if LAYOUT == 1:
                code = read[None, :] & (groups < 7)[:, None]
                scale = gl.load(page_base[None, :] + block_size * 576 + offset[None, :] * 8 + groups[:, None],
                                mask=code, other=127)
                codes = gl.load((token[None, :] + groups[:, None] * 64)[:, :, None] + cols[None, :][None, :, :],
                                mask=code[:, :, None], other=0)
            else:
                codes0, low0, high0 = _fp4_half(page_base, token, offset, read, block_size, 0)
                codes1, low1, high1 = _fp4_half(page_base, token, offset, read, block_size, 1)
            rope_read = gl.convert_layout(read, gl.SliceLayout(1, KEY_COLS))
            rope = gl.convert_layout(token + (TOKEN - 128), gl.SliceLayout(1, KEY_COLS))
            rope = rope.to(gl.pointer_type(gl.bfloat16))
            rope = gl.load(rope[:, None] + cols[None, :], mask=rope_read[:, None], other=0.0)
            # While this tile's bytes are in flight: the slots of the tile after the next, and for
            # FP4 the next tile's bytes into L2 (5-7% faster; FP8 was not faster: the same at B64,
            # up to 1.4% slower at B256; BENCHMARKS.md).
            keys = keys + BLOCK_N
            if LAYOUT == 2:
                _prefetch(K, following, keys, n_keys, block_size, stride_kb, TOKEN, 16)
            slot = following
            following = _slots(IDX, keys + BLOCK_N, n_keys)
            stage = _claim(kfree, bias_s, first_tile + tile, gl.convert_layout(read, GATHER_KEYS))
            if LAYOUT == 1:
                value = _e4m3(codes, scale[:, :, None]).to(gl.bfloat16)
                stages.index(stage).store(gl.where((groups == 7)[:, None, None], rope[None, :, :], value))
            else:
                halves.index(2 * stage).store(_fp4_values(codes0, low0, high0))
                last = gl.arange(0, 4, layout=gl.SliceLayout(1, GROUP_KEYS)) == 3
                halves.index(2 * stage + 1).store(gl.where(last[:, None, None], rope[None, :, :],
                                                           _fp4_values(codes1, low1, high1)))
            fence_async_shared()
            mbarrier.arrive(kready.index(stage), count=1)

    @gluon.jit
    def _gather_scope(K, IDX, n_keys, block_size, stride_kb, stride_ks, stride_kh, kvh, k_s, bias_s, kready, kfree,
                      first_tile, LAYOUT: gl.constexpr):
        """The scope's keys (slots IDX[0:n_keys]) into the ring as bf16 tiles, from ring tile
        `first_tile` on."""
        if LAYOUT != 0:
            _gather_quantized(K, IDX, n_keys, block_size, stride_kb, k_s, bias_s, kready, kfree, first_tile, LAYOUT)
        else:  # K's dtype (bf16), any strides
            cols = gl.arange(0, 64, layout=GATHER_COLS)
            keys = gl.arange(0, BLOCK_N, layout=GATHER_KEYS)
            slot = _slots(IDX, keys, n_keys)
            for tile in range(gl.cdiv(n_keys, BLOCK_N)):
                read, page, offset = _locate(slot, keys, n_keys, block_size)
                # The next tile's slots, in flight while this one is gathered.
                keys = keys + BLOCK_N
                slot = _slots(IDX, keys, n_keys)
                stage = _claim(kfree, bias_s, first_tile + tile, read)
                base = K + page * stride_kb + offset * stride_ks + kvh * stride_kh
                for group in gl.static_range(8):
                    _put(k_s, stage, group, gl.load(base[:, None] + (group * 64 + cols)[None, :],
                                                    mask=read[:, None], other=0.0))
                fence_async_shared()
                mbarrier.arrive(kready.index(stage), count=1)

    @gluon.jit
    def _gather_partition(K1, K2, IDX1, IDX2, n_keys1, n_keys2, block_size1, block_size2,
                          stride_k1b, stride_k1s, stride_k1h, stride_k2b, stride_k2s, stride_k2h,
                          kvh, k_s, bias_s, kready, kfree,
                          LAYOUT1: gl.constexpr, LAYOUT2: gl.constexpr, TWO_SCOPES: gl.constexpr):
        _gather_scope(K1, IDX1, n_keys1, block_size1, stride_k1b, stride_k1s, stride_k1h, kvh, k_s, bias_s,
                      kready, kfree, 0, LAYOUT1)
        if TWO_SCOPES:
            _gather_scope(K2, IDX2, n_keys2, block_size2, stride_k2b, stride_k2s, stride_k2h, kvh, k_s, bias_s,
                          kready, kfree, gl.cdiv(n_keys1, BLOCK_N), LAYOUT2)

    @gluon.jit
    def _qk(q_s, k_s, stage, zero_s):
        """Issue QK^T of the stage's key tile (two 256-column chunks into one accumulator)."""
        s = warpgroup_mma(q_s.index(0), k_s.index(2 * stage).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        return warpgroup_mma(q_s.index(1), k_s.index(2 * stage + 1).permute((1, 0)), s, is_async=True)

    @gluon.jit
    def _softmax_partition(q_s, k_s, bias_s, p_s, a_s, f_s, kready, kfree, pfull, pfree, done,
                           SINK, O, LSE, stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
                           b, t, kvh, row0, G, qk_scale, n_tiles, HAS_SINK: gl.constexpr):
        """QK^T, the key rows, the online softmax (P and the rescale to warpgroup 1) and P.V for
        Dv[0:256]. Tile i + 1's QK^T runs on the tensor cores during tile i's softmax; the last
        tile's is issued twice, as the loop has no next tile to issue."""
        rows = row0 + gl.arange(0, ROWS, layout=ROW_QK)
        zero_s = gl.zeros([ROWS, BLOCK_N], gl.float32, QK_LAYOUT)
        m_i = gl.full([ROWS], float("-inf"), gl.float32, ROW_QK)
        l_i = gl.zeros([ROWS], gl.float32, ROW_QK)
        e_i = gl.zeros([ROWS], gl.int32, ROW_QK)
        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)
        s = zero_s
        if n_tiles > 0:  # a row may have no key (topk_len 0): then no tile ever comes
            mbarrier.wait(kready.index(0), 0)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(_qk(q_s, k_s, 0, zero_s),))
        for i in range(n_tiles):
            ks = i % STAGES
            following = gl.minimum(i + 1, n_tiles - 1)
            mbarrier.wait(kready.index(following % STAGES), (following // STAGES) & 1)
            s_next = _qk(q_s, k_s, following % STAGES, zero_s)
            # 0 for a key, -inf for a slot that is none (its tile row is zeros)
            s = s * qk_scale + bias_s.index(ks).load(gl.SliceLayout(0, QK_LAYOUT))[None, :]
            p_hi, p_lo, alpha, m_i, l_i, e_i = dense._online_softmax(s, m_i, l_i, e_i, p_s, a_s, pfull, pfree, i)
            acc = acc * gl.convert_layout(alpha, ROW_PV)[:, None]
            v = k_s.index(2 * ks)
            acc = warpgroup_mma(gl.convert_layout(p_hi, dense.P_LAYOUT), v, acc, is_async=True)
            acc = warpgroup_mma(gl.convert_layout(p_lo, dense.P_LAYOUT), v, acc, is_async=True)
            acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s_next))
            mbarrier.arrive(kfree.index(ks), count=1)

        sink = m_i
        if HAS_SINK:  # once, over both scopes
            sink = gl.load(SINK + kvh * G + rows, mask=rows < G, other=0.0).to(gl.float32) * 1.4426950408889634
        scale_old, denominator, lse = dense._finish_rows(m_i, l_i, e_i, sink, f_s, done, HAS_SINK)
        gl.store(LSE + b * stride_lb + (kvh * G + rows) * stride_lh + t * stride_lt, lse, mask=rows < G)
        o = acc * gl.convert_layout(scale_old, ROW_PV)[:, None] / gl.convert_layout(denominator, ROW_PV)[:, None]
        # One query row: fmha.kernels.gluon_dense's row store with T = 1 and the row's offset as its split.
        dense._store_rows(O, o, t, b, kvh, row0, 1, G, 0, stride_ot, stride_ob, 0, stride_oh, PV_LAYOUT)

    @gluon.jit
    def _second_half_partition(k_s, p_s, a_s, f_s, kfree, pfull, pfree, done, O, stride_ob, stride_ot, stride_oh,
                               b, t, kvh, row0, G, n_tiles):
        """Warpgroup 1: P.V for Dv[256:512] (K is V: the key tile's second chunk), then the
        rows' normalisation and store."""
        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)
        for i in range(n_tiles):
            ks = i % STAGES
            slot = i % 2
            mbarrier.wait(pfull.index(slot), (i // 2) & 1)
            acc = acc * a_s.index(slot).load(ROW_PV)[:, None]
            v = k_s.index(2 * ks + 1)
            acc = warpgroup_mma(p_s.index(2 * slot), v, acc, is_async=True)
            acc = warpgroup_mma(p_s.index(2 * slot + 1), v, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(pfree.index(slot), count=1)
            mbarrier.arrive(kfree.index(ks), count=1)
        mbarrier.wait(done, 0)
        o = acc * f_s.index(0).load(ROW_PV)[:, None] / f_s.index(1).load(ROW_PV)[:, None]
        # One query row: fmha.kernels.gluon_dense's row store with T = 1 and the row's offset as its split.
        dense._store_rows(O, o, t, b, kvh, row0, 1, G, CHUNK, stride_ot, stride_ob, 0, stride_oh, PV_LAYOUT)

    # Lengths, top-k, block sizes and the LSE's and indices' strides are runtime values: a compile
    # per cache layout pair and sink flag, not per problem. The q, o and cache strides stay
    # specialized (as fmha.kernels.gluon_dense's): Triton vectorizes loads it knows are 16-byte
    # aligned, and gathered the bytes one at a time otherwise.
    RUNTIME_ARGS = ("stride_lb", "stride_lh", "stride_lt", "stride_i1b", "stride_i1t", "stride_i2b", "stride_i2t",
                    "T", "HQ", "G", "block_size1", "block_size2", "topk1", "topk2", "has_topk_len1", "has_topk_len2")

    @gluon.jit(do_not_specialize=RUNTIME_ARGS)
    def _sparse_fwd(
        Q, K1, K2, IDX1, IDX2, TOPK_LEN1, TOPK_LEN2, SINK, O, LSE,
        stride_qb, stride_qt, stride_qh, stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
        stride_k1b, stride_k1s, stride_k1h, stride_k2b, stride_k2s, stride_k2h,
        stride_i1b, stride_i1t, stride_i2b, stride_i2t,
        T, HQ, G, qk_scale, q_unit, block_size1, block_size2, topk1, topk2, has_topk_len1, has_topk_len2,
        LAYOUT1: gl.constexpr, LAYOUT2: gl.constexpr, TWO_SCOPES: gl.constexpr, HAS_SINK: gl.constexpr,
    ):
        row0 = gl.program_id(0) * ROWS
        HKV = HQ // G
        kvh = gl.program_id(1) % HKV
        b = gl.program_id(1) // HKV // T
        t = gl.program_id(1) // HKV % T
        IDX1 += b * stride_i1b + t * stride_i1t  # the row's slots
        IDX2 += b * stride_i2b + t * stride_i2t
        n_keys1 = topk1
        if has_topk_len1:
            n_keys1 = gl.load(TOPK_LEN1 + b)
        n_tiles = gl.cdiv(n_keys1, BLOCK_N)
        n_keys2 = 0
        if TWO_SCOPES:
            n_keys2 = topk2
            if has_topk_len2:
                n_keys2 = gl.load(TOPK_LEN2 + b)
            n_tiles += gl.cdiv(n_keys2, BLOCK_N)

        # q (the row's heads, any strides) into shared memory once, in two head-dim chunks, times
        # q_unit (fmha.kernels.triton_utils.q_unit: q.k would overflow fp32 before the scale).
        q_layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        tile_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([ROWS, CHUNK], gl.bfloat16)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [2, ROWS, CHUNK], tile_layout)
        rows = row0 + gl.arange(0, ROWS, layout=gl.SliceLayout(1, q_layout))
        q_rows = Q + b * stride_qb + t * stride_qt + (kvh * G + rows)[:, None] * stride_qh
        for c in gl.static_range(2):
            cols = c * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(0, q_layout))
            q_chunk = gl.load(q_rows + cols[None, :], mask=(rows < G)[:, None], other=0.0)
            q_s.index(c).store((q_chunk.to(gl.float32) * q_unit).to(gl.bfloat16))
        fence_async_shared()

        key_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, CHUNK], gl.bfloat16)
        k_s = gl.allocate_shared_memory(gl.bfloat16, [2 * STAGES, BLOCK_N, CHUNK], key_layout)
        vec_layout: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[0])
        bias_s = gl.allocate_shared_memory(gl.float32, [STAGES, BLOCK_N], vec_layout)
        p_s = gl.allocate_shared_memory(gl.bfloat16, [4, ROWS, BLOCK_N],
                                        gl.NVMMASharedLayout.get_default_for([ROWS, BLOCK_N], gl.bfloat16))
        a_s = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_layout)
        f_s = gl.allocate_shared_memory(gl.float32, [2, ROWS], vec_layout)
        kready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        kfree = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(kready.index(s), count=1)
            mbarrier.init(kfree.index(s), count=2)  # K is V: both warpgroups free a tile after P.V
        pfull, pfree, done = dense._handoff_barriers()

        gl.warp_specialize([
            (_softmax_partition, (q_s, k_s, bias_s, p_s, a_s, f_s, kready, kfree, pfull, pfree, done,
                                  SINK, O, LSE, stride_ob, stride_ot, stride_oh, stride_lb, stride_lh, stride_lt,
                                  b, t, kvh, row0, G, qk_scale, n_tiles, HAS_SINK)),
            (_second_half_partition, (k_s, p_s, a_s, f_s, kfree, pfull, pfree, done, O, stride_ob, stride_ot,
                                      stride_oh, b, t, kvh, row0, G, n_tiles)),
            (_gather_partition, (K1, K2, IDX1, IDX2, n_keys1, n_keys2, block_size1, block_size2,
                                 stride_k1b, stride_k1s, stride_k1h, stride_k2b, stride_k2s, stride_k2h,
                                 kvh, k_s, bias_s, kready, kfree, LAYOUT1, LAYOUT2, TWO_SCOPES)),
        ], [4, GATHER_WARPS], [SECOND_HALF_REGS, GATHER_REGS])


CAPABILITIES = Capabilities(
    head_dims=(HEAD_DIM,),
    dtypes=(torch.bfloat16,),
    devices=("cuda",),
    features=frozenset({"sink", "lse", "gqa", "shared_kv", "out"}),
    requires=frozenset({"shared_kv"}),
    split_head_dim_v=False,
    sources=frozenset({"sparse", "two_scopes"}),
    cache_layouts=frozenset(CACHE_LAYOUTS),
    promises=frozenset({"bitwise_deterministic", "batch_invariant"}),
    notes={"head_dim": "DSV4's head dim; fmha.attention runs fmha.kernels.triton_paged for the others",
           "dtype": "bf16 only (P as bf16 hi + lo)",
           "device": "a Hopper GPU: wgmma and warp specialization, no interpreter",
           "requires": "K = V (DSV4's one cache)",
           "dense": "index-sparse calls only; dense ones run fmha.kernels.gluon_dense or fmha.kernels.triton_dense",
           "paged": "paged calls run fmha.kernels.triton_paged"},
)


availability = dense.availability


def specialization(problem) -> dict:
    """The kernel's compile-time arguments (also for fmha.kernels.compile_check)."""
    return dict(LAYOUT1=LAYOUT_CODES[problem.cache_layout], LAYOUT2=LAYOUT_CODES[problem.extra_cache_layout],
                TWO_SCOPES=problem.extra_topk is not None, HAS_SINK=problem.sink)


def attend(problem, q, k, v, *, scale=None, sink=None, out=None, indices, topk_len=None, extra_k_cache=None,
           extra_indices=None, extra_topk_len=None):
    """`problem` (a checked index-sparse call, K = V, that the capabilities cover) in one launch: (o (B, T, Hq, 512) in q's dtype, lse (B, Hq, T)
    float32)."""
    B, T, HQ, _ = q.shape
    G = problem.group
    o = torch.empty(B, T, HQ, problem.head_dim_v, dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(B, HQ, T, dtype=torch.float32, device=q.device)
    if o.numel() == 0:
        return o, lse.fill_(float("-inf"))
    two = extra_k_cache is not None
    k2, idx2 = (extra_k_cache, extra_indices) if two else (k, indices)
    dummy = indices  # for a length the call does not give: never read
    grid = (triton.cdiv(G, ROWS.value), B * T * problem.heads_kv)
    qk_scale = (problem.head_dim**-0.5 if scale is None else float(scale)) * LOG2E
    unit = q_unit(qk_scale, q.dtype)
    _sparse_fwd[grid](
        q, k, k2, indices, idx2, dummy if topk_len is None else topk_len,
        dummy if extra_topk_len is None else extra_topk_len, q if sink is None else sink, o, lse,
        q.stride(0), q.stride(1), q.stride(2), o.stride(0), o.stride(1), o.stride(2),
        lse.stride(0), lse.stride(1), lse.stride(2),
        k.stride(0), k.stride(1), k.stride(2), k2.stride(0), k2.stride(1), k2.stride(2),
        indices.stride(0), indices.stride(1), idx2.stride(0), idx2.stride(1),
        T, HQ, G, qk_scale / unit, unit,
        problem.block_size, problem.extra_block_size or 1, problem.kv_len, problem.extra_topk or 0,
        int(topk_len is not None), int(extra_topk_len is not None),
        num_warps=4, **specialization(problem),
    )
    return o, lse


ENTRY = implemented_by("gluon-sparse", attend, CAPABILITIES, availability=availability, default_devices=("cuda",),
                       description="fmha's Gluon sparse-decode kernel alone (DSV4: index-sparse bf16 head dim 512 "
                                   "K = V over bf16, FP8 or FP4 caches, on Hopper; fmha.attention runs it there)")

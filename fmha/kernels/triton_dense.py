"""The Triton forward kernel: the whole contract, compiled on GPUs and interpreted on the CPU.

Tiling. A program owns BLOCK_M query rows of one (batch, KV head) and loops over keys in
tiles of BLOCK_N with an online softmax (running max and sum, base 2). Its rows are packed
(t, g) pairs, g the query head within the KV head's group: for decode (T = 1, many heads on
one KV head, DSV4) a tile holds the heads; for prefill it holds positions; GQA mixes both.
Each row keeps its own position S - T + t for the causal and window masks, and the key range
a program visits is cut to the keys its rows can see.

Operands. q is loaded once and stays in shared memory for the whole key loop. K and V come
through TMA tensor descriptors (zero-filled past S and past the head dim), pipelined
num_stages deep. Head dims above 256 (up to 512) go in two chunks of BLOCK_D: QK^T adds the
chunks' logits before the softmax (logits are additive over head-dim chunks; softmaxes are
not: seed 000, §2). Dv wider than BLOCK_DV is split across programs, each recomputing QK^T.
When K is V (DSV4) and a Dv slice is a head-dim chunk, the value tile is that chunk of the
key tile already in shared memory: half the loads, and room for a third stage.

Precision of P.V (docs/contract.md: bf16 P costs ~1e-6 of cosine, below the 0.999998 gate):
- bf16: P = P_hi + P_lo, both bf16, two MMAs against bf16 V. P keeps ~16 bits; V stays in
  its own dtype, so |V| up to bf16's range neither overflows nor loses accuracy.
- fp16: P in fp16 (11 bits) against fp16 V: one MMA.
- fp32: IEEE fp32 dots throughout.
Under the CPU interpreter bf16 and fp16 are upcast to fp32 before any arithmetic, so the same
tiling and masking run with fp32 dots: the interpreter's bf16 arithmetic works on the bits
(Triton issues 11584, 11604), and its fp16 dot sums in fp16 (q.k at 3.1x the fp16 rounding
floor on some draws).

Split-KV (fmha.kernels.host): a split launch writes each key range's normalised fp32 partial
and its LSE, merged after by the D5 merge.

fmha.attention runs this kernel for everything but bf16 head dim 512 on Hopper, which goes
to fmha.kernels.gluon_dense (fmha.dispatch), and for everything interpreted on the CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from fmha.contract import Capabilities, implemented_by
from fmha.kernels import host
from fmha.kernels.host import key_operand
from fmha.kernels.triton_utils import (mma, pow2, pv_mode, renormalize, round_for_bf16, triton_availability,
                                       upcast_under_interpreter)

HEAD_DIMS = tuple(range(16, 513, 16))


@triton.jit
def _key_loop(
    qa, qb, K, V, b, kvh, ca, cb, dv0, lo, hi, position, qk_scale, WINDOW,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    NUM_D: tl.constexpr, V_FROM_K: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr, PV_MODE: tl.constexpr, UPCAST: tl.constexpr,
):
    """Online softmax over the keys [lo, hi) for one tile of rows and one slice of Dv.

    qa and qb are q's head-dim chunks starting at columns ca and cb (qb unused with one
    chunk). K and V are TMA descriptors (B, S, HKV, D): keys past S and columns past D arrive
    as zeros; keys in [hi, S) may arrive too, and their masked logits weigh exactly 0. With
    V_FROM_K, ca is this program's Dv slice and the key chunk at ca, already in shared
    memory, is the value tile.
    """
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.full([BLOCK_M], 0.0, tl.float32)
    e_i = tl.full([BLOCK_M], 0, tl.int32)  # l_i and acc are held at 2^-e_i (triton_utils.renormalize)
    acc = tl.full([BLOCK_M, BLOCK_DV], 0.0, tl.float32)
    # A computed zero: with a literal one the compiler would chain the two chunks' dots into
    # one accumulation, whose rounding then depends on the chunk order (the Dv slice).
    zero = tl.full([BLOCK_M, BLOCK_N], 0.0, tl.float32) * qk_scale
    for start in range(lo, hi, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        # Logits add up over head-dim chunks; a + b == b + a, so every Dv slice gets the
        # same bits whichever chunk it computes first.
        ka = K.load([b, start, kvh, ca]).reshape(BLOCK_N, BLOCK_D)
        s = mma(qa, ka.T, zero, PV_MODE, UPCAST)
        if NUM_D == 2:
            kb = K.load([b, start, kvh, cb]).reshape(BLOCK_N, BLOCK_D)
            s = s + mma(qb, kb.T, zero, PV_MODE, UPCAST)
        s = s * qk_scale
        visible = (cols < hi)[None, :]
        if CAUSAL:
            visible = visible & (cols[None, :] <= position[:, None])
        if WINDOWED:
            visible = visible & (cols[None, :] > position[:, None] - WINDOW)
        s = tl.where(visible, s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        if PV_MODE != 0:  # fp16 P keeps e_i = 0
            factor, e_i = renormalize(l_i * alpha, e_i)
            alpha = alpha * factor
            p = p * pow2(-e_i)[:, None]
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_new

        if V_FROM_K:
            v = ka
        else:
            v = V.load([b, start, kvh, dv0]).reshape(BLOCK_N, BLOCK_DV)
        if UPCAST or PV_MODE == 2:
            acc = mma(p, v, acc, PV_MODE, UPCAST)
        elif PV_MODE == 1:
            p_hi = p.to(tl.bfloat16)
            p_lo = (p - p_hi.to(tl.float32)).to(tl.bfloat16)
            acc = tl.dot(p_hi, v, acc)
            acc = tl.dot(p_lo, v, acc)
        else:
            acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, m_i, l_i, e_i


@triton.jit
def _load_columns(base, cols, row_ok, D, EVEN_D: tl.constexpr):
    """base[row, cols] for the rows in row_ok; columns past D (padding to the tile) as 0."""
    if EVEN_D:
        return tl.load(base + cols[None, :], mask=row_ok[:, None], other=0.0)
    return tl.load(base + cols[None, :], mask=row_ok[:, None] & (cols < D)[None, :], other=0.0)


# Sizes and the sink flag are runtime values, never specialised (Triton would compile again for
# every size that is 1 or a multiple of 16): a compile per tile shape, dtype and feature.
RUNTIME_ARGS = ("stride_ls", "stride_lb", "stride_lh", "T", "S", "HQ", "G", "WINDOW", "keys_per_split", "D", "DV",
                "has_sink")


@triton.jit(do_not_specialize=RUNTIME_ARGS)
def _attention_fwd(
    Q, K, V, SINK, O, LSE,
    stride_qb, stride_qt, stride_qh,
    stride_os, stride_ob, stride_ot, stride_oh,
    stride_ls, stride_lb, stride_lh,
    T, S, HQ, G, WINDOW, qk_scale, keys_per_split, D, DV,
    has_sink,  # 0 or 1: a runtime branch in the epilogue, not a second compile
    BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    NUM_D: tl.constexpr, NUM_DV_BLOCKS: tl.constexpr,  # D in NUM_D chunks (1 or 2), DV in NUM_DV_BLOCKS programs
    EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,  # D == NUM_D * BLOCK_D, DV a multiple of BLOCK_DV: no column masks
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, WINDOWED: tl.constexpr,
    V_FROM_K: tl.constexpr,  # K is V and BLOCK_DV == BLOCK_D: V slices are key-tile chunks
    PV_MODE: tl.constexpr,  # 0: one MMA in the input dtype, 1: bf16 hi + lo, 2: fp32
    UPCAST: tl.constexpr,  # interpreter: compute in fp32
):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    pid_split = tl.program_id(2) // NUM_DV_BLOCKS
    dv_block = tl.program_id(2) % NUM_DV_BLOCKS
    dv0 = dv_block * BLOCK_DV  # this program's slice of the output columns
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

    # q stays in shared memory for the whole loop, in at most two head-dim chunks; with
    # V_FROM_K the chunk that holds this program's Dv slice comes first.
    q_base = Q + b * stride_qb + t[:, None] * stride_qt + h[:, None] * stride_qh
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = dv0 + tl.arange(0, BLOCK_DV)
    ca = dv0 if V_FROM_K else 0
    cb = BLOCK_D - ca
    qa = _load_columns(q_base, ca + offs_d, row_ok, D, EVEN_D)
    qb = qa
    if NUM_D == 2:
        qb = _load_columns(q_base, cb + offs_d, row_ok, D, EVEN_D)
    acc, m_i, l_i, e_i = _key_loop(
        qa, qb, K, V, b, kvh, ca, cb, dv0, lo, hi, position, qk_scale, WINDOW,
        BLOCK_M, BLOCK_N, BLOCK_D, BLOCK_DV, NUM_D, V_FROM_K, CAUSAL, WINDOWED, PV_MODE, UPCAST)

    if has_sink:
        # The sink joins the denominator (never a value); take the max with it first so a
        # large sink cannot overflow exp2.
        sink = tl.load(SINK + h, mask=row_ok, other=0.0) * 1.4426950408889634  # log2(e)
        m_final = tl.maximum(m_i, sink)
        m_final_safe = tl.where(m_final == float("-inf"), 0.0, m_final)  # nothing visible, sink -inf
        scale_old = tl.exp2(m_i - m_final_safe)
        l_i = l_i * scale_old + tl.exp2(sink - m_final_safe) * pow2(-e_i)
        acc = acc * scale_old[:, None]
        m_i = m_final

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    # the sum itself (exact: at most the key count), so the lse does not depend on where e_i stands
    log_sum = tl.log2(tl.where(empty, 1.0, l_i) * pow2(e_i))
    lse = tl.where(empty, float("-inf"), (m_i + log_sum) * 0.6931471805599453)  # ln(2)

    # In a split launch O and LSE are the fp32 partials (splits, B, T, HQ, DV) and (splits, B, HQ, T).
    o_ptrs = O + pid_split * stride_os + b * stride_ob + t[:, None] * stride_ot + h[:, None] * stride_oh + offs_dv[None, :]
    lse_ptrs = LSE + pid_split * stride_ls + b * stride_lb + h * stride_lh + t
    if UPCAST and O.dtype.element_ty == tl.bfloat16:
        o = round_for_bf16(o)
    if EVEN_DV:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None])
    else:
        tl.store(o_ptrs, o.to(O.dtype.element_ty), mask=row_ok[:, None] & (offs_dv < DV)[None, :])
    tl.store(lse_ptrs, lse, mask=row_ok)


# Tile table for Hopper, keyed by max(D, Dv): (BLOCK_M, BLOCK_N, BLOCK_DV, warps, stages).
# Chosen by `python -m fmha.bench.tune` on an H200 (BENCHMARKS.md); BLOCK_DV < Dv splits the output
# columns across programs (each recomputes QK^T for its slice) to stay within registers.
# SHARED_KV_TILES: when K is V the value tile is a chunk of the key tile, which frees the
# shared memory for a third pipeline stage.
GPU_TILES = {
    64: (64, 64, 64, 4, 3),
    128: (64, 64, 128, 4, 3),
    256: (64, 64, 128, 4, 2),
    512: (128, 32, 256, 8, 2),
}
SHARED_KV_TILES = {
    512: (128, 32, 256, 8, 3),
}
# fp32 (IEEE dots on the FMA units, no tensor cores): tiles that keep the dots in registers.
# The table's tiles spilled 5-19 KB of stack a thread (`fmha.kernels.compile_check --dtype fp32`), and
# the driver reserves stack x 2048 threads x 132 SMs of local memory per process, outside
# PyTorch's allocator, for good: 6.9 GB once a process had run hd64-256 in fp32 on an H200
# (BENCHMARKS.md, GPU job), which ran the nightly profile's 16 workers out of GPU memory.
# These spill 0-170 B below head dim 512 (2.5 KB there); head dims above 128 go in chunks of
# 128 (FP32_CHUNK) where they fit in two.
FP32_TILES = {
    64: (16, 32, 64, 4, 2),
    128: (16, 32, 64, 4, 2),
    256: (16, 32, 64, 4, 2),
    512: (16, 16, 128, 8, 1),
}
FP32_CHUNK = 128
SHARED_MEMORY_BYTES = 227 * 1024  # per block on Hopper


def _chunk(D: int, widest: int = 256) -> int:
    """BLOCK_D: the head dim in one chunk up to `widest` (TMA boxes stop at 256), else two."""
    return triton.next_power_of_2(D if D <= widest else triton.cdiv(D, 2))


def _shared_bytes(t: dict, D: int, element_size: int) -> int:
    """Shared memory the kernel needs: q for the whole loop, and per pipeline stage the key
    tile (plus the value tile unless it is a chunk of the key tile)."""
    d = triton.cdiv(D, t["BLOCK_D"]) * t["BLOCK_D"]  # chunks are padded to BLOCK_D
    q = t["BLOCK_M"] * d
    stage = t["BLOCK_N"] * (d + (0 if t["V_FROM_K"] else t["BLOCK_DV"]))
    return element_size * (q + t["num_stages"] * stage)


def _tiles(problem, device_type: str, override: tuple | None = None, k_is_v: bool = False) -> dict:
    """Tile sizes (and V_FROM_K) by head dim and device, shrunk (stages, then keys, then rows)
    until they fit shared memory: fp32, or Dv wider than D, need smaller tiles than the table's."""
    D, DV = problem.head_dim, problem.head_dim_v
    block_d = _chunk(D)
    if device_type == "cpu":
        # The interpreter: few, large steps; Dv above 256 still goes across programs and D
        # above 256 in two chunks, so the CPU tier runs the hd512 code paths.
        block_dv = block_d if k_is_v else min(triton.next_power_of_2(DV), 256)
        return dict(BLOCK_M=32, BLOCK_N=64, BLOCK_D=block_d, BLOCK_DV=block_dv, V_FROM_K=k_is_v,
                    num_warps=4, num_stages=1)
    key = next(k for k in sorted(GPU_TILES) if max(D, DV) <= k)
    if problem.dtype == torch.float32:
        block_d = _chunk(D, FP32_CHUNK)
        m, n, dv, warps, stages = override or FP32_TILES[key]
    else:
        m, n, dv, warps, stages = override or (k_is_v and SHARED_KV_TILES.get(key)) or GPU_TILES[key]
    if not override and m > 64 and problem.q_len * problem.group <= 64:
        m, warps = 64, warps // 2  # few rows per KV head (small-batch decode): half the tile idles
    t = dict(BLOCK_M=m, BLOCK_N=n, BLOCK_D=block_d, BLOCK_DV=min(dv, triton.next_power_of_2(DV)),
             num_warps=warps, num_stages=stages)
    t["V_FROM_K"] = k_is_v and t["BLOCK_DV"] == block_d  # the value tile is a chunk of the key tile
    size = problem.dtype.itemsize
    while _shared_bytes(t, D, size) > SHARED_MEMORY_BYTES:
        if t["num_stages"] > 1:
            t["num_stages"] -= 1
        elif t["BLOCK_N"] > 16:
            t["BLOCK_N"] //= 2
        else:
            t["BLOCK_M"] //= 2
    return t


def _specialization(problem, tiles: dict, upcast: bool) -> dict:
    """The kernel's compile-time arguments for `problem` with `tiles` (warps and stages too)."""
    D, DV = problem.head_dim, problem.head_dim_v
    num_d = triton.cdiv(D, tiles["BLOCK_D"])  # 1 or 2 (_chunk sees to it)
    return dict(NUM_D=num_d, NUM_DV_BLOCKS=triton.cdiv(DV, tiles["BLOCK_DV"]),
                EVEN_D=D == num_d * tiles["BLOCK_D"], EVEN_DV=DV % tiles["BLOCK_DV"] == 0,
                CAUSAL=problem.causal,
                WINDOWED=problem.window is not None,
                PV_MODE=pv_mode(problem.dtype), UPCAST=upcast, **tiles)


def _key_descriptor(t: torch.Tensor, block_n: int, block_d: int) -> TensorDescriptor:
    """A TMA descriptor over keys or values (B, S, H, D) that loads (1, block_n, 1, block_d)."""
    return TensorDescriptor(*key_operand(t), [1, block_n, 1, block_d])


def _key_tile(problem, device_type: str, tiles: tuple | None) -> int:
    return _tiles(problem, device_type, tiles, k_is_v=problem.shared_kv)["BLOCK_N"]


def launch(problem, q, k, v, sink, target, target_lse, *, window, qk_scale, keys_per_split, split, tiles=None):
    """One launch into target (B, T, HQ, Dv) and target_lse (B, HQ, T), or with `split` into
    the fp32 partials (splits, B, T, HQ, Dv) and (splits, B, HQ, T) (fmha.kernels.host.run)."""
    tiles = _tiles(problem, q.device.type, tiles, k_is_v=problem.shared_kv)
    B, T, HQ, _ = q.shape
    S, G = problem.kv_len, problem.group
    row_blocks = triton.cdiv(T * G, tiles["BLOCK_M"])
    dv_blocks = triton.cdiv(problem.head_dim_v, tiles["BLOCK_DV"])
    upcast = upcast_under_interpreter(q.dtype)
    grid = (row_blocks, B * (HQ // G), target.shape[0] * dv_blocks)
    k_desc = _key_descriptor(k, tiles["BLOCK_N"], tiles["BLOCK_D"])
    v_desc = k_desc if tiles["V_FROM_K"] else _key_descriptor(v, tiles["BLOCK_N"], tiles["BLOCK_DV"])
    _attention_fwd[grid](
        q, k_desc, v_desc, sink if sink is not None else q, target, target_lse,
        q.stride(0), q.stride(1), q.stride(2),
        target.stride(0), target.stride(1), target.stride(2), target.stride(3),
        target_lse.stride(0), target_lse.stride(1), target_lse.stride(2),
        T, S, HQ, G, window or 0, qk_scale, keys_per_split, problem.head_dim, problem.head_dim_v,
        int(problem.sink and not split),  # split partials leave the sink to the merge
        **_specialization(problem, tiles, upcast=upcast),
    )


CAPABILITIES = Capabilities(
    head_dims=HEAD_DIMS,
    promises=frozenset({"bitwise_deterministic", "batch_invariant"}),
    notes={"head_dim": "multiples of 16 up to 512 (tiles are powers of two, masked)"},
)



def attend(problem, q, k, v, *, scale=None, sink=None, out=None, tiles=None, splits=None):
    """A checked dense call (fmha.contract.check_attention_args); `tiles` and `splits` override
    the tables (fmha.bench.tune)."""
    return host.run(problem, q, k, v, launch=launch, key_tile=_key_tile, scale=scale, sink=sink, out=out, tiles=tiles,
                    splits=splits)


ENTRY = implemented_by("triton-dense", attend, CAPABILITIES, availability=triton_availability,
                       description="fmha's Triton forward kernel over dense keys (compiled on CUDA, "
                                   "TRITON_INTERPRET=1 on CPU)")

// DeepSeek-V4's sparse decode on Hopper (sm_90a) in CUDA C++: each query row's keys by index
// over one or two quantized K = V caches (dsv4-fp8, dsv4-fp4), head dim 512, a sink, bf16 q/o.
// fmha/kernels/cuda_sparse.py builds it with torch's extension loader and documents the design;
// the facts it rests on (wgmma operand layouts, bulk copies, cluster barriers) are NVIDIA's PTX ISA.
//
// One CTA owns 64 query heads of one (request, query row). Heads > 64 run as a 2-CTA cluster
// (CL = 2): per 64-key tile each CTA gathers and dequantizes 32 keys into its own shared memory
// and has the bulk copy engine copy them into its peer's (completing bytes on the peer's
// mbarrier), so a key is dequantized once for 128 heads. Warpgroups: 0 = QK^T, online softmax,
// P.V for Dv[0:256] (P from registers); 1 = P.V for Dv[256:512] (P from shared memory); 2 = gather +
// dequantize (the producer). Keys, q and P are f16 in a first pass and bf16 in a second that only
// rows f16 cannot hold run (the comment above the kernel).

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#ifndef FMHA_KERNEL_ONLY  // -DFMHA_KERNEL_ONLY compiles the kernels alone, without torch's headers
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#endif

#include "wgmma.cuh"

namespace {

constexpr int ROWS = 64;          // query heads per CTA (wgmma M)
constexpr int KEYS = 64;          // keys per tile
constexpr int DIM = 512;
constexpr int CHUNK_BYTES = ROWS * 128;      // [64 rows][64 bf16] swizzled 128B: 8 KiB
constexpr int Q_BYTES = 8 * CHUNK_BYTES;     // 64 KiB
constexpr int TILE_BYTES = 8 * CHUNK_BYTES;  // 64 keys x 512 bf16
constexpr int STAGES = 2;
constexpr int P_BYTES = ROWS * KEYS * 2;     // one of P's halves (hi or lo): 8 KiB
// What a 2-CTA cluster's peer copies into a stage per tile: its 32 keys' rows and their 0 / -inf.
constexpr uint32_t PEER_TX = KEYS / 2 * (DIM * 2 + 4);

constexpr int OFF_Q = 0;
constexpr int OFF_K = OFF_Q + Q_BYTES;
constexpr int OFF_P = OFF_K + STAGES * TILE_BYTES;      // 2 buffers x (hi, lo)
constexpr int OFF_BIAS = OFF_P + 2 * 2 * P_BYTES;      // [STAGES][KEYS] float
constexpr int OFF_ALPHA = OFF_BIAS + STAGES * KEYS * 4; // [2][ROWS] float
constexpr int OFF_FINAL = OFF_ALPHA + 2 * ROWS * 4;     // [2][ROWS] float: rescale, denominator
constexpr int OFF_BAR = OFF_FINAL + 2 * ROWS * 4;       // mbarriers
constexpr int BAR_READY = 0, BAR_FREE = STAGES, BAR_PFULL = 2 * STAGES, BAR_PFREE = 2 * STAGES + 2;
constexpr int N_BARS = 2 * STAGES + 4;
constexpr int OFF_INEXACT = OFF_BAR + N_BARS * 8;       // the f16 pass's verdict (the kernel's comment)
constexpr int OFF_QTOP = OFF_INEXACT + 4;               // [8] uint32: q's largest magnitude by consumer warp
constexpr int SMEM_BYTES = OFF_QTOP + 8 * 4 + 1024;     // + the 1024-byte alignment of the base
static_assert(SMEM_BYTES <= 232448, "more shared memory than a block may have on sm_90 (227 KiB)");

constexpr int THREADS = 384;
// Registers a thread, by warpgroup (setmaxnreg): the launch gives each 65536 / 384 rounded down
// to 8, 168; for a pass warpgroup 0 takes 200 (its accumulator, QK^T's and P's), the
// producer 144 (two keys' bytes: the one being stored and the next, in flight; f16's rope
// conversion), warpgroup 1 160; each goes back to 168 after it, so that the two passes' code sees
// the same budget at their seams (ptxas spills where the second pass follows the first without).
// More than the launch's in all and setmaxnreg.inc waits forever.
constexpr int REGS_LAUNCH = 168, REGS_SOFTMAX = 200, REGS_PRODUCER = 144, REGS_SECOND = 160;
static_assert(REGS_SOFTMAX + REGS_SECOND + REGS_PRODUCER <= 3 * REGS_LAUNCH, "setmaxnreg: more registers than launched");
constexpr int TRACE_EVENTS = 11;  // per tile (Params::trace); fmha/bench/sparse_trace.py names them
constexpr int TRACE_CTA = 6;      // per CTA
constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

enum Layout { NONE = 0, FP8 = 1, FP4 = 2 };

struct Scope {
  const uint8_t* cache;  // bytes of padded pages
  const int* indices;    // (B, T, topk) slots
  const int* topk_len;   // (B,) or null
  long long page_stride, idx_sb, idx_st, idx_sk;
  int block_size, topk, layout;
};

struct Params {
  const __nv_bfloat16* q;
  __nv_bfloat16* o;
  float* lse;
  const float* sink;  // (Hq,) or null
  long long q_sb, q_st, q_sh, o_sb, o_st, o_sh, l_sb, l_sh, l_st;
  Scope scope[2];
  int n_scopes, T, heads;
  float qk_scale_log2;
  // null, or: clock64() at TRACE_EVENTS events of each of the first CTA's first 64 tiles, then a
  // row of TRACE_CTA for each CTA (block = y * gridDim.x + x): CtaEvent's %globaltimer, its SM
  int64_t* trace;
};

// ---- PTX wrappers ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}

// The shared::cluster address of `addr` (a shared::cta address here) in CTA `rank`'s memory.
__device__ __forceinline__ uint32_t peer_addr(uint32_t addr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
  return r;
}

__device__ __forceinline__ void bar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}

// Waits for the phase of parity `parity` to complete; acquire at cluster scope, as a peer's
// bulk-copied bytes and remote arrivals land on these barriers.
__device__ __forceinline__ void bar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n}\n" ::"r"(bar), "r"(parity) : "memory");
  __syncwarp();  // the lanes leave the spin at different times: converge before .aligned instructions
}

__device__ __forceinline__ void bar_arrive_local(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// A consumer's "done with this stage" to a barrier in any CTA of the cluster. What it orders is
// our reads (wgmma's, complete at its wait) before the producers' writes, so the default
// .release.cta semantics suffice, as in CUTLASS's cluster pipelines; .release.cluster made every
// stage release 7-8% of the kernel's time dearer (BENCHMARKS.md).
__device__ __forceinline__ void bar_arrive_cluster(uint32_t cluster_bar) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(cluster_bar) : "memory");
}

__device__ __forceinline__ void bar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void st_shared16(uint32_t addr, uint4 v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// `bytes` of this CTA's shared memory at `src` to a peer's at `dst` (cluster addresses) by the
// bulk copy engine, completing them on the peer's barrier `bar`.
__device__ __forceinline__ void copy_to_peer(uint32_t dst, uint32_t src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "r"(src), "r"(bytes), "r"(bar) : "memory");
}

__device__ __forceinline__ float fast_exp2(float x) {  // exp2(-inf) = 0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float pow2(int e) {  // 2^e exactly, e in [-126, 127]
  return __int_as_float((e + 127) << 23);
}

__device__ __forceinline__ int exponent(float x) {  // floor(log2(x)) of a normal x > 0; -127 for 0 and subnormals
  return ((__float_as_int(x) >> 23) & 255) - 127;
}

__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}

// Every thread of the cluster (of the CTA where it runs alone).
template <int CL>
__device__ __forceinline__ void cluster_or_cta_sync() {
  if (CL > 1) cluster_sync(); else __syncthreads();
}

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }

template <int REGS>
__device__ __forceinline__ void regs_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void regs_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS)); }

// A wgmma shared-memory descriptor for a 128-byte-swizzled operand (bf16 rows of 64).
// K-major (q, P, keys for QK^T): SBO = 1024 (the next 8 rows), LBO unused.
// MN-major (keys as V for P.V): LBO = 8192 (the next 64 dims), SBO = 1024 (the next 8 keys).
__device__ __forceinline__ uint64_t descriptor(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) |
         (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

// Byte offset of 16-byte unit `unit` (8 bf16) of row `row` in a [rows][64] 128B-swizzled chunk.
__device__ __forceinline__ uint32_t swizzled(int row, int unit) {
  return row * 128 + (((unit ^ row) & 7) << 4);
}

// Four 8x8 bf16 matrices into shared memory: r[m] is this thread's part of matrix m (row lane / 4,
// columns 2 (lane % 4) and + 1: the layout of a wgmma accumulator's 8 columns); thread `lane` gives
// the address of row lane % 8 of matrix lane / 8.
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t* r) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3]) : "memory");
}

__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The f16 pass met a value f16 does not hold exactly: told to every CTA of the cluster (each
// reads its own word once the pass is over), so that they run the bf16 pass together.
template <int CL>
__device__ __forceinline__ void mark_inexact(uint8_t* smem, uint32_t rank) {
  const uint32_t word = smem_u32(smem + OFF_INEXACT);
#pragma unroll
  for (int r = 0; r < CL; ++r)
    asm volatile("red.shared::cluster.or.b32 [%0], 1;" ::"r"(CL == 1 ? word : peer_addr(word, r)) : "memory");
}

// ---- dequantization -------------------------------------------------------------------------
// Two element types, one per pass (the kernel's comment): f16, which holds every key element and q
// exactly only inside a range of scales and magnitudes (each function says which, and adds to
// `inexact` when one falls outside), and bf16, which holds them all.

__device__ __forceinline__ uint32_t f16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two bf16 (a word) times `up` (a power of two) as f16x2: exact from 2^-17 up to below 2^16 (a
// bf16's 8-bit significand fits f16's), rounded below (an absolute error under 2^-25, which
// the sums cannot show beside the row's larger values); from 2^16 on (inf and NaN too) a value
// adds to `inexact`: its f16 is inf or NaN, an exponent field of all ones, which carries into bit 15
// of its magnitude plus 0x0400.
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t w, float up, uint32_t& inexact) {
  const float lo = __uint_as_float(w << 16) * up, hi = __uint_as_float(w & 0xFFFF0000u) * up;
  uint32_t d;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  const uint32_t a = d & 0x7FFF7FFFu;
  inexact |= (a + 0x04000400u) & 0x80008000u;
  return d;
}

__device__ __forceinline__ uint4 bf16x8_to_f16x8(uint4 v, float up, uint32_t& inexact) {
  return make_uint4(bf16x2_to_f16x2(v.x, up, inexact), bf16x2_to_f16x2(v.y, up, inexact),
                    bf16x2_to_f16x2(v.z, up, inexact), bf16x2_to_f16x2(v.w, up, inexact));
}

// bf16 values times `up`, a power of two: exact but where a value falls below bf16's normals.
__device__ __forceinline__ uint32_t bf16x2_scaled(uint32_t w, float up) {
  const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  const __nv_bfloat162 scaled = __floats2bfloat162_rn(f.x * up, f.y * up);
  return *reinterpret_cast<const uint32_t*>(&scaled);
}

__device__ __forceinline__ uint4 bf16x8_scaled(uint4 v, float up) {
  return make_uint4(bf16x2_scaled(v.x, up), bf16x2_scaled(v.y, up), bf16x2_scaled(v.z, up), bf16x2_scaled(v.w, up));
}

// 2^(code - 127) as f16x2 (both halves), for codes 104 to 140 (below 113 an f16 subnormal): the
// f16 pass's scale multiplier, e4m3's and e2m1's alike.
__device__ __forceinline__ uint32_t f16x2_pow2(uint32_t code) {
  return (code >= 113 ? (code - 112) << 10 : 1u << ((code - 103) & 31)) * 0x10001u;
}

// 2^(scale - 7) as a bf16x2 multiplier (both halves) for e4m3_bits' values, which are the codes'
// values times 2^-120. Above scale 134 the exponent field would pass 254: then the value is
// multiplied by 2^127 first (exact: an e4m3 value times 2^7) and by 2^(scale - 134) second, so
// it is rounded once either way. Scale 0xFF is NaN.
struct E4m3Scale {
  uint32_t first, second;
  bool twice;
};

// In f16: 2^(scale - 127), one multiply for the codes' values, exact for scales 112 to 134 (2^-15
// to 2^7: every code's product is an f16); the others add to `inexact`.
template <bool F16>
__device__ __forceinline__ E4m3Scale e4m3_scale(uint32_t scale, uint32_t& inexact) {
  if constexpr (F16) {
    inexact |= scale - 112 > 22;
    return {f16x2_pow2(scale), 0, false};
  }
  const bool twice = scale > 134 && scale != 0xFF;
  const uint32_t first = scale == 0xFF ? 0x7FC0u : twice ? 0x7F00u : (scale + 120) << 7;
  return {first * 0x10001u, ((scale - 7) << 7) * 0x10001u, twice};
}

// Two e4m3 codes (bytes 1 and 3 of x) as bf16x2: the code's exponent and mantissa bits placed
// as a bf16's low exponent and high mantissa bits are its value times 2^-120, normals and
// subnormals (as bf16 subnormals) alike, so no code needs a path of its own.
__device__ __forceinline__ uint32_t e4m3_bits(uint32_t x) {
  return ((x >> 4) & 0x07F007F0u) | (x & 0x80008000u);
}

// Four e4m3 codes (a word, low byte first) as two f16x2 words by the hardware's conversion (two
// instructions; every e4m3 value is an f16, NaN codes become NaN): a third of the bit work's
// instructions, which bound the producer.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 l, h;\nmov.b32 {l, h}, %2;\ncvt.rn.f16x2.e4m3x2 %0, l;\ncvt.rn.f16x2.e4m3x2 %1, h;\n}"
      : "=r"(lo), "=r"(hi) : "r"(w));
}

// Four e4m3 codes (a word, low byte first) times 2^(scale - 127) as two f16x2 (or bf16x2) words,
// exactly (in bf16 rounded once where the product leaves its range). bf16 has no conversion from
// e4m3: one bit path for every code but the NaN codes (0x7F, 0xFF), which a rare branch ORs in
// from a per-byte mask. (__byte_perm keeps 3 bits of each selector nibble, so the mask's bytes are
// spread by plain copies, not prmt's sign mode.)
template <bool F16>
__device__ __forceinline__ void e4m3x4(uint32_t w, const E4m3Scale& s, uint32_t& lo, uint32_t& hi) {
  if constexpr (F16) {
    uint32_t a, b;
    e4m3x4_to_f16(w, a, b);
    lo = f16x2_mul(a, s.first), hi = f16x2_mul(b, s.first);
    return;
  }
  const uint32_t a = e4m3_bits(__byte_perm(w, 0, 0x1404)), b = e4m3_bits(__byte_perm(w, 0, 0x3424));
  lo = bf16x2_mul(a, s.first), hi = bf16x2_mul(b, s.first);
  if (s.twice) lo = bf16x2_mul(lo, s.second), hi = bf16x2_mul(hi, s.second);
  const uint32_t nan = ((w & 0x7F7F7F7Fu) + 0x01010101u) & 0x80808080u;
  if (nan) {
    const uint32_t mask = (nan >> 7) * 0xFFu;
    lo |= __byte_perm(mask, 0, 0x1100) & 0x7FC07FC0u;
    hi |= __byte_perm(mask, 0, 0x3322) & 0x7FC07FC0u;
  }
}

// 2^(code - 127) (both halves), for the FP4 path's multiply. In f16 exact for codes 104 to 140
// (every e2m1 value's product is an f16; below 113 the multiplier is an f16 subnormal); the
// others add to `inexact`.
template <bool F16>
__device__ __forceinline__ uint32_t ue8m0_scale2(uint32_t code, uint32_t& inexact) {
  if constexpr (F16) {
    inexact |= code - 104 > 36;
    return f16x2_pow2(code);
  }
  const uint32_t h = code == 0xFF ? 0x7FC0u : code == 0 ? 0x0040u : code << 7;
  return h * 0x10001u;
}

// Four e2m1 codes (16 bits, code 0 in the low nibble) times a scale: two bf16x2 (or f16x2) words.
// The magnitudes' bytes come from 8-entry tables (prmt), the sign bits are moved in, then one
// multiply each (exact: a 2-bit significand times a power of two).
template <bool F16>
__device__ __forceinline__ void e2m1x4(uint32_t w, uint32_t scale2, uint32_t& lo, uint32_t& hi) {
  const uint32_t sel = w & 0x7777u;
  const uint32_t s0 = ((w << 12) & 0x8000u) | ((w << 24) & 0x80000000u);
  const uint32_t s1 = ((w << 4) & 0x8000u) | ((w << 16) & 0x80000000u);
  if constexpr (F16) {
    // magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 in f16: 0000 3800 3C00 3E00 4000 4200 4400 4600 (low bytes 0)
    const uint32_t high = __byte_perm(0x3E3C3800u, 0x46444240u, sel);
    lo = f16x2_mul(__byte_perm(high, 0, 0x1404) | s0, scale2);
    hi = f16x2_mul(__byte_perm(high, 0, 0x3424) | s1, scale2);
  } else {
    // in bf16: 0000 3F00 3F80 3FC0 4000 4040 4080 40C0
    const uint32_t high = __byte_perm(0x3F3F3F00u, 0x40404040u, sel);
    const uint32_t low = __byte_perm(0xC0800000u, 0xC0804000u, sel);
    lo = bf16x2_mul(__byte_perm(low, high, 0x5140) | s0, scale2);
    hi = bf16x2_mul(__byte_perm(low, high, 0x7362) | s1, scale2);
  }
}

// ---- the producer: gather, dequantize, store into both CTAs ---------------------------------

// A key's bytes, loaded before its stage is free so that their latency overlaps the wait.
// FP8: data[0:7] this thread's 16 codes of each group, data[7:9] its rope bytes, scales.x/y the
// token's 8 scale bytes. FP4: data[0:4] its tiles (sub, sub + 4, ... < 14), data[4:6] rope, scales the 16.
struct KeyBytes {
  uint4 data[9];
  uint4 scales;
  bool read;
};

__device__ __forceinline__ KeyBytes load_key(const Scope& sc, int slot, int sub) {
  KeyBytes k;
  k.read = slot >= 0;
#pragma unroll
  for (int i = 0; i < 9; ++i) k.data[i] = make_uint4(0, 0, 0, 0);
  k.scales = make_uint4(0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu, 0x7F7F7F7Fu);
  if (!k.read) return k;
  const uint8_t* page = sc.cache + static_cast<long long>(slot / sc.block_size) * sc.page_stride;
  const int offset = slot % sc.block_size;
  if (sc.layout == FP8) {
    // 576 data bytes a token (7 groups of 64 e4m3, then 64 bf16 rope dims), then the page's
    // scales: 8 bytes a token (7 ue8m0, one pad).
    const uint8_t* token = page + offset * 576;
    const uint2 scales = __ldg(reinterpret_cast<const uint2*>(page + sc.block_size * 576 + offset * 8));
    k.scales.x = scales.x, k.scales.y = scales.y;
#pragma unroll
    for (int g = 0; g < 7; ++g) k.data[g] = __ldg(reinterpret_cast<const uint4*>(token + g * 64 + sub * 16));
#pragma unroll
    for (int j = 0; j < 2; ++j) k.data[7 + j] = __ldg(reinterpret_cast<const uint4*>(token + 448 + (sub + 4 * j) * 16));
  } else {
    // 352 data bytes a token (14 tiles of 32 e2m1, two a byte, then 64 bf16 rope dims), then
    // 16 scale bytes a token (14 ue8m0, two pads).
    const uint8_t* token = page + offset * 352;
    k.scales = __ldg(reinterpret_cast<const uint4*>(page + sc.block_size * 352 + offset * 16));
#pragma unroll
    for (int j = 0; j < 4; ++j)
      if (sub + 4 * j < 14) k.data[j] = __ldg(reinterpret_cast<const uint4*>(token + (sub + 4 * j) * 16));
#pragma unroll
    for (int j = 0; j < 2; ++j) k.data[4 + j] = __ldg(reinterpret_cast<const uint4*>(token + 224 + (sub + 4 * j) * 16));
  }
  return k;
}

// 8 rope dims (bf16 in the cache) as the pass's element type.
template <bool F16>
__device__ __forceinline__ uint4 rope(uint4 v, uint32_t& inexact) {
  if constexpr (F16) return bf16x8_to_f16x8(v, 1.f, inexact);
  return v;
}

// Key `key` of the tile (0-63) into this CTA's stage `stage` as bf16 (or f16): 4 threads a key,
// `sub` (0-3) picks this thread's 16-byte pieces. A key not read is zeros (so that no byte of
// it, NaN poison included, reaches a sum) with bias -inf. PART 0 stores chunks 0-3 (dims 0-255)
// and the bias, PART 1 chunks 4-7, so that the first can be on its way to the peer.
template <int PART, bool F16>
__device__ __forceinline__ void store_key(int layout, const KeyBytes& k, int key, int sub, uint8_t* smem, int stage,
                                          uint32_t& inexact) {
  const uint32_t tile = smem_u32(smem + OFF_K + stage * TILE_BYTES);
  auto store = [&](uint32_t off, uint4 v) { st_shared16(tile + off, v); };
  if (PART == 0 && sub == 0) reinterpret_cast<float*>(smem + OFF_BIAS)[stage * KEYS + key] = k.read ? 0.f : -INFINITY;
  if (!k.read) {
    const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 8 * PART; u < 8 * PART + 8; ++u) store((u / 2) * CHUNK_BYTES + swizzled(key, 2 * sub + (u % 2)), zero);
    return;
  }
  if (layout == FP8) {
#pragma unroll
    for (int g = 4 * PART; g < (PART ? 7 : 4); ++g) {
      const E4m3Scale scale =
          e4m3_scale<F16>((g < 4 ? k.scales.x >> (8 * g) : k.scales.y >> (8 * (g - 4))) & 0xFF, inexact);
      uint4 a, b;
      e4m3x4<F16>(k.data[g].x, scale, a.x, a.y);
      e4m3x4<F16>(k.data[g].y, scale, a.z, a.w);
      e4m3x4<F16>(k.data[g].z, scale, b.x, b.y);
      e4m3x4<F16>(k.data[g].w, scale, b.z, b.w);
      store(g * CHUNK_BYTES + swizzled(key, 2 * sub), a);
      store(g * CHUNK_BYTES + swizzled(key, 2 * sub + 1), b);
    }
    if (PART == 1)
#pragma unroll
      for (int j = 0; j < 2; ++j) store(7 * CHUNK_BYTES + swizzled(key, sub + 4 * j), rope<F16>(k.data[7 + j], inexact));
  } else {
    const uint32_t scale_words[4] = {k.scales.x, k.scales.y, k.scales.z, k.scales.w};
#pragma unroll
    for (int j = 2 * PART; j < 2 * PART + 2; ++j) {
      const int tile = sub + 4 * j;  // dims 32 tile .. 32 tile + 31: chunk tile / 2, units 4 (tile % 2) ..
      if (tile < 14) {
        const uint32_t scale2 = ue8m0_scale2<F16>((scale_words[j] >> (8 * sub)) & 0xFF, inexact);  // scale byte `tile`
        const uint32_t words[4] = {k.data[j].x, k.data[j].y, k.data[j].z, k.data[j].w};
#pragma unroll
        for (int u = 0; u < 4; ++u) {  // 8 codes a word: one 16-byte unit of 8 bf16
          uint4 v;
          e2m1x4<F16>(words[u] & 0xFFFF, scale2, v.x, v.y);
          e2m1x4<F16>(words[u] >> 16, scale2, v.z, v.w);
          store((tile / 2) * CHUNK_BYTES + swizzled(key, 4 * (tile % 2) + u), v);
        }
      }
    }
    if (PART == 1)
#pragma unroll
      for (int j = 0; j < 2; ++j) store(7 * CHUNK_BYTES + swizzled(key, sub + 4 * j), rope<F16>(k.data[4 + j], inexact));
  }
}

__device__ __forceinline__ int scope_keys(const Scope& sc, int b) {
  return sc.topk_len ? sc.topk_len[b] : sc.topk;
}

// Warpgroup 0's: has q and starts its tiles, has left them, has stored its half of o. Column 2 is the SM.
enum CtaEvent { CTA_START = 0, CTA_END = 1, CTA_TILES = 3, CTA_TILES_DONE = 4, CTA_STORED = 5 };

// The CTA's `event` in nanoseconds (and at its start its SM) in the trace's per-CTA rows.
__device__ __forceinline__ void trace_cta(const Params& p, CtaEvent event) {
  if (!p.trace || threadIdx.x != 0) return;
  int64_t* row = p.trace + 64 * TRACE_EVENTS + (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * TRACE_CTA;
  int64_t now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  row[event] = now;
  if (event == CTA_START) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    row[2] = sm;
  }
}

__device__ __forceinline__ void trace(const Params& p, int tile, int event) {
  if (p.trace && blockIdx.x == 0 && blockIdx.y == 0 && tile < 64) p.trace[tile * TRACE_EVENTS + event] = clock64();
}

// The tiles: the first scope's keys in tiles of 64, then the second's. A CTA of a 2-CTA
// cluster gathers half of each tile (keys 32 rank ..) into its own shared memory, then one thread
// has the bulk copy engine copy that half into the peer's (8 chunks of 4 KiB and the 0 / -inf
// row); a lone CTA gathers both halves, one at a time.
template <int CL, bool F16>
__device__ void producer(const Params& p, uint8_t* smem, int b, int t, uint32_t rank) {
  const int tid = threadIdx.x - 256;
  const int key_in_half = tid / 4, sub = tid % 4;
  const uint32_t free_bar = smem_u32(smem + OFF_BAR + BAR_FREE * 8);
  const uint32_t ready_bar = smem_u32(smem + OFF_BAR + BAR_READY * 8);
  const int n0 = scope_keys(p.scope[0], b), tiles0 = (n0 + KEYS - 1) / KEYS;
  const int n1 = p.n_scopes > 1 ? scope_keys(p.scope[1], b) : 0;
  constexpr int HALVES = CL == 2 ? 1 : 2;
  const int pieces = (tiles0 + (n1 + KEYS - 1) / KEYS) * HALVES;
  auto half_of = [&](int piece) { return CL == 2 ? static_cast<int>(rank) : piece % 2; };
  auto slot_of = [&](int piece) {  // this thread's key's slot in piece `piece`, or -1
    const int tile = piece / HALVES, second = tile >= tiles0;
    const Scope& sc = p.scope[second];
    const int j = (tile - (second ? tiles0 : 0)) * KEYS + half_of(piece) * 32 + key_in_half;
    return j < (second ? n1 : n0) ? sc.indices[b * sc.idx_sb + t * sc.idx_st + j * sc.idx_sk] : -1;
  };
  auto scope_of_piece = [&](int piece) -> const Scope& { return p.scope[piece / HALVES >= tiles0]; };
  // Our half of chunks 4 part .. 4 part + 3 of stage `stage` (and with part 0 of the 0 / -inf row)
  // into the peer's by the bulk copy engine, completing on the peer's ready barrier.
  auto copy_part_to_peer = [&](int stage, int part) {
    const uint32_t peer = rank ^ 1, half = rank * 32;
    const uint32_t tile_at = smem_u32(smem + OFF_K + stage * TILE_BYTES) + half * 128;
    const uint32_t peer_ready = peer_addr(ready_bar + stage * 8, peer);
#pragma unroll
    for (int c = 4 * part; c < 4 * part + 4; ++c)
      copy_to_peer(peer_addr(tile_at + c * CHUNK_BYTES, peer), tile_at + c * CHUNK_BYTES, 32 * 128, peer_ready);
    if (part == 0) {
      const uint32_t bias_at = smem_u32(smem + OFF_BIAS + (stage * KEYS + half) * 4);
      copy_to_peer(peer_addr(bias_at, peer), bias_at, 32 * 4, peer_ready);
    }
  };
  // Software-pipelined one piece deep: piece + 1's bytes (and piece + 2's slot) are in flight
  // while this piece waits for its stage and is dequantized.
  uint32_t inexact = 0;
  int slot = pieces > 1 ? slot_of(1) : -1;
  KeyBytes next = load_key(scope_of_piece(0), pieces > 0 ? slot_of(0) : -1, sub);
  for (int piece = 0; piece < pieces; ++piece) {
    const int tile = piece / HALVES, stage = tile % STAGES;
    const Scope& sc = scope_of_piece(piece);
    if (tid == 0 && piece % HALVES == 0) trace(p, tile, 8);
    const KeyBytes bytes = next;
    if (piece + 1 < pieces) next = load_key(scope_of_piece(piece + 1), slot, sub);
    slot = piece + 2 < pieces ? slot_of(piece + 2) : -1;
    if (piece % HALVES == 0) {  // both CTAs' consumers are done with the stage (the peer's too: we copy into it)
      bar_wait(free_bar + stage * 8, ((tile / STAGES) & 1) ^ 1);
      if (tid == 0) trace(p, tile, 6);
    }
    const int key = half_of(piece) * 32 + key_in_half;
    store_key<0, F16>(sc.layout, bytes, key, sub, smem, stage, inexact);
    if (CL == 2) {  // chunks 0-3 travel to the peer while chunks 4-7 are dequantized
      fence_proxy_async();
      named_sync(4, 128);
      if (tid == 0) copy_part_to_peer(stage, 0);
    }
    store_key<1, F16>(sc.layout, bytes, key, sub, smem, stage, inexact);
    if (piece % HALVES != HALVES - 1) continue;
    if (tid == 0) trace(p, tile, 9);
    fence_proxy_async();  // the tile is read by wgmma and the bulk copy engine (the async proxy)
    named_sync(4, 128);
    if (tid == 0) {
      trace(p, tile, 10);
      if (CL == 2) copy_part_to_peer(stage, 1);
      // Our half is written (the barrier above orders the other threads' stores before this
      // release); the peer's half lands as bytes on the same barrier.
      bar_expect_tx(ready_bar + stage * 8, CL == 2 ? PEER_TX : 0);
      trace(p, tile, 7);
    }
  }
  if (inexact) mark_inexact<CL>(smem, rank);
}

// ---- the consumers --------------------------------------------------------------------------

// q (this CTA's 64 heads; rows past Hq are zeros) into shared memory by both consumer warpgroups
// while the producer gathers the first tiles: 16 loads of 16 bytes a thread, all in flight at
// once, then their stores. Warpgroup 1 (which never reads q) only arrives on the named barrier.
// In f16, q times 2^c, c such that the largest magnitude lands in [2^15, 2^16): the returned
// 2^-c joins the scores' scale. (q's range is its own, unlike the keys': no scale to trust.)
// In bf16, q times 2^-8 of the largest power of two not above the scores' scale (at most 1): the
// fp32 accumulator then holds well under the logit in base 2, not the dot product, which
// overflows first (keys at scale code 223 (2^96), a logit of -9e37: the dot -2e39, so the row
// read as empty), with room for partial sums past the logit where terms cancel
// (fmha.kernels.triton_utils.q_unit, the same unit).
template <int CL, bool F16>
__device__ __forceinline__ float load_q(const Params& p, uint8_t* smem, int b, int t, int head0, uint32_t rank) {
  constexpr int PER_THREAD = ROWS * 64 / 256;
  const int tid = threadIdx.x, unit = tid % 64;
  const __nv_bfloat16* q = p.q + b * p.q_sb + t * p.q_st;
  uint4 v[PER_THREAD];
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i) {
    const int head = head0 + tid / 64 + 4 * i;
    v[i] = head < p.heads ? __ldg(reinterpret_cast<const uint4*>(q + head * p.q_sh + unit * 8)) : make_uint4(0, 0, 0, 0);
  }
  float up = 1.f;
  uint32_t inexact = 0;
  if (F16) {
    uint32_t top = 0;  // the largest magnitude's bf16 bits, over the thread, its warp, then both warpgroups
#pragma unroll
    for (int i = 0; i < PER_THREAD; ++i)
      for (uint32_t w : {v[i].x, v[i].y, v[i].z, v[i].w}) top = max(top, max(w & 0x7FFFu, (w >> 16) & 0x7FFFu));
    top = __reduce_max_sync(0xFFFFFFFFu, top);
    uint32_t* tops = reinterpret_cast<uint32_t*>(smem + OFF_QTOP);
    if (tid % 32 == 0) tops[tid / 32] = top;
    named_sync(6, 256);
#pragma unroll
    for (int w = 0; w < 8; ++w) top = max(top, tops[w]);
    const int exponent = top >> 7, c = top == 0 ? 0 : min(max(142 - exponent, -100), 100);
    up = __int_as_float((127 + c) << 23);
  } else {
    const int c = (__float_as_int(p.qk_scale_log2) >> 23) - 127;  // floor(log2(scale)) for a normal scale
    up = __int_as_float((127 + max(min(c, 0) - 8, -64)) << 23);
  }
#pragma unroll
  for (int i = 0; i < PER_THREAD; ++i)
    st_shared16(smem_u32(smem + OFF_Q + (unit / 8) * CHUNK_BYTES) + swizzled(tid / 64 + 4 * i, unit % 8),
                F16 ? bf16x8_to_f16x8(v[i], up, inexact) : bf16x8_scaled(v[i], up));
  if (inexact) mark_inexact<CL>(smem, rank);
  fence_proxy_async();  // wgmma reads q
  if (tid < 128) named_sync(5, 256);
  else asm volatile("barrier.arrive 5, 256;" ::: "memory");
  return 1.f / up;
}

__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xFFFFFFFFu, v, 1);
  return v + __shfl_xor_sync(0xFFFFFFFFu, v, 2);
}

// A row of o staged in shared memory: 512 bf16 and 16 bytes of padding, so that the 8 rows a
// warp stores at once fall on distinct banks.
constexpr int O_ROW = DIM * 2 + 16;
static_assert(OFF_Q + ROWS * O_ROW <= OFF_K + TILE_BYTES, "o's staging overruns the first key stage");

// A consumer warpgroup's 64 x 256 part of o (columns col0 ..), rows scaled by f, staged in shared
// memory (q's and the first stage's, unused once every tile is done) and written by the bulk copy
// engine, 512 contiguous bytes a head.
__device__ __forceinline__ void store_o(const Params& p, uint8_t* smem, const float* acc, const float* f, int b,
                                        int t, int head0, int col0, int tid, int barrier) {
  const int warp = tid / 32, lane = tid % 32, r0 = warp * 16 + lane / 4, quad = lane % 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    uint8_t* row = smem + OFF_Q + (r0 + 8 * h) * O_ROW + col0 * 2;
#pragma unroll
    for (int j = 0; j < 32; ++j)
      *reinterpret_cast<uint32_t*>(row + (8 * j + 2 * quad) * 2) = pack_bf16(acc[4 * j + 2 * h] * f[h], acc[4 * j + 2 * h + 1] * f[h]);
  }
  fence_proxy_async();
  named_sync(barrier, 128);
  if (tid < 32) {
    for (int r = tid; r < ROWS && head0 + r < p.heads; r += 32) {
      const __nv_bfloat16* dst = p.o + b * p.o_sb + t * p.o_st + (head0 + r) * p.o_sh + col0;
      asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], 512;"
                   ::"l"(dst), "r"(smem_u32(smem + OFF_Q + r * O_ROW + col0 * 2)) : "memory");
    }
    asm volatile("cp.async.bulk.commit_group;\ncp.async.bulk.wait_group.read 0;" ::: "memory");
  }
}

// Both consumer warpgroups free a stage in every CTA of the cluster (its producer writes into both).
template <int CL>
__device__ __forceinline__ void release_stage(uint8_t* smem, int stage) {
  const uint32_t bar = smem_u32(smem + OFF_BAR + (BAR_FREE + stage) * 8);
#pragma unroll
  for (int r = 0; r < CL; ++r) bar_arrive_cluster(CL == 1 ? bar : peer_addr(bar, r));
}

// Warpgroup 1's P.V for Dv[256:512] from P buffer `pb` (f16, or bf16 hi then lo) and stage `stage`.
template <bool F16>
__device__ __forceinline__ void pv_from_shared(float* acc, uint8_t* smem, int pb, int stage) {
  const uint32_t p_hi = smem_u32(smem + OFF_P + pb * 2 * P_BYTES);
  const uint32_t v = smem_u32(smem + OFF_K + stage * TILE_BYTES + 4 * CHUNK_BYTES);
  wgmma_fence();
#pragma unroll
  for (int part = 0; part < (F16 ? 1 : 2); ++part)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n256k16_b_mn_major<F16>(acc, descriptor(p_hi + part * P_BYTES + kk * 32, 16, 1024),
                                  descriptor(v + kk * 2048, 8192, 1024), 1);
  wgmma_commit();
  wgmma_wait0();
}

// Warpgroup 0's P.V for Dv[0:256] with P (f16, or bf16 hi) from registers: a[4 kk ..] are keys
// 16 kk .. 16 kk + 15 in wgmma's A layout, which is the layout of QK^T's accumulator; bf16's lo
// half from shared memory (P buffer `pb`, as warpgroup 1 reads it: its registers would spill).
// Issued; the caller waits.
template <bool F16>
__device__ __forceinline__ void pv_from_registers(float* acc, const uint32_t* p_hi, uint8_t* smem, int pb, int stage) {
  const uint32_t v = smem_u32(smem + OFF_K + stage * TILE_BYTES);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
    wgmma_m64n256k16_a_regs_b_mn_major<F16>(acc, p_hi + 4 * kk, descriptor(v + kk * 2048, 8192, 1024), 1);
  const uint32_t p_lo = smem_u32(smem + OFF_P + pb * 2 * P_BYTES + P_BYTES);
  if (!F16)
#pragma unroll
    for (int kk = 0; kk < 4; ++kk)
      wgmma_m64n256k16_b_mn_major<F16>(acc, descriptor(p_lo + kk * 32, 16, 1024), descriptor(v + kk * 2048, 8192, 1024), 1);
  wgmma_commit();
}

// The sinks of warpgroup 0's thread's rows (softmax_warpgroup's r0, r0 + 8; -inf past Hq), loaded
// before q so that their latency passes with q's: they are used once the tiles are done (scaled at
// the load, they held warpgroup 0 there for the load's latency before its first tile).
__device__ __forceinline__ float2 load_sinks(const Params& p, int head0) {
  const int head = head0 + (threadIdx.x / 32) * 16 + (threadIdx.x % 32) / 4;
  float2 sink = make_float2(-INFINITY, -INFINITY);
  if (p.sink && head < p.heads) sink.x = __ldg(p.sink + head);
  if (p.sink && head + 8 < p.heads) sink.y = __ldg(p.sink + head + 8);
  return sink;
}

// Row r0 = 16 warp + lane / 4 and r0 + 8 of the warpgroup's 64; columns 8 j + 2 (lane % 4) + {0, 1}.
// q_unit: what a unit of q in shared memory is worth (load_q).
template <int CL, bool F16>
__device__ void softmax_warpgroup(const Params& p, uint8_t* smem, int b, int t, int head0, int n_tiles, float q_unit,
                                  float2 sinks) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int r0 = warp * 16 + lane / 4, quad = lane % 4;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // l and acc are held at unit = 2^-e of their value, l brought into [1, 2) each tile (bf16 P; f16 P keeps
  // unit 1): the accumulator stays within a few |v|max, not keys x |v|max (fmha/kernels/triton_utils.py,
  // renormalize). Both rows' units in one register, as bf16 (powers of two, exact): two spilled.
  __nv_bfloat162 unit = __float2bfloat162_rn(1.f);
  const uint32_t q = smem_u32(smem + OFF_Q);
  const float* bias_s = reinterpret_cast<const float*>(smem + OFF_BIAS);
  float* alpha_s = reinterpret_cast<float*>(smem + OFF_ALPHA);
  const float qk_scale_log2 = p.qk_scale_log2 * q_unit;
  trace_cta(p, CTA_TILES);
  for (int i = 0; i < n_tiles; ++i) {
    const int stage = i % STAGES, pb = i % 2;
    bar_wait(smem_u32(smem + OFF_BAR + (BAR_READY + stage) * 8), (i / STAGES) & 1);
    fence_proxy_async();
    if (tid == 0) trace(p, i, 0);
    float s[32] = {};
    const uint32_t k = smem_u32(smem + OFF_K + stage * TILE_BYTES);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 32; ++kk)
      wgmma_m64n64k16<F16>(s, descriptor(q + (kk / 4) * CHUNK_BYTES + (kk % 4) * 32, 16, 1024),
                      descriptor(k + (kk / 4) * CHUNK_BYTES + (kk % 4) * 32, 16, 1024), kk > 0);
    wgmma_commit();
    wgmma_wait0();
    if (tid == 0) trace(p, i, 1);
    float row_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 bias = reinterpret_cast<const float2*>(bias_s + stage * KEYS)[4 * j + quad];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[4 * j + e] = s[4 * j + e] * qk_scale_log2 + (e & 1 ? bias.y : bias.x);
        row_max[e / 2] = fmaxf(row_max[e / 2], s[4 * j + e]);
      }
    }
    float alpha[2], m_use[2], sum[2] = {0.f, 0.f};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], quad_max(row_max[h]));
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;  // nothing seen yet: exp2(-inf - 0) = 0
      alpha[h] = fast_exp2(m[h] - m_use[h]);
      m[h] = m_new;
    }
    if (!F16) {  // the held sum into [1, 2): k from its exponent bits, never past unit 1
      const float2 units = __bfloat1622float2(unit);
      const float down0 = pow2(-max(exponent(l[0] * alpha[0]), exponent(units.x)));
      const float down1 = pow2(-max(exponent(l[1] * alpha[1]), exponent(units.y)));
      alpha[0] *= down0, alpha[1] *= down1;
      unit = __floats2bfloat162_rn(units.x * down0, units.y * down1);
    }
    // P as f16 (or bf16 hi + lo) into buffer pb, once warpgroup 1 is done with it (tile i - 2).
    bar_wait(smem_u32(smem + OFF_BAR + (BAR_PFREE + pb) * 8), ((i / 2) & 1) ^ 1);
    // The rescale, to warpgroup 1 and on our half, before P: alpha is not live beside P's registers.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] *= alpha[h];
      if (quad == 0) alpha_s[pb * ROWS + r0 + 8 * h] = alpha[h];
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= alpha[0], acc[4 * j + 1] *= alpha[0];
      acc[4 * j + 2] *= alpha[1], acc[4 * j + 3] *= alpha[1];
    }
    // Also kept in registers for our own P.V: (j, h) is register 2 j + h of wgmma's A layout.
    uint8_t* p_hi = smem + OFF_P + pb * 2 * P_BYTES;
    uint32_t a_hi[16], a_lo[16];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float row_unit = h ? __high2float(unit) : __low2float(unit);
        const float x0 = fast_exp2(s[4 * j + 2 * h] - m_use[h]) * row_unit,
                    x1 = fast_exp2(s[4 * j + 2 * h + 1] - m_use[h]) * row_unit;
        sum[h] += x0 + x1;
        if (F16) {
          asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(a_hi[2 * j + h]) : "f"(x1), "f"(x0));
        } else {
          const __nv_bfloat162 hi = __floats2bfloat162_rn(x0, x1);
          const float2 hf = __bfloat1622float2(hi);
          a_hi[2 * j + h] = *reinterpret_cast<const uint32_t*>(&hi);
          a_lo[2 * j + h] = pack_bf16(x0 - hf.x, x1 - hf.y);
        }
      }
    // P's 16 8x8 matrices of this warp, (j, h) = (2 q + m / 2, m % 2) in registers 4 q + m.
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const uint32_t at = smem_u32(p_hi) + swizzled(warp * 16 + 8 * ((lane / 8) % 2) + lane % 8, 2 * q + lane / 16);
      stmatrix_x4(at, a_hi + 4 * q);
      if (!F16) stmatrix_x4(at + P_BYTES, a_lo + 4 * q);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] += quad_sum(sum[h]);
    fence_proxy_async();
    named_sync(1, 128);  // all of P written (warpgroup 1's wgmma reads it)
    pv_from_registers<F16>(acc, a_hi, smem, pb, stage);
    // Warpgroup 1 is told P is full once our P.V is issued, not before: our wgmmas are queued
    // ahead of its (8% faster on every bench shape, BENCHMARKS.md).
    if (tid == 0) {
      bar_arrive_local(smem_u32(smem + OFF_BAR + (BAR_PFULL + pb) * 8));
      trace(p, i, 2);
    }
    wgmma_wait0();
    named_sync(1, 128);
    if (tid == 0) {
      release_stage<CL>(smem, stage);
      trace(p, i, 3);
    }
  }
  trace_cta(p, CTA_TILES_DONE);
  // The sink joins the denominator once; the max is taken with it first so it cannot overflow.
  float* final_s = reinterpret_cast<float*>(smem + OFF_FINAL);
  float rescale[2], denominator[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int head = head0 + r0 + 8 * h;
    rescale[h] = 1.f;
    if (p.sink) {
      const float sink = (h ? sinks.y : sinks.x) * LOG2E;
      const float m_final = fmaxf(m[h], sink);
      const float m_safe = m_final == -INFINITY ? 0.f : m_final;
      rescale[h] = exp2f(m[h] - m_safe);
      l[h] = l[h] * rescale[h] + exp2f(sink - m_safe) * (h ? __high2float(unit) : __low2float(unit));
      m[h] = m_final;
    }
    const bool empty = l[h] == 0.f;
    denominator[h] = empty ? 1.f : l[h];
    if (quad == 0) {
      final_s[r0 + 8 * h] = rescale[h];
      final_s[ROWS + r0 + 8 * h] = denominator[h];
      if (head < p.heads)
        p.lse[b * p.l_sb + head * p.l_sh + t * p.l_st] =  // of the sum itself (exact), not of the held sum
            empty ? -INFINITY : (m[h] + log2f(l[h] * pow2(-exponent(h ? __high2float(unit) : __low2float(unit))))) * LN2;
    }
  }
  // o's staging reaches into the first key stage. In a 2-CTA cluster our bulk copy of a tile out
  // of that stage may still be reading it after our own consumers are done: the stage's last
  // free phase (both CTAs' consumers done with it, so the peer has every byte we copied) orders
  // it. Warpgroup 1 stages after the barrier below.
  if (n_tiles > 0) bar_wait(smem_u32(smem + OFF_BAR + BAR_FREE * 8), ((n_tiles - 1) / STAGES) & 1);
  named_sync(2, 256);  // final_s to warpgroup 1
  const float f[2] = {rescale[0] / denominator[0], rescale[1] / denominator[1]};
  store_o(p, smem, acc, f, b, t, head0, 0, tid, 1);
  trace_cta(p, CTA_STORED);
}

template <int CL, bool F16>
__device__ void second_half_warpgroup(const Params& p, uint8_t* smem, int b, int t, int head0, int n_tiles) {
  const int tid = threadIdx.x - 128, warp = tid / 32, lane = tid % 32;
  const int r0 = warp * 16 + lane / 4;
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  const float* alpha_s = reinterpret_cast<const float*>(smem + OFF_ALPHA);
  for (int i = 0; i < n_tiles; ++i) {
    const int stage = i % STAGES, pb = i % 2;
    bar_wait(smem_u32(smem + OFF_BAR + (BAR_READY + stage) * 8), (i / STAGES) & 1);
    bar_wait(smem_u32(smem + OFF_BAR + (BAR_PFULL + pb) * 8), (i / 2) & 1);
    fence_proxy_async();
    if (tid == 0) trace(p, i, 4);
    const float a0 = alpha_s[pb * ROWS + r0], a1 = alpha_s[pb * ROWS + r0 + 8];
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      acc[4 * j] *= a0, acc[4 * j + 1] *= a0;
      acc[4 * j + 2] *= a1, acc[4 * j + 3] *= a1;
    }
    pv_from_shared<F16>(acc, smem, pb, stage);
    named_sync(3, 128);
    if (tid == 0) {
      bar_arrive_local(smem_u32(smem + OFF_BAR + (BAR_PFREE + pb) * 8));
      release_stage<CL>(smem, stage);
      trace(p, i, 5);
    }
  }
  named_sync(2, 256);
  const float* final_s = reinterpret_cast<const float*>(smem + OFF_FINAL);
  float f[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) f[h] = final_s[r0 + 8 * h] / final_s[ROWS + r0 + 8 * h];
  store_o(p, smem, acc, f, b, t, head0, 256, tid, 3);
}

// The mbarriers' first phases (after mbarrier.inval where they were used by an earlier pass).
template <int CL>
__device__ __forceinline__ void init_barriers(uint8_t* smem, bool used) {
  auto init = [&](int bar, uint32_t count) {
    const uint32_t at = smem_u32(smem + OFF_BAR + bar * 8);
    if (used) asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(at) : "memory");
    bar_init(at, count);
  };
  for (int s = 0; s < STAGES; ++s) init(BAR_READY + s, 1), init(BAR_FREE + s, 2 * CL);
  for (int i = 0; i < 2; ++i) init(BAR_PFULL + i, 1), init(BAR_PFREE + i, 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// A pass is over: no CTA goes on (to the next pass, or out) while its peer may still store into
// its memory or arrive on its barriers. Then whether the f16 pass met a value it does not hold
// (mark_inexact): if so the barriers start over for the bf16 pass.
template <int CL>
__device__ __forceinline__ bool bf16_pass_needed(uint8_t* smem) {
  cluster_or_cta_sync<CL>();
  if (!*reinterpret_cast<volatile uint32_t*>(smem + OFF_INEXACT)) return false;
  // The f16 pass's o lands before the bf16 pass's (store_o's bulk copies: threads 0-31 of each consumer warpgroup).
  if (threadIdx.x < 256 && threadIdx.x % 128 < 32) asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
  if (threadIdx.x == 0) init_barriers<CL>(smem, true);
  cluster_or_cta_sync<CL>();
  return true;
}

// One pass over the row's tiles, keys, q and P as f16 (or bf16), each warpgroup its part.
template <int CL, bool F16>
__device__ __forceinline__ void run_pass(const Params& p, uint8_t* smem, int b, int t, int head0, uint32_t rank,
                                         int n_tiles) {
  const int warpgroup = threadIdx.x / 128;
  if (warpgroup == 2) {
    regs_dec<REGS_PRODUCER>();
    producer<CL, F16>(p, smem, b, t, rank);
    regs_inc<REGS_LAUNCH>();
  } else if (warpgroup == 0) {
    regs_inc<REGS_SOFTMAX>();
    const float2 sinks = load_sinks(p, head0);
    const float q_unit = load_q<CL, F16>(p, smem, b, t, head0, rank);
    softmax_warpgroup<CL, F16>(p, smem, b, t, head0, n_tiles, q_unit, sinks);
    regs_dec<REGS_LAUNCH>();
  } else {
    regs_dec<REGS_SECOND>();
    load_q<CL, F16>(p, smem, b, t, head0, rank);
    second_half_warpgroup<CL, F16>(p, smem, b, t, head0, n_tiles);
    regs_inc<REGS_LAUNCH>();
  }
}

// Two passes, the second rarely run. The first holds keys, q and P as f16: P's 11-bit significand
// keeps the output at the gate in one P.V (bf16's 8 bits do not: FlashMLA's cosine 0.9999979),
// and f16 holds every dequantized key element exactly for the scales real caches have (e4m3
// scale codes 112-134, e2m1 104-140), q scaled by a power of two, and the rope dims below 2^16. Where
// a value of the row falls outside, the cluster runs the second pass: bf16, which holds them all,
// with P split into bf16 hi + lo (two P.Vs).
template <int CL>
__global__ void __launch_bounds__(THREADS, 1) sparse_decode_kernel(const __grid_constant__ Params p) {
  extern __shared__ uint8_t raw_smem[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw_smem) + 1023) & ~uintptr_t(1023));
  const int row = blockIdx.y, b = row / p.T, t = row % p.T;
  const int head0 = blockIdx.x * ROWS;
  const uint32_t rank = CL == 1 ? 0 : cluster_rank();
  trace_cta(p, CTA_START);

  if (threadIdx.x == 0) {
    *reinterpret_cast<uint32_t*>(smem + OFF_INEXACT) = 0;
    init_barriers<CL>(smem, false);
  }
  cluster_or_cta_sync<CL>();  // barriers initialised before any peer uses them

  int n_tiles = 0;
  for (int s = 0; s < p.n_scopes; ++s) n_tiles += (scope_keys(p.scope[s], b) + KEYS - 1) / KEYS;

  run_pass<CL, true>(p, smem, b, t, head0, rank, n_tiles);
  if (bf16_pass_needed<CL>(smem)) {
    run_pass<CL, false>(p, smem, b, t, head0, rank, n_tiles);
    if (CL > 1) cluster_sync();
  }
  trace_cta(p, CTA_END);
}

#ifndef FMHA_KERNEL_ONLY
Scope scope_of(const torch::Tensor& cache, const torch::Tensor& indices, const c10::optional<torch::Tensor>& topk_len,
               int64_t layout) {
  Scope s{};
  s.cache = cache.data_ptr<uint8_t>();
  s.indices = indices.data_ptr<int>();
  s.topk_len = topk_len ? topk_len->data_ptr<int>() : nullptr;
  s.page_stride = cache.stride(0);
  s.idx_sb = indices.stride(0), s.idx_st = indices.stride(1), s.idx_sk = indices.stride(2);
  s.block_size = static_cast<int>(cache.size(1));
  s.topk = static_cast<int>(indices.size(2));
  s.layout = static_cast<int>(layout);
  return s;
}

template <int CL>
void launch(const Params& p, dim3 grid, cudaStream_t stream) {
  auto kernel = sparse_decode_kernel<CL>;
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM_BYTES));
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(THREADS);
  config.dynamicSmemBytes = SMEM_BYTES;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = CL;
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, p));
}

}  // namespace

// o (B, T, Hq, 512) bf16 and lse (B, Hq, T) float32 are written; the caller has checked the call.
void sparse_decode(torch::Tensor q, torch::Tensor o, torch::Tensor lse, c10::optional<torch::Tensor> sink,
                   torch::Tensor cache, torch::Tensor indices, c10::optional<torch::Tensor> topk_len, int64_t layout,
                   c10::optional<torch::Tensor> extra_cache, c10::optional<torch::Tensor> extra_indices,
                   c10::optional<torch::Tensor> extra_topk_len, int64_t extra_layout, double qk_scale,
                   c10::optional<torch::Tensor> trace) {
  TORCH_CHECK(q.stride(3) == 1 && o.stride(3) == 1, "q, o: the head dim must be contiguous");
  // o's rows are written by the bulk copy engine, 16 bytes aligned.
  TORCH_CHECK(reinterpret_cast<uintptr_t>(o.data_ptr()) % 16 == 0 && o.stride(0) % 8 == 0 && o.stride(1) % 8 == 0 &&
                  o.stride(2) % 8 == 0,
              "o: expected a 16-byte aligned base and strides of multiples of 8 elements, got ", o.strides());
  const c10::cuda::CUDAGuard guard(q.device());
  Params p{};
  p.q = reinterpret_cast<const __nv_bfloat16*>(q.data_ptr<at::BFloat16>());
  p.o = reinterpret_cast<__nv_bfloat16*>(o.data_ptr<at::BFloat16>());
  p.lse = lse.data_ptr<float>();
  p.sink = sink ? sink->data_ptr<float>() : nullptr;
  p.q_sb = q.stride(0), p.q_st = q.stride(1), p.q_sh = q.stride(2);
  p.o_sb = o.stride(0), p.o_st = o.stride(1), p.o_sh = o.stride(2);
  p.l_sb = lse.stride(0), p.l_sh = lse.stride(1), p.l_st = lse.stride(2);
  p.scope[0] = scope_of(cache, indices, topk_len, layout);
  p.n_scopes = 1;
  if (extra_cache) {
    p.scope[1] = scope_of(*extra_cache, *extra_indices, extra_topk_len, extra_layout);
    p.n_scopes = 2;
  }
  const int B = static_cast<int>(q.size(0)), T = static_cast<int>(q.size(1));
  p.T = T;
  p.heads = static_cast<int>(q.size(2));
  p.qk_scale_log2 = static_cast<float>(qk_scale) * LOG2E;
  p.trace = trace ? trace->data_ptr<int64_t>() : nullptr;
  const int cl = p.heads > ROWS ? 2 : 1;
  const int blocks = (p.heads + ROWS - 1) / ROWS;
  const dim3 grid((blocks + cl - 1) / cl * cl, B * T);  // whole clusters
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  if (cl == 2) launch<2>(p, grid, stream); else launch<1>(p, grid, stream);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("sparse_decode", &sparse_decode, "fmha's DSV4 sparse decode (sm_90a)");
  m.attr("smem_bytes") = SMEM_BYTES;
  m.attr("trace_events") = TRACE_EVENTS;
  m.attr("trace_cta") = TRACE_CTA;
}
#else
template __global__ void sparse_decode_kernel<1>(const __grid_constant__ Params);
template __global__ void sparse_decode_kernel<2>(const __grid_constant__ Params);
}  // namespace
#endif

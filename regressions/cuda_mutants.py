"""Mutants of fmha's CUDA sparse-decode kernel (fmha/kernels/cuda/sparse_decode.cu): the bugs its
two-CTA exchange and its integer dequantization invite, each put back into its source and built
as an extension of its own. Like the Gluon kernels' mutants they live apart from the kill matrix
(which runs on the CPU): tests/test_cuda_sparse.py catches them on a Hopper GPU with nvcc.

What catches each: the cluster cases below through the verdict (a peer's bytes in the wrong
place), a bounded wait (a barrier that never completes: the case hangs), the contract's FP8 law
and every e4m3 code through the kernel (subnormals flushed; f16 scales unchecked, which only
codes at scales outside f16's range show). A mutant's `trap` names the trap of
its kind of bug where the library has one (smem-stride: a shared-memory tile partly stale), else
it is empty.
"""

from __future__ import annotations

from fmha.regressions.mutation import Mutant, cuda_only, cuda_sparse_mutant_build, patched_cuda_sparse_kernel
from fmha.regressions.paged_cases import SPARSE, TWO_SCOPES
from fmha.regressions.trap import reproducer

# Hq > 64: two CTAs of a cluster, each dequantizing half of every 64-key tile for both.
CLUSTER_CASES = (
    reproducer(SPARSE.replace(heads_q=128, q_len=1, kv_len=70, block_size=16), seed=3,
               why="128 heads: a 2-CTA cluster, two key tiles (the second ragged)"),
    reproducer(TWO_SCOPES.replace(heads_q=96, q_len=2, kv_len=40, block_size=8, extra_topk=24, extra_block_size=4),
               seed=4, why="96 heads over FP8 and FP4 scopes: a cluster whose second CTA has 32 rows"),
)

# Each mutant's patches of the .cu: (old, new) snippets.
PATCHES = {
    "cuda-sparse-peer-wrong-half": ((
        "copy_to_peer(peer_addr(tile_at + c * CHUNK_BYTES, peer)",
        "copy_to_peer(peer_addr(tile_at - half * 128 + peer * 32 * 128 + c * CHUNK_BYTES, peer)"),),
    "cuda-sparse-peer-bytes-miscounted": ((
        "constexpr uint32_t PEER_TX = KEYS / 2 * (DIM * 2 + 4);",
        "constexpr uint32_t PEER_TX = KEYS / 2 * (DIM * 2 + 4) + 16;"),),
    "cuda-sparse-subnormals-flushed": ((
        "    e4m3x4_to_f16(w, a, b);\n", "    e4m3x4_to_f16(w & __vcmpne4(w & 0x78787878u, 0), a, b);\n"), (
        "  return ((x >> 4) & 0x07F007F0u) | (x & 0x80008000u);\n",
        "  const uint32_t v = ((x >> 4) & 0x07F007F0u) | (x & 0x80008000u);\n"
        "  return v & __vcmpne2(v & 0x7F807F80u, 0);\n")),
    "cuda-sparse-f16-scale-unchecked": (("    inexact |= scale - 112 > 22;\n", "\n"),),
}


def _patched(name: str):
    return lambda: patched_cuda_sparse_kernel(name, *PATCHES[name])


CUDA_MUTANTS = cuda_only(
    Mutant(
        "cuda-sparse-peer-wrong-half", "smem-stride",
        "each CTA's bulk copy lands in the peer's own half of the tile: half of every tile the consumers read is stale",
        _patched("cuda-sparse-peer-wrong-half")),
    Mutant(
        "cuda-sparse-peer-bytes-miscounted", "",
        "the ready barrier expects 16 bytes more than the peer copies: its phase never completes, the kernel hangs",
        _patched("cuda-sparse-peer-bytes-miscounted"), isolate="hang"),
    Mutant(
        "cuda-sparse-subnormals-flushed", "",
        "e4m3 codes with exponent bits 0 (subnormals) decoded as 0: flushed before the f16 pass's conversion and in "
        "the bf16 pass's bits",
        _patched("cuda-sparse-subnormals-flushed")),
    Mutant(
        "cuda-sparse-f16-scale-unchecked", "",
        "the f16 pass takes every e4m3 scale as in its range: keys past 2^7 overflow to inf, below 2^-15 lose their "
        "small codes, and the bf16 pass never runs for them",
        _patched("cuda-sparse-f16-scale-unchecked")),
)


def builds() -> list:
    """The mutants' builds, for `python -m fmha.kernels.build --mutants` (the `fmha.cuda_builds`
    entry point): built once per machine beside the kernel, off the tests' critical path."""
    return [cuda_sparse_mutant_build(name, *patches) for name, patches in PATCHES.items()]

"""Mutants of the Gluon kernels (fmha.kernels.gluon_dense, bf16 head dim 512 on Hopper, and
fmha.kernels.gluon_sparse, DSV4's sparse decode): seed bugs and shipped sparse-decode bugs put back
into their code, each with the trap it belongs to; the head-dim-512 reproducers (dense) and
the trap's own cases (sparse) must catch them.

They live apart from the kill matrix, which runs on the CPU where Gluon cannot:
tests/test_gluon_mutants.py runs them on a Hopper GPU (the GPU tier).
"""

from __future__ import annotations

from fmha.contract import Problem
from fmha.regressions.mutation import Mutant, cuda_only, patched_gluon_kernel, patched_gluon_sparse_kernel
from fmha.regressions.trap import reproducer

# The trap reproducers in the Gluon kernel's shapes: DSV4 decode with a ragged last key tile,
# and MTP-style causal GQA with a sink.
CASES = (
    reproducer(Problem(batch=1, q_len=1, kv_len=200, heads_q=64, heads_kv=1, head_dim=512, shared_kv=True),
               why="DSV4-like decode, four key tiles, S ragged"),
    reproducer(Problem(batch=1, q_len=4, kv_len=300, heads_q=16, heads_kv=2, head_dim=512, causal=True, sink=True),
               why="causal GQA, two KV heads, sink"),
)

GLUON_DENSE_MUTANTS = cuda_only(
    Mutant(
        "gluon-multi-tile-rescale", "multi-tile-rescale",
        "warpgroup 1 never rescales its half of the accumulator when the running max grows",
        lambda: patched_gluon_kernel("gluon-multi-tile-rescale", (
            "acc = acc * a_s.index(slot).load(ROW_PV)[:, None]\n", "\n"))),
    Mutant(
        "gluon-partial-head-dim", "partial-head-dim",
        "QK^T from the first 256 head-dim columns only",
        lambda: patched_gluon_kernel("gluon-partial-head-dim", (
            "            s = warpgroup_mma(q_s.index(1), _tile(k_s, 2 * ks + 1).permute((1, 0)), s, is_async=True)\n",
            ""))),
    Mutant(
        "gluon-unmasked-padding", "unmasked-padding",
        "keys past S (zero-filled by TMA) are not masked: each adds a logit of 0",
        lambda: patched_gluon_kernel("gluon-unmasked-padding", (
            "visible = (cols < hi)[None, :]", "visible = (cols >= 0)[None, :]"))),
    Mutant(
        "gluon-gqa-head-mapping", "gqa-head-mapping",
        "q rows are read from the first KV head's query heads whatever the KV head",
        lambda: patched_gluon_kernel("gluon-gqa-head-mapping", (
            "(kvh * G + rows % G)[:, None] * stride_qh", "(rows % G)[:, None] * stride_qh"))),
    Mutant(
        "gluon-normalize-twice", "normalize-twice",
        "warpgroup 1 divides its half by the softmax sum twice",
        lambda: patched_gluon_kernel("gluon-normalize-twice", (
            "o = acc * f_s.index(0).load(ROW_PV)[:, None] / f_s.index(1).load(ROW_PV)[:, None]\n",
            "o = acc * f_s.index(0).load(ROW_PV)[:, None] / f_s.index(1).load(ROW_PV)[:, None]\n"
            "        o = o / f_s.index(1).load(ROW_PV)[:, None]\n"))),
)

# The sparse-decode kernel's: each is caught by its contract-v2 trap's cases (hd512, K = V,
# FP8 and FP4 caches), which the kernel runs.
GLUON_SPARSE_MUTANTS = cuda_only(
    Mutant(
        "gluon-sparse-minus-one-is-slot-0", "minus-one-is-slot-0",
        "the gather clamps a slot of -1 to 0 and reads it as a key",
        lambda: patched_gluon_sparse_kernel("gluon-sparse-minus-one-is-slot-0", (
            "        read = (keys < n_keys) & (slot >= 0)\n        slot = gl.where(read, slot, 0)\n",
            "        read = keys < n_keys\n        slot = gl.maximum(slot, 0)\n"))),
    Mutant(
        "gluon-sparse-topk-len-ignored", "topk-len-ignored",
        "the first scope runs to top-k whatever the request's topk_len",
        lambda: patched_gluon_sparse_kernel("gluon-sparse-topk-len-ignored", (
            "            n_keys1 = gl.load(TOPK_LEN1 + b)\n", "            n_keys1 = topk1\n"))),
    Mutant(
        "gluon-sparse-fp8-scale-wrong-tile", "fp8-scale-wrong-tile",
        "the first 64 FP8 dims take the second tile's scale",
        lambda: patched_gluon_sparse_kernel("gluon-sparse-fp8-scale-wrong-tile", (
            "offset[None, :] * 8 + groups[:, None],", "offset[None, :] * 8 + gl.maximum(groups, 1)[:, None],"))),
)

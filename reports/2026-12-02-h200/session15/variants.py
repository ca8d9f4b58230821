"""Session 15: fmha.gluon_sparse's variants on the DSV4 sparse-decode bench shapes: median of
CUDA-graph replays (µs) and the largest |o - the first variant run|. Call 1: session 14's kernel
(git 0e5c4f8, an e2m1 code decoded a nibble at a time) against a byte at a time; and, timing
only, P.V over P's bf16 high half alone (FlashMLA's precision, which the gate rejects: DESIGN's
P probe). Call 2: the next tile's keys prefetched into L2 (the working tree) against call 1's
kernel (git 0821b06), each also with consumers that take each tile at once (the gatherer alone).
`python variants.py [index ...]`; SECOND=dsv4-fp4 makes the second scope's cache FP4, SHAPES
picks shapes by name (" " for all). Run it in a clone: on the device machine the git kernels
lay beside this script (gluon_sparse_<commit>.py)."""
import os
import subprocess
import sys

import torch
from triton.testing import do_bench_cudagraph

from fmha import bench_sparse
from fmha.contract import check_attention_args
from fmha.regressions.mutation import _import_patched, patch_source

HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_at(commit: str) -> str:
    beside = os.path.join(HERE, f"gluon_sparse_{commit}.py")
    if os.path.exists(beside):
        return open(beside).read()
    return subprocess.run(["git", "show", f"{commit}:fmha/gluon_sparse.py"], cwd=HERE, capture_output=True,
                          text=True, check=True).stdout


product = open(os.path.join(HERE, "../../../fmha/gluon_sparse.py")).read()
HI_ONLY = (("            acc = warpgroup_mma(gl.convert_layout(p_lo, dense.P_LAYOUT), v, acc, is_async=True)\n", ""),
           ("            acc = warpgroup_mma(p_s.index(2 * slot + 1), v, acc, is_async=True)\n", ""))
# Call 2's kernel: the prefetch for both layouts.
BOTH_LAYOUTS = (("""            if LAYOUT == 2:
                _prefetch(K, following, keys, n_keys, block_size, stride_kb, TOKEN, 16)
""", """            _prefetch(K, following, keys, n_keys, block_size, stride_kb, TOKEN, 8 if LAYOUT == 1 else 16)
"""),)
# Call 5's try: the e4m3 codes converted to bf16 and scaled by a bf16 product.
E4M3_IN_BF16 = (
    ("        return codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * _decode_ue8m0(scale_codes.to(gl.int32))",
     "        return codes.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16) * "
     "_decode_ue8m0(scale_codes.to(gl.int32)).to(gl.bfloat16)"),
    ("                value = _e4m3(codes, scale[:, :, None]).to(gl.bfloat16)",
     "                value = _e4m3(codes, scale[:, :, None])"))
# Timing only: warpgroups 0 and 1 take each tile and free it at once (session 13's patch).
NO_CONSUMERS = (
    ("""            following = gl.minimum(i + 1, n_tiles - 1)
            mbarrier.wait(kready.index(following % STAGES), (following // STAGES) & 1)
            s_next = _qk(q_s, k_s, following % STAGES, zero_s)
            # 0 for a key, -inf for a slot that is none (its tile row is zeros)
            s = s * qk_scale + bias_s.index(ks).load(gl.SliceLayout(0, QK_LAYOUT))[None, :]
            p_hi, p_lo, alpha, m_i, l_i = dense._online_softmax(s, m_i, l_i, p_s, a_s, pfull, pfree, i)
            acc = acc * gl.convert_layout(alpha, ROW_PV)[:, None]
            v = k_s.index(2 * ks)
            acc = warpgroup_mma(gl.convert_layout(p_hi, dense.P_LAYOUT), v, acc, is_async=True)
            acc = warpgroup_mma(gl.convert_layout(p_lo, dense.P_LAYOUT), v, acc, is_async=True)
            acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s_next))
            mbarrier.arrive(kfree.index(ks), count=1)
""", """            mbarrier.wait(kready.index(ks), (i // STAGES) & 1)
            mbarrier.arrive(kfree.index(ks), count=2)
"""),
    ("        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)\n        for i in range(n_tiles):\n",
     "        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)\n        for i in range(0):\n"))
VARIANTS = {  # name: (base source, patches)
    "session 14 (a nibble at a time)": (kernel_at("0e5c4f8"), ()),
    "a byte at a time": (kernel_at("0821b06"), ()),
    "P.V with P hi only (timing only)": (kernel_at("0821b06"), HI_ONLY),
    "the next tile prefetched into L2": (product, BOTH_LAYOUTS),
    "a byte at a time, consumers take nothing (timing only)": (kernel_at("0821b06"), NO_CONSUMERS),
    "the next tile prefetched into L2, consumers take nothing (timing only)": (product, BOTH_LAYOUTS + NO_CONSUMERS),
    "the next tile prefetched into L2 for FP4 only": (kernel_at("cbcfbee"), ()),
    "e4m3 scaled in bf16": (kernel_at("cbcfbee"), E4M3_IN_BF16),
}

if __name__ == "__main__":
    only = sys.argv[1:]
    modules = {name: _import_patched("_variant", f"v{i}", patch_source(base, patches, name, "fmha/gluon_sparse.py"))
               for i, (name, (base, patches)) in enumerate(VARIANTS.items()) if not only or str(i) in only}
    second = os.environ.get("SECOND", "dsv4-fp8")
    for shape in [s for s in bench_sparse.SHAPES if os.environ.get("SHAPES", "B64 Hq128 T1 top-k 128+512") in s]:
        x = bench_sparse.inputs(bench_sparse.SHAPES[shape].replace(extra_cache_layout=second))
        shape = shape.replace("FP8", "FP8" if second == "dsv4-fp8" else f"FP8 + {second}")
        args = dict(sink=x["sink"], indices=x["indices"], extra_k_cache=x["extra_k_cache"],
                    extra_indices=x["extra_indices"])
        problem = check_attention_args(x["q"], x["k_cache"], x["k_cache"], cache_layout="dsv4-fp8",
                                       extra_cache_layout=second, **args)
        reference = None
        for name, module in modules.items():
            out = torch.empty_like(x["q"])
            fn = lambda: module.attention(problem, x["q"], x["k_cache"], x["k_cache"], out=out, **args)  # noqa: E731
            fn()
            torch.cuda.synchronize()
            reference = out.clone() if reference is None else reference
            diff = (out.float() - reference.float()).abs().max().item()
            us = do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
            print(f"{shape} | {name}: {us:.1f} us, max |o - first| {diff:.3g}", flush=True)

"""Session 12, call 2: variants of fmha.gluon_sparse as it was then (at commit cba5ad5,
reports/2026-12-02-h200/session12/gluon_sparse_call2.py: 32-key tiles, 4 stages, QK^T one tile
ahead, e4m3 decoded by integer bit operations) on the DSV4 sparse-decode bench shapes, each
against the first (session 11's kernel): median of CUDA-graph replays, and the largest
|o - first| (tile sizes change the online softmax's rescale order, so bits may differ slightly).
Variants are patched sources, as regressions' mutants are. Call 1 ran an earlier version of this
script (its variants: LOOKAHEAD on or off, 3 stages). Both kernels are read from git, so run this
in a clone (on the device machine of call 2 the two files lay beside this script)."""
import os
import subprocess
import sys

import torch
from triton.testing import do_bench_cudagraph

from fmha import bench_sparse
from fmha.contract import check_attention_args
from fmha.regressions.mutation import _import_patched, patch_source

HERE = os.path.dirname(os.path.abspath(__file__))


def at(commit: str, path: str) -> str:
    return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=HERE, capture_output=True, text=True,
                          check=True).stdout


product = at("cba5ad5", "reports/2026-12-02-h200/session12/gluon_sparse_call2.py")
N32 = "BLOCK_N = tl.constexpr(32)"
S4 = "STAGES = tl.constexpr(4)"
AHEAD = "LOOKAHEAD = tl.constexpr(True)"
HARDWARE = (
    ("""        scale = _decode_ue8m0(scale_codes.to(gl.int32)).to(gl.bfloat16)[:, None]
        return gl.inline_asm_elementwise(E4M3_TO_BF16, "=r,=r,r,r,r", [codes, scale], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)""",
     """        return codes.to(gl.float8e4nv, bitcast=True).to(gl.float32) * _decode_ue8m0(scale_codes.to(gl.int32))[:, None]"""),)
NO_LOADS = (  # timing only: the codes made up from the offsets, no byte read
    ("codes = gl.load((page_base + offset * 576 + group * 64)[:, None] + cols[None, :], mask=read[:, None], other=0)",
     "codes = (offset[:, None] + cols[None, :] + group).to(gl.uint8)"),
    ("scale = gl.load(page_base + block_size * 576 + offset * 8 + group, mask=read, other=127)",
     "scale = (offset * 0 + 127).to(gl.uint8)"),
    ("return gl.load(rope[:, None] + cols[None, :], mask=read[:, None], other=0.0)",
     "return (offset[:, None] + cols[None, :]).to(gl.bfloat16)"))
VARIANTS = {
    "session 11 (64-key tiles, 2 stages)": at("5b0f6f8", "fmha/gluon_sparse.py"),
    "product (32-key tiles, 4 stages, QK^T ahead, e4m3 by bits)": product,
    "product, e4m3 by hardware conversions": patch_source(product, HARDWARE, "v", "v"),
    "product, 64-key tiles, 2 stages": patch_source(product, (
        (N32, N32.replace("32", "64")), (S4, S4.replace("4", "2")), (AHEAD, AHEAD.replace("True", "False"))), "v", "v"),
    "product, no bytes loaded (timing only)": patch_source(product, NO_LOADS, "v", "v"),
}
only = sys.argv[1:]
modules = {name: _import_patched("_variant", f"v{i}", source) for i, (name, source) in enumerate(VARIANTS.items())
           if not only or str(i) in only}
SHAPES = [s for s in bench_sparse.SHAPES if os.environ.get("SHAPES", "B64 Hq128 T1 top-k 128+512") in s]
for shape in SHAPES:
    p = bench_sparse.SHAPES[shape]
    x = bench_sparse.inputs(p)
    args = dict(sink=x["sink"], indices=x["indices"], extra_k_cache=x["extra_k_cache"], extra_indices=x["extra_indices"])
    problem = check_attention_args(x["q"], x["k_cache"], x["k_cache"], cache_layout="dsv4-fp8",
                                   extra_cache_layout="dsv4-fp8", **args)
    reference = None
    for name, module in modules.items():
        out = torch.empty_like(x["q"])
        fn = lambda: module.attention(problem, x["q"], x["k_cache"], x["k_cache"], out=out, **args)  # noqa: E731
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"{shape} | {name}: RAISED {type(e).__name__}: {str(e)[:300]}", flush=True)
            continue
        reference = out.clone() if reference is None else reference
        diff = (out.float() - reference.float()).abs().max().item()
        us = do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
        print(f"{shape} | {name}: {us:.1f} us, max |o - first| {diff:.3g}", flush=True)

"""Session 11, call 2 (the kernel of that call: two gathering warpgroups, each tile's bytes loaded
group by group after its stage is free): where fmha.gluon_sparse's time goes, by variants of its source
(patched as regressions' mutants are): the product; no gather (the consumers alone: the tiles are left as
they are); the e4m3 bytes converted to bf16 and scaled in bf16. Median of CUDA-graph replays."""
import inspect

import torch
from triton.testing import do_bench_cudagraph

from fmha import bench_sparse, gluon_sparse
from fmha.contract import check_attention_args
from fmha.regressions.mutation import _import_patched, patch_source

VARIANTS = {
    "product": (),
    "no gather (consumers alone)": (
        ("                for group in gl.static_range(7):\n", "                for group in gl.static_range(0):\n"),
        ("                _put(k_s, stage, 7, gl.load(rope[:, None] + cols[None, :], mask=read[:, None], other=0.0))\n",
         "")),
    "e4m3 to bf16, scaled in bf16": (
        ("value = code.to(gl.float8e4nv, bitcast=True).to(gl.float32)",
         "value = code.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16)"),
        ("scale = _ue8m0(gl.load(scales + group, mask=read, other=127).to(gl.int32))[:, None]",
         "scale = _ue8m0(gl.load(scales + group, mask=read, other=127).to(gl.int32))[:, None].to(gl.bfloat16)")),
}
source = inspect.getsource(gluon_sparse)
modules = {name: _import_patched("_variant", name.split()[0], patch_source(source, patches, name, "fmha/gluon_sparse.py"))
           for name, patches in VARIANTS.items()}
for shape in ("DSV4 sparse decode B64 Hq128 T1 top-k 128+512 FP8", "DSV4 sparse decode B256 Hq128 T1 top-k 128+1024 FP8"):
    p = bench_sparse.SHAPES[shape]
    x = bench_sparse.inputs(p)
    args = dict(sink=x["sink"], indices=x["indices"], extra_k_cache=x["extra_k_cache"], extra_indices=x["extra_indices"])
    problem = check_attention_args(x["q"], x["k_cache"], x["k_cache"], cache_layout="dsv4-fp8",
                                   extra_cache_layout="dsv4-fp8", **args)
    reference = None
    for name, module in modules.items():
        out = torch.empty_like(x["q"])
        fn = lambda: module.attention(problem, x["q"], x["k_cache"], x["k_cache"], out=out, **args)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        reference = out.clone() if reference is None else reference
        diff = (out.float() - reference.float()).abs().max().item()
        us = do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
        print(f"{shape} | {name}: {us:.1f} us, max |o - product| {diff:.3g}", flush=True)

"""Session 14: variants of fmha.gluon_sparse on the DSV4 sparse-decode bench shapes: median of
CUDA-graph replays (µs) and the largest |o - the first variant run|. The product is the working
tree (calls 1-3: the FP8 tile stored at once, one [group, key, column] store; from call 4 the FP4
gather rewritten alike), against session 13's kernel (a store per 64-column group, each a
warpgroup barrier; git 9aac546); then where its time goes. Variants are patched sources, as
regressions' mutants are; the consumer-less one and the softmax overlap are session 13's (its
variants.py), and those marked "timing only" compute something else. `python variants.py
[index ...]`; INDICES=sorted sorts each row's slots (is the gather's rate the order of its
reads?); SECOND=dsv4-fp4 makes the second scope's cache FP4. Run it in a clone: on the device
machine the git kernels lay beside session 13's script."""
import importlib.util
import os
import sys

import torch
from triton.testing import do_bench_cudagraph

from fmha import bench_sparse
from fmha.contract import check_attention_args
from fmha.regressions.mutation import _import_patched, patch_source

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("session13", os.path.join(HERE, "../session13/variants.py"))
session13 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(session13)

product = open(os.path.join(HERE, "../../../fmha/gluon_sparse.py")).read()
STORE = "stages.index(stage).store(gl.where((groups == 7)[:, None, None], rope[None, :, :], value))"
TILES_64 = (("BLOCK_N = tl.constexpr(32)", "BLOCK_N = tl.constexpr(64)"),
            ("STAGES = tl.constexpr(4)", "STAGES = tl.constexpr(2)"))
# Where the consumers' time goes (each on the consumers alone, all timing only).
QK_HALF = ("        return warpgroup_mma(q_s.index(1), k_s.index(2 * stage + 1).permute((1, 0)), s, is_async=True)\n",
           "        return s\n")
HI_ONLY = (("            acc = warpgroup_mma(gl.convert_layout(p_lo, dense.P_LAYOUT), v, acc, is_async=True)\n", ""),
           ("            acc = warpgroup_mma(p_s.index(2 * slot + 1), v, acc, is_async=True)\n", ""))
WG1_IDLE = ("""            acc = acc * a_s.index(slot).load(ROW_PV)[:, None]
            v = k_s.index(2 * ks + 1)
            acc = warpgroup_mma(p_s.index(2 * slot), v, acc, is_async=True)
            acc = warpgroup_mma(p_s.index(2 * slot + 1), v, acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
""", "")
VARIANTS = {  # name: (base source, patches)
    "session 13 (a store per group)": (session13.kernel_at("9aac546"), ()),
    "one store a tile": (product, ()),
    "one store a tile, consumers take nothing (timing only)": (product, session13.NO_CONSUMERS),
    "one store a tile, gather stores nothing (timing only)": (product, ((STORE, "pass"),)),
    "one store a tile, 64-key tiles, 2 stages": (product, TILES_64),
    "session 13, consumers take nothing (timing only)": (session13.kernel_at("9aac546"), session13.NO_CONSUMERS),
    # FlashAttention-3's overlap of the softmax with the previous P.V (session 13's patch)
    "one store a tile, softmax beside the previous P.V": (product, ((session13.LOOP0, session13.OVERLAP0),
                                                                   session13.ACC0, session13.IMPORT)),
    "one store a tile, softmax beside the previous P.V, gather stores nothing (timing only)": (
        product, ((session13.LOOP0, session13.OVERLAP0), session13.ACC0, session13.IMPORT, (STORE, "pass"))),
    "consumers alone, QK^T over half the dims (timing only)": (product, ((STORE, "pass"), QK_HALF)),
    "consumers alone, P.V with P hi only (timing only)": (product, ((STORE, "pass"),) + HI_ONLY),
    "consumers alone, warpgroup 1 takes P and does nothing with it (timing only)": (product, ((STORE, "pass"),
                                                                                              WG1_IDLE)),
    "consumers alone, 64-key tiles, 2 stages (timing only)": (product, TILES_64 + ((STORE, "pass"),)),
}
SOURCES = {name: patch_source(base, patches, name, "fmha/gluon_sparse.py")
           for name, (base, patches) in VARIANTS.items()}

if __name__ == "__main__":
    only = sys.argv[1:]
    modules = {name: _import_patched("_variant", f"v{i}", source) for i, (name, source) in enumerate(SOURCES.items())
               if not only or str(i) in only}
    second = os.environ.get("SECOND", "dsv4-fp8")
    for shape in [s for s in bench_sparse.SHAPES if os.environ.get("SHAPES", "B64 Hq128 T1 top-k 128+512") in s]:
        x = bench_sparse.inputs(bench_sparse.SHAPES[shape].replace(extra_cache_layout=second))
        shape = shape.replace("FP8", "FP8" if second == "dsv4-fp8" else f"FP8 + {second}")
        if os.environ.get("INDICES") == "sorted":
            x["indices"], x["extra_indices"] = x["indices"].sort(-1).values, x["extra_indices"].sort(-1).values
        args = dict(sink=x["sink"], indices=x["indices"], extra_k_cache=x["extra_k_cache"],
                    extra_indices=x["extra_indices"])
        problem = check_attention_args(x["q"], x["k_cache"], x["k_cache"], cache_layout="dsv4-fp8",
                                       extra_cache_layout=second, **args)
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
            print(f"{shape} | {os.environ.get('INDICES', 'random')} slots | {name}: {us:.1f} us, "
                  f"max |o - first| {diff:.3g}", flush=True)

"""Session 13: variants of fmha.gluon_sparse on the DSV4 sparse-decode bench shapes, to place the
time: median of CUDA-graph replays (µs) and the largest |o - the first variant run|. The bases
are read from git: session 12's kernel (9aac546, the product again after this session) and the
FP8 gather staged through cp.async three tiles ahead (9b0f121, reverted); "one ahead" patches the
latter. Variants are patched sources, as regressions' mutants are; those marked "timing only"
(all but the bases and the softmax overlap) compute something else. `python variants.py [index
...]` runs some; `--write DIR` writes each variant's source there instead (for SASS counts). Run
it in a clone: on the device machine the kernels lay beside this script (gluon_sparse_<commit>.py).
Calls 1-4 ran earlier states of this script (call1.sh ... call4.sh)."""
import os
import subprocess
import sys

from fmha.regressions.mutation import _import_patched, patch_source

HERE = os.path.dirname(os.path.abspath(__file__))


def kernel_at(commit: str) -> str:
    beside = os.path.join(HERE, f"gluon_sparse_{commit}.py")
    if os.path.exists(beside):
        return open(beside).read()
    return subprocess.run(["git", "show", f"{commit}:fmha/gluon_sparse.py"], cwd=HERE, capture_output=True,
                          text=True, check=True).stdout


product = kernel_at("9b0f121")
PUT = "k_s.index(2 * stage + group // 4).slice((group % 4) * 64, 64, dim=1).store(x.to(gl.bfloat16))"
RESCALE0 = "            acc = acc * gl.convert_layout(alpha, ROW_PV)[:, None]\n"
RESCALE1 = "            acc = acc * a_s.index(slot).load(ROW_PV)[:, None]\n"
LOOP0 = """            p_hi, p_lo, alpha, m_i, l_i = dense._online_softmax(s, m_i, l_i, p_s, a_s, pfull, pfree, i)
            acc = acc * gl.convert_layout(alpha, ROW_PV)[:, None]
            v = k_s.index(2 * ks)
            acc = warpgroup_mma(gl.convert_layout(p_hi, dense.P_LAYOUT), v, acc, is_async=True)
            acc = warpgroup_mma(gl.convert_layout(p_lo, dense.P_LAYOUT), v, acc, is_async=True)
            acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s_next))
            mbarrier.arrive(kfree.index(ks), count=1)
"""
# FlashAttention-3's overlap in warpgroup 0: P.V of tile i - 1 stays on the tensor cores during
# tile i's softmax, and is waited for (with QK^T(i + 1)) only before the rescale (P read from
# shared memory, as warpgroup 1 reads it).
OVERLAP0 = """            p_hi, p_lo, alpha, m_i, l_i = dense._online_softmax(s, m_i, l_i, p_s, a_s, pfull, pfree, i)
            acc, s = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s_next))
            if i > 0:
                mbarrier.arrive(kfree.index((i - 1) % STAGES), count=1)
            acc = acc * gl.convert_layout(alpha, ROW_PV)[:, None]
            v = k_s.index(2 * ks)
            acc = warpgroup_mma(p_s.index(2 * (i % 2)), v, acc, is_async=True)
            acc = warpgroup_mma(p_s.index(2 * (i % 2) + 1), v, acc, is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        if n_tiles > 0:
            mbarrier.arrive(kfree.index((n_tiles - 1) % STAGES), count=1)
"""
ACC0 = ("        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)\n        s = zero_s\n",
        "        acc = warpgroup_mma_init(gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT))\n        s = zero_s\n")
IMPORT = ("        warpgroup_mma_wait,\n", "        warpgroup_mma_init,\n        warpgroup_mma_wait,\n")
NO_CONSUMERS = (  # timing only: warpgroups 0 and 1 take each tile and free it at once
    ("""            following = gl.minimum(i + 1, n_tiles - 1)
            mbarrier.wait(kready.index(following % STAGES), (following // STAGES) & 1)
            s_next = _qk(q_s, k_s, following % STAGES, zero_s)
            # 0 for a key, -inf for a slot that is none (its tile row is zeros)
            s = s * qk_scale + bias_s.index(ks).load(gl.SliceLayout(0, QK_LAYOUT))[None, :]
""" + LOOP0, """            mbarrier.wait(kready.index(ks), (i // STAGES) & 1)
            mbarrier.arrive(kfree.index(ks), count=2)
"""),
    ("        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)\n        for i in range(n_tiles):\n",
     "        acc = gl.zeros([ROWS, CHUNK], gl.float32, PV_LAYOUT)\n        for i in range(0):\n"))
# Call 2's product: one tile in flight, three ring stages, two staging buffers.
ONE_AHEAD = (
    ("STAGES = tl.constexpr(2)\nSLOTS = tl.constexpr(4)\n", "STAGES = tl.constexpr(3)\nSLOTS = tl.constexpr(2)\n"),
    ("""        s0 = _slots(IDX, keys, n_keys)
        s1 = _slots(IDX, keys + BLOCK_N, n_keys)
        s2 = _slots(IDX, keys + 2 * BLOCK_N, n_keys)
        s3 = _slots(IDX, keys + 3 * BLOCK_N, n_keys)
        if n_tiles > 0:
            _stage_fp8(K, s0, keys, n_keys, block_size, stride_kb, codes_s, rope_s, scale_s, staged, first_staged % SLOTS)
        if n_tiles > 1:
            _stage_fp8(K, s1, keys + BLOCK_N, n_keys, block_size, stride_kb, codes_s, rope_s, scale_s, staged,
                       (first_staged + 1) % SLOTS)
        if n_tiles > 2:
            _stage_fp8(K, s2, keys + 2 * BLOCK_N, n_keys, block_size, stride_kb, codes_s, rope_s, scale_s, staged,
                       (first_staged + 2) % SLOTS)
        for tile in range(n_tiles):
            if tile + 3 < n_tiles:
                _stage_fp8(K, s3, keys + 3 * BLOCK_N, n_keys, block_size, stride_kb, codes_s, rope_s, scale_s,
                           staged, (first_staged + tile + 3) % SLOTS)
            read, _, _ = _locate(s0, keys, n_keys, block_size)
            s0, s1, s2 = s1, s2, s3
            s3 = _slots(IDX, keys + 4 * BLOCK_N, n_keys)
""", """        s0 = _slots(IDX, keys, n_keys)
        s1 = _slots(IDX, keys + BLOCK_N, n_keys)
        if n_tiles > 0:
            _stage_fp8(K, s0, keys, n_keys, block_size, stride_kb, codes_s, rope_s, scale_s, staged, first_staged % SLOTS)
        for tile in range(n_tiles):
            if tile + 1 < n_tiles:
                _stage_fp8(K, s1, keys + BLOCK_N, n_keys, block_size, stride_kb, codes_s, rope_s, scale_s,
                           staged, (first_staged + tile + 1) % SLOTS)
            read, _, _ = _locate(s0, keys, n_keys, block_size)
            s0 = s1
            s1 = _slots(IDX, keys + 2 * BLOCK_N, n_keys)
"""))
BASES = {"session 12": kernel_at("9aac546"), "three ahead (2 stages, 4 buffers)": product,
         "one ahead (3 stages, 2 buffers)": patch_source(product, ONE_AHEAD, "one ahead", "fmha/gluon_sparse.py")}
VARIANTS = {  # name: (base, patches)
    "session 12": ("session 12", ()),
    "session 12, consumers take nothing": ("session 12", NO_CONSUMERS),
    "session 12, gather stores nothing": ("session 12", ((PUT, "pass"),)),
    "session 12, gather stores nothing, no acc rescale":
        ("session 12", ((PUT, "pass"), (RESCALE0, ""), (RESCALE1, ""))),
    "session 12, gather stores groups 0-3 only": ("session 12", ((PUT, "if group < 4:\n            " + PUT),)),
    "session 12, no acc rescale": ("session 12", ((RESCALE0, ""), (RESCALE1, ""))),
}
for base in ("one ahead (3 stages, 2 buffers)", "three ahead (2 stages, 4 buffers)"):
    VARIANTS[base] = (base, ())
    VARIANTS[f"{base}, consumers take nothing"] = (base, NO_CONSUMERS)
    VARIANTS[f"{base}, gather stores nothing"] = (base, ((PUT, "pass"),))
    VARIANTS[f"{base}, copies only"] = (base, NO_CONSUMERS + ((PUT, "pass"),))
VARIANTS["one ahead, softmax beside the previous P.V"] = (  # 3 stages: with 2 it deadlocks (call 3)
    "one ahead (3 stages, 2 buffers)", ((LOOP0, OVERLAP0), ACC0, IMPORT))
SOURCES = {name: patch_source(BASES[base], patches, name, "fmha/gluon_sparse.py")
           for name, (base, patches) in VARIANTS.items()}

if __name__ == "__main__":
    if sys.argv[1:2] == ["--write"]:
        for i, source in enumerate(SOURCES.values()):
            with open(os.path.join(sys.argv[2], f"v{i}.py"), "w") as f:
                f.write(source)
        sys.exit()
    import torch
    from triton.testing import do_bench_cudagraph

    from fmha import bench_sparse
    from fmha.contract import check_attention_args

    only = sys.argv[1:]
    modules = {name: _import_patched("_variant", f"v{i}", source) for i, (name, source) in enumerate(SOURCES.items())
               if not only or str(i) in only}
    for shape in [s for s in bench_sparse.SHAPES if os.environ.get("SHAPES", "B64 Hq128 T1 top-k 128+512") in s]:
        x = bench_sparse.inputs(bench_sparse.SHAPES[shape])
        args = dict(sink=x["sink"], indices=x["indices"], extra_k_cache=x["extra_k_cache"],
                    extra_indices=x["extra_indices"])
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
            print(f"{shape} | {name}: {us:.1f} us, max |o - product| {diff:.3g}", flush=True)

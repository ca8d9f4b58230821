"""Session 15: Triton 3.9's Gluon, compiled only (no GPU), for sm_90a with a cluster of two CTAs.
Each CTA loads half of a [32, 64] bf16 tile (16 keys, a layout split across the CTAs) and stores
it with `hopper.async_store` into a shared tile that both CTAs hold whole (a replicated CGA
layout), then reads the whole tile back: FlashMLA's crossover, if the store reached both CTAs.

What it showed (crossover_probe.txt): Triton 3.9 emits the cluster launch (.reqnctapercluster 2),
`mapa` and `st.async ... mbarrier::complete_tx`, but the address is mapped to the CTA's own rank
(%cluster_ctarank): a CTA's half lands only in its own copy, while the barrier expects the whole
tile (4096 bytes). So even Triton 3.9 does not write the peer's half from layouts alone; the
crossover needs a store addressed to the peer CTA. Run it in a venv with triton==3.9.0 alone
(`python crossover_probe.py`); it does not import torch or fmha.
"""
import re
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia import hopper
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from triton.experimental.gluon._runtime import GluonASTSource

SPLIT = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[1, 0]]))
WHOLE = gl.constexpr(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0], cga_layout=[[0, 0]]))
TILE = gl.constexpr(gl.NVMMASharedLayout(128, 16, rank=2, cga_layout=[[0, 0]]))


@gluon.jit
def crossover(X, OUT):
    keys = gl.arange(0, 32, layout=gl.SliceLayout(1, SPLIT))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, SPLIT))
    half = gl.load(X + keys[:, None] * 64 + cols[None, :])
    tile = gl.allocate_shared_memory(gl.bfloat16, [32, 64], TILE)
    bar = mbarrier.allocate_mbarrier()
    mbarrier.init(bar, count=1)
    mbarrier.expect(bar, tile.nbytes_per_cta)
    hopper.async_store(tile, half, bar)
    mbarrier.wait(bar, 0, deps=[tile])
    keys = gl.arange(0, 32, layout=gl.SliceLayout(1, WHOLE))
    cols = gl.arange(0, 64, layout=gl.SliceLayout(0, WHOLE))
    gl.store(OUT + keys[:, None] * 64 + cols[None, :], tile.load(WHOLE))


src = GluonASTSource(crossover, {"X": "*bf16", "OUT": "*bf16"}, {}, {})
try:
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_ctas": 2})
except Exception as e:
    print("does not compile:", type(e).__name__, str(e)[:1500])
    sys.exit(1)
ptx = c.asm["ptx"]
open("/tmp/p39/probe.ptx", "w").write(ptx)
for pat in ("st.async", "mapa", "cluster", "mbarrier.try_wait", "expect_tx"):
    print(pat, len(re.findall(re.escape(pat), ptx)))
print([l.strip() for l in ptx.splitlines() if "st.async" in l][:4])
print("cluster dims", getattr(c.metadata, "cluster_dims", None), "num_ctas", c.metadata.num_ctas)

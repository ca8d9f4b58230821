"""Session 14: how fast an H200 gathers random 576-byte tokens (the dsv4-fp8 token's data bytes)
from a 42 MB cache, the bench shape's volume (B64 x 640 slots): a Triton copy kernel with 128
programs (one a SM, 32 tokens a step, as fmha.gluon_sparse's gatherer) or one program a tile,
and torch.index_select; slots random or sorted. Median of CUDA-graph replays."""
import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

TOKEN = 576


@triton.jit
def _gather(SRC, IDX, DST, n_tiles):
    keys = tl.arange(0, 32)
    body, tail = tl.arange(0, 512), tl.arange(0, 64)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        slot = tl.load(IDX + t * 32 + keys).to(tl.int64) * 576
        row = (t * 32 + keys).to(tl.int64) * 576
        a = tl.load(SRC + slot[:, None] + body[None, :])
        b = tl.load(SRC + slot[:, None] + 512 + tail[None, :])
        tl.store(DST + row[:, None] + body[None, :], a)
        tl.store(DST + row[:, None] + 512 + tail[None, :], b)


g = torch.Generator(device="cuda").manual_seed(0)
requests, cache, picked = 64, 1152, 640
src = torch.randint(0, 255, (requests * cache, TOKEN), dtype=torch.uint8, device="cuda", generator=g)
pick = torch.rand(requests, cache, generator=g, device="cuda").argsort(-1)[:, :picked]
random_slots = (pick + torch.arange(requests, device="cuda")[:, None] * cache).to(torch.int32).flatten()
dst = torch.empty(random_slots.numel(), TOKEN, dtype=torch.uint8, device="cuda")
distinct = random_slots.numel() * TOKEN
for order, slots in (("random", random_slots), ("sorted", random_slots.sort().values)):
    n_tiles = slots.numel() // 32
    for programs, warps in ((128, 4), (128, 8), (256, 4), (n_tiles, 4)):
        fn = lambda: _gather[(programs,)](src, slots, dst, n_tiles, num_warps=warps)  # noqa: E731
        fn()
        assert torch.equal(dst, src[slots.long()])
        us = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
        print(f"{order} slots, Triton, {programs} programs x {warps} warps: {us:.1f} us, "
              f"{distinct / us / 1e6:.2f} TB/s", flush=True)
    view = src.view(torch.int32)
    fn = lambda: torch.index_select(view, 0, slots)  # noqa: E731
    us = do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
    print(f"{order} slots, torch.index_select: {us:.1f} us, {distinct / us / 1e6:.2f} TB/s", flush=True)

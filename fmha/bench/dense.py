"""Benchmark fmha's dense attention against the SDPA backends and FlexAttention (GPU only).

    python -m fmha.bench [--quick] [--sparse] [--only CONTENDER ...] [--clocks]

Times each kernel on the speed shapes of docs/contract.md and the grid's decode shapes (median of
CUDA-graph replays, triton.testing.do_bench_cudagraph) and prints it next to the roofline
floor max(FLOPs / matmul rate, bytes / copy bandwidth), with both ceilings measured in the
same run. Alternatives get their inputs in their own layout (heads first; KV heads repeated
where the backend has no GQA) outside the timed region, so only their kernels are timed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph

from fmha.contract import Problem
from fmha.tables import Table


def visible_pairs(p: Problem) -> int:
    """(query, key) pairs that are visible: the FLOPs scale with these."""
    if not p.causal:
        return p.q_len * p.kv_len
    return sum(min(p.kv_len, max(0, p.kv_len - p.q_len + i + 1)) for i in range(p.q_len))


def flops(p: Problem) -> float:
    return 2.0 * p.batch * p.heads_q * visible_pairs(p) * (p.head_dim + p.head_dim_v)


def bytes_moved(p: Problem) -> float:
    element = p.dtype.itemsize
    kv = p.batch * p.kv_len * p.heads_kv * (p.head_dim + (0 if p.shared_kv else p.head_dim_v))
    q_and_o = p.batch * p.q_len * p.heads_q * (p.head_dim + p.head_dim_v)
    return element * (kv + q_and_o) + 4.0 * p.batch * p.heads_q * p.q_len  # + fp32 lse


def _dsv4(batch=64, heads_q=128, q_len=1, kv_len=640, causal=False):
    return Problem(batch=batch, q_len=q_len, kv_len=kv_len, heads_q=heads_q, heads_kv=1, head_dim=512,
                   causal=causal, shared_kv=True)


SPEED_SHAPES = {
    "DSV4 decode B64 Hq128 T1 S640 hd512 K=V": _dsv4(),
    "DSV4 decode MTP B64 Hq128 T4 S640 hd512 K=V": _dsv4(q_len=4, causal=True),
    "prefill B1 Hq128 Hkv1 T=S=2048 hd512 causal K=V": _dsv4(batch=1, q_len=2048, kv_len=2048, causal=True),
    "prefill B4 H32 T=S=4096 hd128 causal": Problem(batch=4, q_len=4096, kv_len=4096, heads_q=32, heads_kv=32,
                                                    head_dim=128, causal=True),
}
GRID_DECODE = {
    f"grid decode hd{d} T{t} S{s} B2 H8": Problem(batch=2, q_len=t, kv_len=s, heads_q=8, heads_kv=8, head_dim=d,
                                                  causal=True)
    for d in (64, 128, 256, 512) for t, s in ((1, 512), (4, 640))
}


def measure_ceilings() -> tuple[float, float]:
    """(copy bytes/s counting read + write, bf16 matmul FLOP/s), measured now."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    t_copy = do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median") * 1e-3
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    t_mm = do_bench(lambda: a @ b, warmup=50, rep=300, return_mode="median") * 1e-3
    return 2 * n / t_copy, 2 * 8192**3 / t_mm


def inputs(p: Problem):
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*s):
        return torch.randn(*s, generator=g, device="cuda", dtype=p.dtype)
    q = randn(p.batch, p.q_len, p.heads_q, p.head_dim)
    k = randn(p.batch, p.kv_len, p.heads_kv, p.head_dim)
    v = k if p.shared_kv else randn(p.batch, p.kv_len, p.heads_kv, p.head_dim_v)
    return q, k, v


def _ours(p: Problem, q, k, v, implementation=None):
    from fmha import dispatch

    out = torch.empty(p.batch, p.q_len, p.heads_q, p.head_dim_v, dtype=q.dtype, device="cuda")
    return lambda: dispatch.attention(q, k, v, causal=p.causal, out=out, implementation=implementation)


def _sdpa(backend_name: str, p: Problem, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    backend = getattr(SDPBackend, backend_name)
    qh = q.transpose(1, 2).contiguous()
    kh = k.repeat_interleave(p.group, dim=2).transpose(1, 2).contiguous()
    vh = kh if p.shared_kv else v.repeat_interleave(p.group, dim=2).transpose(1, 2).contiguous()
    mask = None
    if p.causal and p.q_len != p.kv_len:
        mask = causal_lower_right(p.q_len, p.kv_len)
        if backend_name == "CUDNN_ATTENTION":
            mask = mask._materialize(device="cuda")
    is_causal = p.causal and p.q_len == p.kv_len

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=is_causal)
    return run


def _flex(p: Problem, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    offset = p.kv_len - p.q_len
    block_mask = None
    if p.causal:
        block_mask = create_block_mask(lambda b, h, r, c: c <= r + offset, None, None, p.q_len, p.kv_len,
                                       device="cuda")
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: compiled(qh, kh, vh, block_mask=block_mask, enable_gqa=True)


CONTENDERS = {
    "fmha": _ours,  # fmha.attention: the Gluon kernel where it applies (bf16 hd512)
    "fmha, Triton only": lambda *a: _ours(*a, implementation="triton"),
    "sdpa flash": lambda *a: _sdpa("FLASH_ATTENTION", *a),
    "sdpa efficient": lambda *a: _sdpa("EFFICIENT_ATTENTION", *a),
    "sdpa cudnn": lambda *a: _sdpa("CUDNN_ATTENTION", *a),
    "flex": _flex,
}


def time_us(fn) -> float:
    fn()
    torch.cuda.synchronize()
    try:
        return do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
    except Exception:  # some kernels cannot be captured; plain events then
        return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


PEER = "FlashMLA"  # the best other kernel, where a bench has it: its column gets fmha's ratio to it


def _ratio(ours: str, other) -> str:
    try:
        return f"{float(ours) / float(other):.2f}x"
    except ValueError:  # a cell with no time
        return "—"


def ours(contenders) -> str:
    """The contender the ratio columns are about: fmha.attention, else the first of fmha's kernels
    run (`--only "fmha, CUDA"`)."""
    return "fmha" if "fmha" in contenders else next((c for c in contenders if c.startswith("fmha")), "fmha")


def _rows(shapes: dict, contenders: dict, make_inputs, floor_us, table: Table, clock_table: Table | None = None) -> None:
    """Time every contender on every shape into `table` (a contender that fails gets its error);
    with `clock_table`, the SM clock and power while each was timed into it."""
    from fmha.bench import clocks

    mine = ours(contenders)
    device = clocks.device_id(torch.cuda.current_device()) if clock_table is not None else ""
    for shape_name, problem in shapes.items():
        floor = floor_us(problem)
        inputs = make_inputs(problem)
        cells, readings = {}, {}
        for name, make in contenders.items():
            sampler = clocks.Sampler(device) if clock_table is not None else None
            try:
                run = make(problem, *inputs)
                with sampler or contextlib.nullcontext():
                    cells[name] = f"{time_us(run):.1f}"
            except Exception as e:  # no kernel for this shape, out of resources, ...
                cells[name] = f"— ({type(e).__name__}: {str(e).splitlines()[0][:60]})" if str(e) else "—"
            if sampler:
                readings[name] = str(sampler.reading or "—")
            torch.cuda.empty_cache()
        if clock_table is not None:
            clock_table.add(shape_name, *readings.values())
        ratios = [_ratio(cells.get(mine, "—"), floor)]
        if PEER in contenders:
            ratios.append(_ratio(cells.get(mine, "—"), cells[PEER]))
        table.add(shape_name, f"{floor:.1f}", *cells.values(), *ratios)
        print(f"{shape_name}: {', '.join(f'{c} {v}' for c, v in cells.items())}", file=sys.stderr, flush=True)
        del inputs
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the four speed shapes only")
    parser.add_argument("--sparse", action="store_true",
                        help="DeepSeek-V4's sparse decode over FP8 caches instead (fmha.bench.sparse)")
    parser.add_argument("--only", action="append", default=[], help="contenders to run (default: all)")
    parser.add_argument("--clocks", action="store_true",
                        help="also the SM clock and power while each contender is timed (nvidia-smi; fmha.bench.clocks)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fmha.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.clocks:
        from fmha.bench import clocks

        reason = clocks.available()
        if reason:
            parser.error(f"--clocks: {reason}")
    bandwidth, rate = measure_ceilings()
    print(f"# fmha.bench, {datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    print(f"# ceilings measured now: copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s\n")
    if args.sparse:
        from fmha.bench import sparse as sparse_bench

        shapes, every, make_inputs = sparse_bench.SHAPES, sparse_bench.CONTENDERS, lambda p: (sparse_bench.inputs(p),)
        work = sparse_bench.flops, sparse_bench.bytes_moved
    else:
        shapes, every, make_inputs = {**SPEED_SHAPES, **({} if args.quick else GRID_DECODE)}, CONTENDERS, inputs
        work = flops, bytes_moved
    contenders = {k: v for k, v in every.items() if not args.only or k in args.only}
    mine = ours(contenders)
    table = Table(["shape", "floor µs", *(f"{c} µs" for c in contenders), f"{mine} / floor",
                   *([f"{mine} / {PEER}"] if PEER in contenders else [])])
    clock_table = Table(["shape", *contenders]) if args.clocks else None
    _rows(shapes, contenders, make_inputs,
          lambda p: max(work[0](p) / rate, work[1](p) / bandwidth) * 1e6, table, clock_table)
    print(table.markdown())
    if clock_table is not None:
        print("\n# while each was timed (nvidia-smi every 50 ms): median SM clock, board power, the share of samples"
              " with a power or thermal limit holding the clock down")
        print(clock_table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark fmha's dense attention against the SDPA backends, FlexAttention and the peers
installed (FlashAttention 2 or 3, FlashMLA's dense decode), and your own kernel beside them.

    python -m fmha.bench [--quick] [--sparse] [--only CONTENDER ...] [--clocks] [--fmha-kernel module:attr ...]

Times each kernel on the speed shapes of docs/contract.md and the grid's decode shapes (median of
CUDA-graph replays, triton.testing.do_bench_cudagraph) and prints it next to the roofline
floor max(FLOPs / matmul rate, bytes / copy bandwidth), with both ceilings measured in the
same run. Alternatives get their inputs in their own layout (heads first; KV heads repeated
where the backend has no GQA) outside the timed region, so only their kernels are timed. A
kernel of yours (`--fmha-kernel`, named as in pytest) is called as the contract calls it, on
the shapes its capabilities declare, and gets the ratio columns: to the floor and to fmha.
Without a GPU, `--quick` times one small decode shape on the CPU (wall clock, no floor): a smoke
run that the plumbing works, not a performance figure.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import importlib
import importlib.util
import statistics
import sys
import time

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


# The CPU smoke run's one shape: a decode small enough for the Triton interpreter.
CPU_SMOKE = {"grid decode hd64 T1 S128 B2 H8": Problem(batch=2, q_len=1, kv_len=128, heads_q=8, heads_kv=8, head_dim=64,
                                                       causal=True)}


def inputs(p: Problem, device: str = "cuda"):
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*s):
        return torch.randn(*s, generator=g, device=device, dtype=p.dtype)
    q = randn(p.batch, p.q_len, p.heads_q, p.head_dim)
    k = randn(p.batch, p.kv_len, p.heads_kv, p.head_dim)
    v = k if p.shared_kv else randn(p.batch, p.kv_len, p.heads_kv, p.head_dim_v)
    return q, k, v


def _ours(p: Problem, q, k, v, implementation=None):
    from fmha import dispatch

    out = torch.empty(p.batch, p.q_len, p.heads_q, p.head_dim_v, dtype=q.dtype, device=q.device)
    return lambda: dispatch.attention(q, k, v, causal=p.causal, out=out, implementation=implementation)


def plugged(kernel):
    """A contender for a kernel entry (yours, or any registered one): called as the contract calls
    it, with out= where it declares it; a shape its capabilities do not declare is its cell's reason."""
    from fmha.contract import NotSupportedError

    def make(p: Problem, q, k, v):
        reasons = kernel.not_supported_reasons(p, q.device.type)
        if reasons:
            raise NotSupportedError("; ".join(reasons))
        if "out" not in kernel.capabilities_on(q.device.type).features:
            return lambda: kernel(q, k, v, causal=p.causal)
        out = torch.empty(p.batch, p.q_len, p.heads_q, p.head_dim_v, dtype=q.dtype, device=q.device)
        return lambda: kernel(q, k, v, causal=p.causal, out=out)
    return make


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


def _flash_attention(module: str, p: Problem, q, k, v):
    """FlashAttention's `flash_attn_func` (FA3's `flash_attn_interface` on Hopper, FA2's
    `flash_attn`): the contract's (B, T, H, D) layout, GQA and bottom-right causal its own."""
    flash_attn_func = importlib.import_module(module).flash_attn_func
    return lambda: flash_attn_func(q, k, v, causal=p.causal)


def _flashmla_dense(module: str, p: Problem, q, k, v):
    """FlashMLA's dense MLA decode (SM90, `flash_mla_with_kvcache` without indices): the keys
    copied into a cache of 64-token pages (its one page size), V read from K's cache (K = V)."""
    from fmha.contract import NotSupportedError

    flash_mla = importlib.import_module(module)
    if not p.shared_kv:
        raise NotSupportedError("FlashMLA's dense decode reads V from K's cache: K = V only")
    page, pages = 64, -(-p.kv_len // 64)
    cache = k.new_zeros(p.batch, pages * page, p.heads_kv, p.head_dim)
    cache[:, :p.kv_len] = k
    cache = cache.view(p.batch * pages, page, p.heads_kv, p.head_dim)
    table = torch.arange(p.batch * pages, dtype=torch.int32, device=q.device).view(p.batch, pages)
    lengths = torch.full((p.batch,), p.kv_len, dtype=torch.int32, device=q.device)
    schedule, _ = flash_mla.get_mla_metadata()
    return lambda: flash_mla.flash_mla_with_kvcache(q, cache, table, lengths, p.head_dim_v, schedule, causal=p.causal)


CONTENDERS = {
    "fmha": _ours,  # fmha.attention: the Gluon kernel where it applies (bf16 hd512)
    "fmha, Triton only": lambda *a: _ours(*a, implementation="triton"),
    "sdpa flash": lambda *a: _sdpa("FLASH_ATTENTION", *a),
    "sdpa efficient": lambda *a: _sdpa("EFFICIENT_ATTENTION", *a),
    "sdpa cudnn": lambda *a: _sdpa("CUDNN_ATTENTION", *a),
    "flex": _flex,
}
# Peers timed where their package is installed (a column of "not installed" says nothing):
# name -> (package, contender given the package's name).
INSTALLED_PEERS = {
    "FlashAttention 3": ("flash_attn_interface", _flash_attention),
    "FlashAttention 2": ("flash_attn", _flash_attention),
    "FlashMLA dense": ("flash_mla", _flashmla_dense),
}


def installed_peers() -> dict:
    """The contenders of INSTALLED_PEERS whose package imports here."""
    return {name: functools.partial(make, module) for name, (module, make) in INSTALLED_PEERS.items()
            if importlib.util.find_spec(module)}


def time_us(fn) -> float:
    fn()
    if not torch.cuda.is_initialized():  # the CPU smoke run: wall clock, the median of a few calls
        return 1e6 * statistics.median(_wall_seconds(fn) for _ in range(5))
    torch.cuda.synchronize()
    try:
        return do_bench_cudagraph(fn, rep=200, return_mode="median") * 1e3
    except Exception:  # some kernels cannot be captured; plain events then
        return do_bench(fn, warmup=25, rep=200, return_mode="median") * 1e3


def _wall_seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# The best other kernels, where a bench has them: the first present gets fmha's ratio column.
PEERS = ("FlashMLA", "FlashMLA dense", "FlashAttention 3", "FlashAttention 2")


def _ratio(ours: str, other) -> str:
    try:
        return f"{float(ours) / float(other):.2f}x"
    except (TypeError, ValueError):  # a cell with no time, or no floor (the CPU smoke run)
        return "—"


def ours(contenders, yours=()) -> str:
    """The contender the ratio columns are about: the first kernel of yours (`--fmha-kernel`), else
    fmha.attention, else the first of fmha's kernels run (`--only "fmha, CUDA"`)."""
    if yours:
        return yours[0]
    return "fmha" if "fmha" in contenders else next((c for c in contenders if c.startswith("fmha")), "fmha")


def peer(contenders, yours=()) -> str | None:
    """The contender the second ratio column compares with: fmha for a kernel of yours, else the
    first of PEERS the bench has."""
    wanted = ("fmha",) if yours else PEERS
    return next((name for name in wanted if name in contenders), None)


def _rows(shapes: dict, contenders: dict, make_inputs, floor_us, table: Table, clock_table: Table | None = None,
          yours=()) -> None:
    """Time every contender on every shape into `table` (a contender that fails gets its error);
    with `clock_table`, the SM clock and power while each was timed into it."""
    from fmha.bench import clocks

    mine, other = ours(contenders, yours), peer(contenders, yours)
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
            _free_memory()
        if clock_table is not None:
            clock_table.add(shape_name, *readings.values())
        ratios = [_ratio(cells.get(mine, "—"), floor)]
        if other is not None:
            ratios.append(_ratio(cells.get(mine, "—"), cells[other]))
        table.add(shape_name, "—" if floor is None else f"{floor:.1f}", *cells.values(), *ratios)
        print(f"{shape_name}: {', '.join(f'{c} {v}' for c, v in cells.items())}", file=sys.stderr, flush=True)
        del inputs
        _free_memory()


def _free_memory() -> None:
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    from fmha.regressions.selection import command_line, parse, resolve_kernel

    parser = command_line(__doc__, default_kernels="none: fmha's kernels and the peers alone")
    parser.add_argument("--quick", action="store_true", help="the four speed shapes only")
    parser.add_argument("--sparse", action="store_true",
                        help="DeepSeek-V4's sparse decode over FP8 caches instead (fmha.bench.sparse)")
    parser.add_argument("--only", action="append", default=[], help="contenders to run (default: all)")
    parser.add_argument("--clocks", action="store_true",
                        help="also the SM clock and power while each contender is timed (nvidia-smi; fmha.bench.clocks)")
    args = parse(parser, argv)
    try:  # yours: timed beside the others on the shapes it declares
        yours = {kernel.name: plugged(kernel) for kernel in map(resolve_kernel, args.fmha_kernel)}
    except ValueError as e:
        parser.error(str(e))
    if args.fmha_device == "cpu":
        if args.quick and not args.sparse and not args.clocks:
            return _cpu_smoke(yours, args.only)
        parser.error("times on a CUDA GPU (on the CPU, --quick times one small decode shape: a smoke run)")
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
        shapes, make_inputs = {**SPEED_SHAPES, **({} if args.quick else GRID_DECODE)}, inputs
        every = {**CONTENDERS, **installed_peers()}
        work = flops, bytes_moved
    contenders = {**yours, **{k: v for k, v in every.items() if not args.only or k in args.only}}
    table = _table(contenders, list(yours))
    clock_table = Table(["shape", *contenders]) if args.clocks else None
    _rows(shapes, contenders, make_inputs,
          lambda p: max(work[0](p) / rate, work[1](p) / bandwidth) * 1e6, table, clock_table, list(yours))
    print(table.markdown())
    if clock_table is not None:
        print("\n# while each was timed (nvidia-smi every 50 ms): median SM clock, board power, the share of samples"
              " with a power or thermal limit holding the clock down")
        print(clock_table.markdown())
    return 0


def _table(contenders: dict, yours: list) -> Table:
    mine, other = ours(contenders, yours), peer(contenders, yours)
    return Table(["shape", "floor µs", *(f"{c} µs" for c in contenders), f"{mine} / floor",
                  *([f"{mine} / {other}"] if other else [])])


def _cpu_smoke(yours: dict, only: list) -> int:
    """One small decode shape on the CPU, wall clock: fmha through the Triton interpreter, SDPA's
    math backend and your kernels. It shows the command works; CPU times say nothing of a GPU's."""
    everyone = {**yours, "fmha": _ours, "sdpa math": lambda *a: _sdpa("MATH", *a)}
    contenders = {k: v for k, v in everyone.items() if k in yours or not only or k in only}
    print(f"# fmha.bench --quick on the CPU, {datetime.date.today()}, torch {torch.__version__}: a smoke run, "
          "wall clock (no floor: no ceilings measured)\n")
    table = _table(contenders, list(yours))
    _rows(CPU_SMOKE, contenders, lambda p: inputs(p, "cpu"), lambda p: None, table, yours=list(yours))
    print(table.markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark fmha's Triton attention against the SDPA backends and FlexAttention (GPU only).

    python -m fmha.bench [--quick] [--markdown]

Times each kernel on the DESIGN.md speed shapes and the grid's decode shapes (median of
CUDA-graph replays, triton.testing.do_bench_cudagraph) and prints it next to the roofline
floor max(FLOPs / matmul rate, bytes / copy bandwidth), with both ceilings measured in the
same run. Alternatives get their inputs in their own layout (heads first; KV heads repeated
where the backend has no GQA) outside the timed region, so only their kernels are timed.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph


@dataclass(frozen=True)
class Shape:
    name: str
    B: int
    Hq: int
    Hkv: int
    T: int
    S: int
    D: int
    causal: bool
    shared_kv: bool

    def visible_pairs(self) -> int:
        """(query, key) pairs that are visible: the FLOPs scale with these."""
        if not self.causal:
            return self.T * self.S
        return sum(min(self.S, self.S - self.T + i + 1) for i in range(self.T))

    def flops(self) -> float:
        return 2.0 * self.B * self.Hq * self.visible_pairs() * (self.D + self.D)

    def bytes(self) -> float:
        kv = self.B * self.S * self.Hkv * self.D * (1 if self.shared_kv else 2)
        q_and_o = 2 * self.B * self.T * self.Hq * self.D
        return 2.0 * (kv + q_and_o) + 4.0 * self.B * self.Hq * self.T  # bf16 + fp32 lse


SPEED_SHAPES = [
    Shape("DSV4 decode B64 Hq128 T1 S640 hd512 K=V", 64, 128, 1, 1, 640, 512, False, True),
    Shape("DSV4 decode MTP B64 Hq128 T4 S640 hd512 K=V", 64, 128, 1, 4, 640, 512, True, True),
    Shape("prefill B1 Hq128 Hkv1 T=S=2048 hd512 causal K=V", 1, 128, 1, 2048, 2048, 512, True, True),
    Shape("prefill B4 H32 T=S=4096 hd128 causal", 4, 32, 32, 4096, 4096, 128, True, False),
]
GRID_DECODE = [
    Shape(f"grid decode hd{d} T{t} S{s} B2 H8", 2, 8, 8, t, s, d, True, False)
    for d in (64, 128, 256, 512) for t, s in ((1, 512), (4, 640))
]


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


def _inputs(shape: Shape):
    g = torch.Generator(device="cuda").manual_seed(0)
    def randn(*s):
        return torch.randn(*s, generator=g, device="cuda", dtype=torch.bfloat16)
    q = randn(shape.B, shape.T, shape.Hq, shape.D)
    k = randn(shape.B, shape.S, shape.Hkv, shape.D)
    v = k if shape.shared_kv else randn(shape.B, shape.S, shape.Hkv, shape.D)
    return q, k, v


def _ours(shape, q, k, v, gluon=None):
    from fmha.triton_attention import _attention

    out = torch.empty(shape.B, shape.T, shape.Hq, shape.D, dtype=q.dtype, device="cuda")
    return lambda: _attention(q, k, v, causal=shape.causal, out=out, gluon=gluon)


def _sdpa(backend_name: str, shape, q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right

    backend = getattr(SDPBackend, backend_name)
    group = shape.Hq // shape.Hkv
    qh = q.transpose(1, 2).contiguous()
    kh = k.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
    vh = kh if shape.shared_kv else v.repeat_interleave(group, dim=2).transpose(1, 2).contiguous()
    mask = None
    if shape.causal and shape.T != shape.S:
        mask = causal_lower_right(shape.T, shape.S)
        if backend_name == "CUDNN_ATTENTION":
            mask = mask._materialize(device="cuda")
    is_causal = shape.causal and shape.T == shape.S

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, is_causal=is_causal)
    return run


def _flex(shape, q, k, v):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    offset = shape.S - shape.T
    block_mask = None
    if shape.causal:
        block_mask = create_block_mask(lambda b, h, r, c: c <= r + offset, None, None, shape.T, shape.S, device="cuda")
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))
    return lambda: compiled(qh, kh, vh, block_mask=block_mask, enable_gqa=True)


CONTENDERS = {
    "fmha triton": _ours,  # fmha.attention: the Gluon kernel where it applies (bf16 hd512)
    "fmha, Gluon off": lambda *a: _ours(*a, gluon=False),
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the four speed shapes only")
    parser.add_argument("--only", action="append", default=[], help="contenders to run (default: all)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("fmha.bench needs a CUDA GPU", file=sys.stderr)
        return 2
    bandwidth, rate = measure_ceilings()
    shapes = SPEED_SHAPES + ([] if args.quick else GRID_DECODE)
    contenders = {k: v for k, v in CONTENDERS.items() if not args.only or k in args.only}
    print(f"# fmha.bench, {datetime.date.today()}, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"triton {triton.__version__}")
    print(f"# ceilings measured now: copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s\n")
    print("| shape | floor µs | " + " | ".join(f"{c} µs" for c in contenders) + " | ours / floor |")
    print("|---|---|" + "---|" * len(contenders) + "---|")
    for shape in shapes:
        floor = max(shape.flops() / rate, shape.bytes() / bandwidth) * 1e6
        q, k, v = _inputs(shape)
        cells = {}
        for name, make in contenders.items():
            try:
                cells[name] = f"{time_us(make(shape, q, k, v)):.1f}"
            except Exception as e:  # no kernel for this shape, out of resources, ...
                cells[name] = f"— ({type(e).__name__}: {str(e).splitlines()[0][:60]})" if str(e) else "—"
            torch.cuda.empty_cache()
        ours = cells.get("fmha triton", "—")
        ratio = f"{float(ours) / floor:.2f}x" if ours.replace(".", "").isdigit() else "—"
        print(f"| {shape.name} | {floor:.1f} | " + " | ".join(cells.values()) + f" | {ratio} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

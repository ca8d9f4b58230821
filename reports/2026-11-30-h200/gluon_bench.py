"""Times the Gluon DSV4 decode prototypes in this folder against fmha's Triton kernel, with
cosine against float64, on a Hopper GPU:

    PYTHONPATH=$PWD python reports/2026-11-30-h200/gluon_bench.py

Prints one line per kernel and configuration (and writes $OUT/gluon.txt when OUT is set)."""
import importlib.util
import os

import torch

from fmha.bench import time_us
from fmha.triton_attention import attention

HERE = os.path.dirname(os.path.abspath(__file__))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    sync, ws, mla = _load("gluon_dsv4"), _load("gluon_ws"), _load("gluon_mla")
    candidates = [
        ("fmha triton", lambda q, k, o: attention(q, k, k, out=o)),
        ("gluon async QK^T, BN32 3 stages", lambda q, k, o: sync.dsv4(q, k, o, 32, 3)),
        ("gluon warp-specialized, BN32 3 stages", lambda q, k, o: ws.dsv4_ws(q, k, o, 32, 3)),
        ("gluon FlashMLA-style, BN32 4 stages", lambda q, k, o: mla.dsv4_mla(q, k, o, 32, 4)),
        ("gluon FlashMLA-style, BN64 2 stages", lambda q, k, o: mla.dsv4_mla(q, k, o, 64, 2)),
    ]
    lines = []
    for B, S in ((64, 640), (64, 600), (3, 1000)):
        g = torch.Generator(device="cuda").manual_seed(S)
        q = torch.randn(B, 1, 128, 512, generator=g, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, S, 1, 512, generator=g, device="cuda", dtype=torch.bfloat16)
        kd = k.double().expand(-1, -1, 128, -1)
        scores = torch.einsum("bthd,bshd->bhts", q.double(), kd) * 512**-0.5
        ref = torch.einsum("bhts,bshd->bthd", scores.softmax(-1), kd)
        for name, fn in candidates:
            out = torch.full_like(q, float("nan"))
            fn(q, k, out)
            torch.cuda.synchronize()
            cos = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.flatten(), dim=0).item()
            us = time_us(lambda fn=fn, q=q, k=k, out=out: fn(q, k, out))
            lines.append(f"B{B} S{S} {name:40s} {us:8.1f} us  cos {cos:.8f}  nan {bool(out.isnan().any())}")
            print(lines[-1], flush=True)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "gluon.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

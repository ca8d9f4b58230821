"""Where a worker's GPU memory outside PyTorch's allocator goes (session 10's nightly profile
ran out of it): device memory in use minus the allocator's reserve, after each kernel's
first run in one process, in the order given."""
import torch
import torch.nn.functional as F

import fmha


def outside_gb() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / 2**30


torch.ones(1, device="cuda")
print(f"context: {outside_gb():.2f} GB outside the allocator", flush=True)


def run(name, fn):
    try:
        fn()
        torch.cuda.synchronize()
        print(f"after {name}: {outside_gb():.2f} GB", flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"{name}: {type(e).__name__}: {str(e)[:120]}", flush=True)


for dtype in (torch.bfloat16, torch.float32):
    for d in (64, 128, 256, 512):
        q = torch.randn(2, 64, 8, d, device="cuda", dtype=dtype)
        run(f"fmha {dtype} hd{d}", lambda: fmha.attention(q, q, q, causal=True))
for dtype in (torch.bfloat16, torch.float32):
    q = torch.randn(2, 8, 64, 256, device="cuda", dtype=dtype)
    for backend in ("EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa():
            with sdpa_kernel(getattr(SDPBackend, backend)):
                F.scaled_dot_product_attention(q, q, q)
        run(f"sdpa {backend} {dtype}", sdpa)

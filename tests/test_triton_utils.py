"""fmha.kernels.triton_utils.round_for_bf16: what interpreted kernels store for bf16 outputs."""

import torch
import triton
import triton.language as tl

from fmha.kernels.triton_utils import round_for_bf16


@triton.jit
def _store_rounded(X, Y, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(Y + offs, round_for_bf16(tl.load(X + offs)))


def test_round_for_bf16_matches_torch_bitwise_subnormals_included(device):
    """Round to nearest even, ties, signed zeros and subnormals (where the Triton 3.6
    interpreter's own cast is off by up to 10x) as torch rounds them, interpreted or
    compiled."""
    g = torch.Generator().manual_seed(0)
    normal = torch.randn(1024, generator=g) * torch.logspace(-30, 30, 1024)
    subnormal = torch.randn(512, generator=g) * 1e-39
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 0.0, -0.0, float("inf"), -float("inf")])
    x = torch.cat([normal, subnormal, ties, torch.zeros(2048 - 1024 - 512 - ties.numel())])
    x = x.to(device)
    y = torch.empty(x.numel(), dtype=torch.bfloat16, device=device)
    _store_rounded[(1,)](x, y, x.numel())
    expected = x.cpu().to(torch.bfloat16).to(device)
    differ = y.view(torch.int16) != expected.view(torch.int16)
    assert not differ.any(), f"{int(differ.sum())} differ; first: {x[differ][0].item()!r} -> {y[differ][0].item()!r}"


def test_a_process_that_compiles_for_the_gpu_refuses_cpu_tensors_saying_why(monkeypatch):
    """On a CUDA machine fmha compiles; `--fmha-device cpu` there must skip its Triton kernels
    and merge with the reason, not fail in Triton's launcher ("cpu tensor?")."""
    from fmha.registry import KERNELS, MERGES
    from fmha.kernels.triton_utils import triton_availability

    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "TRITON_INTERPRET=1" in triton_availability("cpu")
    assert triton_availability("cuda") is None
    assert MERGES["fmha"].not_supported_reasons("cpu") == [triton_availability("cpu")]
    assert KERNELS["fmha"].availability("cpu") == triton_availability("cpu")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert triton_availability("cpu") is None and not MERGES["fmha"].not_supported_reasons("cpu")

"""K and V views that a TMA descriptor cannot describe as they are (a base off 16-byte
alignment, a broadcast head dim of stride 0) still give fmha.attention's answer: the host copies
them first. Checked bitwise against the same values laid out contiguously."""

import torch

from fmha import attention


def _inputs(device, Hkv=2, S=40, D=64):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, D, generator=g).to(device, torch.bfloat16)
    k = torch.randn(2, S, Hkv, D, generator=g).to(device, torch.bfloat16)
    return q, k


def test_a_key_view_off_16_byte_alignment_gives_the_contiguous_answer(device):
    q, k = _inputs(device)
    buffer = torch.empty(k.numel() + 1, dtype=k.dtype, device=device)
    shifted = buffer[1:].view(k.shape)  # base 2 bytes past an aligned allocation
    shifted.copy_(k)
    assert shifted.data_ptr() % 16 != 0
    o_ref, lse_ref = attention(q, k, k.clone(), causal=True)
    o, lse = attention(q, shifted, shifted.clone(), causal=True)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)


def test_a_broadcast_kv_head_gives_the_materialised_answer(device):
    q, k = _inputs(device, Hkv=1)
    broadcast = k.expand(-1, -1, 2, -1)  # two KV heads, one in memory: stride 0
    assert broadcast.stride(2) == 0
    o_ref, lse_ref = attention(q, broadcast.contiguous(), broadcast.contiguous())
    o, lse = attention(q, broadcast, broadcast)
    assert torch.equal(o, o_ref) and torch.equal(lse, lse_ref)

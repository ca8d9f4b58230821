"""Quantized KV caches, encoded and decoded exactly in float64 (contract v2).

Plain definitions, not kernels: the formats and layouts are the contract's
(fmha.contract.cache_layouts: each format is a table of the values its codes stand for);
decoding is a lookup and the reference quantizer picks the nearest value, ties to the even
code (round to nearest even: the code's last bit is the mantissa's). Nothing here shares
code with a kernel's dequantization.
"""

from __future__ import annotations

import torch

from fmha.contract.cache_layouts import LAYOUTS, UE8M0, CacheLayout, Element, pages_of

__all__ = ["LAYOUTS", "decode", "encode", "pow2_scale", "quantize", "dequantize", "pages_of"]


def decode(codes: torch.Tensor, element: Element) -> torch.Tensor:
    """float64 values of integer `codes` (any integer dtype, one code an element)."""
    return element.table.to(codes.device)[codes.long()]


def encode(x: torch.Tensor, element: Element) -> torch.Tensor:
    """The code of the nearest value to each element of `x` (int64), ties to the even code;
    magnitudes past the largest value saturate to it; -0.0 encodes as +0. Non-finite input is
    refused."""
    x = x.double()
    if not torch.isfinite(x).all():
        raise ValueError(f"encode: {element.name} of non-finite values ({int((~torch.isfinite(x)).sum())} of them)")
    # The positive codes 0 .. 2^(bits-1) - 1 hold ascending magnitudes (the NaN codes last).
    magnitudes = element.table.to(x.device)[:2 ** (element.bits - 1)]
    magnitudes = magnitudes[~torch.isnan(magnitudes)]
    size = x.abs().clamp(max=element.largest)
    above = torch.searchsorted(magnitudes, size).clamp(1, len(magnitudes) - 1)  # magnitudes[above - 1] <= size
    below = above - 1
    to_below, to_above = size - magnitudes[below], magnitudes[above] - size
    # The nearer neighbour; on a tie the even code (the code's last bit is the mantissa's).
    code = torch.where((to_below < to_above) | ((to_below == to_above) & (below % 2 == 0)), below, above)
    sign = (x < 0) & (code != 0)
    return code | (sign.long() << (element.bits - 1))


def pow2_scale(amax: torch.Tensor, element: Element) -> torch.Tensor:
    """ue8m0 code of 2^ceil(log2(amax / largest)), FlashMLA's tile scale (amax floored at
    1e-4 * largest, as theirs is: an all-zero tile still gets a finite scale)."""
    ratio = (amax.double() / element.largest).clamp_min(1e-4)
    return (torch.log2(ratio).ceil() + 127).long()


def _pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(..., n) codes -> (..., n * bits / 8) bytes, low bits first."""
    if bits == 8:
        return codes.to(torch.uint8)
    low, high = codes[..., 0::2], codes[..., 1::2]
    return (low | (high << 4)).to(torch.uint8)


def _unpack(data: torch.Tensor, bits: int) -> torch.Tensor:
    if bits == 8:
        return data.long()
    data = data.long()
    return torch.stack([data & 0xF, data >> 4], dim=-1).flatten(-2)


def quantize(cache_values: torch.Tensor, layout: CacheLayout) -> torch.Tensor:
    """(num_blocks, block_size, 1, head_dim) keys (bf16, or anything bf16 holds) -> the
    layout's bytes, uint8 (num_blocks, page_bytes). Padding bytes are 0."""
    num_blocks, block_size, heads, head_dim = cache_values.shape
    if heads != 1 or head_dim != layout.head_dim:
        raise ValueError(f"quantize: {layout.name} holds (num_blocks, block_size, 1, {layout.head_dim}), "
                         f"got {tuple(cache_values.shape)}")
    x = cache_values[:, :, 0].double()
    tiles = x[..., :layout.quantized_dims].unflatten(-1, (layout.tiles, layout.tile))
    scale_codes = pow2_scale(tiles.abs().amax(dim=-1), layout.element)  # (blocks, tokens, tiles)
    scaled = tiles / decode(scale_codes, UE8M0)[..., None]
    codes = encode(scaled, layout.element).flatten(-2)
    rope = cache_values[:, :, 0, layout.quantized_dims:].to(torch.bfloat16).contiguous()
    data = torch.cat([_pack(codes, layout.element.bits), rope.view(torch.uint8)], dim=-1)
    scales = torch.zeros(num_blocks, block_size, layout.scale_bytes, dtype=torch.uint8, device=x.device)
    scales[..., :layout.tiles] = scale_codes.to(torch.uint8)
    page = torch.zeros(num_blocks, layout.page_bytes(block_size), dtype=torch.uint8, device=x.device)
    page[:, :block_size * layout.data_bytes] = data.flatten(1)
    page[:, block_size * layout.data_bytes:block_size * layout.token_bytes] = scales.flatten(1)
    return page


def dequantize(pages: torch.Tensor, layout: CacheLayout, block_size: int) -> torch.Tensor:
    """The layout's bytes, uint8 (num_blocks, page_bytes) -> float64 (num_blocks, block_size,
    1, head_dim): each element's value times its tile's scale, exactly."""
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] < block_size * layout.token_bytes:
        raise ValueError(f"dequantize: {layout.name} pages of block_size {block_size} are uint8 (num_blocks, "
                         f">= {block_size * layout.token_bytes}), got {pages.dtype} {tuple(pages.shape)}")
    num_blocks = pages.shape[0]
    data = pages[:, :block_size * layout.data_bytes].reshape(num_blocks, block_size, layout.data_bytes)
    scale_bytes = pages[:, block_size * layout.data_bytes:block_size * layout.token_bytes]
    scale_codes = scale_bytes.reshape(num_blocks, block_size, layout.scale_bytes)[..., :layout.tiles]
    packed = layout.quantized_dims * layout.element.bits // 8
    values = decode(_unpack(data[..., :packed], layout.element.bits), layout.element)
    scales = decode(scale_codes, UE8M0).repeat_interleave(layout.tile, dim=-1)
    rope = data[..., packed:].contiguous().view(torch.bfloat16).double()
    return torch.cat([values * scales, rope], dim=-1)[:, :, None]

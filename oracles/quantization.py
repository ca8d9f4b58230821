"""Quantized KV caches, decoded exactly in float64 (contract v2).

Plain definitions, not kernels: every format is a table of the values its codes stand for,
decoding is a lookup and the reference quantizer picks the nearest value, ties to the even
code (round to nearest even: the code's last bit is the mantissa's). Nothing here shares
code with a kernel's dequantization.

Formats: FP8 e4m3fn (bias 7, no infinities, 0x7F/0xFF NaN, largest 448), FP4 e2m1 (OCP MX:
bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6), ue8m0 scales (2^(code - 127), 0xFF NaN).

Cache layouts (`CacheLayout`), one KV head of head dim 512 with K = V, as DeepSeek-V4 decode
reads it: the first 448 dims quantized in tiles, each tile with one power-of-two scale
2^ceil(log2(amax / largest value)), the last 64 (rope) dims kept in bf16. Per page of
`block_size` tokens: every token's quantized dims then its rope dims, then every token's
scales, the page padded to a multiple of 576 bytes.

- `DSV4_FP8`: FlashMLA's MODEL1_FP8Sparse (tests/quant.py there): e4m3 in 7 tiles of 64,
  7 scale bytes and one pad byte a token; 584 bytes a token.
- `DSV4_FP4`: fmha's own FP4 layout for the second cache (no public reference layout):
  e2m1 packed two a byte, element 2i in the low nibble (OCP, torch.float4_e2m1fn_x2), in
  14 tiles of 32 (OCP MX block size), 14 scale bytes and two pad bytes a token; 368 bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

import torch


def _minifloat_values(exponent_bits: int, mantissa_bits: int, bias: int) -> list[float]:
    """Value of every code of a sign-exponent-mantissa minifloat, in code order, before NaNs."""
    values = []
    for code in range(2 ** (1 + exponent_bits + mantissa_bits)):
        sign = -1.0 if code >> (exponent_bits + mantissa_bits) else 1.0
        exponent = (code >> mantissa_bits) & (2**exponent_bits - 1)
        mantissa = code & (2**mantissa_bits - 1)
        if exponent == 0:  # subnormal
            values.append(sign * mantissa / 2**mantissa_bits * 2.0 ** (1 - bias))
        else:
            values.append(sign * (1 + mantissa / 2**mantissa_bits) * 2.0 ** (exponent - bias))
    return values


@dataclass(frozen=True)
class Element:
    """A quantized element format: its name, bits and the value of every code."""

    name: str
    bits: int
    values: tuple[float, ...]  # by code; NaN where the code is not a number

    @property
    def largest(self) -> float:
        return max(v for v in self.values if not math.isnan(v))

    @property
    def table(self) -> torch.Tensor:
        return _table(self)


E4M3 = Element("e4m3fn", 8, tuple(float("nan") if code & 0x7F == 0x7F else v
                                  for code, v in enumerate(_minifloat_values(4, 3, 7))))
E2M1 = Element("e2m1", 4, tuple(_minifloat_values(2, 1, 1)))
UE8M0 = Element("ue8m0", 8, tuple(float("nan") if code == 0xFF else 2.0 ** (code - 127) for code in range(256)))


@cache
def _table(element: Element) -> torch.Tensor:
    return torch.tensor(element.values, dtype=torch.float64)


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


@dataclass(frozen=True)
class CacheLayout:
    """A quantized K = V cache of head dim `quantized_dims + rope_dims`, one KV head."""

    name: str
    element: Element
    tile: int  # dims per scale
    quantized_dims: int = 448
    rope_dims: int = 64
    scale_bytes: int = 8  # per token, the scales then padding
    page_alignment: int = 576  # a page's bytes are padded to a multiple of this

    @property
    def head_dim(self) -> int:
        return self.quantized_dims + self.rope_dims

    @property
    def tiles(self) -> int:
        return self.quantized_dims // self.tile

    @property
    def data_bytes(self) -> int:
        """Per token: the quantized dims, then the bf16 rope dims."""
        return self.quantized_dims * self.element.bits // 8 + 2 * self.rope_dims

    @property
    def token_bytes(self) -> int:
        return self.data_bytes + self.scale_bytes

    def page_bytes(self, block_size: int) -> int:
        return -(-block_size * self.token_bytes // self.page_alignment) * self.page_alignment


DSV4_FP8 = CacheLayout("dsv4-fp8", E4M3, tile=64, scale_bytes=8)
DSV4_FP4 = CacheLayout("dsv4-fp4", E2M1, tile=32, scale_bytes=16)
LAYOUTS = {layout.name: layout for layout in (DSV4_FP8, DSV4_FP4)}


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


def pages_of(cache: torch.Tensor) -> torch.Tensor:
    """A call's byte view of a quantized cache, (num_blocks, block_size, 1, token_bytes) over
    padded pages, as one row of block_size * token_bytes bytes per page (`dequantize`'s input)."""
    num_blocks, block_size, _, token_bytes = cache.shape
    return cache.as_strided((num_blocks, block_size * token_bytes), (cache.stride(0), 1))


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

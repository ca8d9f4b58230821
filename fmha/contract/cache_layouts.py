"""Quantized K = V cache layouts (contract v2, docs/contract.md): the element formats, where
each byte of a page goes, and the byte view of a page.

Formats: FP8 e4m3fn (bias 7, no infinities, 0x7F/0xFF NaN, largest 448), FP4 e2m1 (OCP MX:
bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6), ue8m0 scales (2^(code - 127), 0xFF NaN). Each
format is the table of the values its codes stand for.

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

fmha.oracles.quantization encodes and decodes these exactly in float64.
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


def pages_of(cache: torch.Tensor) -> torch.Tensor:
    """A call's byte view of a quantized cache, (num_blocks, block_size, 1, token_bytes) over
    padded pages, as one row of block_size * token_bytes bytes per page (`dequantize`'s input)."""
    num_blocks, block_size, _, token_bytes = cache.shape
    return cache.as_strided((num_blocks, block_size * token_bytes), (cache.stride(0), 1))

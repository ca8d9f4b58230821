"""The quantized-cache decoders against bytes decoded by hand, and the reference quantizer's
rounding on every tie (round to nearest even)."""

import math

import pytest
import torch

from fmha.oracles import quantization as qz
from fmha.contract.cache_layouts import DSV4_FP4, DSV4_FP8, E2M1, E4M3, UE8M0


@pytest.mark.parametrize("element, code, value", [
    (E4M3, 0x00, 0.0), (E4M3, 0x01, 2.0**-9), (E4M3, 0x07, 7 * 2.0**-9), (E4M3, 0x08, 2.0**-6),
    (E4M3, 0x38, 1.0), (E4M3, 0x3C, 1.5), (E4M3, 0x40, 2.0), (E4M3, 0x7E, 448.0), (E4M3, 0x80, -0.0),
    (E4M3, 0xB8, -1.0), (E4M3, 0xFE, -448.0),
    (E2M1, 0x0, 0.0), (E2M1, 0x1, 0.5), (E2M1, 0x2, 1.0), (E2M1, 0x3, 1.5), (E2M1, 0x4, 2.0), (E2M1, 0x5, 3.0),
    (E2M1, 0x6, 4.0), (E2M1, 0x7, 6.0), (E2M1, 0x9, -0.5), (E2M1, 0xF, -6.0),
    (UE8M0, 0, 2.0**-127), (UE8M0, 126, 0.5), (UE8M0, 127, 1.0), (UE8M0, 128, 2.0), (UE8M0, 254, 2.0**127),
])
def test_a_code_decodes_to_the_value_read_off_its_bits(element, code, value):
    assert qz.decode(torch.tensor([code]), element).item() == value


@pytest.mark.parametrize("element, codes", [(E4M3, (0x7F, 0xFF)), (UE8M0, (0xFF,))])
def test_the_nan_codes_decode_to_nan(element, codes):
    assert torch.isnan(qz.decode(torch.tensor(codes), element)).all()


@pytest.mark.parametrize("element", [E4M3, E2M1], ids=lambda e: e.name)
def test_every_value_encodes_to_its_own_code(element):
    codes = torch.tensor([c for c, v in enumerate(element.values) if not math.isnan(v) and not (v == 0 and c)])
    assert torch.equal(qz.encode(qz.decode(codes, element), element), codes)


def _ties(element):
    """(midpoint, the even code of its two neighbours) for every pair of adjacent values."""
    values = sorted({v for v in element.values if not math.isnan(v)})
    code = {v: c for c, v in reversed(list(enumerate(element.values)))}  # +0 before -0
    pairs = zip(values, values[1:])
    return [((a + b) / 2, code[a] if code[a] % 2 == 0 else code[b]) for a, b in pairs]


@pytest.mark.parametrize("element", [E4M3, E2M1], ids=lambda e: e.name)
def test_every_tie_rounds_to_the_even_code(element):
    midpoints, even = zip(*_ties(element))
    codes = qz.encode(torch.tensor(midpoints, dtype=torch.float64), element)
    wrong = [(m, c, e) for m, c, e in zip(midpoints, codes.tolist(), even) if c != e]
    assert not wrong, f"{element.name}: ties encoded to the odd code (midpoint, got, want): {wrong[:8]}"
    # Just off a tie, the nearest value wins whichever code is even.
    for midpoint, _ in _ties(element):
        below, above = qz.encode(torch.tensor([midpoint - 1e-9, midpoint + 1e-9], dtype=torch.float64), element)
        assert qz.decode(below, element) < midpoint < qz.decode(above, element), midpoint


def test_e2m1_ties_are_the_midpoints_not_seed_001s_thresholds_above_two():
    """Seed 001 rounded with thresholds 0.25, 0.75, 1.25, 1.75, 2.75, 3.75, 5.25; between 2 and 6
    the values are 2, 3, 4, 6, so the ties are 2.5, 3.5 and 5 (to 2, 4 and 4: the even codes)."""
    x = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 2.6, 3.6, 5.1], dtype=torch.float64)
    got = qz.decode(qz.encode(x, E2M1), E2M1).tolist()
    assert got == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 3.0, 4.0, 6.0]


def test_e4m3_encoding_matches_torchs_round_to_nearest_even_cast():
    """Values float32 holds exactly: torch casts float64 to e4m3 through float32, rounding twice (a
    value 1e-12 under a tie becomes the tie, then goes to even: -0.0107421875 + 1e-12 gives -6 x 2^-9
    where one rounding gives -5 x 2^-9), and one random draw in a run did land there."""
    ties = torch.tensor([m for m, _ in _ties(E4M3)], dtype=torch.float64)
    x = torch.cat([ties, torch.randn(4096, dtype=torch.float64) * 30, torch.randn(512, dtype=torch.float64) * 1e-2])
    x = x.float().double()
    torch_values = x.to(torch.float8_e4m3fn).double()
    ours = qz.decode(qz.encode(x, E4M3), E4M3)
    assert torch.equal(ours, torch_values), x[ours != torch_values][:8]


def test_encoding_saturates_past_the_largest_value_and_refuses_non_finite_input():
    x = torch.tensor([500.0, -1e6], dtype=torch.float64)
    assert qz.decode(qz.encode(x, E4M3), E4M3).tolist() == [448.0, -448.0]
    assert qz.decode(qz.encode(x, E2M1), E2M1).tolist() == [6.0, -6.0]
    with pytest.raises(ValueError, match="e4m3fn of non-finite values"):
        qz.encode(torch.tensor([1.0, float("nan")]), E4M3)


def test_the_layouts_sizes_are_dsv4s():
    assert DSV4_FP8.token_bytes == 584 and DSV4_FP8.data_bytes == 576 and DSV4_FP8.tiles == 7
    assert DSV4_FP8.page_bytes(1) == 1152 and DSV4_FP8.page_bytes(64) == 37440  # 65 x 576 >= 64 x 584
    assert DSV4_FP4.token_bytes == 224 + 128 + 16 and DSV4_FP4.tiles == 14


def _hand_page(layout, data: dict[int, int], scales: dict[int, int], rope: float, block_size=2, token=1):
    """A page of `block_size` tokens, all zero but `token`'s: `data` {byte: value} of its
    quantized dims, `scales` {tile: code}, and every rope dim = `rope`."""
    page = torch.zeros(1, layout.page_bytes(block_size), dtype=torch.uint8)
    start = token * layout.data_bytes
    for byte, value in data.items():
        page[0, start + byte] = value
    rope_bytes = torch.full((layout.rope_dims,), rope, dtype=torch.bfloat16).view(torch.uint8)
    quantized_bytes = layout.data_bytes - 2 * layout.rope_dims
    page[0, start + quantized_bytes:start + layout.data_bytes] = rope_bytes
    scale_start = block_size * layout.data_bytes + token * layout.scale_bytes
    for tile in range(layout.tiles):
        page[0, scale_start + tile] = scales.get(tile, 127)
    return page


def test_fp8_page_bytes_decoded_by_hand():
    # Token 1: dim 0 = 0x38 (1.0) in tile 0 at scale 2^1; dim 64 = 0xC0 (-2.0) in tile 1 at
    # 2^-3; dim 447 = 0x01 (2^-9) in tile 6 at 2^0; rope 1.5. Token 0: all zero bytes (scale 2^-127).
    page = _hand_page(DSV4_FP8, {0: 0x38, 64: 0xC0, 447: 0x01}, {0: 128, 1: 124}, rope=1.5)
    k = qz.dequantize(page, DSV4_FP8, block_size=2)
    assert k.shape == (1, 2, 1, 512) and k.dtype == torch.float64
    token = k[0, 1, 0]
    assert token[0] == 2.0 and token[64] == -0.25 and token[447] == 2.0**-9
    assert (token[448:] == 1.5).all() and token[1:64].eq(0).all() and token[65:447].eq(0).all()
    assert k[0, 0].eq(0).all()


def test_fp4_page_bytes_decoded_by_hand():
    # Token 1: byte 0 = 0x21 packs dim 0 = code 1 (0.5), dim 1 = code 2 (1.0), tile 0 at 2^2;
    # byte 16 = 0xF0: dim 32 = 0, dim 33 = code 0xF (-6.0), tile 1 at 2^-1; rope -3.0.
    page = _hand_page(DSV4_FP4, {0: 0x21, 16: 0xF0}, {0: 129, 1: 126}, rope=-3.0)
    token = qz.dequantize(page, DSV4_FP4, block_size=2)[0, 1, 0]
    assert token[:2].tolist() == [2.0, 4.0] and token[32:34].tolist() == [0.0, -3.0]
    assert (token[448:] == -3.0).all() and token[2:32].eq(0).all() and token[34:448].eq(0).all()


@pytest.mark.parametrize("block_size", [1, 5, 64])
def test_fp8_quantized_as_flashmla_does_dequantizes_to_the_same_values(block_size):
    """FlashMLA's recipe (tests/quant.py): scale = 2^ceil(log2(amax / 448)), x / scale cast to
    e4m3 by torch, the rope dims copied; our bytes decode to exactly that."""
    torch.manual_seed(block_size)
    k = (torch.randn(3, block_size, 1, 512) * torch.logspace(-3, 2, 512)).to(torch.bfloat16)
    tiles = k[:, :, 0, :448].float().unflatten(-1, (7, 64))
    scale = torch.pow(2, (tiles.abs().amax(-1) / 448).clamp_min(1e-4).log2().ceil())[..., None]
    flashmla = torch.cat([((tiles / scale).to(torch.float8_e4m3fn).double() * scale).flatten(-2),
                          k[:, :, 0, 448:].double()], dim=-1)
    ours = qz.dequantize(qz.quantize(k, DSV4_FP8), DSV4_FP8, block_size)
    assert torch.equal(ours[:, :, 0], flashmla)


@pytest.mark.parametrize("layout", [DSV4_FP8, DSV4_FP4], ids=lambda l: l.name)
def test_a_quantized_element_is_the_nearest_value_at_its_tiles_scale(layout):
    torch.manual_seed(0)
    k = (torch.randn(2, 3, 1, 512) * 5).to(torch.bfloat16)
    got = qz.dequantize(qz.quantize(k, layout), layout, 3)[:, :, 0, :448].unflatten(-1, (layout.tiles, layout.tile))
    x = k[:, :, 0, :448].double().unflatten(-1, (layout.tiles, layout.tile))
    scale = 2.0 ** (torch.log2(x.abs().amax(-1, keepdim=True) / layout.element.largest).ceil())
    values = qz.decode(torch.arange(2**layout.element.bits), layout.element).nan_to_num(1e30)
    distance_to_nearest = ((x / scale)[..., None] - values).abs().min(-1).values * scale
    assert torch.equal((got - x).abs(), distance_to_nearest)


def test_the_layouts_refuse_the_wrong_shape_and_bytes():
    with pytest.raises(ValueError, match=r"dsv4-fp8 holds \(num_blocks, block_size, 1, 512\), got \(1, 2, 2, 512\)"):
        qz.quantize(torch.zeros(1, 2, 2, 512), DSV4_FP8)
    with pytest.raises(ValueError, match="uint8 .* got torch.float32"):
        qz.dequantize(torch.zeros(1, 1152), DSV4_FP8, 1)


def test_the_contracts_layout_names_are_the_layouts_here():
    from fmha.contract import CACHE_LAYOUTS

    assert tuple(qz.LAYOUTS) == CACHE_LAYOUTS

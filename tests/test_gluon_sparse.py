"""fmha.kernels.gluon_sparse on a Hopper GPU: its e4m3 dequantization against torch's float8_e4m3fn and
its e2m1 one against the oracle's table (every code, at scales from 2^-127 to NaN, bit for bit),
and rows with no key at all."""

import pytest
import torch

from fmha.kernels import gluon_dense, gluon_sparse
from fmha.contract import cache_layouts
from fmha.oracles import quantization
from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.regressions.paged_cases import SPARSE
from fmha.registry import resolve_kernel

pytestmark = pytest.mark.gpu

if gluon_sparse.dense.IMPORT_ERROR is None:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    @gluon.jit
    def _decode_tile(CODES, SCALES, OUT):
        keys = gl.arange(0, gluon_sparse.BLOCK_N, layout=gluon_sparse.GATHER_KEYS)
        cols = gl.arange(0, 64, layout=gluon_sparse.GATHER_COLS)
        at = keys[:, None] * 64 + cols[None, :]
        value = gluon_sparse._e4m3(gl.load(CODES + at), gl.load(SCALES + keys)[:, None])
        gl.store(OUT + at, value)

    @gluon.jit
    def _decode_fp4_tile(CODES, LOW, HIGH, OUT):
        """Four groups of BLOCK_N keys: bytes [4, keys, 32] and scale codes [4, keys] in, bf16 [4, keys, 64] out."""
        groups = gl.arange(0, 4, layout=gl.SliceLayout(1, gluon_sparse.FP4_KEYS))
        keys = gl.arange(0, gluon_sparse.BLOCK_N, layout=gl.SliceLayout(0, gluon_sparse.FP4_KEYS))
        pairs = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(0, gluon_sparse.FP4_BYTES)))
        at = groups[:, None] * gluon_sparse.BLOCK_N + keys[None, :]
        codes = gl.load(CODES + (at * 32)[:, :, None] + pairs[None, :][None, :, :])
        value = gluon_sparse._fp4_values(codes, gl.load(LOW + at), gl.load(HIGH + at))
        groups = gl.arange(0, 4, layout=gl.SliceLayout(1, gluon_sparse.GROUP_KEYS))
        keys = gl.arange(0, gluon_sparse.BLOCK_N, layout=gl.SliceLayout(0, gluon_sparse.GROUP_KEYS))
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, gluon_sparse.KEY_COLS))
        at = groups[:, None] * gluon_sparse.BLOCK_N + keys[None, :]
        gl.store(OUT + (at * 64)[:, :, None] + cols[None, :][None, :, :], value)


# 2^-127 (code 0), small, 1, large, 2^127 and NaN (code 255): the products stay exact or overflow.
SCALE_CODES = (0, 1, 20, 100, 127, 134, 140, 200, 254, 255)


@pytest.fixture
def hopper(device):
    if gluon_dense.availability(device):
        pytest.skip(gluon_dense.availability(device))
    return device


def _bitwise_mismatch(out: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Indices where two bf16 tensors differ in bits (any NaN equals any NaN)."""
    same = (out.view(torch.int16) == expected.view(torch.int16)) | (out.isnan() & expected.isnan())
    return (~same).nonzero()


@pytest.mark.parametrize("scale_code", SCALE_CODES)
def test_e4m3_decoder_matches_torch(scale_code, hopper):
    device = hopper
    keys = gluon_sparse.BLOCK_N.value
    codes = (torch.arange(keys * 64, device=device) % 256).to(torch.uint8).reshape(keys, 64)
    scales = torch.full((keys,), scale_code, dtype=torch.uint8, device=device)
    out = torch.empty(keys, 64, dtype=torch.bfloat16, device=device)
    _decode_tile[(1,)](codes, scales, out, num_warps=gluon_sparse.GATHER_WARPS.value)
    scale = torch.tensor(2.0, dtype=torch.float64).pow(scale_code - 127) if scale_code < 255 else float("nan")
    expected = (codes.view(torch.float8_e4m3fn).double() * scale).to(torch.bfloat16)
    bad = _bitwise_mismatch(out, expected)
    assert bad.numel() == 0, (
        f"scale code {scale_code}: {len(bad)} of {codes.numel()} codes decode differently, first code "
        f"{codes[tuple(bad[0])].item():#04x}: {out[tuple(bad[0])].item()!r}, torch {expected[tuple(bad[0])].item()!r}")


# (low, high) scale codes of a group's two halves: distinct, so that a half taking the other's shows.
FP4_SCALE_CODES = ((0, 1), (20, 100), (127, 134), (140, 200), (254, 255), (255, 127))


@pytest.mark.parametrize("low_high", FP4_SCALE_CODES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_e2m1_decoder_matches_the_oracle(low_high, hopper):
    device, keys = hopper, gluon_sparse.BLOCK_N.value
    codes = (torch.arange(4 * keys * 32, device=device) % 256).to(torch.uint8).reshape(4, keys, 32)
    low, high = (torch.full((4, keys), code, dtype=torch.uint8, device=device) for code in low_high)
    out = torch.empty(4, keys, 64, dtype=torch.bfloat16, device=device)
    _decode_fp4_tile[(1,)](codes, low, high, out, num_warps=gluon_sparse.GATHER_WARPS.value)
    # Column 2j is byte j's low nibble, 2j + 1 its high one; columns 0-31 take the low scale.
    nibbles = torch.stack([codes & 15, codes >> 4], dim=-1).reshape(4, keys, 64)
    scale = torch.tensor([cache_layouts.UE8M0.values[code] for code in low_high], dtype=torch.float64, device=device)
    expected = quantization.decode(nibbles, cache_layouts.E2M1) * scale.repeat_interleave(32)
    expected = expected.to(torch.bfloat16)
    bad = _bitwise_mismatch(out, expected)
    assert bad.numel() == 0, (
        f"scale codes {low_high}: {len(bad)} of {out.numel()} values decode differently, first at (group, key, "
        f"column) {tuple(bad[0].tolist())}: {out[tuple(bad[0])].item()!r}, "
        f"the oracle {expected[tuple(bad[0])].item()!r}")


# The softmax warpgroup computes the first tile's QK^T before its loop: a row with no tile must
# not wait for one (it hung), in one scope or two, with a sink or without.
NO_KEY_ROWS = [
    Sample(problem=SPARSE.replace(sink=False), topk_lens=(6, 0), seed=1),
    Sample(problem=SPARSE, topk_lens=(0, 0), seed=2),
    Sample(problem=SPARSE.replace(extra_topk=4, extra_block_size=2), topk_lens=(0, 6), extra_topk_lens=(0, 0), seed=3),
]


@pytest.mark.parametrize("sample", NO_KEY_ROWS, ids=lambda s: s.id)
def test_rows_with_no_key(sample, hopper):
    assert not gluon_sparse.ENTRY.not_supported_reasons(sample.problem, hopper)
    verdict = check_sample(resolve_kernel("gluon-sparse"), sample, hopper)
    assert verdict.passed, verdict.message(f"gluon-sparse {sample.id}")

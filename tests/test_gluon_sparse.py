"""fmha.gluon_sparse on a Hopper GPU: its e4m3 dequantization against torch's float8_e4m3fn
(every code, at scales from 2^-127 to NaN, bit for bit), and rows with no key at all."""

import pytest
import torch

from fmha import gluon_attention, gluon_sparse
from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.regressions.source_cases import SPARSE
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
        value = gluon_sparse._e4m3_tile(gl.load(CODES + at), gl.load(SCALES + keys))
        gl.store(OUT + at, value)


# 2^-127 (code 0), small, 1, large, 2^127 and NaN (code 255): the products stay exact or overflow.
SCALE_CODES = (0, 1, 20, 100, 127, 134, 140, 200, 254, 255)


@pytest.fixture
def hopper(device):
    if gluon_attention.availability(device):
        pytest.skip(gluon_attention.availability(device))
    return device


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
    same = (out.view(torch.int16) == expected.view(torch.int16)) | (out.isnan() & expected.isnan())
    bad = (~same).nonzero()
    assert bad.numel() == 0, (
        f"scale code {scale_code}: {len(bad)} of {codes.numel()} codes decode differently, first code "
        f"{codes[tuple(bad[0])].item():#04x}: {out[tuple(bad[0])].item()!r}, torch {expected[tuple(bad[0])].item()!r}")


# The softmax warpgroup computes the first tile's QK^T before its loop: a row with no tile must
# not wait for one (it hung), in one scope or two, with a sink or without.
NO_KEY_ROWS = [
    Sample(problem=SPARSE.replace(sink=False), topk_lens=(6, 0), seed=1),
    Sample(problem=SPARSE, topk_lens=(0, 0), seed=2),
    Sample(problem=SPARSE.replace(extra_topk=4, extra_block_size=2), topk_lens=(0, 6), extra_topk_lens=(0, 0), seed=3),
]


@pytest.mark.parametrize("sample", NO_KEY_ROWS, ids=lambda s: s.id)
def test_rows_with_no_key(sample, hopper):
    assert not gluon_sparse.not_supported_reasons(sample.problem, hopper)
    verdict = check_sample(resolve_kernel("gluon-sparse"), sample, hopper)
    assert verdict.passed, verdict.message(f"gluon-sparse {sample.id}")

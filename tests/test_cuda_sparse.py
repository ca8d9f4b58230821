"""fmha.kernels.cuda_sparse on a Hopper GPU with nvcc: its dequantization through the whole kernel
(one key, q = 0, so the output row is the key's bf16 value) against the oracle's decoder, every
code at scales from 2^-127 to 2^118, value for value; the head counts of TP-sharded DSV4 (one CTA,
or a 2-CTA cluster sharing each tile) and MTP rows against the oracle; rows with no key;
random index-sparse draws inside its capabilities against the oracle; and its mutants
(regressions/cuda_mutants.py) caught."""

import time

import pytest
import torch
from hypothesis import given, settings

from fmha.contract import cache_layouts
from fmha.kernels import cuda_sparse
from fmha.oracles import quantization
from fmha.oracles.check import check_sample
from fmha.oracles.sample import Sample
from fmha.properties.catalog import LAWS
from fmha.properties.paged_strategies import paged_samples
from fmha.regressions.cuda_mutants import CLUSTER_CASES, CUDA_MUTANTS
from fmha.regressions.isolation import CASE_TIMEOUT_S, check_case_isolated
from fmha.regressions.paged_cases import SPARSE
from fmha.regressions.trap import check_case
from fmha.registry import resolve_kernel

GPU = pytest.mark.gpu  # every test here but the patches' check runs on a Hopper GPU with nvcc


@pytest.fixture
def cuda_hopper(device):
    if cuda_sparse.availability(device):
        pytest.skip(cuda_sparse.availability(device))
    return device


def _mismatch(out: torch.Tensor, expected: torch.Tensor) -> torch.Tensor:
    """Indices where two bf16 tensors differ in value (bits, but for the sign of a zero: the
    kernel sums 1 x -0 into +0; any NaN equals any NaN)."""
    same = (out == expected) | (out.isnan() & expected.isnan())
    return (~same).nonzero()


def _one_key_page(layout: cache_layouts.CacheLayout, codes: torch.Tensor, scale_codes: list[int], g) -> torch.Tensor:
    """One page of one token: `codes` (its quantized bytes), random bf16 rope dims, `scale_codes`."""
    page = torch.zeros(1, layout.page_bytes(1), dtype=torch.uint8)
    quantized = layout.quantized_dims * layout.element.bits // 8
    page[0, :quantized] = codes
    page[0, quantized:layout.data_bytes] = torch.randn(layout.rope_dims, generator=g).to(torch.bfloat16).view(torch.uint8)
    page[0, layout.data_bytes:layout.data_bytes + len(scale_codes)] = torch.tensor(scale_codes, dtype=torch.uint8)
    return page


def _decoded_by_the_kernel(page: torch.Tensor, layout: cache_layouts.CacheLayout, heads: int, device,
                           kernel=cuda_sparse.ENTRY) -> torch.Tensor:
    page = page.to(device)
    cache = page[:, :layout.token_bytes].view(1, 1, 1, layout.token_bytes)
    q = torch.zeros(1, 1, heads, 512, dtype=torch.bfloat16, device=device)  # every score 0: the one key's p is 1
    indices = torch.zeros(1, 1, 1, dtype=torch.int32, device=device)
    o, _ = kernel.fn(q, cache, cache, indices=indices, cache_layout=layout.name)
    return o[0, 0]


def _decoding_failure(page, layout, heads: int, device, kernel=cuda_sparse.ENTRY) -> str | None:
    expected = quantization.dequantize(page, layout, 1)[0, 0, 0].to(torch.bfloat16).to(device)
    out = _decoded_by_the_kernel(page, layout, heads, device, kernel)
    bad = _mismatch(out, expected.expand_as(out))
    if bad.numel():
        return (f"{len(bad)} of {out.numel()} values differ, first at (head, dim) {tuple(bad[0].tolist())}: "
                f"{out[tuple(bad[0])].item()!r}, the oracle {expected[bad[0][1]].item()!r}")
    return None


def _assert_decodes_like_the_oracle(page, layout, heads: int, device, what: str) -> None:
    failure = _decoding_failure(page, layout, heads, device)
    assert failure is None, f"{what}: {failure}"


def _every_e4m3_code_page(scale_code: int) -> torch.Tensor:
    """One FP8 key holding every finite e4m3 code, its 7 groups at `scale_code` and the one above."""
    codes = torch.arange(448) % 256
    codes[(codes & 0x7F) == 0x7F] -= 1  # no NaN codes (see SCALE_CODES)
    scales = [scale_code + (group % 2 if scale_code < 245 else 0) for group in range(7)]  # a group taking its neighbour's shows
    return _one_key_page(cache_layouts.DSV4_FP8, codes.to(torch.uint8), scales, torch.Generator().manual_seed(scale_code))


# 2^-127 (code 0), subnormal products, 1, the last scale of one multiply (134) and the first of two
# (135), and 2^118 (code 245): the largest scale at which every e4m3 value stays finite in bf16 (a
# key with inf or NaN makes every score NaN).
SCALE_CODES = (0, 1, 6, 7, 8, 20, 100, 127, 134, 135, 200, 239, 240, 245)


@GPU
@pytest.mark.parametrize("heads", (64, 128), ids=lambda h: f"h{h}")
@pytest.mark.parametrize("scale_code", SCALE_CODES)
def test_e4m3_through_the_kernel(scale_code, heads, cuda_hopper):
    _assert_decodes_like_the_oracle(_every_e4m3_code_page(scale_code), cache_layouts.DSV4_FP8, heads, cuda_hopper,
                                    f"scale code {scale_code} (odd groups {scale_code + 1})")


# (even, odd) tiles' scale codes: distinct, so that a tile taking its neighbour's shows; 6 x 2^125 is finite.
FP4_SCALE_CODES = ((0, 1), (20, 100), (127, 134), (140, 200), (252, 127))


@GPU
@pytest.mark.parametrize("heads", (16, 128), ids=lambda h: f"h{h}")
@pytest.mark.parametrize("even_odd", FP4_SCALE_CODES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_e2m1_through_the_kernel(even_odd, heads, cuda_hopper):
    g = torch.Generator().manual_seed(sum(even_odd))
    layout = cache_layouts.DSV4_FP4
    page = _one_key_page(layout, (torch.arange(224) % 256).to(torch.uint8), [even_odd[t % 2] for t in range(14)], g)
    _assert_decodes_like_the_oracle(page, layout, heads, cuda_hopper, f"scale codes {even_odd}")


# Hq 16/32/64 (one CTA, rows past Hq masked), 96 and 128 (a 2-CTA cluster, each CTA
# dequantizing half of every tile for both), MTP T 4, top-k not a multiple of 64, FP4 second scope.
HEADS_AND_ROWS = [
    Sample(problem=SPARSE.replace(heads_q=h, q_len=t, kv_len=topk, block_size=block, extra_topk=extra,
                                  extra_block_size=61, extra_cache_layout="dsv4-fp4"), seed=h + t)
    for h, t, topk, block, extra in ((16, 4, 70, 5, 130), (32, 1, 200, 64, 64), (64, 2, 129, 1, 100),
                                     (96, 3, 64, 16, 65), (128, 4, 100, 61, 300), (128, 1, 640, 64, 1))
]


@GPU
@pytest.mark.parametrize("sample", HEADS_AND_ROWS, ids=lambda s: s.id)
def test_heads_and_rows_against_the_oracle(sample, cuda_hopper):
    assert not cuda_sparse.ENTRY.not_supported_reasons(sample.problem, cuda_hopper)
    verdict = check_sample(resolve_kernel("cuda-sparse"), sample, cuda_hopper)
    assert verdict.passed, verdict.message(f"cuda-sparse {sample.id}")


# A row with no tile at all must not wait for one, in one scope or two, with a sink or without,
# in a lone CTA and in a cluster (whose peer then copies nothing).
NO_KEY_ROWS = [
    Sample(problem=SPARSE.replace(sink=False), topk_lens=(6, 0), seed=1),
    Sample(problem=SPARSE.replace(heads_q=128), topk_lens=(0, 0), seed=2),
    Sample(problem=SPARSE.replace(extra_topk=4, extra_block_size=2, extra_cache_layout="dsv4-fp8", heads_q=128),
           topk_lens=(0, 6), extra_topk_lens=(0, 0), seed=3),
]


@GPU
@pytest.mark.parametrize("sample", NO_KEY_ROWS, ids=lambda s: s.id)
def test_rows_with_no_key(sample, cuda_hopper):
    verdict = check_sample(resolve_kernel("cuda-sparse"), sample, cuda_hopper)
    assert verdict.passed, verdict.message(f"cuda-sparse {sample.id}")


@GPU
@settings(max_examples=25, deadline=None)
@given(data=paged_samples(cuda_sparse.CAPABILITIES, "cuda", kinds=("sparse",)))
def test_random_sparse_draws_against_the_oracle(data, device):
    if cuda_sparse.availability(device):
        pytest.skip(cuda_sparse.availability(device))
    verdict = check_sample(resolve_kernel("cuda-sparse"), data, device)
    assert verdict.passed, verdict.message(f"cuda-sparse {data.id}")


MUTANT = {mutant.name: mutant for mutant in CUDA_MUTANTS}


def test_cuda_mutants_patch_the_kernel():
    """On any machine: each patch still applies exactly once (MutationError otherwise)."""
    for mutant in CUDA_MUTANTS:
        assert mutant.kernel().name == f"mutant:{mutant.name}"


@GPU
@pytest.mark.parametrize("case", CLUSTER_CASES, ids=lambda c: c.id)
def test_the_kernel_passes_the_cluster_cases(case, cuda_hopper):
    assert check_case(cuda_sparse.ENTRY, case, cuda_hopper) == []


@GPU
@pytest.mark.starts_first  # nvcc builds its mutant first (60-90 s on the H200 machine)
def test_a_peer_copying_into_the_wrong_half_is_caught(cuda_hopper):
    mutant = MUTANT["cuda-sparse-peer-wrong-half"]
    failures = {case.id: check_case(mutant.kernel(), case, cuda_hopper) for case in CLUSTER_CASES}
    assert all(failures.values()), f"{mutant.name} ({mutant.bug}) passes {[c for c, f in failures.items() if not f]}"


@GPU
@pytest.mark.starts_first  # where `python -m fmha.kernels.build --mutants` has not run, nvcc builds its mutant first
def test_a_miscounted_peer_barrier_hangs_and_is_caught_in_bounded_time(cuda_hopper):
    """The ready barrier never completes: the case runs in a child that is killed after the
    GPU's case timeout, seconds (the mutant comes from the build cache, so the timeout bounds the
    kernel, not nvcc), and the run goes on."""
    mutant = MUTANT["cuda-sparse-peer-bytes-miscounted"]
    mutant.kernel().apply.keywords["extension"]()  # in the build cache before the child loads it
    started = time.monotonic()
    failures = check_case_isolated(f"mutant:{mutant.name}", "fmha.regressions.cuda_mutants:CLUSTER_CASES", 0,
                                   cuda_hopper)
    assert failures and failures[0].startswith("hang:"), f"{mutant.name} ({mutant.bug}) did not hang: {failures}"
    assert time.monotonic() - started < CASE_TIMEOUT_S["cuda"] + 30, "the child's start and the bound took too long"
    assert check_case(cuda_sparse.ENTRY, CLUSTER_CASES[0], cuda_hopper) == []  # this process's GPU still works


@GPU
@pytest.mark.starts_first  # nvcc builds its mutant first (60-90 s on the H200 machine)
def test_flushed_subnormals_are_caught_by_the_fp8_law_and_by_every_code(cuda_hopper):
    """The law's covering sample at scale 2^0 puts subnormal codes beside an outlier in every
    tile, q meeting the outliers at their weight: the small codes carry the LSE (its draws do so
    only now and then); the code test decodes each of them."""
    mutant = MUTANT["cuda-sparse-subnormals-flushed"]
    law = LAWS["fp8_cache_calls_agree_with_the_oracle"]
    with pytest.raises(AssertionError, match=mutant.name):
        # one failure, not a group: a call replayed in another context fails it too, with its own message
        law.run(cuda_hopper, mutant.kernel(), settings=settings(max_examples=30, derandomize=True, database=None,
                                                                deadline=None, report_multiple_bugs=False))
    for scale_code in (127, 245):  # the f16 pass's, the bf16 pass's
        failure = _decoding_failure(_every_e4m3_code_page(scale_code), cache_layouts.DSV4_FP8, 128, cuda_hopper,
                                    mutant.kernel())
        assert failure is not None, f"{mutant.name} decodes every e4m3 code at scale code {scale_code} like the oracle"


@GPU
@pytest.mark.starts_first
def test_unchecked_f16_scales_are_caught_by_every_code(cuda_hopper):
    """Codes at scales outside f16's exact range decode wrong in the f16 pass: the check that
    sends their rows to the bf16 pass is what keeps them right, at both ends."""
    mutant = MUTANT["cuda-sparse-f16-scale-unchecked"]
    for scale_code in (100, 135):
        failure = _decoding_failure(_every_e4m3_code_page(scale_code), cache_layouts.DSV4_FP8, 128, cuda_hopper,
                                    mutant.kernel())
        assert failure is not None, f"{mutant.name} decodes every e4m3 code at scale code {scale_code} like the oracle"

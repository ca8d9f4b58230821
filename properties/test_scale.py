"""The GPU scale tier (`--fmha-scale` on a CUDA device; the nightly workflow's): each selected
kernel agrees with the float64 oracle on calls at production sizes (fmha.properties.scale: 128k
keys, caches past 2^31 elements, 512 requests, page ids past 2^20, the largest top-k, and each
size's freedoms past what a CPU run affords), one test a call."""

import pytest

from fmha.oracles.check import check_sample


@pytest.mark.scale
def test_agrees_with_the_oracle_at_production_sizes(kernel, scale_sample, device):
    verdict = check_sample(kernel, scale_sample, device)
    assert verdict.passed, f"{verdict.message(f'{kernel.name} {scale_sample.id}')}\npin it: {scale_sample.pinned()!r}"

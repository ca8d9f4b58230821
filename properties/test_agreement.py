"""Every selected kernel agrees with the float64 oracle under the verdict, on samples that
touch every part of the contract, in every dtype and a few input distributions."""

import pytest

from fmha.properties.run_settings import problem_params
from fmha.oracles.check import check_sample
from fmha.properties.feature_cases import AGREEMENT_DISTRIBUTIONS, FEATURE_CASES, WIDE_CASES, with_dtypes

SAMPLES = [s.replace(distribution=d) for s in with_dtypes(FEATURE_CASES) for d in AGREEMENT_DISTRIBUTIONS] + WIDE_CASES


@pytest.mark.parametrize("sample", problem_params(SAMPLES))
def test_kernel_matches_oracle(kernel, sample, device):
    verdict = check_sample(kernel, sample, device)
    assert verdict.passed, f"{verdict.message(f'{kernel.name} {sample.id}')}\npin it: {sample.pinned()!r}"

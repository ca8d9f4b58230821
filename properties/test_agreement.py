"""Every selected kernel agrees with the float64 oracle under the verdict, on problems that
touch every part of the contract, in every dtype."""

import pytest

from ci.plugin import problem_params
from oracles.check import check_kernel
from properties.feature_cases import AGREEMENT_DISTRIBUTIONS, FEATURE_CASES, with_dtypes


@pytest.mark.parametrize("distribution", AGREEMENT_DISTRIBUTIONS)
@pytest.mark.parametrize("problem", problem_params(with_dtypes(FEATURE_CASES)))
def test_kernel_matches_oracle(kernel, problem, distribution, device):
    verdict = check_kernel(kernel, problem, distribution, seed=0, device=device)
    assert verdict.passed, verdict.message(f"{kernel.name} {problem.id} {distribution}")

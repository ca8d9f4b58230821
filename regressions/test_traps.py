"""Every selected kernel passes every named regression case it supports, in every dtype it
declares (a case outside a kernel's capabilities is a skip carrying the kernel's reason)."""

import pytest

from fmha.contract import DTYPE_NAMES
from fmha.regressions.trap import check_case
from fmha.regressions.traps import TRAPS

pytestmark = pytest.mark.regression


def _dtypes(case):
    """Every dtype, but a quantized cache is read by bf16 queries only."""
    return (case.problem.dtype,) if case.problem.cache_layouts else DTYPE_NAMES


@pytest.mark.parametrize("trap, sample", [
    pytest.param(trap, case.replace(dtype=dtype), id=f"{trap.id}/{case.replace(dtype=dtype).id}")
    for trap in TRAPS.values() for case in trap.cases for dtype in _dtypes(case)
])
def test_named_regression_case(kernel, trap, sample, device):
    failures = check_case(kernel, sample, device, trap.symptoms)
    assert not failures, (
        f"{kernel.name} fails named case {trap.id}/{sample.id} ({trap.origin}: {trap.symptom}; "
        f"known root cause: {trap.root_cause}):\n" + "\n".join(f"  - {f}" for f in failures))

"""Every selected kernel passes every named regression case, in every dtype it declares. A
paged or sparse case outside a kernel's capabilities is re-laid inside them (its block sizes,
Dv = D, ...) as long as the trap's mutant still fails it; a case whose point cannot be laid
out, or a dense case the kernel does not support, is a skip carrying the reason."""

import pytest

from fmha.contract import DTYPE_NAMES
from fmha.regressions.trap import check_case, laid_out_for
from fmha.regressions.traps import TRAPS, in_process_mutants

pytestmark = pytest.mark.regression


def _dtypes(case):
    """Every dtype, but a quantized cache is read by bf16 queries only."""
    return (case.problem.dtype,) if case.problem.cache_layouts else DTYPE_NAMES


@pytest.mark.parametrize("trap, case", [
    pytest.param(trap, case.replace(dtype=dtype), id=f"{trap.id}/{case.replace(dtype=dtype).id}")
    for trap in TRAPS.values() for case in trap.cases for dtype in _dtypes(case)
])
def test_named_regression_case(kernel, trap, case, device):
    laid, why = laid_out_for(kernel, case, device, in_process_mutants(trap.id) if case.problem.source != "dense" else ())
    if laid is None:
        pytest.skip(f"{kernel.name}, {trap.id}: {why}")
    failures = check_case(kernel, laid, device, trap.symptoms)
    relaid = "" if laid is case else f", re-laid for the kernel as {laid.id}"
    assert not failures, (
        f"{kernel.name} fails named case {trap.id}/{case.id}{relaid} ({trap.origin}: {trap.symptom}; "
        f"known root cause: {trap.root_cause}):\n" + "\n".join(f"  - {f}" for f in failures))

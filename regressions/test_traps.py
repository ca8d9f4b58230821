"""Every selected kernel passes every named regression case it supports (a case outside a
kernel's capabilities is a skip carrying the kernel's reason)."""

import pytest

from regressions.trap import check_case
from regressions.traps import TRAPS

pytestmark = pytest.mark.regression


@pytest.mark.parametrize("trap, case", [
    pytest.param(trap, case, id=f"{trap.id}/{case.id}") for trap in TRAPS.values() for case in trap.cases
])
def test_named_regression_case(kernel, trap, case, device):
    failures = check_case(kernel, case, device)
    assert not failures, (
        f"{kernel.name} fails named case {trap.id}/{case.id} (seed {', '.join(trap.seeds)}: {trap.symptom}; "
        f"known root cause: {trap.root_cause}):\n" + "\n".join(f"  - {f}" for f in failures))

"""Every selected kernel passes every named regression case, in every dtype it declares. A
paged or sparse case outside a kernel's capabilities is re-laid inside them (its block sizes,
Dv = D, ...) as long as the trap's mutant still fails it; a case whose point cannot be laid
out, or a dense case the kernel does not support, is a skip carrying the reason."""

import pytest

from fmha.contract import DTYPE_NAMES
from fmha.regressions.trap import check_case, laid_out_for
from fmha.regressions.traps import MUTANTS, TRAPS, USER_TRAPS, in_process_mutants

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


if USER_TRAPS:  # a kernel author's own traps (--fmha-cases DIR): each case is seen failing on its bug
    @pytest.mark.parametrize("trap, index", [
        pytest.param(TRAPS[t], i, id=f"{t}/{case.id}") for t in USER_TRAPS for i, case in enumerate(TRAPS[t].cases)
    ])
    def test_your_case_fails_on_its_mutant(trap, index, device):
        from fmha.regressions.kill_matrix import case_failures

        mutants = [m for m in MUTANTS.values() if m.trap == trap.id]
        assert mutants, (f"trap {trap.id} has no mutant: a case never seen failing on its bug proves nothing. Keep the "
                         f"buggy kernel and name it in MUTANTS ({trap.id.replace('-', '_')}.py shows how)")
        passed = [m.name for m in mutants if not case_failures(m, trap, index, device)]
        assert not passed, (f"mutant(s) {passed} pass case {trap.id}/{trap.cases[index].id}: the case does not "
                            f"catch the bug it is named for")

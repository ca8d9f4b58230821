"""Every selected kernel passes every named regression case, in every dtype it declares. A
paged or sparse case outside a kernel's capabilities is re-laid inside them (its block sizes,
Dv = D, ...) as long as the trap's mutant still fails it; a case whose point cannot be laid
out, or a dense case the kernel does not support, is a skip carrying the reason."""

import pytest

from fmha.regressions.traps import MUTANTS_OF, TRAPS, USER_TRAPS, named_cases, run_named_case

pytestmark = pytest.mark.regression


@pytest.mark.parametrize("trap, case", [pytest.param(trap, case, id=f"{trap.id}/{case.id}") for trap, case in named_cases()])
def test_named_regression_case(kernel, trap, case, device):
    outcome, message = run_named_case(kernel, trap, case, device)
    if outcome == "skipped":
        pytest.skip(message)
    assert outcome == "passed", message


if USER_TRAPS:  # a kernel author's own traps (--fmha-cases DIR): each case is seen failing on its bug
    @pytest.mark.parametrize("trap, index", [
        pytest.param(TRAPS[t], i, id=f"{t}/{case.id}") for t in USER_TRAPS for i, case in enumerate(TRAPS[t].cases)
    ])
    def test_your_case_fails_on_its_mutant(trap, index, device):
        from fmha.regressions.kill_matrix import case_failures

        mutants = MUTANTS_OF[trap.id]
        assert mutants, (f"trap {trap.id} has no mutant: a case never seen failing on its bug proves nothing. Keep the "
                         f"buggy kernel and name it in MUTANTS ({trap.id.replace('-', '_')}.py shows how)")
        passed = [m.name for m in mutants if not case_failures(m, trap, index, device)]
        assert not passed, (f"mutant(s) {passed} pass case {trap.id}/{trap.cases[index].id}: the case does not "
                            f"catch the bug it is named for")

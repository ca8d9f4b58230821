"""A named case's "known root cause" is printed only where the failure is the trap's bug: the
kernel fails the case as the trap's own mutant does. Another bug that fails the same case gets
no pointer at the trap's fix, only the verdict's measurements and likely causes."""

import pytest

from fmha.regressions.selection import resolve_kernel
from fmha.regressions.traps import TRAPS, run_named_case

pytestmark = pytest.mark.cpu_tier  # mutants of the reference and the interpreted Triton kernel


@pytest.mark.parametrize("trap, own, other", [
    ("zero-query-request", "zero-query-request-shifts-rows", "full-last-page-read-empty"),
    ("cores-mn-layout", "cores-mn-layout", "no-scale"),
])
def test_the_root_cause_is_named_only_when_the_failure_is_the_traps_bug(trap, own, other):
    trap = TRAPS[trap]
    outcome, message = run_named_case(resolve_kernel(f"mutant:{own}"), trap, trap.cases[0], "cpu")
    assert outcome == "failed" and f"known root cause (it fails as the trap's mutant does): {trap.root_cause}" in message
    outcome, message = run_named_case(resolve_kernel(f"mutant:{other}"), trap, trap.cases[0], "cpu")
    assert outcome == "failed", message
    assert trap.root_cause not in message and "it fails otherwise than the trap's bug does" in message, message
    assert "  - metrics" in message and " rel-L2 " in message and " ulp at " in message, message  # how much, not only what

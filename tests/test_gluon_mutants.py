"""The Gluon kernels' mutants (regressions/gluon_mutants.py): on a Hopper GPU each fails at
least one head-dim-512 reproducer (the sparse kernel's: one of its trap's cases), which fmha's
own kernels pass (the trap cases: regressions/test_traps.py)."""

import pytest
import torch

from fmha.kernels import gluon_dense, gluon_sparse
from fmha.registry import resolve_kernel
from fmha.regressions.gluon_mutants import CASES, GLUON_DENSE_MUTANTS, GLUON_SPARSE_MUTANTS
from fmha.regressions.trap import check_case
from fmha.regressions.traps import TRAPS

pytestmark = pytest.mark.regression


@pytest.fixture
def hopper(device):
    reasons = gluon_dense.ENTRY.not_supported_reasons(CASES[0].problem, torch.device(device))
    if reasons:
        pytest.skip(f"the Gluon kernel does not run here: {'; '.join(reasons)}")
    return device


@pytest.mark.parametrize("mutant", GLUON_DENSE_MUTANTS + GLUON_SPARSE_MUTANTS, ids=lambda m: m.name)
def test_gluon_mutant_builds_and_names_a_trap(mutant):
    """On any machine: the patch still applies exactly once (MutationError otherwise)."""
    assert mutant.trap in TRAPS, f"mutant {mutant.name}: no trap {mutant.trap!r}"
    mutant.kernel()


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_fmha_passes_the_gluon_reproducers(case, hopper):
    assert check_case(resolve_kernel("fmha"), case, hopper) == []


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", GLUON_DENSE_MUTANTS, ids=lambda m: m.name)
def test_gluon_mutant_is_caught(mutant, hopper):
    failures = {case.id: check_case(mutant.kernel(), case, hopper) for case in CASES}
    assert any(failures.values()), (f"mutant {mutant.name} ({mutant.bug}) passes every head-dim-512 reproducer "
                                    f"({', '.join(failures)}): the trap {mutant.trap} does not reach the Gluon kernel")


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", GLUON_SPARSE_MUTANTS, ids=lambda m: m.name)
def test_gluon_sparse_mutant_is_caught(mutant, hopper):
    cases = [case for case in TRAPS[mutant.trap].cases
             if not gluon_sparse.ENTRY.not_supported_reasons(case.problem, hopper)]
    assert cases, f"the Gluon sparse kernel runs none of trap {mutant.trap}'s cases"
    failures = {case.id: check_case(mutant.kernel(), case, hopper) for case in cases}
    assert any(failures.values()), (f"mutant {mutant.name} ({mutant.bug}) passes every case of its trap "
                                    f"({', '.join(failures)})")

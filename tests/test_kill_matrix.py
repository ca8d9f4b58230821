"""The diagonal of the kill matrix: every mutant fails every case of its own trap, and a
mutant that hangs or crashes its process costs one bounded failure, not the run."""

import os
import re
import time

import pytest
import torch

from fmha.regressions import kill_matrix
from fmha.regressions.isolation import CASE_TIMEOUT_S, check_case_isolated
from fmha.regressions.kill_matrix import case_failures
from fmha.regressions.mutation import MutationError, patch_source
from fmha.regressions.mutants import MUTANTS, trap_mutants
from fmha.regressions.traps import TRAPS
from fmha.regressions.traps.warp_collective_tmem import _collective_epilogue

pytestmark = pytest.mark.regression

DOC = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "kill-matrix.md")
DIAGONAL = [pytest.param(m, i, id=f"{m.name}/{TRAPS[m.trap].cases[i].id}",
                         marks=[pytest.mark.starts_first] if m.isolate else [])
            for m in trap_mutants().values() for i in range(len(TRAPS[m.trap].cases))]


@pytest.mark.parametrize("mutant, index", DIAGONAL)
def test_mutant_fails_its_own_case(mutant, index, device):
    trap = TRAPS[mutant.trap]
    start = time.monotonic()
    failures = case_failures(mutant, trap, index, device)
    assert failures, (f"mutant {mutant.name} ({mutant.bug}) passes case {trap.cases[index].id} of trap "
                      f"{trap.id}: the case does not catch the bug it exists for")
    if mutant.isolate == "hang":
        assert failures[0].startswith("hang:"), f"the hang mutant should be reported as a hang, got {failures}"
        # bounded: the kernel's timeout plus process start-up, never the whole run's timeout
        assert time.monotonic() - start < CASE_TIMEOUT_S[device] + 120
    if mutant.isolate == "crash":
        assert failures[0].startswith(("crash:", "raised")), f"expected a crash or a raised CUDA error, got {failures}"


@pytest.mark.starts_first  # two spawned children
def test_an_isolated_case_comes_from_a_trap_or_from_a_module_of_cases():
    """The GPU kernels' own cases (regressions.cuda_mutants) run isolated like a trap's: the
    reference passes a cluster case; a trap's mutant, resolved by name, fails its own case."""
    assert check_case_isolated("reference", "fmha.regressions.cuda_mutants:CLUSTER_CASES", 0, "cpu", 300) == []
    assert check_case_isolated("mutant:minus-one-is-slot-0", "minus-one-is-slot-0", 0, "cpu", 300)


def test_every_trap_is_proven_by_a_mutant():
    unproven = [t for t in TRAPS if not any(m.trap == t for m in trap_mutants().values())]
    assert not unproven, (f"traps without a mutant: {unproven}. Add a kernel with exactly that bug to the trap's "
                          "MUTANTS (see regressions/mutation.py); a case never seen failing proves nothing")


def test_the_collective_completes_when_all_lanes_arrive(device):
    """The hang mutant hangs because of its bug (16 of 32 lanes), not because of the model."""
    arrivals = torch.zeros(1, dtype=torch.int32, device=device)
    _collective_epilogue[(1,)](arrivals, LANES_THAT_ARRIVE=32)
    assert int(arrivals.item()) == 32


def test_a_patch_whose_target_is_gone_fails_loudly():
    with pytest.raises(MutationError, match="occurs 0 times"):
        patch_source("o = acc / l_i", (("text the kernel does not contain", "x"),), "stale-mutant")


def test_the_kill_matrix_page_covers_every_mutant_and_trap():
    with open(DOC) as f:
        page = f.read()
    missing = [name for name in [*trap_mutants(), *TRAPS] if f"| {name} |" not in page and name not in page]
    assert not missing, f"docs/kill-matrix.md does not mention {missing}: regenerate it with `python -m fmha.regressions matrix`"


@pytest.mark.cpu_tier  # a row computed on the CPU, whatever the session's device
def test_each_row_is_reported_as_it_is_computed():
    lines = []
    cache = {"gone-mutant": {"key": "x", "row": {}}}
    rows = kill_matrix.build("cpu", 1, cache=cache, progress=lines.append,
                             mutants={"minus-one-is-slot-0": MUTANTS["minus-one-is-slot-0"]})
    assert lines[0] == "1 row(s) to compute, 0 reused"
    assert re.fullmatch(r"\[1/1, \d+ s\] minus-one-is-slot-0: own cases caught, \d+/15 laws \(\d+ s\)", lines[1]), lines
    assert [r.mutant for r in rows] == ["minus-one-is-slot-0"] and set(cache) == {"minus-one-is-slot-0"}

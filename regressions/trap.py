"""What a named regression case is: the trap (a bug a kernel team actually shipped, from the
seed logs), the inputs that expose it, and the symptom checks that see it.

Every case runs the foundation's verdict (oracles.verdict) on the kernel's output; a trap
may add symptom checks for what the verdict's tolerances are too loose to see (a rounding
bias of half an ulp is inside every per-element bound but is still a bug).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fmha.capabilities import KernelEntry
from fmha.problem import Problem
from oracles.check import judge_run, oracle_of, run_kernel
from properties.strategies import Case, build_inputs

# A symptom check: (kernel output, float64 oracle output, problem) -> failure text or None.
Symptom = Callable[[torch.Tensor, torch.Tensor, Problem], "str | None"]


@dataclass(frozen=True)
class TrapCase:
    """One reproducer: a problem and how its inputs are made, plus the symptoms to check."""

    case: Case
    symptoms: tuple[Symptom, ...] = ()
    why: str = ""  # what about these inputs exposes the trap

    @property
    def problem(self) -> Problem:
        return self.case.problem

    @property
    def id(self) -> str:
        return f"{self.problem.id}-{self.case.distribution}"


@dataclass(frozen=True)
class Trap:
    id: str  # kebab-case, e.g. "normalize-twice"
    seeds: tuple[str, ...]  # the seed logs it comes from, e.g. ("002",)
    symptom: str  # what a user sees
    root_cause: str  # what was wrong in the kernel
    cases: tuple[TrapCase, ...]
    source: str = "DESIGN.md trap table"  # or where in the seeds it was found

    def __post_init__(self):
        for name in ("id", "symptom", "root_cause"):
            if not getattr(self, name).strip():
                raise ValueError(f"Trap.{name} is mandatory")
        if not self.seeds or not self.cases:
            raise ValueError(f"trap {self.id!r}: needs at least one seed reference and one case")


def reproducer(problem: Problem, distribution: str = "normal", why: str = "", symptoms: tuple[Symptom, ...] = (),
               seed: int = 0, storage: str = "contiguous") -> TrapCase:
    return TrapCase(Case(problem, distribution, seed, storage), symptoms, why)


def check_case(kernel: KernelEntry, case: TrapCase, device: str) -> list[str]:
    """Run `kernel` on the case; return what failed (empty: the kernel passes)."""
    inputs = build_inputs(case.case, device)
    run = run_kernel(kernel, case.problem, inputs)
    oracle = oracle_of(run)
    failures = list(judge_run(run, oracle=oracle).failures)
    # Unwritten elements still hold the NaN poison: symptom checks skip non-finite values.
    failures += [f for check in case.symptoms if (f := check(run.o, oracle[0], case.problem))]
    return failures

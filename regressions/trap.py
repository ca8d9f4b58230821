"""What a named regression case is: the trap (a bug a kernel team actually shipped, from the
seed logs), the samples that expose it, and the symptom checks that see it.

Every case runs the foundation's verdict (fmha.oracles.verdict) on the kernel's output; a
trap may add symptom checks for what the verdict's tolerances are too loose to see (a
rounding bias of half an ulp is inside every per-element bound but is still a bug).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from fmha.contract import KernelEntry
from fmha.oracles.check import judge_run, oracle_of, run_kernel
from fmha.oracles.sample import Sample
from fmha.contract import Problem

# A symptom check: (kernel output, float64 oracle output, problem) -> failure text or None.
Symptom = Callable[[torch.Tensor, torch.Tensor, Problem], "str | None"]


@dataclass(frozen=True)
class Trap:
    id: str  # kebab-case, e.g. "normalize-twice"
    seeds: tuple[str, ...]  # the seed logs it comes from, e.g. ("002",); () when `source` says where
    symptom: str  # what a user sees
    root_cause: str  # what was wrong in the kernel
    cases: tuple[Sample, ...]  # each with its name: what about these inputs exposes the trap
    source: str = "docs/contract.md trap table"  # or where in the seeds it was found
    symptoms: tuple[Symptom, ...] = ()  # checks beyond the verdict

    @property
    def origin(self) -> str:
        """Where the trap comes from, for messages: ``seed 002`` or its source."""
        return f"seed {', '.join(self.seeds)}" if self.seeds else self.source

    def __post_init__(self):
        for name in ("id", "symptom", "root_cause"):
            if not getattr(self, name).strip():
                raise ValueError(f"Trap.{name} is mandatory")
        if not self.cases:
            raise ValueError(f"trap {self.id!r}: needs at least one case")
        if not self.seeds and self.source == Trap.source:
            raise ValueError(f"trap {self.id!r}: name the seed logs it comes from, or its source (where the bug was seen)")


def reproducer(problem: Problem, distribution: str = "normal", why: str = "", **sample_fields) -> Sample:
    """A trap case: `problem` with its inputs (distribution, seed, scale, storages), named by `why`."""
    return Sample(problem=problem, distribution=distribution, name=why, **sample_fields)


def check_case(kernel: KernelEntry, case: Sample, device: str, symptoms: tuple[Symptom, ...] = ()) -> list[str]:
    """Run `kernel` on the case; return what failed (empty: the kernel passes)."""
    run = run_kernel(kernel, case.inputs(device))
    oracle = oracle_of(run.inputs)
    failures = list(judge_run(run, oracle=oracle, kernel=kernel).failures)
    # Unwritten elements still hold the NaN poison: symptom checks skip non-finite values.
    failures += [f for check in symptoms if (f := check(run.o, oracle.o, case.problem))]
    return failures

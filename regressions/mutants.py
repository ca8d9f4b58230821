"""Mutant kernels as plug-ins, so any part of the suite can run against one:

    pytest properties --fmha-kernel regressions.mutants:normalize_twice

Attribute names are mutant names with '_' for '-'. `resolve` also takes 'mutant:<name>' and
anything fmha.registry.resolve_kernel takes.
"""

from __future__ import annotations

from fmha.capabilities import KernelEntry
from fmha.registry import resolve_kernel
from regressions.traps import MUTANTS


def resolve(spec: str) -> KernelEntry:
    if spec.startswith("mutant:"):
        return MUTANTS[spec.removeprefix("mutant:")].kernel()
    return resolve_kernel(spec)


def __getattr__(attr: str) -> KernelEntry:
    name = attr.replace("_", "-")
    if name not in MUTANTS:
        raise AttributeError(f"no mutant {name!r}; mutants: {', '.join(MUTANTS)}")
    return MUTANTS[name].kernel()

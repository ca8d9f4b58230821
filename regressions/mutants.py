"""Mutant kernels as plug-ins, so any part of the suite can run against one:

    pytest properties --fmha-kernel regressions.mutants:normalize_twice

Attribute names are mutant names with '_' for '-'. `resolve` also takes 'mutant:<name>' and
anything fmha.registry.resolve_kernel takes.
"""

from __future__ import annotations

from fmha.contract import KernelEntry
from fmha.registry import resolve_kernel

# regressions.traps is imported inside the functions: a trap module may itself use resolve()
# for its mutant, while the trap modules are still being loaded.


def resolve(spec: str) -> KernelEntry:
    if spec.startswith("mutant:"):
        from fmha.regressions.traps import MUTANTS
        return MUTANTS[spec.removeprefix("mutant:")].kernel()
    return resolve_kernel(spec)


def __getattr__(attr: str) -> KernelEntry:
    if attr.startswith("__"):  # the import machinery probes dunders (__path__, ...)
        raise AttributeError(attr)
    from fmha.regressions.traps import MUTANTS
    name = attr.replace("_", "-")
    if name not in MUTANTS:
        raise AttributeError(f"no mutant {name!r}; mutants: {', '.join(MUTANTS)}")
    return MUTANTS[name].kernel()

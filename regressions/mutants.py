"""Mutant kernels as plug-ins, so any part of the suite can run against one:

    pytest properties --fmha-kernel regressions.mutants:normalize_twice

Attribute names are mutant names with '_' for '-'. `resolve` also takes 'mutant:<name>' (any
of fmha's mutants, the GPU kernels' too) and anything fmha.registry.resolve_kernel takes.
"""

from __future__ import annotations

from fmha.contract import KernelEntry
from fmha.registry import resolve_kernel

# regressions.traps is imported inside the functions: a trap module may itself use resolve()
# for its mutant, while the trap modules are still being loaded.


def resolve(spec: str) -> KernelEntry:
    if spec.startswith("mutant:"):
        return every_mutant()[spec.removeprefix("mutant:")].kernel()
    return resolve_kernel(spec)


def every_mutant() -> dict:
    """Name -> mutant: the traps' and the GPU kernels' (regressions.gluon_mutants and
    regressions.cuda_mutants, which live apart from the kill matrix)."""
    from fmha.regressions import cuda_mutants, gluon_mutants
    from fmha.regressions.traps import MUTANTS

    gpu = (*gluon_mutants.MUTANTS, *gluon_mutants.SPARSE_MUTANTS, *cuda_mutants.MUTANTS)
    return {**MUTANTS, **{mutant.name: mutant for mutant in gpu}}


def __getattr__(attr: str) -> KernelEntry:
    if attr.startswith("__"):  # the import machinery probes dunders (__path__, ...)
        raise AttributeError(attr)
    mutants = every_mutant()
    name = attr.replace("_", "-")
    if name not in mutants:
        raise AttributeError(f"no mutant {name!r}; mutants: {', '.join(mutants)}")
    return mutants[name].kernel()

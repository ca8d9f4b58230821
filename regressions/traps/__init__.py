"""The trap library: one module per trap, each with TRAP (the case) and MUTANTS (kernels
with exactly that bug). Modules are discovered, so a new trap is one new file
(`python -m fmha.regressions new <id>` writes it)."""

from __future__ import annotations

import importlib
import pkgutil

from fmha.oracles.sample import Sample
from fmha.regressions.mutation import Mutant
from fmha.regressions.trap import Trap, laid_out_for


def _modules():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        yield importlib.import_module(f"{__name__}.{info.name}")


def _load() -> tuple[dict[str, Trap], dict[str, Mutant], dict[str, str]]:
    traps, mutants, files = {}, {}, {}
    for module in _modules():
        trap = module.TRAP
        files[trap.id] = module.__file__
        if trap.id in traps:
            raise ValueError(f"{module.__name__}: trap id {trap.id!r} is already used")
        traps[trap.id] = trap
        for mutant in getattr(module, "MUTANTS", ()):
            if mutant.name in mutants or mutant.trap != trap.id:
                raise ValueError(f"{module.__name__}: mutant {mutant.name!r} is a duplicate or names another trap")
            mutants[mutant.name] = mutant
    return traps, mutants, files


TRAPS, MUTANTS, TRAP_FILES = _load()


def in_process_mutants(trap_id: str) -> list:
    """The kernels of a trap's mutants that run in this process (not those that hang or crash
    it): what a case re-laid for another kernel must still catch (trap.laid_out_for)."""
    return [m.kernel() for m in MUTANTS.values() if m.trap == trap_id and not m.isolate]


def laid_out_cases(kernel, device: str) -> list[tuple[str, Sample]]:
    """Every named case `kernel` can run, laid out for it: (trap id, case) pairs."""
    found = []
    for trap in TRAPS.values():
        # a dense case runs as it is or not at all: its mutants (patched kernels) are not needed
        mutants = in_process_mutants(trap.id) if any(c.problem.source != "dense" for c in trap.cases) else ()
        for case in trap.cases:
            laid, _ = laid_out_for(kernel, case, device, mutants)
            if laid is not None:
                found.append((trap.id, laid))
    return found

"""The trap library: one module per trap, each with TRAP (the case) and MUTANTS (kernels
with exactly that bug). Modules are discovered, so a new trap is one new file
(`python -m fmha.regressions new <id>` writes it)."""

from __future__ import annotations

import importlib
import pkgutil

from fmha.regressions.mutation import Mutant
from fmha.regressions.trap import Trap


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

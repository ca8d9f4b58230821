"""The trap library: one module per trap, each with TRAP (the case) and MUTANTS (the trap's
mutants: kernels with exactly that bug, which its every case must catch). Modules are
discovered, so a new trap is one new file (`python -m fmha.regressions new <id>` writes it).
fmha.regressions.mutants lists these mutants with every other."""

from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import pkgutil
import sys

from fmha.contract import DTYPE_NAMES
from fmha.oracles.sample import Sample
from fmha.regressions.mutation import Mutant
from fmha.regressions.trap import Trap, check_case, fails_like, laid_out_for


def _modules():
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        yield importlib.import_module(f"{__name__}.{info.name}")


def _register(module) -> str:
    trap = getattr(module, "TRAP", None)
    if not isinstance(trap, Trap):
        raise ValueError(f"{module.__file__}: expected TRAP = Trap(...) (python -m fmha.regressions new writes one)")
    if trap.id in TRAPS:
        raise ValueError(f"{module.__file__}: trap id {trap.id!r} is already used (by {TRAP_FILES[trap.id]})")
    mutants = tuple(getattr(module, "MUTANTS", ()))
    taken = {m.name for ms in MUTANTS_OF.values() for m in ms}
    for mutant in mutants:
        if not isinstance(mutant, Mutant) or mutant.trap != trap.id or mutant.name in taken:
            raise ValueError(f"{module.__file__}: MUTANTS holds {mutant!r}: expected Mutant records with trap "
                             f"{trap.id!r} and names no other trap's mutant has")
    TRAP_FILES[trap.id] = module.__file__
    TRAPS[trap.id] = trap
    MUTANTS_OF[trap.id] = mutants
    return trap.id


TRAPS: dict[str, Trap] = {}
TRAP_FILES: dict[str, str] = {}
MUTANTS_OF: dict[str, tuple[Mutant, ...]] = {}  # trap id -> the trap's mutants, its module's MUTANTS
for _module in _modules():
    _register(_module)
USER_TRAPS: list[str] = []  # ids of the traps load_directory() added, in its order


def load_directories(directories) -> list[str]:
    """load_directory for each of `directories` (--fmha-cases DIR ...)."""
    return [trap_id for directory in directories for trap_id in load_directory(directory)]


def load_directory(directory: str) -> list[str]:
    """Add the trap modules of `directory` (a kernel author's own named cases, written there
    by `python -m fmha.regressions new ID --dir DIR`) to the library; return their ids."""
    if not os.path.isdir(directory):
        raise ValueError(f"--fmha-cases {directory}: expected a directory of trap modules, found none there")
    paths = [p for p in sorted(glob.glob(os.path.join(directory, "*.py"))) if not os.path.basename(p).startswith("_")]
    if not paths:
        raise ValueError(f"--fmha-cases {directory}: expected trap modules (python -m fmha.regressions new ID --dir "
                         f"{directory} writes one), found no .py file there")
    added = []
    for path in paths:
        name = f"fmha_cases.{os.path.splitext(os.path.basename(path))[0]}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise ValueError(f"--fmha-cases {directory}: {path} does not import: {type(e).__name__}: {e}") from e
        sys.modules[name] = module
        added.append(_register(module))
    USER_TRAPS.extend(added)
    return added


def in_process_mutants(trap_id: str) -> list:
    """The kernels of a trap's mutants that run in this process (not those that hang or crash
    it): what a case re-laid for another kernel must still catch (trap.laid_out_for)."""
    return [m.kernel() for m in MUTANTS_OF[trap_id] if not m.isolate]


def named_cases() -> list[tuple[Trap, Sample]]:
    """Every case of every trap, in every dtype (a quantized cache is read by bf16 queries only)."""
    return [(trap, case.replace(dtype=dtype)) for trap in TRAPS.values() for case in trap.cases
            for dtype in ((case.problem.dtype,) if case.problem.cache_layouts else DTYPE_NAMES)]


def run_named_case(kernel, trap: Trap, case: Sample, device: str) -> tuple[str, str]:
    """`case` of `trap` on `kernel`, laid out for it: ("passed", ""), ("skipped", why it cannot
    run there) or ("failed", what failed, with the trap's symptom and root cause)."""
    laid, why = laid_out_for(kernel, case, device, in_process_mutants(trap.id))
    if laid is None:
        return "skipped", f"{kernel.name}, {trap.id}: {why}"
    failures = check_case(kernel, laid, device, trap.symptoms)
    if not failures:
        return "passed", ""
    relaid = "" if laid is case else f", re-laid for the kernel as {laid.id}"
    return "failed", (f"{kernel.name} fails named case {trap.id}/{case.id}{relaid} ({trap.origin}: {trap.symptom}; "
                      f"{_cause(kernel, trap, laid, device)}):\n" + "\n".join(f"  - {f}" for f in failures))


def _cause(kernel, trap: Trap, case: Sample, device: str) -> str:
    """The trap's root cause where the failure is its bug's: the kernel's output fails as the
    trap's mutant's does. Where it fails otherwise, the trap's cause would point at the wrong fix."""
    try:
        same = fails_like(kernel, in_process_mutants(trap.id), case, device)
    except Exception:  # noqa: BLE001 -- the kernel raised on the rerun: its own failure says so
        same = None
    if same is None:
        return f"the trap's root cause, if it is the trap's bug (no mutant here to compare with): {trap.root_cause}"
    if same:
        return f"known root cause (it fails as the trap's mutant does): {trap.root_cause}"
    return ("it fails otherwise than the trap's bug does (its output is not the trap's mutant's), so the trap's "
            "root cause is not the likely one: see the measurements and likely causes below")


def laid_out_cases(kernel, device: str) -> list[tuple[str, Sample]]:
    """Every named case `kernel` can run, laid out for it: (trap id, case) pairs."""
    found = []
    for trap in TRAPS.values():
        mutants = in_process_mutants(trap.id)
        for case in trap.cases:
            laid, _ = laid_out_for(kernel, case, device, mutants)
            if laid is not None:
                found.append((trap.id, laid))
    return found

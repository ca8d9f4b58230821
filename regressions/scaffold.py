"""`python -m fmha.regressions new <id>`: a trap module from a reproducer, ready to run.

The reproducer is what the property suite prints on a failure, the shrunk sample:
    pin it: @example(sample=Sample(problem=Problem(batch=1, q_len=1, ...), distribution='peaky', seed=3))
"""

from __future__ import annotations

import dataclasses
import keyword
import os
import re

import torch

from fmha.oracles.sample import Sample
from fmha.contract import Problem

TRAPS_DIR = os.path.join(os.path.dirname(__file__), "traps")
_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

TEMPLATE = '''"""{id} ({seed_logs}): {symptom}

Root cause: {root_cause}
"""

import torch  # noqa: F401  (the reproducer's dtype)

from fmha.oracles.sample import Sample
from fmha.contract import Problem
from fmha.regressions.trap import Trap

TRAP = Trap(
    id={id!r},
    seed_logs=({seed_logs!r},),
    source={source!r},
    symptom={symptom!r},
    root_cause={root_cause!r},
    cases=(
        {case},
    ),
)

{mutants}
'''

MUTANT_FROM_PLUGIN = '''from fmha.regressions.selection import resolve_kernel  # noqa: E402
from fmha.regressions.mutation import Mutant  # noqa: E402

MUTANTS = (
    Mutant({id!r}, TRAP.id, {bug!r}, lambda: resolve_kernel({spec!r})),
)'''

NO_MUTANT = '''# Prove the case: add a kernel that has exactly this bug (regressions/mutation.py patches
# fmha's kernel; or keep the buggy version of yours as a plug-in), e.g.
#   from fmha.regressions.selection import resolve_kernel
#   MUTANTS = (Mutant({id!r}, TRAP.id, "what it does wrong", lambda: resolve_kernel("my_pkg.attn:fwd_buggy")),)
# Until then tests/test_kill_matrix.py fails: a case never seen failing proves nothing.
MUTANTS = ()'''


def parse_reproducer(text: str) -> Sample:
    """A `Sample(...)` or a bare `Problem(...)`, as the property suite prints them."""
    text = text.strip().removeprefix("pin it:").strip()
    if text.startswith("@example(sample=") and text.endswith(")"):
        text = text[len("@example(sample="):-1]
    try:
        value = eval(text, {"__builtins__": {}}, {"Sample": Sample, "Problem": Problem, "torch": torch})  # noqa: S307
    except Exception as e:
        raise ValueError(f"reproducer: expected 'Sample(problem=Problem(...), ...)' or 'Problem(...)', "
                         f"got {text!r} ({type(e).__name__}: {e})") from None
    if isinstance(value, Problem):
        return Sample(problem=value)
    if not isinstance(value, Sample):
        raise ValueError(f"reproducer: expected a Sample or a Problem, got {type(value).__name__}")
    return value


def module_path(trap_id: str, directory: str = TRAPS_DIR) -> str:
    return os.path.join(directory, trap_id.replace("-", "_") + ".py")


def new_trap(trap_id: str, reproducer: str, *, seed_logs: str, symptom: str, root_cause: str, why: str = "",
             source: str = "", mutant: str = "", bug: str = "", directory: str = TRAPS_DIR) -> str:
    """Write the trap module; return its path."""
    if not _ID.match(trap_id) or keyword.iskeyword(trap_id.replace("-", "_")):
        raise ValueError(f"id: expected kebab-case like 'normalize-twice', got {trap_id!r}")
    path = module_path(trap_id, directory)
    if os.path.exists(path):
        raise ValueError(f"id: {trap_id!r} exists already ({path})")
    case = parse_reproducer(reproducer)
    text = TEMPLATE.format(
        id=trap_id, seed_logs=seed_logs, source=source or f"found by the property suite ({seed_logs})",
        symptom=symptom, root_cause=root_cause,
        case=repr(dataclasses.replace(case, name=why or "the shrunk counterexample")),
        mutants=MUTANT_FROM_PLUGIN.format(id=trap_id, bug=bug or symptom, spec=mutant) if mutant
        else NO_MUTANT.format(id=trap_id),
    )
    with open(path, "w") as f:
        f.write(text)
    return path

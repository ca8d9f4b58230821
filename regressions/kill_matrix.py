"""The kill matrix: which checks catch which mutant, and whether the correct kernels pass
every named case. `python -m fmha.regressions matrix` writes it to docs/kill-matrix.md, so a gap
(a bug only its own case catches, or one nothing catches) is visible; CI asserts the part
that must hold (tests/test_kill_matrix.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, Phase, settings

from fmha.contract import KernelEntry, cache_layouts, slots
from fmha.kernels import host, triton_dense
from fmha.oracles import metrics, oracle, paged_inputs, quantization, reference_kernel, verdict
from fmha.properties import dense_laws, paged_laws, paged_strategies, strategies
from fmha.properties.catalog import LAWS
from fmha.properties.law_record import Law
from fmha.registry import MERGES
from fmha.regressions import paged_cases, paged_mutants
from fmha.regressions.mutants import trap_mutants
from fmha.tables import Table
from fmha.regressions.isolation import check_case_isolated
from fmha.regressions.mutation import Mutant
from fmha.regressions.trap import Trap, check_case
from fmha.regressions.traps import TRAP_FILES, TRAPS, load_directories

# Every row computed for fmha's own mutants, keyed by what it depends on (row_key): shipped
# with the package, so a run anywhere recomputes only what changed.
ROWS = os.path.join(os.path.dirname(__file__), "kill_matrix_rows.json")


def case_failures(mutant: Mutant, trap: Trap, index: int, device: str) -> list[str]:
    """How the mutant fails case `index` of `trap` (empty: it passes). An exception counts."""
    if mutant.isolate:
        return check_case_isolated(f"mutant:{mutant.name}", trap.id, index, device)
    kernel = mutant.kernel()  # a mutant that cannot be built is an error, never a catch
    try:
        return check_case(kernel, trap.cases[index], device, trap.symptoms)
    except Exception as e:  # noqa: BLE001 -- a kernel that raises is caught by the case
        return [f"raised {type(e).__name__}: {e}"]


def is_v2(trap: Trap) -> bool:
    """A trap of contract v2 (paged or index-sparse keys): the v2 laws are the ones to try."""
    return any(case.problem.source != "dense" for case in trap.cases)


def laws_for(trap: Trap) -> tuple:
    """The laws a trap's mutant is tried on: those over its kind of keys (a merge law takes no kernel)."""
    draws = "paged" if is_v2(trap) else "dense"
    return tuple(law for law in LAWS.values() if law.draws == draws)


# A v2 mutant is the eager float64 reference with one bug: its laws cost seconds, not the
# interpreter's minutes, so they get the draws tests/test_law_mutants.py gives them.
V2_LAW_EXAMPLES = 20


def examples_for(trap: Trap, law_examples: int) -> int:
    return max(law_examples, V2_LAW_EXAMPLES) if is_v2(trap) else law_examples


def law_failure(kernel: KernelEntry, law, device: str, max_examples: int) -> str | None:
    """The law's first counterexample on `kernel` (unshrunk), None when it holds, or
    'n/a: ...' when the kernel lacks what the law needs."""
    quick = settings(max_examples=max_examples, derandomize=True, database=None, deadline=None,
                     phases=[Phase.generate], report_multiple_bugs=False, suppress_health_check=list(HealthCheck))
    try:
        law.require(kernel, device)
    except pytest.skip.Exception as e:
        return f"n/a: {e.msg}"
    try:
        law.run(device, kernel, MERGES["torch-merge"], settings=quick)
    except pytest.skip.Exception:
        return None
    except Exception as e:  # noqa: BLE001 -- AssertionError or a crash: either way the law caught it
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    return None


@dataclass
class Row:
    mutant: str
    own: list[str]  # failures on its own trap's cases (first per case)
    other_traps: list[str] = field(default_factory=list)  # trap ids whose cases also catch it
    laws_caught: list[str] = field(default_factory=list)
    laws_run: int = 0
    note: str = ""
    seconds: float = 0.0
    device: str = ""


def mutant_row(name: str, device: str, law_examples: int) -> Row:
    """The row of trap mutant `name` (by name: rows are computed in spawned processes)."""
    start = time.perf_counter()
    mutant = trap_mutants()[name]
    trap = TRAPS[mutant.trap]
    row = Row(mutant.name, [(case_failures(mutant, trap, i, device) or ["(passed)"])[0] for i in range(len(trap.cases))])
    if mutant.isolate:
        row.note = f"{ {'hang': 'hangs', 'crash': 'crashes'}[mutant.isolate]} its process: run isolated, on its own cases only"
    else:
        kernel = mutant.kernel()
        row.other_traps = [t.id for t in TRAPS.values() if t.id != trap.id and any(
            case_failures(mutant, t, i, device) for i, case in enumerate(t.cases)
            if not kernel.not_supported_reasons(case.problem, device))]
        for law in laws_for(trap):
            failure = law_failure(kernel, law, device, examples_for(trap, law_examples))
            if failure is not None and failure.startswith("n/a"):
                continue
            row.laws_run += 1
            if failure:
                row.laws_caught.append(law.name)
    row.seconds = time.perf_counter() - start
    row.device = device
    return row


def row_key(mutant: Mutant, law_examples: int) -> str:
    """Changes when anything a row depends on changes: the trap module (cases and mutant),
    the kernel it patches, the laws, the verdict they apply or the number of draws. Not the
    device: a row computed on a GPU stays valid for a CPU-only contributor who adds a trap."""
    trap = TRAPS[mutant.trap]
    judged_by = (paged_mutants, paged_cases, reference_kernel, paged_laws, paged_strategies, oracle, paged_inputs,
                 quantization, cache_layouts, slots) if is_v2(trap) else (triton_dense, host, dense_laws, strategies)
    parts = [TRAP_FILES[trap.id], *(inspect.getsourcefile(m) for m in (*judged_by, Law, metrics, verdict))]
    digest = hashlib.sha1(f"{mutant.name} {examples_for(trap, law_examples)}".encode())
    for path in parts:
        with open(path, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()[:16]


def build(device: str, law_examples: int, jobs: int = 1, cache: dict | None = None, progress=print,
          cases_dirs: tuple[str, ...] = (), mutants: dict[str, Mutant] | None = None) -> list[Row]:
    """One row per trap mutant (or per one of `mutants`), reusing rows in `cache` whose key
    still matches (the cache is updated in place); with jobs > 1, mutants run in parallel child
    processes, which load the traps of `cases_dirs` (--fmha-cases) as this process has."""
    cache = {} if cache is None else cache
    mutants = trap_mutants() if mutants is None else mutants
    keys = {name: row_key(mutant, law_examples) for name, mutant in mutants.items()}
    stale = [name for name, key in keys.items() if cache.get(name, {}).get("key") != key]
    progress(f"{len(stale)} row(s) to compute, {len(mutants) - len(stale)} reused")
    start = time.perf_counter()
    jobs = min(jobs, len(stale))
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=load_directories,
                             initargs=(tuple(cases_dirs),)) if jobs > 1 else nullcontext() as pool:
        computing = (pool.map if pool else map)(mutant_row, stale, [device] * len(stale), [law_examples] * len(stale))
        for done, row in enumerate(computing, 1):  # each row as it comes: a fresh matrix takes minutes
            cache[row.mutant] = {"key": keys[row.mutant], "row": dataclasses.asdict(row)}
            progress(f"[{done}/{len(stale)}, {time.perf_counter() - start:.0f} s] {row.mutant}: own cases "
                     f"{'caught' if all(f != '(passed)' for f in row.own) else 'MISSED'}, "
                     f"{len(row.laws_caught)}/{row.laws_run} laws ({row.seconds:.0f} s)")
    for name in set(cache) - set(mutants):
        del cache[name]
    return [Row(**cache[name]["row"]) for name in mutants]


def correct_kernel_failures(kernels: list[KernelEntry], device: str, progress=print) -> dict[str, list[str]]:
    """Per correct kernel, the named cases it fails (it should fail none)."""
    result = {}
    start = time.perf_counter()
    for kernel in kernels:
        found = []
        for trap in TRAPS.values():
            for case in trap.cases:
                if kernel.not_supported_reasons(case.problem, device):
                    continue
                failures = check_case(kernel, case, device, trap.symptoms)
                if failures:
                    found.append(f"{trap.id}/{case.id}: {failures[0]}")
        result[kernel.name] = found
        progress(f"[{time.perf_counter() - start:.0f} s] correct kernel {kernel.name}: "
                 f"{len(found)} named case(s) failed")
    return result


def render(rows: list[Row], correct: dict[str, list[str]], device: str, command: str, date: str) -> str:
    devices = ", ".join(sorted({r.device for r in rows}))
    out = [
        "# Kill matrix",
        "",
        f"Generated by `{command}` on {device}, {date} (mutant rows computed on {devices}; a row is",
        "reused from the .json beside this page while its trap, the kernel, the laws and the verdict are unchanged).",
        "Each mutant is fmha's kernel with one seed bug",
        "put back (regressions/traps/). CI asserts the diagonal (every mutant fails every case of its",
        "own trap) and that correct kernels pass every case (tests/test_kill_matrix.py, regressions/test_traps.py); this page shows",
        "what else catches each bug, including the generic property suite (the metamorphic laws of",
        "properties/dense_laws.py, or for a contract-v2 trap those of properties/paged_laws.py; first",
        f"counterexample of a few hypothesis draws each, {V2_LAW_EXAMPLES} for a v2 law). A v2 mutant is the float64",
        "reference kernel with one paged or sparse bug (regressions/paged_mutants.py).",
        "",
    ]
    table = Table(["mutant", "bug", "its own trap's cases", "other traps' cases that catch it",
                   "property laws that catch it"])
    mutants = trap_mutants()
    for r in rows:
        mutant = mutants[r.mutant]
        own = "; ".join(f.split(":")[0] for f in r.own)
        caught_all = all(f != "(passed)" for f in r.own)
        laws_cell = r.note or (f"{len(r.laws_caught)}/{r.laws_run}: " + ", ".join(r.laws_caught) if r.laws_caught
                               else f"**none of {r.laws_run}**")
        table.add(r.mutant, mutant.bug, f"{'caught' if caught_all else '**MISSED**'} ({own})",
                  ", ".join(r.other_traps) or "—", laws_cell)
    out.append(table.markdown())
    gaps = [r.mutant for r in rows if not r.note and not r.laws_caught]
    out += ["", "## Gaps", ""]
    out += ([f"- `{name}`: no property law catches it; only named cases do." for name in gaps]
            or ["- none: every mutant run in-process is caught by at least one property law."])
    correct_table = Table(["kernel", "cases failed"])
    for name, failures in correct.items():
        correct_table.add(name, "; ".join(failures) if failures else "0")
    out += ["", "## Correct kernels on every named case", "", correct_table.markdown()]
    for draws, what in (("dense", "Laws run on dense-key mutants"), ("paged", "Laws run on paged and sparse mutants")):
        out.append(f"{what}: {', '.join(law.name for law in LAWS.values() if law.draws == draws)}.")
    out.append("")
    return "\n".join(out)

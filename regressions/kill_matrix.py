"""The kill matrix: which test functions of the suite catch which mutant, under the CI profile's
draws, and whether the correct kernels pass every named case. `python -m fmha.regressions matrix`
writes it to docs/kill-matrix.md, so a gap (a bug fewer than three test functions catch, or one
nothing catches) is visible; CI asserts what must hold (tests/test_kill_matrix.py).

A row is a mutant that runs in this process on the CPU (the Gluon and CUDA kernels' mutants are
the GPU tier's, tests/test_gluon_mutants.py and tests/test_cuda_sparse.py); a trap's mutant that
hangs or crashes its process runs isolated, on its own trap's cases only. Each law runs as
pytest runs it under `CI=true`: the fmha-ci profile's draws, its pinned and covering samples
first (first counterexample, unshrunk); the agreement tests run their parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import inspect
import multiprocessing
import os
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

from fmha.contract import KernelEntry, MergeEntry
from fmha.oracles import check, production, run_seed
from fmha.properties.catalog import LAWS
from fmha.properties.test_agreement import SAMPLES as FEATURE_SAMPLES
from fmha.registry import MERGES
from fmha.regressions import eager_mutants
from fmha.regressions.isolation import check_case_isolated
from fmha.regressions.mutants import MUTANTS, trap_mutants
from fmha.regressions.mutation import Mutant
from fmha.regressions.trap import Trap, check_case
from fmha.regressions.traps import TRAP_FILES, TRAPS, load_directories
from fmha.tables import Table

# Every row computed for fmha's own mutants, keyed by what it depends on (row_key): shipped
# with the package, so a run anywhere recomputes only what changed.
ROWS = os.path.join(os.path.dirname(__file__), "kill_matrix_rows.json")
NAMED_CASES_TEST = "test_named_regression_case"
ENOUGH = 3  # test functions that must catch each mutant

# What a row's outcome can depend on, keyed whole: every module of these packages (the contract,
# the kernels and their host code, the judge, the draws, the laws, the traps and mutants) and
# every trap file loaded (a user's too: "other traps' cases that catch it"). A narrower list once
# left out modules that decide outcomes (the pinned samples, the guard, the symptoms).
KEYED_PACKAGES = ("fmha.contract", "fmha.kernels", "fmha.oracles", "fmha.properties", "fmha.regressions")
NOT_KEYED = ("fmha.regressions.cli", "fmha.regressions.ledger", "fmha.regressions.scaffold")  # no outcome


def matrix_mutants() -> dict[str, Mutant]:
    """The rows: every trap's mutants, then every other mutant that runs in-process on the CPU (not
    the GPU scale tier's: the CPU tier passes them by design)."""
    rows = dict(trap_mutants())
    rows.update({name: m for name, m in MUTANTS.items()
                 if name not in rows and "cpu" in m.devices and not m.isolate and not m.tier})
    return rows


def _as_in_ci(test: str) -> None:
    """Test `test` starts as CI's profile starts it: its judged calls replayed as pytest's would
    be (fmha.oracles.production)."""
    from fmha.properties.run_settings import REPLAYS

    production.start_of_test(f"{run_seed.current()}/{test}", **REPLAYS["fmha-ci"]._asdict())


def case_failures(mutant: Mutant, trap: Trap, index: int, device: str) -> list[str]:
    """How the mutant fails case `index` of `trap` (empty: it passes). An exception counts."""
    if mutant.isolate:
        return check_case_isolated(f"mutant:{mutant.name}", trap.id, index, device)
    kernel = mutant.kernel()  # a mutant that cannot be built is an error, never a catch
    _as_in_ci(f"{trap.id}/{index}")
    try:
        return check_case(kernel, trap.cases[index], device, trap.symptoms)
    except Exception as e:  # noqa: BLE001 -- a kernel that raises is caught by the case
        return [f"raised {type(e).__name__}: {e}"]


def ci_settings(max_examples: int | None = None):
    """The fmha-ci profile as pytest runs it under CI=true, first counterexample unshrunk."""
    from fmha.properties.run_settings import register_profiles

    register_profiles()
    profile = settings.get_profile("fmha-ci")
    return settings(profile, max_examples=max_examples or profile.max_examples, phases=[Phase.explicit, Phase.generate],
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck), deadline=None)


def law_failure(entry, law, device: str, max_examples: int | None = None) -> str | None:
    """The law's first counterexample on `entry` (a kernel, or a merge for a merge law), None
    when it holds, or 'n/a: ...' when the law does not run on it."""
    merge = entry if isinstance(entry, MergeEntry) else MERGES["torch-merge"]
    kernel = eager_mutants.CORRECT if isinstance(entry, MergeEntry) else entry
    if isinstance(entry, MergeEntry) and law.operands == "kernel":
        return "n/a: a merge"
    if not isinstance(entry, MergeEntry) and law.operands == "merge":
        return "n/a: a merge law"
    try:
        law.require(kernel, device)
    except pytest.skip.Exception as e:
        return f"n/a: {e.msg}"
    _as_in_ci(law.test)
    try:
        law.run(device, kernel, merge, settings=ci_settings(max_examples))
    except pytest.skip.Exception:
        return None
    except Exception as e:  # noqa: BLE001 -- AssertionError or a crash: either way the law caught it
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def _grid_samples() -> list:
    """The grid configs the CPU tier runs (properties/test_grid.py, not marked slow)."""
    from fmha.oracles.sample import Sample
    from fmha.properties import test_grid

    return [Sample(problem=param.values[0]) for param in test_grid._params() if not param.marks]


def agreement_failure(kernel: KernelEntry, samples, device: str) -> str | None:
    """The first sample of an agreement test the kernel fails (an exception counts)."""
    for s in samples:
        if kernel.not_supported_reasons(s.problem, device):
            continue
        _as_in_ci(s.id)
        try:
            verdict = check.check_sample(kernel, s, device)
        except Exception as e:  # noqa: BLE001
            return f"{s.id}: raised {type(e).__name__}"
        if not verdict.passed:
            return s.id
    return None


def merge_tests_failing(merge: MergeEntry, device: str) -> list[str]:
    """The merge tests (properties/test_merge.py) that `merge` fails."""
    from fmha.properties import test_merge

    failing = []
    for problem, cuts in test_merge.CASES:
        try:
            test_merge.test_merge_of_key_splits_equals_attention_over_all_keys(merge, problem, cuts, device)
        except Exception:  # noqa: BLE001
            failing.append("test_merge_of_key_splits_equals_attention_over_all_keys")
            break
    try:
        test_merge.test_all_parts_empty_gives_zero_and_minus_infinity_or_the_sink(merge, device)
    except Exception:  # noqa: BLE001
        failing.append("test_all_parts_empty_gives_zero_and_minus_infinity_or_the_sink")
    return failing


@dataclass
class Row:
    mutant: str
    own: list[str]  # failures on its own trap's cases (first per case); [] for a mutant of no trap
    other_traps: list[str] = field(default_factory=list)  # trap ids whose cases also catch it
    laws_caught: list[str] = field(default_factory=list)
    laws_run: int = 0
    agreement_caught: list[str] = field(default_factory=list)  # the agreement (or merge) tests that catch it
    note: str = ""
    seconds: float = 0.0
    device: str = ""

    @property
    def tests(self) -> list[str]:
        """The distinct test functions that catch it."""
        named = [NAMED_CASES_TEST] if any(f != "(passed)" for f in self.own) or self.other_traps else []
        return sorted({*named, *(LAWS[name].test for name in self.laws_caught if name in LAWS), *self.agreement_caught})


def mutant_row(name: str, device: str, law_examples: int | None = None) -> Row:
    """The row of mutant `name` (by name: rows are computed in spawned processes)."""
    start = time.perf_counter()
    production.new_process()  # no row's count depends on the rows its worker computed before it
    mutant = matrix_mutants()[name]
    trap = TRAPS.get(mutant.trap)
    own = [(case_failures(mutant, trap, i, device) or ["(passed)"])[0] for i in range(len(trap.cases))] if trap else []
    row = Row(name, own)
    if mutant.isolate:
        row.note = f"{ {'hang': 'hangs', 'crash': 'crashes'}[mutant.isolate]} its process: run isolated, on its own cases only"
    else:
        entry = mutant.kernel()
        if isinstance(entry, MergeEntry):
            row.agreement_caught = merge_tests_failing(entry, device)
        if isinstance(entry, KernelEntry):
            row.other_traps = [t.id for t in TRAPS.values() if t.id != mutant.trap and any(
                case_failures(mutant, t, i, device) for i, case in enumerate(t.cases)
                if not entry.not_supported_reasons(case.problem, device))]
            for test, samples in (("test_kernel_matches_oracle", FEATURE_SAMPLES),
                                  ("test_grid_config_matches_oracle", _grid_samples())):
                if agreement_failure(entry, samples, device):
                    row.agreement_caught.append(test)
        for law in LAWS.values():
            failure = law_failure(entry, law, device, law_examples)
            if failure is not None and failure.startswith("n/a"):
                continue
            row.laws_run += 1
            if failure:
                row.laws_caught.append(law.name)
    row.seconds = time.perf_counter() - start
    row.device = device
    return row


def _defining_file(mutant: Mutant) -> str:
    build = getattr(mutant.build, "func", mutant.build)
    return inspect.getsourcefile(build)


@functools.cache
def _package_files() -> tuple[tuple[str, Path], ...]:
    """(module name, its source) of every keyed module, found once a process."""
    found = []
    for package in KEYED_PACKAGES:
        root = Path(importlib.util.find_spec(package).origin).parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join((package, *parts)).removesuffix(".__init__")
            if "__pycache__" not in parts and not name.startswith(NOT_KEYED):
                found.append((name, path))
    return tuple(found)


@functools.cache
def _digest(path) -> str:
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()[:12]


def _row_paths(mutant: Mutant) -> dict[str, Path]:
    """What a row depends on, by name: the keyed modules, every trap file loaded (a user's by its
    file name), and the file the mutant is built in."""
    paths = dict(_package_files())
    paths.update({f"trap {trap} ({Path(path).name})": Path(path) for trap, path in TRAP_FILES.items()})
    paths[f"mutant {mutant.name} ({Path(_defining_file(mutant)).name})"] = Path(_defining_file(mutant))
    return paths


def row_files(mutant: Mutant) -> dict[str, str]:
    """The digest of each source a row depends on, by name (_row_paths)."""
    return {name: _digest(path) for name, path in _row_paths(mutant).items()}


def row_key(mutant: Mutant, law_examples: int | None, files: dict[str, str] | None = None) -> str:
    """Changes when anything a row depends on changes (row_files), or the number of draws. Not the
    device: a row computed on a GPU stays valid for a CPU-only contributor who adds a trap."""
    digest = hashlib.sha1(f"{mutant.name} {law_examples}".encode())
    for name, file_digest in sorted((files or row_files(mutant)).items()):
        digest.update(f"{name} {file_digest}\n".encode())
    return digest.hexdigest()[:16]


def head_commit() -> str:
    """fmha's checkout's commit, recorded with each row computed ("" for an installed package,
    even one inside another repository)."""
    try:
        found = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"],
                               cwd=os.path.dirname(__file__), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = found.stdout.split()
    if found.returncode or len(lines) != 2 or Path(lines[0], "regressions", "kill_matrix.py") != Path(__file__):
        return ""
    return lines[1]


def stale_rows(cache: dict, mutants: dict[str, Mutant], law_examples: int | None) -> dict[str, str]:
    """Per row of `mutants` whose cached key no longer matches: what changed since it was
    computed (the files, and in a checkout the first commit after the row's that changed one)."""
    stale = {}
    for name, mutant in mutants.items():
        entry = cache.get(name)
        if entry is None:
            stale[name] = "never computed"
            continue
        now = row_files(mutant)
        if entry.get("key") == row_key(mutant, law_examples, now):
            continue
        then = entry.get("files") or {}
        changed = sorted(k for k in now if then.get(k) != now[k]) if then else []
        said = f"changed: {', '.join(changed[:6])}{', ...' if len(changed) > 6 else ''}" if changed else (
            "computed before rows recorded their files")
        paths = _row_paths(mutant)
        since = _first_commit_since(entry.get("commit", ""), [str(paths[name]) for name in changed])
        stale[name] = f"stale since {since}; {said}" if since else f"stale; {said}"
    return stale


def _first_commit_since(commit: str, paths: list[str]) -> str:
    """The first commit after `commit` that touched one of `paths` ("uncommitted changes" if none
    did; "" outside a checkout or without a recorded commit)."""
    if not commit or not paths:
        return ""
    try:
        found = subprocess.run(["git", "log", "--reverse", "--format=%h %ad %s", "--date=short", f"{commit}..HEAD",
                                "--", *paths], cwd=os.path.dirname(__file__), capture_output=True, text=True,
                               timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    if found.returncode:
        return ""
    first = found.stdout.splitlines()[:1]
    return first[0][:100] if first else "uncommitted changes"


def build(device: str, law_examples: int | None = None, jobs: int = 1, cache: dict | None = None, progress=print,
          cases_dirs: tuple[str, ...] = (), mutants: dict[str, Mutant] | None = None,
          only: set[str] | None = None, save=lambda cache: None) -> list[Row]:
    """One row per matrix mutant (or per one of `mutants`), reusing rows in `cache` whose key
    still matches (the cache is updated in place and `save`d after each row computed: an hour's
    matrix cut short keeps what it computed); with `only`, the stale rows of other mutants are
    reused as they are (a user's own traps' rows, without an hour of fmha's). With jobs > 1,
    mutants run in parallel child processes, which load the traps of `cases_dirs` (--fmha-cases)
    as this process has."""
    cache = {} if cache is None else cache
    mutants = matrix_mutants() if mutants is None else mutants
    keys = {name: row_key(mutant, law_examples) for name, mutant in mutants.items()}
    stale = [name for name, key in keys.items() if cache.get(name, {}).get("key") != key
             and (only is None or name in only or name not in cache)]
    commit = head_commit()
    kept = sum(name not in stale and cache[name].get("key") != keys[name] for name in mutants)
    progress(f"{len(stale)} row(s) to compute, {len(mutants) - len(stale)} reused"
             + (f" ({kept} of them stale: python -m fmha.regressions matrix --stale)" if kept else ""))
    start = time.perf_counter()
    jobs = min(jobs, len(stale))
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=load_directories,
                             initargs=(tuple(cases_dirs),)) if jobs > 1 else nullcontext() as pool:
        computing = (pool.map if pool else map)(mutant_row, stale, [device] * len(stale), [law_examples] * len(stale))
        for done, row in enumerate(computing, 1):  # each row as it comes: a fresh matrix takes minutes
            cache[row.mutant] = {"key": keys[row.mutant], "row": dataclasses.asdict(row),
                                 "files": row_files(mutants[row.mutant]), "commit": commit}
            save(cache)
            caught = "" if not row.own else ("own cases caught, " if all(f != "(passed)" for f in row.own)
                                              else "own cases MISSED, ")
            progress(f"[{done}/{len(stale)}, {time.perf_counter() - start:.0f} s] {row.mutant}: {caught}"
                     f"{len(row.tests)} test functions, {len(row.laws_caught)}/{row.laws_run} laws ({row.seconds:.0f} s)")
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


def short_of(rows: list[Row]) -> list[Row]:
    """Rows of in-process mutants fewer than ENOUGH test functions catch."""
    return [r for r in rows if not r.note and len(r.tests) < ENOUGH]


def render(rows: list[Row], correct: dict[str, list[str]], device: str, command: str, date: str,
           stale: dict[str, str] | None = None) -> str:
    """The page; `stale`: the rows shown as they were last computed (stale_rows), said so."""
    stale = stale or {}
    devices = ", ".join(sorted({r.device for r in rows}))
    out = [
        "# Kill matrix",
        "",
        f"Generated by `{command}` on {device}, {date} (mutant rows computed on {devices}; a row is reused from the",
        ".json beside this page while its mutant, its trap, the judge, the draws and the laws are unchanged).",
        "",
        "A row per mutant that runs in-process on the CPU (fmha.regressions.mutants): fmha's kernels with one seed bug put",
        "back (regressions/traps/), the eager and float64 reference kernels with one bug (regressions/eager_mutants.py,",
        "regressions/paged_mutants.py) and with a bug public kernels shipped (regressions/shipped_mutants.py, each with",
        "its source). Each law and agreement test runs as pytest runs it under `CI=true` (the fmha-ci profile, its",
        "pinned and covering samples first, first counterexample unshrunk). CI asserts the diagonal (every trap's",
        "mutant fails every case of its trap), that correct kernels pass every case, and that at least "
        f"{ENOUGH} distinct test",
        "functions catch every mutant in this table (tests/test_kill_matrix.py).",
        "",
    ]
    table = Table(["mutant", "bug", "its own trap's cases", "test functions that catch it", "laws that catch it",
                   "other traps' cases that catch it"])
    mutants = matrix_mutants()
    for r in rows:
        mutant = mutants[r.mutant]
        own = "; ".join(f.split(":")[0] for f in r.own)
        caught_all = all(f != "(passed)" for f in r.own)
        own_cell = (f"{'caught' if caught_all else '**MISSED**'} by {mutant.trap} ({own})" if r.own else "— (no trap)")
        bug = mutant.bug + (f" ([source]({mutant.source}))" if mutant.source else "")
        tests = r.note or (f"{len(r.tests)}" if len(r.tests) >= ENOUGH else f"**{len(r.tests)}**")
        laws_cell = "" if r.note else f"{len(r.laws_caught)}/{r.laws_run}: " + ", ".join(r.laws_caught)
        table.add(r.mutant + (" (stale)" if r.mutant in stale else ""), bug, own_cell, tests, laws_cell,
                  ", ".join(r.other_traps) or "—")
    if stale:
        out += [f"**{len(stale)} of these rows are stale**: shown as last computed; what each depends on has changed "
                "since (`python -m fmha.regressions matrix --stale` says what; `python -m fmha.regressions matrix` "
                "recomputes them).", ""]
    out.append(table.markdown())
    if stale:
        out += ["", "## Stale rows", ""] + [f"- `{name}`: {why}" for name, why in stale.items()]
    out += ["", "## Gaps", ""]
    out += ([f"- `{r.mutant}`: caught by {len(r.tests)} test function(s) ({', '.join(r.tests) or 'none'})"
             for r in short_of(rows)]
            or [f"- none: every mutant run in-process is caught by at least {ENOUGH} test functions."])
    correct_table = Table(["kernel", "cases failed"])
    for name, failures in correct.items():
        correct_table.add(name, "; ".join(failures) if failures else "0")
    out += ["", "## Correct kernels on every named case", "", correct_table.markdown(), ""]
    return "\n".join(out)

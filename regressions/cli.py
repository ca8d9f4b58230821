"""Command line of the trap library.

    python -m fmha.regressions list [--markdown]
    python -m fmha.regressions matrix [--fmha-kernel NAME ...] [--fmha-device cpu] [--out PAGE.md] \\
        [--jobs N] [--fresh] [--stale] [--fmha-cases DIR]
    python -m fmha.regressions new <id> --reproducer "Sample(problem=Problem(...), ...)" --seed-logs "..." \\
        --symptom "..." --root-cause "..." [--mutant mutant:NAME|module:attr] [--fmha-kernel module:attr] [--dir DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
from pathlib import Path

from fmha.regressions import selection
from fmha.regressions.scaffold import TRAPS_DIR


# regressions/traps -> the repository, where fmha runs from its checkout (editable install)
CHECKOUT = os.path.dirname(os.path.dirname(os.path.realpath(TRAPS_DIR)))


def _in_checkout() -> bool:
    """Run inside fmha's own repository, not a kernel author's (nor fmha in site-packages)."""
    here = os.path.realpath(os.getcwd()) + os.sep
    return os.path.exists(os.path.join(CHECKOUT, "pyproject.toml")) and here.startswith(CHECKOUT + os.sep)


def _user_cache(name: str) -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "fmha", name)


def _user_rows() -> str:
    """Where a kill matrix run outside fmha's checkout keeps the rows it computed."""
    return _user_cache("kill-matrix-rows.json")


def hypothesis_files_out_of_the_current_directory() -> None:
    """Outside fmha's checkout, hypothesis keeps its files (the constants it collects from the
    source it draws for) in the user's cache, not in a .hypothesis/ folder where the command runs."""
    if not _in_checkout():
        from hypothesis.configuration import set_hypothesis_home_dir

        set_hypothesis_home_dir(_user_cache("hypothesis"))


def _default_cases_dir() -> str:
    """fmha's own trap library in fmha's checkout; anywhere else ./fmha_cases, never the
    installed package."""
    return TRAPS_DIR if _in_checkout() else "fmha_cases"


def _usage_error(command: str, e: Exception) -> int:
    """A bad argument, as argparse says one (exit status 2, no traceback)."""
    print(f"python -m fmha.regressions {command}: error: {e}", file=sys.stderr)
    return 2


def trap_table() -> str:
    """docs/contract.md's table of the named traps, from their records."""
    from fmha.regressions.traps import MUTANTS_OF, TRAPS
    from fmha.tables import Table

    table = Table(["trap", "where it was seen", "what a user sees", "what was wrong", "its mutants"])
    for trap in TRAPS.values():
        mutants = ", ".join(f"`{m.name}`" for m in MUTANTS_OF[trap.id]) or "—"
        table.add(f"`{trap.id}`", trap.origin, trap.symptom, trap.root_cause, mutants)
    return table.markdown() + "\n"


def _list(args) -> int:
    from fmha.regressions.traps import MUTANTS_OF, TRAPS
    if args.markdown:
        print(trap_table(), end="")
        return 0
    for trap in TRAPS.values():
        mutants = [m.name for m in MUTANTS_OF[trap.id]] or ["(no mutant)"]
        print(f"{trap.id}  {trap.origin}: {trap.symptom}")
        for case in trap.cases:
            print(f"    case {case.id}: {case.name}")
        print(f"    mutants: {', '.join(mutants)}")
    return 0


def _matrix(args) -> int:
    from fmha.kernels.triton_utils import triton_availability
    from fmha.oracles import threads
    from fmha.regressions import kill_matrix, traps
    device = args.fmha_device
    shipped = set(traps.TRAPS)
    try:
        traps.load_directories(args.fmha_cases)
        kernels = selection.kernels(args.fmha_kernel, device)
    except ValueError as e:
        return _usage_error("matrix", e)
    # fmha's own rows ship with the package (ROWS): a run anywhere recomputes only the rows
    # whose inputs differ from them (a kernel author's traps, an edited law) and keeps its
    # own rows in the user's cache; in fmha's checkout ROWS itself is kept up to date.
    cache_path = kill_matrix.ROWS if _in_checkout() else _user_rows()
    cache = {}
    for path in dict.fromkeys((kill_matrix.ROWS, cache_path)):  # the package's rows, then this run's own
        if not args.fresh and os.path.exists(path):
            cache.update(json.loads(Path(path).read_text()))
    mutants = kill_matrix.matrix_mutants()
    if args.stale:
        stale = kill_matrix.stale_rows(cache, mutants, args.law_examples)
        for name, why in stale.items():
            print(f"{name}: {why}")
        print(f"{len(stale)} of {len(mutants)} rows stale" + ("; python -m fmha.regressions matrix recomputes them"
                                                              if stale else ""), file=sys.stderr)
        return 0
    # A row is kept for any machine (its key is not the device's): rows made where fmha's Triton
    # kernels cannot take this device's tensors would hold their laws as not applying to them.
    unavailable = triton_availability(device)
    if unavailable:
        return _usage_error("matrix", f"--fmha-device {device}: {unavailable}; fmha's Triton kernels and their "
                            "mutants would run none of their laws and the page would not say why")
    # A kernel author's cases: their rows, fmha's reused as they are (stale ones said so on the page).
    only = {name for name, m in mutants.items() if m.trap not in shipped} if args.fmha_cases else None
    only = set() if args.new_only else only  # the rows no run has computed only
    say = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731

    def save(rows: dict) -> None:
        os.makedirs(os.path.dirname(cache_path), exist_ok=True)
        with open(cache_path, "w") as f:
            json.dump(rows, f, indent=1, sort_keys=True)
            f.write("\n")

    # Each row's process gets its share of the cores, as an xdist worker does: with torch's default
    # of a thread per core, --jobs 2 on 2 cores ran four threads that spun waiting for a core
    # (the same rows 12 to 21 times slower, BENCHMARKS.md).
    threads.share_cores(args.jobs)
    rows = kill_matrix.build(device, args.law_examples, args.jobs, cache, progress=say, save=save,
                             cases_dirs=tuple(os.path.abspath(d) for d in args.fmha_cases), mutants=mutants, only=only)
    stale = kill_matrix.stale_rows(cache, mutants, args.law_examples)
    correct = kill_matrix.correct_kernel_failures(kernels, device, progress=say)
    command = "python -m fmha.regressions matrix " + " ".join(sys.argv[2:])
    text = kill_matrix.render(rows, correct, device, command.strip(), datetime.date.today().isoformat(), stale)
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            f.write(text)
    save(cache)
    print(text)
    missed = [r.mutant for r in rows if any(f == "(passed)" for f in r.own)]
    false_failures = {k: f for k, f in correct.items() if f}
    for name in missed:
        print(f"MISSED: mutant {name} passes a case of its own trap", file=sys.stderr)
    for name, failures in false_failures.items():
        print(f"FALSE FAILURE: correct kernel {name} fails {len(failures)} case(s)", file=sys.stderr)
    return 1 if missed or false_failures else 0


def _new(args) -> int:
    from fmha.regressions.scaffold import new_trap
    try:
        if args.mutant:
            selection.resolve_kernel(args.mutant)  # a name nothing answers to is refused now, not when the case runs
        os.makedirs(args.dir, exist_ok=True)
        path = new_trap(args.id, args.reproducer, seed_logs=args.seed_logs, symptom=args.symptom, root_cause=args.root_cause,
                        why=args.why, mutant=args.mutant, directory=args.dir)
    except (ValueError, OSError) as e:
        return _usage_error("new", e)
    if os.path.realpath(args.dir) == os.path.realpath(TRAPS_DIR):
        run = f"pytest regressions -k {args.id}"
    else:
        run = f"pytest --pyargs fmha --fmha-cases {shlex.quote(os.path.relpath(args.dir))} -k {args.id}"
    lines = [f"wrote {os.path.relpath(path)}"]
    device = f" --fmha-device {args.fmha_device}" if args.fmha_device else ""
    if args.mutant:
        lines.append(f"it catches the bug:  {run} --fmha-kernel {shlex.quote(args.mutant)}{device}    (fails)")
    kernels = " ".join(f"--fmha-kernel {shlex.quote(k)}" for k in args.fmha_kernel) or "--fmha-kernel YOUR_MODULE:FUNCTION"
    lines.append(f"run it on your kernel: {run} {kernels}{device}")
    if not args.mutant:
        lines.append("prove it: until the trap names a kernel with exactly this bug (--mutant, or MUTANTS in the "
                     "file), its cases are a failure of the suite")
    print("\n".join(lines))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmha.regressions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="the traps, their cases and mutants")
    listing.add_argument("--markdown", action="store_true", help="as docs/contract.md's table of the named traps")
    listing.set_defaults(run=_list)

    matrix = sub.add_parser("matrix", help="compute the kill matrix and write it as Markdown")
    selection.add_options(matrix.add_argument, "the correct kernels: every registered kernel that runs on the device "
                                               "by default, each of which must pass every named case")
    matrix.add_argument("--law-examples", type=int, default=None,
                        help="hypothesis draws per law and mutant (default: the fmha-ci profile's, as CI draws them)")
    matrix.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="mutants run in parallel processes (default: one per core)")
    matrix.add_argument("--stale", action="store_true",
                        help="list the rows whose inputs changed since they were computed (and since which commit), "
                             "computing nothing")
    matrix.add_argument("--fresh", action="store_true",
                        help="recompute every row (default: reuse the rows whose inputs did not change)")
    matrix.add_argument("--new-only", action="store_true",
                        help="compute only the rows never computed (a mutant just added), the stale ones shown as "
                             "they were")
    matrix.add_argument("--fmha-cases", action="append", default=[], metavar="DIR",
                        help="your own traps (python -m fmha.regressions new ID --dir DIR): their rows too")
    matrix.add_argument("--out", default=None,
                        help="also write the page there (default: docs/kill-matrix.md in fmha's checkout; elsewhere "
                             "it goes to stdout only, the rows to ~/.cache/fmha)")
    matrix.set_defaults(run=_matrix)

    new = sub.add_parser("new", help="scaffold a trap module from a reproducer")
    new.add_argument("id", help="kebab-case trap id, e.g. lse-base-two")
    new.add_argument("--reproducer", required=True,
                     help="the shrunk sample the property suite printed: 'Sample(problem=Problem(...), ...)' or 'Problem(...)'")
    new.add_argument("--seed-logs", required=True, help="where the bug is documented (seed log, issue, commit)")
    new.add_argument("--symptom", required=True, help="what a user sees")
    new.add_argument("--root-cause", required=True, help="what is wrong in the kernel (or 'unknown yet')")
    new.add_argument("--why", default="", help="what about the reproducer exposes the bug")
    new.add_argument("--mutant", default="", metavar="mutant:NAME|module:attr", help="a kernel with exactly this bug")
    selection.add_options(new.add_argument, "YOUR_MODULE:FUNCTION (your kernel, for the commands printed)")
    new.add_argument("--dir", default=None,
                     help="where to write it (default: the trap library in fmha's checkout, else ./fmha_cases); "
                          "pytest --pyargs fmha --fmha-cases DIR runs it")
    new.set_defaults(run=_new)

    args = parser.parse_args(argv)
    if args.command == "matrix":
        try:
            args.fmha_device = selection.device(args.fmha_device)
        except ValueError as e:
            matrix.error(str(e))
    if getattr(args, "dir", "") is None:
        args.dir = _default_cases_dir()
    if args.command == "matrix" and args.out is None and _in_checkout():
        args.out = os.path.join(CHECKOUT, "docs", "kill-matrix.md")
    hypothesis_files_out_of_the_current_directory()
    return args.run(args)

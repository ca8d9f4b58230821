"""Command line of the trap library.

    python -m fmha.regressions list
    python -m fmha.regressions matrix [--fmha-device cpu] [--out docs/kill-matrix.md] [--jobs N] [--fresh]
    python -m fmha.regressions new <id> --reproducer "Sample(problem=Problem(...), ...)" --seeds "..." \\
        --symptom "..." --root-cause "..." [--mutant module:attr]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch

from fmha import registry


def _list(_args) -> int:
    from fmha.regressions.traps import MUTANTS, TRAPS
    for trap in TRAPS.values():
        mutants = [m.name for m in MUTANTS.values() if m.trap == trap.id] or ["(no mutant)"]
        print(f"{trap.id}  {trap.origin}: {trap.symptom}")
        for case in trap.cases:
            print(f"    case {case.id}: {case.name}")
        print(f"    mutants: {', '.join(mutants)}")
    return 0


def _matrix(args) -> int:
    from fmha.regressions import kill_matrix
    device = args.fmha_device or ("cuda" if torch.cuda.is_available() else "cpu")
    kernels = registry.selected_kernels(args.fmha_kernel, device)
    cache_path = os.path.splitext(args.out)[0] + ".json"
    cache = {} if args.fresh or not os.path.exists(cache_path) else json.loads(Path(cache_path).read_text())
    rows = kill_matrix.build(device, args.law_examples, args.jobs, cache,
                             progress=lambda line: print(line, file=sys.stderr))
    correct = kill_matrix.correct_kernel_failures(kernels, device)
    command = "python -m fmha.regressions matrix " + " ".join(sys.argv[2:])
    text = kill_matrix.render(rows, correct, device, command.strip(), datetime.date.today().isoformat())
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    with open(cache_path, "w") as f:
        json.dump(cache, f, indent=1, sort_keys=True)
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
        path = new_trap(args.id, args.reproducer, seeds=args.seeds, symptom=args.symptom, root_cause=args.root_cause,
                        why=args.why, mutant=args.mutant, directory=args.dir)
    except ValueError as e:
        print(f"regressions new: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}\n"
          f"run it:   pytest regressions -k {args.id} --fmha-kernel <your kernel>\n"
          f"prove it: the kill matrix test fails until the trap has a mutant that its case catches")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fmha.regressions", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the traps, their cases and mutants").set_defaults(run=_list)

    matrix = sub.add_parser("matrix", help="compute the kill matrix and write it as Markdown")
    matrix.add_argument("--fmha-device", choices=("cpu", "cuda"), default=None)
    matrix.add_argument("--fmha-kernel", action="append", default=[], metavar="NAME|module:attr",
                        help="correct kernels that must pass every case (default: the registry's for the device)")
    matrix.add_argument("--law-examples", type=int, default=6, help="hypothesis draws per law and mutant")
    matrix.add_argument("--jobs", type=int, default=1, help="mutants run in parallel processes")
    matrix.add_argument("--fresh", action="store_true",
                        help="recompute every row (default: reuse rows of OUT.json whose inputs did not change)")
    matrix.add_argument("--out", default="docs/kill-matrix.md")
    matrix.set_defaults(run=_matrix)

    new = sub.add_parser("new", help="scaffold a trap module from a reproducer")
    new.add_argument("id", help="kebab-case trap id, e.g. lse-base-two")
    new.add_argument("--reproducer", required=True,
                     help="the shrunk sample the property suite printed: 'Sample(problem=Problem(...), ...)' or 'Problem(...)'")
    new.add_argument("--seeds", required=True, help="where the bug is documented (seed log, issue, commit)")
    new.add_argument("--symptom", required=True, help="what a user sees")
    new.add_argument("--root-cause", required=True, help="what is wrong in the kernel (or 'unknown yet')")
    new.add_argument("--why", default="", help="what about the reproducer exposes the bug")
    new.add_argument("--mutant", default="", metavar="module:attr", help="a kernel with exactly this bug")
    new.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    new.set_defaults(run=_new)

    args = parser.parse_args(argv)
    if getattr(args, "dir", "") is None:
        from fmha.regressions.scaffold import TRAPS_DIR
        args.dir = TRAPS_DIR
    return args.run(args)

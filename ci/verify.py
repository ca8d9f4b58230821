"""Verify kernels against the float64 oracle from the command line: the README's main job.

    python -m fmha.ci.verify                                  # registry defaults for this device
    python -m fmha.ci.verify --fmha-kernel sdpa-math --fmha-kernel my_pkg.attn:fwd
    python -m fmha.ci.verify --json verify.json               # every result, for tools
    python -m fmha.ci.verify --calibrate --seeds 4            # worst metric values, for the tolerances

Three passes per kernel: agreement with the oracle on the feature cases (every dtype and
input distribution, --seeds seeds each); the named regression cases, each laid out inside the
kernel's limits where it still catches its bug; and a fast pass of the metamorphic laws,
contract v2's for a kernel that declares a paged or sparse source (--law-examples
derandomized draws each, unshrunk: `pytest --pyargs fmha` shrinks). Every run draws its values
from a fresh seed (--fmha-seed N draws a run's again), printed with the report. A kernel that raises
costs that case, recorded with its error, and the run goes on; a NotSupportedError is a
skip with the kernel's reason. Prints progress, a table, the findings grouped (identical
failures once, with their count and cases) and, per kernel, what it cannot run and why (its
to-do list); exits 1 if anything failed or raised.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from tqdm import tqdm

from fmha.ci import progress
from fmha.oracles import run_seed
from fmha.regressions.selection import command_line, parse, selected_kernels
from fmha.ci.gpu_runner import cuda_context_error
from fmha.ci.run_record import RunRecord, against_ledger, raised, signature
from fmha.contract import NotSupportedError
from fmha.oracles.check import judge_run
from fmha.oracles.kernel_call import run_kernel
from fmha.oracles.distributions import DISTRIBUTIONS
from fmha.contract import DTYPE_NAMES
from fmha.properties.catalog import LAWS
from fmha.properties.feature_cases import FEATURE_CASES, with_dtypes
from fmha.registry import MERGES
from fmha.regressions import cli, ledger
from fmha.regressions.traps import named_cases, run_named_case
from fmha.tables import Table

# Gated metric -> worse-is-larger value.
WORST = {
    "1-cos": lambda m: 1 - m.cos,
    "1-worst row cos": lambda m: 1 - m.worst_row_cos,
    "error ratio": lambda m: m.error_ratio,
    "worst row err": lambda m: m.worst_row_err,
    "ulp / conditioning": lambda m: m.max_ulp * m.output_floor / m.floor,
    "lse err": lambda m: m.lse_max_err if m.lse_max_err is not None else -math.inf,
}


def _reasons(message: str) -> list[str]:
    """A skip's reasons: its "; "-separated parts, not splitting inside a parenthesised note."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(message):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0 and message.startswith("; ", i):
            parts.append(message[start:i])
            start = i + 2
    return parts + [message[start:]]


def agreement(kernel, sample, device: str, worst=None) -> RunRecord:
    dtype = DTYPE_NAMES[sample.problem.dtype]
    reasons = kernel.not_supported_reasons(sample.problem, device)
    if reasons:
        return RunRecord(kernel.name, "agreement", sample.id, dtype, "skipped", "; ".join(reasons))
    try:
        verdict = judge_run(run_kernel(kernel, sample.inputs(device)), kernel=kernel)
    except NotSupportedError as e:
        return RunRecord(kernel.name, "agreement", sample.id, dtype, "skipped", f"raised NotSupportedError: {e}")
    except Exception as e:  # noqa: BLE001 -- a kernel that raises costs this case, not the run
        return raised(kernel.name, "agreement", sample.id, e, dtype=dtype)
    if worst is not None:
        row = worst[(kernel.name, dtype)]
        for column, value in WORST.items():
            row[column] = max(row[column], (value(verdict.metrics), sample.id))
    if verdict.passed:
        return RunRecord(kernel.name, "agreement", sample.id, dtype, "passed")
    # The same likely cause is the same finding, whichever checks it trips; without one, the
    # checks that failed are what identical findings share.
    shared = "; ".join(verdict.hints) or "fails " + ", ".join(f.split(":")[0] for f in verdict.failures)
    return RunRecord(kernel.name, "agreement", sample.id, dtype, "failed", verdict.message(f"{kernel.name} {sample.id}"),
                     signature(shared))


def _rest_in_a_fresh_process(argv, start_at: int, seed: int) -> list[RunRecord]:
    """Work items `start_at` onward, run by a fresh `verify` process at the same seed (which
    does the same if another item poisons its context): a kernel fault costs its case, not the run."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rest.json")
        command = [sys.executable, "-m", "fmha.ci.verify", *(sys.argv[1:] if argv is None else argv),
                   "--fmha-seed", str(seed), "--start-at", str(start_at), "--json", path]
        subprocess.run(command, stdout=subprocess.DEVNULL, check=False)
        if not os.path.exists(path):
            return [RunRecord("verify", "run", f"items {start_at}+", "", "raised",
                              f"the fresh process for the rest exited without results: {shlex.join(command)}",
                              "the fresh process exited")]
        with open(path) as f:
            return [RunRecord.from_json(r) for r in json.load(f)["results"]]


def named_case(kernel, trap, case, device: str) -> RunRecord:
    what, dtype = f"{trap.id}/{case.id}", DTYPE_NAMES[case.problem.dtype]
    try:
        outcome, message = run_named_case(kernel, trap, case, device)
    except NotSupportedError as e:
        outcome, message = "skipped", f"raised NotSupportedError: {e}"
    except Exception as e:  # noqa: BLE001 -- a kernel that raises costs this case, not the run
        return raised(kernel.name, "named cases", what, e, dtype=dtype)
    if outcome == "skipped":
        message = message.removeprefix(f"{kernel.name}, {trap.id}: ")
    return RunRecord(kernel.name, "named cases", what, dtype, outcome, message,
                     signature(f"{trap.id}: {message.splitlines()[-1]}") if outcome == "failed" else "")


def law_pass(kernel, law, device: str, examples: int) -> RunRecord:
    """The law on its covering set and a few derandomized draws, unshrunk (the covering array's
    calls are pytest's: `pytest --pyargs fmha` runs them)."""
    quick = settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                     phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False,
                     suppress_health_check=list(HealthCheck))
    try:
        law.run(device, kernel, MERGES["fmha"], settings=quick, pairs=False)
    except pytest.skip.Exception as e:
        return RunRecord(kernel.name, "laws", law.name, "", "skipped", e.msg.removeprefix(f"{kernel.name}: "))
    except AssertionError as e:
        notes = "\n".join(line for line in getattr(e, "__notes__", []) if line.startswith("pin it"))
        first = str(e).splitlines()[0]
        return RunRecord(kernel.name, "laws", law.name, "", "failed", f"{e}\n{notes}".strip(),
                         signature(f"{law.name}: {first.split(':', 1)[-1]}"))
    except Exception as e:  # noqa: BLE001 -- a kernel that raises costs this law, not the run
        return raised(kernel.name, "laws", law.name, e)
    return RunRecord(kernel.name, "laws", law.name, "", "passed")


def report(results: list[RunRecord], header: str) -> str:
    lines = [header, ""]
    counts = Counter((r.kernel, r.part, r.dtype, r.outcome) for r in results)
    groups = sorted({(r.kernel, r.part, r.dtype) for r in results}, key=lambda g: (g[0], g[1], g[2]))
    outcomes = ("passed", "failed", "raised", "skipped", "known", "fixed")
    table = Table(["kernel", "part", "dtype", *outcomes])
    for kernel, part, dtype in groups:
        table.add(kernel, part, dtype or "all", *(counts[(kernel, part, dtype, o)] for o in outcomes))
    lines.append(table.markdown())
    findings = defaultdict(list)
    for r in results:
        if r.bad:
            findings[(r.kernel, r.part, r.signature)].append(r)
    if findings:
        lines += ["", f"## Findings: {sum(map(len, findings.values()))} failing case(s), {len(findings)} distinct", ""]
        for i, ((kernel, part, _), found) in enumerate(sorted(findings.items(), key=lambda f: -len(f[1])), 1):
            cases = ", ".join(r.what for r in found[:6]) + (f", ... ({len(found)} in all)" if len(found) > 6 else "")
            lines += [f"### {i}. {kernel}, {part}: {len(found)} case(s) {found[0].outcome}: {cases}", "",
                      "```", found[0].message, "```", ""]
    todo = to_do(results)
    if todo:
        lines += ["", "## To do: what each kernel cannot run, and why", "", *todo]
    known = Counter((r.kernel, r.part, r.message) for r in results if r.outcome == "known")
    if known:
        lines += ["", "## Known failures (the ledger)", ""]
        lines += [f"- {kernel}, {n} {part} case(s): {why}" for (kernel, part, why), n in sorted(known.items())]
    return "\n".join(lines) + "\n"


def to_do(results: list[RunRecord]) -> list[str]:
    """Each kernel's skips by reason, the reason a kernel gives most first: one line per
    missing capability with what it keeps from running (a skip with several reasons counts
    under each; reasons that differ only in their numbers, Hq=2 and Hq=4, are one line)."""
    blocked = defaultdict(lambda: defaultdict(dict))  # kernel -> reason's shape -> {reason: skipped results}
    for r in results:
        if r.outcome == "skipped":
            for reason in _reasons(r.message):
                blocked[r.kernel][signature(reason)].setdefault(reason, []).append(r)
    lines = []
    for kernel, shapes in sorted(blocked.items()):
        for variants in sorted(shapes.values(), key=lambda v: -sum(map(len, v.values()))):
            skipped = [r for found in variants.values() for r in found]
            parts = Counter(r.part for r in skipped)
            traps = sorted({r.what.split("/")[0] for r in skipped if r.part == "named cases"})
            what = ", ".join(f"{n} {part}" + (f" ({', '.join(traps)})" if part == "named cases" else "")
                             for part, n in sorted(parts.items()))
            reason = max(variants, key=lambda text: len(variants[text]))
            others = f" (and {len(variants) - 1} more like it)" if len(variants) > 1 else ""
            lines.append(f"- {kernel}: {reason}{others}: {what}")
    return lines


def reruns(results: list[RunRecord], args) -> str:
    """The command that reruns each failure alone, last, where a CI log's reader looks."""
    bad = [r for r in results if r.bad]
    if not bad:
        return ""
    common = [f"--fmha-device {args.fmha_device}", f"--fmha-seed {args.fmha_seed}"]
    common += [f"--seeds {args.seeds}"] if args.seeds != 1 else []
    common += [f"--law-examples {args.law_examples}"] if args.law_examples != 3 else []
    common += [f"--fmha-known-failures {shlex.quote(args.fmha_known_failures)}"] if args.fmha_known_failures else []
    findings = defaultdict(list)  # identical findings: one command, the count of the others
    for r in bad:
        findings[(r.kernel, r.part, r.outcome, r.signature)].append(r)
    lines = ["", f"## Rerun a failure ({len(bad)} failing, {len(findings)} distinct)", ""]
    for (kernel, part, outcome, _), found in findings.items():
        more = f" (and {len(found) - 1} more like it)" if len(found) > 1 else ""
        lines.append(f"python -m fmha.ci.verify --fmha-kernel {shlex.quote(kernel)} {' '.join(common)} "
                     f"--only {shlex.quote(found[0].what)}    # {part} {outcome}{more}")
    return "\n".join(lines) + "\n"


def what_ran(results: list[RunRecord], law_examples: int) -> str:
    """Per part, how many of its items ran (the rest were skipped, the kernels' reasons in the
    to-do list)."""
    parts = []
    for part in ("agreement", "named cases", "laws"):
        mine = [r for r in results if r.part == part]
        if mine:
            ran = sum(r.outcome != "skipped" for r in mine)
            parts.append(f"{part}: {ran} of {len(mine)} ran" + (f" ({law_examples} draws each)" if part == "laws" else ""))
    return "; ".join(parts).capitalize() + "." if parts else "Nothing ran."


def calibration(worst: dict) -> str:
    table = Table(["kernel", "dtype", *WORST])
    for (name, dtype), row in worst.items():
        table.add(name, dtype, *(f"{v:.3g}" if v > -math.inf else "—" for v, _ in row.values()))
    where = [f"  {name} {dtype} {column}: {v:.3g} ({at})" for (name, dtype), row in worst.items()
             for column, (v, at) in row.items()]
    return table.markdown() + "\n\nWhere each worst value came from:\n" + "\n".join(where) + "\n"


def main(argv=None) -> int:
    parser = command_line(__doc__)
    parser.add_argument("--seeds", type=int, default=1, help="seeds per agreement case (default 1)")
    parser.add_argument("--fmha-seed", type=int, default=None, metavar="N",
                        help="the run's seed, which every sample's values are drawn from (default: $FMHA_SEED, else "
                             "a fresh one, printed in the report and in every rerun command)")
    parser.add_argument("--law-examples", type=int, default=3, help="draws per law; 0 skips the laws (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write every result as JSON")
    parser.add_argument("--fmha-known-failures", metavar="FILE", help="a TOML file of your kernels' known failures")
    parser.add_argument("--calibrate", action="store_true", help="print the worst value of each gated metric")
    parser.add_argument("--start-at", type=int, default=0, help=argparse.SUPPRESS)  # a fresh process's share
    parser.add_argument("--only", action="append", default=[], metavar="CASE|TRAP/CASE|LAW",
                        help="run only this agreement case, named case or law (repeatable): the rerun commands use it")
    args = parse(parser, argv)
    kernels = selected_kernels(parser, args)
    device = args.fmha_device
    cli.hypothesis_files_out_of_the_current_directory()
    if args.fmha_seed is None:
        args.fmha_seed = int(os.environ.get(run_seed.ENVIRONMENT) or run_seed.fresh())
    try:
        known = ledger.LEDGER + (ledger.load_known_failures(args.fmha_known_failures) if args.fmha_known_failures else ())
    except ValueError as e:
        parser.error(str(e))

    cases = [s.replace(distribution=d, seed=seed) for s in with_dtypes(FEATURE_CASES)
             for d in DISTRIBUTIONS for seed in range(args.seeds)]
    law_list = [law for law in LAWS.values() if law.draws != "merge"] if args.law_examples > 0 and not args.calibrate else []
    named = [] if args.calibrate else named_cases()
    if args.only:
        unknown = (set(args.only) - {s.id for s in cases} - {law.name for law in law_list}
                   - {f"{trap.id}/{case.id}" for trap, case in named})
        if unknown:
            parser.error(f"--only: no agreement case, named case or law named {sorted(unknown)} (their names are in "
                         "the report)")
        cases = [s for s in cases if s.id in args.only]
        named = [(trap, case) for trap, case in named if f"{trap.id}/{case.id}" in args.only]
        law_list = [law for law in law_list if law.name in args.only]
    worst = defaultdict(lambda: {c: (-math.inf, "") for c in WORST}) if args.calibrate else None
    # (what, the pytest test a ledger record names, the step): one flat list, so that a fresh
    # process can take over from any item
    work = [(kernel.name, f"{kernel.name} {what}", test, step) for kernel in kernels for what, test, step in (
        *((s.id, "test_kernel_matches_oracle", functools.partial(agreement, kernel, s, worst=worst)) for s in cases),
        *((f"{trap.id}/{case.id}", "test_named_regression_case", functools.partial(named_case, kernel, trap, case))
          for trap, case in named),
        *((law.name, law.test, functools.partial(law_pass, kernel, law, examples=args.law_examples))
          for law in law_list))]
    results = []
    total, start, now = len(work), time.monotonic(), [""]

    def line() -> str:  # piped output (a CI log) gets this every few seconds instead of tqdm's bar
        return (f"fmha verify: {len(results)}/{total} done in {progress.elapsed(time.monotonic() - start)}, "
                f"{sum(r.bad for r in results)} failed; now {now[0]}")

    with (tqdm(total=total, initial=args.start_at, unit="case", file=sys.stderr, disable=None) as bar,
          progress.Ticker(0 if sys.stderr.isatty() else progress.EVERY_S, line,
                          lambda text: print(text, file=sys.stderr, flush=True))):
        for index in range(args.start_at, len(work)):
            kernel_name, now[0], test, step = work[index]
            bar.set_postfix_str(now[0][:60])
            run_seed.use(run_seed.for_kernel(args.fmha_seed, kernel_name))  # as the pytest plugin draws
            result = step(device).replace(test=test)
            results.append(against_ledger(result, known, device, test))
            bar.update()
            poisoned = device == "cuda" and result.outcome == "raised" and cuda_context_error()
            if poisoned:  # the CUDA context is gone: the rest runs in a fresh process
                results[-1].message += f" (it left the CUDA context unusable: {poisoned}; the rest ran in a fresh process)"
                results += _rest_in_a_fresh_process(argv, index + 1, args.fmha_seed)
                break

    device_name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    header = (f"# fmha verify, {datetime.date.today()}, {device_name}, torch {torch.__version__}\n\n"
              + what_ran(results, law_examples=args.law_examples) + (f" Only {', '.join(args.only)}." if args.only else "")
              + f" Values drawn at seed {args.fmha_seed} (--fmha-seed {args.fmha_seed} draws them again).")
    print(calibration(worst) if args.calibrate else report(results, header) + reruns(results, args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(header=header, device=device, results=[r.to_json() for r in results]), f, indent=1)
    return 1 if any(r.bad for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

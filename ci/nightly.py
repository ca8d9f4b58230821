"""The nightly gate: every kernel on the 72-config grid and the DSV4 sparse-decode grid must
reach cosine >= 0.999998.

    python -m fmha.ci.nightly [--fmha-kernel NAME|module:attr ...] [--compare NAME|installed ...] [--out DIR]
                              [--seeds N] [--head-dims D ...] [--shard I/N]
    python -m fmha.ci.nightly merge SHARD_DIR ... [--out DIR]

It gates the kernels selected as in pytest, fmha's own when none is (`fmha`, and on CUDA its
CUDA C++ kernels: `cuda-sparse`); --compare adds
kernels whose rows are reported and never gated. For each kernel it runs the grid x
layouts (MHA, GQA, MQA with K = V) x every dtype, and the 96 sparse-decode configs
(properties/grid.py), x distributions (normal, peaky, flat) x seeds, each dtype the kernel does
not declare a skip with its reason, against the float64 oracle (over the dequantized
keys for quantized caches) and records global and worst-row cosine, error ratio and LSE error. The gate
is the global cosine of every run, with every output element written and finite (the cosine is
taken over the finite elements alone). Writes DIR/results.json (atomically), DIR/summary.md and
DIR/index.html (the threshold, failing configs first, per kernel a trend over the nights of
DIR/history.jsonl and heatmaps of both grids), DIR/junit.xml (one test case per kernel and
config), compares with the previous DIR/results.json and lists what got worse; exits 1 when
any run is below the gate.
On a machine without CUDA it runs a reduced slice through the Triton interpreter (every
head dim, decode shapes; two sparse configs; each layout and dtype of a config in one
distribution, rotated so that every layout and every dtype meets every distribution) so the
command works anywhere.

Over N runners: each runs `--shard I/N --out DIR_I` (every N-th grid case from the I-th: the same
N, the same parts), then `merge DIR_1 ... DIR_N --out DIR` joins their runs into one report, in
the unsharded run's order (results.json, summary.md, index.html, junit.xml, one history.jsonl
line per kernel), with their sanitize.json and pytest-junit.xml joined beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from xml.etree import ElementTree

import torch

from tqdm import tqdm

from fmha import registry
from fmha.regressions import ledger
from fmha.regressions.selection import command_line, parse, resolve_kernel, selected_kernels
from fmha.ci import journal, report_html, shards
from fmha.ci.gate_child import GateChild
from fmha.ci.gate_judge import GATE, judged, skipped
from fmha.ci import progress as progress_lines
from fmha.ci.run_record import RunRecord, against_ledger
from fmha.contract import DTYPE_NAMES
from fmha.properties.grid import GRID, LAYOUTS, SPARSE_GRID, config_id, grid_id, grid_problem, sparse_id
from fmha.tables import Table

SPARSE_LAYOUT = report_html.SPARSE
DISTRIBUTIONS = ("normal", "peaky", "flat")
GATE_TEST = "nightly:gate"  # what a known-failure record names for a grid case's runs (its `case`: the case's id)
RUNS = "runs.jsonl"  # each shard's journal: the night's plan, then every run as it finishes
NOT_RUN = "not run: no process finished it (its shard was killed, or is missing from the merge)"
# The bound on one run in the gate's child process (--run-timeout), its kernel's first call
# included: a Triton or Gluon compile takes seconds, and the CUDA kernel's first call builds it
# where `python -m fmha.kernels.build` has not (nvcc, 60-90 s); the CPU interpreter's slowest
# slice run (head dim 512, 640 keys) takes a few seconds. A hang costs its config this long.
RUN_TIMEOUT_S = 180.0
# CPU slice: every head dim, decode shapes, the boundary configs; of the sparse grid, Hq 64,
# T 1, 128 + 512 keys in pages of 64 with a sink, the second scope in FP8 and in FP4.
CPU_SLICE = {(1, 128), (4, 128), (1, 100), (4, 640)}
CPU_SPARSE_SLICE = {"dsv4-h64-T1-topk128+512-block64-fp8-sink", "dsv4-h64-T1-topk128+512-block64-fp4-sink"}


def cases(configs, sparse_configs) -> list[tuple]:
    """(problem, the case's id, where it sits in the grids) of every grid case: configs x
    layouts x dtypes, then the sparse ones (bf16 queries: their caches are quantized)."""
    dense = [(grid_problem(c, layout, dtype), grid_id(c, layout, dtype),
              dict(config=config_id(c), head_dim=c.head_dim, q_len=c.q_len, kv_len=c.kv_len, layout=layout))
             for c in configs for layout in LAYOUTS for dtype in DTYPE_NAMES]
    sparse = [(p, sparse_id(p), dict(config=sparse_id(p), head_dim=p.head_dim, q_len=p.q_len,
                                     kv_len=p.kv_len + p.extra_topk, layout=SPARSE_LAYOUT)) for p in sparse_configs]
    return dense + sparse


def _distributions(problem, where: dict, every: bool) -> tuple[str, ...]:
    """Every distribution, or (the CPU slice) one a dense case's layout and dtype rotate through:
    over a config's layouts and dtypes each layout and each dtype meets every distribution."""
    if every or where["layout"] == SPARSE_LAYOUT:
        return DISTRIBUTIONS
    turn = list(LAYOUTS).index(where["layout"]) + list(DTYPE_NAMES).index(problem.dtype)
    return (DISTRIBUTIONS[turn % len(DISTRIBUTIONS)],)


def planned_runs(kernels, seeds: int, grid_cases, every_distribution: bool = True) -> list[tuple]:
    """(kernel, problem, record) of every run: kernels x grid cases x distributions x seeds, each
    record not yet run."""
    return [(kernel, problem, RunRecord(kernel.name, "gate", case, DTYPE_NAMES[problem.dtype], outcome="not_run",
                                        message=NOT_RUN, where=dict(where, distribution=distribution, seed=seed)))
            for kernel in kernels for problem, case, where in grid_cases
            for distribution in _distributions(problem, where, every_distribution) for seed in range(seeds)]


def run_gate(kernels, device: str, seeds: int, grid_cases, progress=True, judge=None, on_record=None,
             known=(), every_distribution: bool | None = None) -> list[RunRecord]:
    """One record per run, each given to `on_record` as it is made. `judge(kernel, problem, record)`
    runs one (default: in this process, `judged`; the command runs each in a child process that a
    hang or a crash costs one run, fmha.ci.gate_child). A kernel that raises (or returns the wrong
    shape, or ignores out=) gets that run recorded with the error, and the gate goes on; a
    NotSupportedError for a call its capabilities admit is a skip with its reason, as in pytest
    and verify. A run the `known` records (test "nightly:gate", the grid case's id) cover is
    known when it fails and fixed when it passes. Every distribution runs on a GPU, one a case
    on the CPU (`every_distribution` says otherwise)."""
    judge = judge or (lambda kernel, problem, record: judged(kernel, problem, record, device))
    records = []
    every = device != "cpu" if every_distribution is None else every_distribution
    runs = planned_runs(kernels, seeds, grid_cases, every)
    start = time.monotonic()

    def line() -> str:  # piped stderr (a CI log) gets this every few seconds instead of tqdm's bar
        now = f"{records[-1].kernel} {records[-1].what}" if records else "starting"
        took = progress_lines.elapsed(time.monotonic() - start)
        return (f"fmha nightly: {len(records)}/{len(runs)} runs in {took}, "
                f"{sum(r.bad for r in records)} below the gate or raised; last {now}")

    piped = progress and not sys.stderr.isatty()
    with progress_lines.Ticker(progress_lines.EVERY_S if piped else 0, line,
                               lambda text: print(text, file=sys.stderr, flush=True)):
        for kernel, problem, record in tqdm(runs, unit="run", file=sys.stderr, disable=None if progress else True):
            done = skipped(kernel, problem, record, device) or judge(kernel, problem, record)
            records.append(against_ledger(done, known, device, GATE_TEST))
            if on_record is not None:
                on_record(records[-1])
    return records


@dataclass
class KernelTally:
    """One kernel's runs and what the gate makes of them (the Markdown and HTML reports)."""

    runs: list[RunRecord]
    allow_no_runs: bool = False  # a gated kernel that ran nothing passes (--allow-no-runs)

    @property
    def ran(self) -> list[RunRecord]:
        return [r for r in self.runs if r.returned]

    @property
    def below(self) -> list[RunRecord]:
        """Runs below the gate, and runs a known-failure record covers that passed (fixed)."""
        return [r for r in self.ran if r.outcome in ("failed", "fixed")]

    @property
    def known(self) -> list[RunRecord]:
        """Failures a record of the ledger covers: reported, never gated on."""
        return [r for r in self.runs if r.outcome == "known"]

    @property
    def errors(self) -> list[RunRecord]:
        """Runs where the kernel raised instead of returning an answer."""
        return [r for r in self.runs if r.outcome == "raised"]

    @property
    def skipped(self) -> list[RunRecord]:
        return [r for r in self.runs if r.outcome == "skipped"]

    @property
    def not_run(self) -> list[RunRecord]:
        """Runs planned that no process finished (a shard killed, or missing from a merge)."""
        return [r for r in self.runs if r.outcome == "not_run"]

    @property
    def ran_nothing(self) -> bool:
        """No run returned an answer: the gate has nothing to pass it on."""
        return not self.ran and not self.allow_no_runs

    @property
    def gated(self) -> bool:
        """Its runs decide the exit status (a --compare kernel's are only reported)."""
        return all(r.gated for r in self.runs)

    @property
    def failing(self) -> bool:
        return bool(self.below or self.errors or self.not_run) or self.ran_nothing

    @property
    def by_config(self) -> dict[str, list[RunRecord]]:
        """Its runs per grid config (layouts, distributions and seeds)."""
        found = defaultdict(list)
        for r in self.runs:
            found[r.where["config"]].append(r)
        return found

    @property
    def failing_by_config(self) -> dict[str, list[RunRecord]]:
        """The runs below the gate, that raised or that no process finished, per config that has any."""
        failing = {id(r) for r in self.below + self.errors + self.not_run}
        return {c: bad for c, runs in self.by_config.items() if (bad := [r for r in runs if id(r) in failing])}

    @property
    def configs(self) -> set[str]:
        return {r.where["config"] for r in self.runs}

    @property
    def configs_at_gate(self) -> set[str]:
        """Configs the kernel ran, every run at the gate."""
        return {r.where["config"] for r in self.ran} - {r.where["config"]
                                                         for r in self.below + self.errors + self.not_run}


def tally(records: list[RunRecord], allow_no_runs: bool = False) -> dict[str, KernelTally]:
    by_kernel = defaultdict(list)
    for r in records:
        by_kernel[r.kernel].append(r)
    return {kernel: KernelTally(runs, allow_no_runs) for kernel, runs in by_kernel.items()}


def summarize(records: list[RunRecord], previous: list[RunRecord] | None, header: str,
              allow_no_runs: bool = False) -> tuple[str, bool]:
    lines = [header, "", f"Gate: global cosine >= {GATE} against the float64 oracle, every run, with every output "
             "element written and finite.", ""]
    table = Table(["kernel", "gated", "configs at gate", "runs", "raised", "skipped", "not run", "cos min",
                   "cos median"])
    failing_lines = []
    tallies = tally(records, allow_no_runs)
    for kernel, t in tallies.items():
        cos = [r.metrics["cos"] for r in t.ran if r.metrics["cos"] is not None]
        table.add(kernel, "yes" if t.gated else "no (--compare)", f"{len(t.configs_at_gate)}/{len(t.configs)}",
                  len(t.ran), len(t.errors), len(t.skipped), len(t.not_run),
                  f"{min(cos):.7f}" if cos else "-", f"{statistics.median(cos):.7f}" if cos else "-")
        where = kernel if t.gated else f"{kernel} (compared, not gated)"
        if t.ran_nothing:
            failing_lines.append(f"- {where}: no run returned an answer ({len(t.skipped)} skipped, {len(t.errors)} "
                                 f"raised, {len(t.not_run)} not run): the gate does not pass a kernel it did not run "
                                 "(--allow-no-runs accepts it)")
        failing_lines += [f"- {where} {r.run_id}: {r.message}" for r in t.below]
        failing_lines += [f"- {where} {r.run_id}: raised {r.message}" for r in t.errors]
        failing_lines += [f"- {where} {r.run_id}: {r.message}" for r in t.not_run]
    lines.append(table.markdown())
    any_fail = any(t.gated and t.failing for t in tallies.values())
    if failing_lines:
        lines += ["", f"## Below the gate, raised or not run ({len(failing_lines)})", ""] + failing_lines[:200]
        if len(failing_lines) > 200:
            lines.append(f"- ... {len(failing_lines) - 200} more in results.json")
    skipped = defaultdict(set)
    for r in records:
        if r.outcome == "skipped":
            skipped[r.kernel, r.message].add(r.what)
    known = [f"- {kernel} {r.run_id}: {r.message}" for kernel, t in tallies.items() for r in t.known]
    if known:
        lines += ["", f"## Known failures ({len(known)} runs the ledger's records cover: not gated on)", ""]
        lines += known[:100] + ([f"- ... {len(known) - 100} more in results.json"] if len(known) > 100 else [])
    if skipped:
        lines += ["", "## Skipped (the kernel's reasons)", ""]
        lines += [f"- {k}, {len(cases)} case(s) ({sorted(cases)[0]}{', ...' if len(cases) > 1 else ''}): {why}"
                  for (k, why), cases in sorted(skipped.items())[:100]]
    if previous is not None:
        lines += ["", "## Compared with the previous results", ""] + _regressions(records, previous)
    return "\n".join(lines) + "\n", any_fail


def _key(r: RunRecord):
    return (r.kernel, r.what, r.where["distribution"], r.where["seed"])


def _regressions(records: list[RunRecord], previous: list[RunRecord]) -> list[str]:
    before = {_key(r): r for r in previous if r.returned and r.metrics["cos"] is not None}
    worse = []
    for r in records:
        old = before.get(_key(r))
        if old is None or not r.returned or r.metrics["cos"] is None:
            continue
        was, now = old.metrics["cos"], r.metrics["cos"]
        if old.outcome == "passed" and r.outcome != "passed":
            worse.append(f"- {r.kernel} {r.run_id}: now below the gate ({was:.7f} -> {now:.7f})")
        elif (1 - now) > 1.5 * (1 - was) + 1e-9:
            worse.append(f"- {r.kernel} {r.run_id}: 1-cos grew {1 - was:.2e} -> {1 - now:.2e}")
    return worse or ["- nothing got worse"]


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())  # on the disk before it replaces the old file
    # mkstemp makes the file 0600: a report is read by whoever the CI server serves it to
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def _compared(parser, args, gated: list) -> list[tuple]:
    """--compare NAME|installed: (kernel, its spec) of kernels reported beside the gated ones,
    never gated."""
    names = {k.name for k, _ in gated}
    found = []
    for spec in args.compare:
        if spec == "installed":
            found += [(k, k.name) for k in registry.installed_kernels(args.fmha_device)]
        else:
            try:
                found.append((resolve_kernel(spec), spec))
            except ValueError as e:
                parser.error(str(e).replace("--fmha-kernel", "--compare"))
    return list({k.name: (k, spec) for k, spec in found if k.name not in names}.values())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["merge"]:
        return merge(argv[1:])
    parser = command_line(__doc__, default_kernels="fmha (fmha.attention), and on CUDA fmha's CUDA C++ kernels")
    parser.add_argument("--compare", action="append", default=[], metavar="NAME|module:attr|installed",
                        help="report these kernels beside the gated ones, without gating them (repeatable; "
                             "'installed': every registered kernel that runs here)")
    parser.add_argument("--out", type=Path, default=Path("nightly-report"))
    parser.add_argument("--seeds", type=int, default=None, help="default: 3 on CUDA, 1 on CPU")
    parser.add_argument("--full-grid", action="store_true", help="on CPU too (slow through the interpreter)")
    parser.add_argument("--head-dims", type=int, nargs="+", metavar="D",
                        help="only these head dims of the grids (triage); the sparse grid is head dim 512")
    parser.add_argument("--report-only", action="store_true",
                        help="only re-render summary.md and index.html from DIR/results.json")
    parser.add_argument("--run-timeout", type=float, default=None, metavar="S",
                        help="seconds one run may take, its kernel's first call (a compile, a build) included, "
                             f"before its process is killed and the run recorded as hung (default: {RUN_TIMEOUT_S:g})")
    parser.add_argument("--allow-no-runs", action="store_true",
                        help="pass a gated kernel none of whose runs returned an answer (every one skipped)")
    parser.add_argument("--fmha-known-failures", default=None, metavar="FILE",
                        help=f"a TOML file of known failures of your kernels: records with test = '{GATE_TEST}' and "
                             "case = a grid case's id (or a glob) make those runs known, not failing")
    shards.add_option(parser, "the grid cases")
    args = parse(parser, argv)
    try:
        known = ledger.LEDGER + (ledger.load_known_failures(args.fmha_known_failures) if args.fmha_known_failures
                                 else ())
    except ValueError as e:
        parser.error(str(e))
    if args.report_only:
        saved = json.loads((args.out / "results.json").read_text())
        return _report(_records(saved), None, saved["header"], args.out, None, args.allow_no_runs)
    gated = (list(zip(selected_kernels(parser, args), args.fmha_kernel)) if args.fmha_kernel
             else [(k, k.name) for k in default_gated(args.fmha_device)])
    kernels = gated + _compared(parser, args, gated)
    reduced = args.fmha_device == "cpu" and not args.full_grid
    configs = [c for c in GRID if (c.q_len, c.kv_len) in CPU_SLICE] if reduced else list(GRID)
    sparse = [p for p in SPARSE_GRID if sparse_id(p) in CPU_SPARSE_SLICE] if reduced else list(SPARSE_GRID)
    if args.head_dims:
        configs = [c for c in configs if c.head_dim in args.head_dims]
        sparse = [p for p in sparse if p.head_dim in args.head_dims]
    seeds = args.seeds or (1 if args.fmha_device == "cpu" else 3)
    # Each case keeps its place in the whole grid: a merge of shards puts the runs back in order.
    whole = [(p, case, dict(where, case_index=i)) for i, (p, case, where) in enumerate(cases(configs, sparse))]
    grid = args.shard.take(whole)
    gated_names = {k.name for k, _ in gated}
    entries = [k for k, _ in kernels]
    device_name = torch.cuda.get_device_name() if args.fmha_device == "cuda" else "CPU (Triton interpreter)"
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
    part = f", shard {args.shard} ({len(grid)} of the grid cases)" if args.shard.count > 1 else ""
    header = (f"# Nightly gate, {now} UTC\n\n"
              f"{device_name}, torch {torch.__version__}; {len(configs)} configs"
              f"{' (CPU slice)' if reduced else ''} x layouts {', '.join(LAYOUTS)} x {', '.join(DTYPE_NAMES.values())} "
              f"(B=2, Hq=8, causal) and {len(sparse)} DSV4 sparse-decode configs, x "
              f"{'one of ' if reduced else ''}{', '.join(DISTRIBUTIONS)} x {seeds} seed(s){part}.\n\n"
              f"Command: python -m fmha.ci.nightly {' '.join(argv)}")
    shard = [args.shard.index, args.shard.count]
    # The whole night's runs, in every shard's journal: a merge names those no shard finished.
    plan = [r.replace(gated=r.kernel in gated_names).to_json() for _, _, r in planned_runs(entries, seeds, whole, not reduced)]
    specs = {k.name: spec for k, spec in kernels}
    bound = args.run_timeout or RUN_TIMEOUT_S
    try:
        with journal.one_writer(args.out), journal.Journal(args.out / RUNS) as runs, \
                GateChild(args.fmha_device, bound) as child:
            runs.add(dict(header=header, device=device_name, torch=torch.__version__, shard=shard, plan=plan))

            def isolated(kernel, problem, record):
                return child.judge(specs[kernel.name], problem, record)

            records = [r.replace(gated=r.kernel in gated_names)
                       for r in run_gate(entries, args.fmha_device, seeds, grid, judge=isolated,
                                         on_record=lambda r: runs.add(dict(record=r.to_json())), known=known,
                                         every_distribution=not reduced)]
            status = _write(records, header, args.out, device_name, now, shard=shard, allow_no_runs=args.allow_no_runs)
            runs.add(dict(finished=True))  # results.json is this night's
            return status
    except journal.FolderBusy as e:
        parser.error(str(e))


def default_gated(device: str) -> list:
    """What the gate judges when no kernel is named: fmha.attention, and on CUDA fmha's CUDA C++
    kernels, which it runs first where they are built."""
    return [registry.KERNELS["fmha"]] + [k for k in registry.COMPILED if device in k.default_devices]


def _write(records: list[RunRecord], header: str, out: Path, device_name: str, now: str, shard=None,
           allow_no_runs: bool = False) -> int:
    """results.json (atomically), then the reports (`_report`), compared with the previous results."""
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    previous = _records(json.loads(results_path.read_text())) if results_path.exists() else None
    write_atomically(results_path, json.dumps(dict(device=device_name, torch=torch.__version__, gate=GATE,
                                                   header=header, shard=shard, records=[r.to_json() for r in records]),
                                              indent=1, default=_json_safe))
    return _report(records, previous, header, out, now, allow_no_runs)


def merge(argv: list[str]) -> int:
    """`merge SHARD_DIR ... --out DIR`: the shards' runs as one night's report. A shard killed
    before its report gives the runs its journal kept; runs no shard finished (a shard missing
    altogether, or cut short) are "not run", and the night fails."""
    parser = argparse.ArgumentParser(prog="python -m fmha.ci.nightly merge",
                                     description="Join the reports of a nightly's shards (--shard I/N) into one.")
    parser.add_argument("shards", nargs="+", type=Path, metavar="SHARD_DIR", help="each shard's --out")
    parser.add_argument("--out", type=Path, default=Path("nightly-report"))
    parser.add_argument("--allow-no-runs", action="store_true",
                        help="pass a gated kernel none of whose runs returned an answer (every one skipped)")
    args = parser.parse_args(argv)
    try:
        with journal.one_writer(args.out):
            return _merge(parser, args, argv)
    except journal.FolderBusy as e:
        parser.error(str(e))


def _shard_part(directory: Path) -> dict | None:
    """A shard's results.json with the night's plan from its journal, or, from a shard killed
    before its report (its journal not finished: a results.json there is an earlier night's), the
    journal alone: every run it finished. None: neither is there."""
    runs = journal.read_journal(directory / RUNS) if (directory / RUNS).exists() else []
    started = runs[0] if runs and "plan" in runs[0] else {}
    finished = not runs or "finished" in runs[-1]
    if finished and (directory / "results.json").exists():
        return dict(json.loads((directory / "results.json").read_text()), plan=started.get("plan"))
    if not started:
        return None
    return dict(started, records=[e["record"] for e in runs[1:] if "record" in e], cut_short=True)


def _merge(parser, args, argv: list[str]) -> int:
    parts = {directory: _shard_part(directory) for directory in args.shards}
    found = [part for part in parts.values() if part is not None]
    if not found:
        parser.error(f"expected a shard's report folder (its results.json or {RUNS}), found none in "
                     f"{', '.join(map(str, args.shards))}")
    shards_found = sorted(tuple(p.get("shard") or (1, 1)) for p in found)
    count = shards_found[0][1]
    if len(set(shards_found)) != len(shards_found) or any(n != count or not 1 <= i <= count for i, n in shards_found):
        parser.error(f"expected shards 1/{count} to {count}/{count} once each, got "
                     f"{', '.join(f'{i}/{n}' for i, n in shards_found)}")
    plan = next((p["plan"] for p in found if p.get("plan")), None)
    if plan is None and len(found) < count:
        parser.error(f"expected shards 1/{count} to {count}/{count} once each, got "
                     f"{', '.join(f'{i}/{n}' for i, n in shards_found)} (and no journal naming the night's runs)")
    records = [r for p in found for r in _records(p)]
    done = {_key(r) for r in records}
    records += [r for r in map(RunRecord.from_json, plan or []) if _key(r) not in done]
    first = min(found, key=lambda p: tuple(p.get("shard") or (1, 1)))
    kernels = list(dict.fromkeys(r["kernel"] for r in plan or []) or dict.fromkeys(r.kernel for r in records))
    records.sort(key=lambda r: (kernels.index(r.kernel) if r.kernel in kernels else len(kernels),
                                r.where.get("case_index", 0), DISTRIBUTIONS.index(r.where["distribution"]),
                                r.where["seed"]))
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
    header = re.sub(r", shard \d+/\d+ \(\d+ of the grid cases\)", f", {count} shards merged", first["header"])
    missing = [str(d) for d, p in parts.items() if p is None] + [f"shard {p['shard'][0]}/{count} (cut short)"
                                                                for p in found if p.get("cut_short")]
    header += (f" (shard {first['shard'][0] if first.get('shard') else 1} of {count}), merged by: "
               f"python -m fmha.ci.nightly merge {' '.join(argv)}")
    if missing or len(found) < count:
        header += f"\n\nNot all shards finished: {', '.join(missing) or 'some shards were not given'}."
    _join_beside(args.shards, args.out)
    return _write(records, header, args.out, first["device"], now, allow_no_runs=args.allow_no_runs)


def _join_beside(shard_dirs: list[Path], out: Path) -> None:
    """The shards' sanitize.json (findings and skips together) and pytest-junit.xml (their
    test suites in one file), where they have them."""
    sanitized = [json.loads((d / "sanitize.json").read_text()) for d in shard_dirs if (d / "sanitize.json").exists()]
    if sanitized:
        joined = dict(findings=[f for s in sanitized for f in s["findings"]], skipped=[k for s in sanitized for k in s["skipped"]])
        write_atomically(out / "sanitize.json", json.dumps(joined, indent=1))
    suites = []
    for d in shard_dirs:
        if (d / "pytest-junit.xml").exists():
            root = ElementTree.parse(d / "pytest-junit.xml").getroot()
            suites += [root] if root.tag == "testsuite" else list(root)
    if suites:
        joined = ElementTree.Element("testsuites")
        joined.extend(suites)
        write_atomically(out / "pytest-junit.xml", ElementTree.tostring(joined, encoding="unicode"))


def _records(results: dict) -> list[RunRecord] | None:
    """The run records of a results.json (None: one written in another format, which the
    comparison with the previous night then leaves out)."""
    try:
        return [RunRecord.from_json(r) for r in results["records"]]
    except (KeyError, TypeError, ValueError):
        return None


def _report(records: list[RunRecord], previous: list[RunRecord] | None, header: str, out: Path,
            time: str | None, allow_no_runs: bool = False) -> int:
    """summary.md, index.html, junit.xml; `time`: this night's, appended to history.jsonl
    (None: re-rendering a night already there)."""
    summary, failed = summarize(records, previous, header, allow_no_runs)
    write_atomically(out / "summary.md", summary)
    tallies = tally(records, allow_no_runs)
    history_path = out / "history.jsonl"
    history = report_html.read_history(history_path)
    if time is not None:
        if not history and previous is not None:  # a report folder from before history.jsonl
            stamp = datetime.datetime.fromtimestamp((out / "results.json").stat().st_mtime, datetime.timezone.utc)
            history = report_html.night(tally(previous), f"{stamp:%Y-%m-%d %H:%M}")
        history += report_html.night(tallies, time)
        write_atomically(history_path, "".join(json.dumps(h) + "\n" for h in history))
    regressions = _regressions(records, previous) if previous is not None else []
    page = report_html.write_page(tallies, GATE, header, regressions, history, out)
    write_atomically(out / "junit.xml", report_html.junit(tallies, GATE))
    print(summary)
    print(f"report: {page}", file=sys.stderr)
    return 1 if failed else 0


def _json_safe(x):
    return None if isinstance(x, float) and not math.isfinite(x) else str(x)


if __name__ == "__main__":
    sys.exit(main())

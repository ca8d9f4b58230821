"""The nightly gate: every kernel on the 72-config grid and the DSV4 sparse-decode grid must
reach cosine >= 0.999998.

    python -m fmha.ci.nightly [--fmha-kernel NAME|module:attr ...] [--compare NAME|installed ...] [--out DIR]
                              [--seeds N] [--head-dims D ...] [--shard I/N]
    python -m fmha.ci.nightly merge SHARD_DIR ... [--out DIR]

It gates the kernels selected as in pytest, fmha's own when none is (`fmha`, and on CUDA its
CUDA C++ kernels: `cuda-sparse`); --compare adds
kernels whose rows are reported and never gated. For each kernel it runs the grid x
layouts (MHA, MQA with K = V), and the 96 sparse-decode configs (properties/grid.py), x
distributions (normal, peaky, flat) x seeds against the float64 oracle (over the dequantized
keys for quantized caches) and records global and worst-row cosine, error ratio and LSE error. The gate
is the global cosine of every run, with every output element written and finite (the cosine is
taken over the finite elements alone). Writes DIR/results.json (atomically), DIR/summary.md and
DIR/index.html (the threshold, failing configs first, per kernel a trend over the nights of
DIR/history.jsonl and heatmaps of both grids), DIR/junit.xml (one test case per kernel and
config), compares with the previous DIR/results.json and lists what got worse; exits 1 when
any run is below the gate.
On a machine without CUDA it runs a reduced slice through the Triton interpreter (every
head dim, decode shapes; two sparse configs) so the command works anywhere.

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
from fmha.regressions.selection import command_line, parse, resolve_kernel, selected_kernels
from fmha.ci import report_html, shards
from fmha.ci import progress as progress_lines
from fmha.ci.run_record import RunRecord, raised
from fmha.contract import NotSupportedError
from fmha.oracles.check import judge_run
from fmha.oracles.kernel_call import run_kernel
from fmha.oracles.sample import Sample
from fmha.contract import DTYPE_NAMES
from fmha.properties.grid import GRID, SPARSE_GRID, config_id, grid_id, grid_problem, sparse_id
from fmha.tables import Table

GATE = 0.999998
LAYOUTS = ("mha", "mqa")
SPARSE_LAYOUT = report_html.SPARSE
DISTRIBUTIONS = ("normal", "peaky", "flat")
# CPU slice: every head dim, decode shapes, the boundary configs; of the sparse grid, Hq 64,
# T 1, 128 + 512 keys in pages of 64 with a sink, the second scope in FP8 and in FP4.
CPU_SLICE = {(1, 128), (4, 128), (1, 100), (4, 640)}
CPU_SPARSE_SLICE = {"dsv4-h64-T1-topk128+512-block64-fp8-sink", "dsv4-h64-T1-topk128+512-block64-fp4-sink"}


def cases(configs, sparse_configs) -> list[tuple]:
    """(problem, the case's id, where it sits in the grids) of every grid case: configs x
    layouts, then the sparse ones."""
    dense = [(grid_problem(c, layout), grid_id(c, layout), dict(config=config_id(c), head_dim=c.head_dim,
                                                                 q_len=c.q_len, kv_len=c.kv_len, layout=layout))
             for c in configs for layout in LAYOUTS]
    sparse = [(p, sparse_id(p), dict(config=sparse_id(p), head_dim=p.head_dim, q_len=p.q_len,
                                     kv_len=p.kv_len + p.extra_topk, layout=SPARSE_LAYOUT)) for p in sparse_configs]
    return dense + sparse


def why_below(metrics: dict, gate: float = GATE) -> str:
    """Why a run that returned an answer is not at the gate ("" when it is): the gate's rule.
    NaN, inf and unwritten elements are left out of the cosine (so that one of them does not
    read as a precision loss): they fail the run apart, or an output of NaN alone would pass."""
    why = [f"{metrics[k]} {what} output elements" for k, what in (("nonfinite", "NaN or inf"),
                                                                   ("unwritten", "unwritten")) if metrics.get(k)]
    if metrics["cos"] is None or not metrics["cos"] >= gate:
        cos = metrics["cos"]
        why.append(f"cos {cos:.7f}, {gate - cos:.2e} below the gate (worst row {metrics['worst_row_cos']:.7f})"
                   if cos is not None else "no cosine (no finite element)")
    return "; ".join(why)


def run_gate(kernels, device: str, seeds: int, grid_cases, progress=True) -> list[RunRecord]:
    """One record per run. A kernel that raises (or returns the wrong shape, or ignores out=)
    gets that run recorded with the error, and the gate goes on; a NotSupportedError for a call
    its capabilities admit is a skip with its reason, as in pytest and verify."""
    records = []
    runs = [(kernel, problem, case, where, distribution, seed) for kernel in kernels
            for problem, case, where in grid_cases for distribution in DISTRIBUTIONS for seed in range(seeds)]
    start = time.monotonic()

    def line() -> str:  # piped stderr (a CI log) gets this every few seconds instead of tqdm's bar
        now = f"{records[-1].kernel} {records[-1].what}" if records else "starting"
        took = progress_lines.elapsed(time.monotonic() - start)
        return (f"fmha nightly: {len(records)}/{len(runs)} runs in {took}, "
                f"{sum(r.bad for r in records)} below the gate or raised; last {now}")

    piped = progress and not sys.stderr.isatty()
    with progress_lines.Ticker(progress_lines.EVERY_S if piped else 0, line,
                               lambda text: print(text, file=sys.stderr, flush=True)):
        for kernel, problem, case, where, distribution, seed in tqdm(runs, unit="run", file=sys.stderr,
                                                                      disable=None if progress else True):
            record = RunRecord(kernel.name, "gate", case, DTYPE_NAMES[problem.dtype],
                               where=dict(where, distribution=distribution, seed=seed))
            records.append(_judged(kernel, problem, record, device))
    return records


def _judged(kernel, problem, record: RunRecord, device: str) -> RunRecord:
    reasons = kernel.not_supported_reasons(problem, device)
    if reasons:
        return record.replace(outcome="skipped", message="; ".join(reasons))
    sample = Sample(problem=problem, distribution=record.where["distribution"], seed=record.where["seed"])
    try:
        m = judge_run(run_kernel(kernel, sample.inputs(device))).metrics
    except NotSupportedError as e:
        return record.replace(outcome="skipped", message=f"raised NotSupportedError: {e}")
    except Exception as e:  # noqa: BLE001 -- a kernel that fails costs its run, not the gate
        return raised(record.kernel, record.part, record.what, e, dtype=record.dtype, where=record.where)
    metrics = dict(cos=m.cos, worst_row_cos=m.worst_row_cos, error_ratio=m.error_ratio, lse_err=m.lse_max_err,
                   nonfinite=m.nonfinite, unwritten=m.unwritten)
    why = why_below(metrics)
    return record.replace(outcome="failed" if why else "passed", message=why, metrics=metrics)


@dataclass
class KernelTally:
    """One kernel's runs and what the gate makes of them (the Markdown and HTML reports)."""

    runs: list[RunRecord]

    @property
    def ran(self) -> list[RunRecord]:
        return [r for r in self.runs if r.returned]

    @property
    def below(self) -> list[RunRecord]:
        return [r for r in self.ran if r.outcome != "passed"]

    @property
    def errors(self) -> list[RunRecord]:
        """Runs where the kernel raised instead of returning an answer."""
        return [r for r in self.runs if r.outcome == "raised"]

    @property
    def skipped(self) -> list[RunRecord]:
        return [r for r in self.runs if r.outcome == "skipped"]

    @property
    def gated(self) -> bool:
        """Its runs decide the exit status (a --compare kernel's are only reported)."""
        return all(r.gated for r in self.runs)

    @property
    def failing(self) -> bool:
        return bool(self.below or self.errors)

    @property
    def by_config(self) -> dict[str, list[RunRecord]]:
        """Its runs per grid config (layouts, distributions and seeds)."""
        found = defaultdict(list)
        for r in self.runs:
            found[r.where["config"]].append(r)
        return found

    @property
    def failing_by_config(self) -> dict[str, list[RunRecord]]:
        """The runs below the gate or that raised, per config that has any."""
        failing = {id(r) for r in self.below + self.errors}
        return {c: bad for c, runs in self.by_config.items() if (bad := [r for r in runs if id(r) in failing])}

    @property
    def configs(self) -> set[str]:
        return {r.where["config"] for r in self.runs}

    @property
    def configs_at_gate(self) -> set[str]:
        """Configs the kernel ran, every run at the gate."""
        return {r.where["config"] for r in self.ran} - {r.where["config"] for r in self.below + self.errors}


def tally(records: list[RunRecord]) -> dict[str, KernelTally]:
    by_kernel = defaultdict(list)
    for r in records:
        by_kernel[r.kernel].append(r)
    return {kernel: KernelTally(runs) for kernel, runs in by_kernel.items()}


def summarize(records: list[RunRecord], previous: list[RunRecord] | None, header: str) -> tuple[str, bool]:
    lines = [header, "", f"Gate: global cosine >= {GATE} against the float64 oracle, every run, with every output "
             "element written and finite.", ""]
    table = Table(["kernel", "gated", "configs at gate", "runs", "raised", "skipped", "cos min", "cos median"])
    failing_lines = []
    tallies = tally(records)
    for kernel, t in tallies.items():
        cos = [r.metrics["cos"] for r in t.ran if r.metrics["cos"] is not None]
        table.add(kernel, "yes" if t.gated else "no (--compare)", f"{len(t.configs_at_gate)}/{len(t.configs)}",
                  len(t.ran), len(t.errors), len(t.skipped),
                  f"{min(cos):.7f}" if cos else "-", f"{statistics.median(cos):.7f}" if cos else "-")
        where = kernel if t.gated else f"{kernel} (compared, not gated)"
        failing_lines += [f"- {where} {r.run_id}: {r.message}" for r in t.below]
        failing_lines += [f"- {where} {r.run_id}: raised {r.message}" for r in t.errors]
    lines.append(table.markdown())
    any_fail = any(t.gated and t.failing for t in tallies.values())
    if failing_lines:
        lines += ["", f"## Below the gate or raised ({len(failing_lines)} runs)", ""] + failing_lines[:200]
        if len(failing_lines) > 200:
            lines.append(f"- ... {len(failing_lines) - 200} more in results.json")
    skipped = defaultdict(set)
    for r in records:
        if r.outcome == "skipped":
            skipped[r.kernel, r.message].add(r.what)
    if skipped:
        lines += ["", "## Not run (the kernel's reasons)", ""]
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
    # mkstemp makes the file 0600: a report is read by whoever the CI server serves it to
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def _compared(parser, args, gated: list) -> list:
    """--compare NAME|installed: kernels reported beside the gated ones, never gated."""
    names = {k.name for k in gated}
    found = []
    for spec in args.compare:
        if spec == "installed":
            found += registry.installed_kernels(args.fmha_device)
        else:
            try:
                found.append(resolve_kernel(spec))
            except ValueError as e:
                parser.error(str(e).replace("--fmha-kernel", "--compare"))
    return list({k.name: k for k in found if k.name not in names}.values())


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
    shards.add_option(parser, "the grid cases")
    args = parse(parser, argv)
    if args.report_only:
        saved = json.loads((args.out / "results.json").read_text())
        return _report(_records(saved), None, saved["header"], args.out, None)
    gated = selected_kernels(parser, args) if args.fmha_kernel else default_gated(args.fmha_device)
    compared = _compared(parser, args, gated)
    kernels = gated + compared
    reduced = args.fmha_device == "cpu" and not args.full_grid
    configs = [c for c in GRID if (c.q_len, c.kv_len) in CPU_SLICE] if reduced else list(GRID)
    sparse = [p for p in SPARSE_GRID if sparse_id(p) in CPU_SPARSE_SLICE] if reduced else list(SPARSE_GRID)
    if args.head_dims:
        configs = [c for c in configs if c.head_dim in args.head_dims]
        sparse = [p for p in sparse if p.head_dim in args.head_dims]
    seeds = args.seeds or (1 if args.fmha_device == "cpu" else 3)
    # Each case keeps its place in the whole grid: a merge of shards puts the runs back in order.
    grid = args.shard.take([(p, case, dict(where, case_index=i)) for i, (p, case, where) in
                            enumerate(cases(configs, sparse))])

    gated_names = {k.name for k in gated}
    records = [r.replace(gated=r.kernel in gated_names) for r in run_gate(kernels, args.fmha_device, seeds, grid)]
    device_name = torch.cuda.get_device_name() if args.fmha_device == "cuda" else "CPU (Triton interpreter)"
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
    part = f", shard {args.shard} ({len(grid)} of the grid cases)" if args.shard.count > 1 else ""
    header = (f"# Nightly gate, {now} UTC\n\n"
              f"{device_name}, torch {torch.__version__}; {len(configs)} configs"
              f"{' (CPU slice)' if reduced else ''} x layouts {', '.join(LAYOUTS)} (bf16, B=2, Hq=8, causal) and "
              f"{len(sparse)} DSV4 sparse-decode configs, x {', '.join(DISTRIBUTIONS)} x {seeds} seed(s){part}.\n\n"
              f"Command: python -m fmha.ci.nightly {' '.join(argv)}")
    return _write(records, header, args.out, device_name, now, shard=[args.shard.index, args.shard.count])


def default_gated(device: str) -> list:
    """What the gate judges when no kernel is named: fmha.attention, and on CUDA fmha's CUDA C++
    kernels, which it runs first where they are built."""
    return [registry.KERNELS["fmha"]] + [k for k in registry.COMPILED if device in k.default_devices]


def _write(records: list[RunRecord], header: str, out: Path, device_name: str, now: str, shard=None) -> int:
    """results.json (atomically), then the reports (`_report`), compared with the previous results."""
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    previous = _records(json.loads(results_path.read_text())) if results_path.exists() else None
    write_atomically(results_path, json.dumps(dict(device=device_name, torch=torch.__version__, gate=GATE,
                                                   header=header, shard=shard, records=[r.to_json() for r in records]),
                                              indent=1, default=_json_safe))
    return _report(records, previous, header, out, now)


def merge(argv: list[str]) -> int:
    """`merge SHARD_DIR ... --out DIR`: the shards' runs as one night's report."""
    parser = argparse.ArgumentParser(prog="python -m fmha.ci.nightly merge",
                                     description="Join the reports of a nightly's shards (--shard I/N) into one.")
    parser.add_argument("shards", nargs="+", type=Path, metavar="SHARD_DIR", help="each shard's --out")
    parser.add_argument("--out", type=Path, default=Path("nightly-report"))
    args = parser.parse_args(argv)
    parts = []
    for directory in args.shards:
        path = directory / "results.json"
        if not path.exists():
            parser.error(f"{directory}: expected a shard's report folder (its results.json), found none")
        parts.append(json.loads(path.read_text()))
    found = sorted(tuple(p.get("shard") or (1, 1)) for p in parts)
    count = found[0][1]
    if found != [(i, count) for i in range(1, count + 1)]:
        parser.error(f"expected shards 1/{count} to {count}/{count} once each, got "
                     f"{', '.join(f'{i}/{n}' for i, n in found)}")
    first = next(p for p in parts if tuple(p["shard"]) == (1, count))
    records = [r for p in parts for r in _records(p)]
    kernels = list(dict.fromkeys(r.kernel for r in _records(first)))
    records.sort(key=lambda r: (kernels.index(r.kernel) if r.kernel in kernels else len(kernels),
                                r.where.get("case_index", 0), DISTRIBUTIONS.index(r.where["distribution"]),
                                r.where["seed"]))
    now = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}"
    header = re.sub(r", shard 1/\d+ \(\d+ of the grid cases\)", f", {count} shards merged", first["header"])
    header += f" (shard 1 of {count}), merged by: python -m fmha.ci.nightly merge {' '.join(argv)}"
    args.out.mkdir(parents=True, exist_ok=True)
    _join_beside(args.shards, args.out)
    return _write(records, header, args.out, first["device"], now)


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
            time: str | None) -> int:
    """summary.md, index.html, junit.xml; `time`: this night's, appended to history.jsonl
    (None: re-rendering a night already there)."""
    summary, failed = summarize(records, previous, header)
    write_atomically(out / "summary.md", summary)
    tallies = tally(records)
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

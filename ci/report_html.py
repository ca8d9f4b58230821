"""The nightly gate's report beside results.json: an HTML page (ci/templates/nightly.html.j2)
with the threshold, the verdict, failing configs first, each kernel's trend over the nights
(history.jsonl) and heatmaps of the dense and the sparse grid; and junit.xml for CI systems."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree as ET

import jinja2

SPARSE = "dsv4-sparse"
RAISED = 1.0  # a run that raised: the heatmap's worst cell, written "raised"
NOT_RUN = 2.0  # a run no process finished (a shard killed): written "not run"
_TOPK = re.compile(r"-topk(\d+\+\d+)")


def _gap(r) -> float:
    """1 - cos of a run that returned (a non-finite cosine, or NaN, inf or unwritten output
    elements, which the cosine leaves out, are the worst there is)."""
    m = r.metrics
    if m["cos"] is None or not math.isfinite(m["cos"]) or m.get("nonfinite") or m.get("unwritten"):
        return 1.0
    return 1 - m["cos"]


def worst_by_cell(runs: list, sparse: bool = False) -> dict[tuple, float | None]:
    """(row label, column label) -> worst 1 - cos over layouts, distributions and seeds (None:
    the kernel ran nothing there). Dense grid: rows (head dim, T), columns S; sparse grid: rows
    the config without its top-k, columns the top-k of each scope."""
    cells: dict[tuple, float | None] = {}
    for r in runs:
        where = r.where
        if (where["layout"] == SPARSE) != sparse:
            continue
        if sparse:
            topk = _TOPK.search(r.what)
            key = (_TOPK.sub("", r.what).removeprefix("dsv4-"), f"top-k {topk.group(1) if topk else '?'}")
        else:
            key = (f"hd{where['head_dim']} T={where['q_len']}", f"S={where['kv_len']}")
        if r.returned:
            cells[key] = max(cells.get(key) or 0.0, _gap(r))
        elif r.outcome == "raised":
            cells[key] = max(cells.get(key) or 0.0, RAISED)
        elif r.outcome == "not_run":
            cells[key] = NOT_RUN
        else:
            cells.setdefault(key, None)
    return cells


def _pass_fail_colours(limit: float, low: float, high: float):
    """Greens below the gate, reds above it: the colour changes family exactly at the gate."""
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import ListedColormap

    share = (math.log(limit) - math.log(low)) / (math.log(high) - math.log(low))
    n = 256
    passing = plt.get_cmap("Greens_r")(np.linspace(0.0, 0.65, int(n * share)))
    failing = plt.get_cmap("Reds")(np.linspace(0.45, 1.0, n - int(n * share)))
    return ListedColormap(np.vstack([passing, failing]))


def cell_labels(cells: dict, gate: float) -> dict[tuple, str]:
    """The text of each grid cell (worst_by_cell's): its worst 1 - cosine (✗ past the gate),
    "raised ✗", "not run ✗" where no process finished a run, or "n/a" where the kernel supports
    none of the config's runs. A config not in this run has no cell (blank)."""
    def label(gap) -> str:
        if gap is None:
            return "n/a"
        if gap == RAISED:
            return "raised ✗"
        if gap == NOT_RUN:
            return "not run ✗"
        return f"{max(gap, 1e-9):.1e}" + (" ✗" if gap > 1 - gate else "")

    return {key: label(gap) for key, gap in cells.items()}


def heatmap(runs: list, kernel: str, gate: float, path: Path, sparse: bool = False) -> Path | None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    cells = worst_by_cell(runs, sparse)
    if not cells:
        return None
    rows = sorted({r for r, _ in cells}, key=_natural)
    cols = sorted({c for _, c in cells}, key=_natural)
    values = np.full((len(rows), len(cols)), np.nan)
    for (r, c), gap in cells.items():
        if gap is not None:
            values[rows.index(r), cols.index(c)] = max(gap, 1e-9)
    limit = 1 - gate
    # One fixed scale for every kernel and night, so pictures compare.
    low, high = limit / 100, limit * 100
    fig, ax = plt.subplots(figsize=(max(1.15 * len(cols) + 3.2, 6.5), 0.3 * len(rows) + 1.9))
    image = ax.imshow(np.ma.masked_invalid(np.clip(values, low, high)), aspect="auto",
                      cmap=_pass_fail_colours(limit, low, high), norm=LogNorm(vmin=low, vmax=high))
    for (row, col), text in cell_labels(cells, gate).items():
        failing = text.endswith("✗")
        ax.text(cols.index(col), rows.index(row), text, ha="center", va="center", fontsize=6,
                color="white" if failing else "black", fontweight="bold" if failing else "normal")
    ax.set_xticks(range(len(cols)), cols, fontsize=7)
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    grid = "DSV4 sparse-decode grid" if sparse else "dense grid"
    ax.set_title(f"{kernel}, {grid}: worst 1 - cosine per config\n"
                 f"green: at the gate; red ✗: past it ({limit:.0e}); n/a: not supported; blank: not in this run",
                 fontsize=8)
    bar = fig.colorbar(image, ax=ax, label="1 - cosine")
    bar.ax.axhline(limit, color="black", linewidth=1.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def trend(history: list[dict], kernel: str, gate: float, path: Path) -> Path | None:
    """Configs at the gate and the worst 1 - cosine of each night, for one kernel."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nights = [h for h in history if h["kernel"] == kernel]
    if not nights:
        return None
    x = range(len(nights))
    fig, left = plt.subplots(figsize=(7.5, 2.6))
    left.plot(x, [100 * h["at_gate"] / max(h["configs"], 1) for h in nights], "o-", color="#1b7a33")
    left.set_ylabel("% configs at the gate", color="#1b7a33")
    left.set_ylim(-5, 105)
    right = left.twinx()
    gaps = [max(h["worst_gap"], 1e-9) if h["worst_gap"] is not None else float("nan") for h in nights]
    right.semilogy(x, gaps, "--", color="#777777", linewidth=0.8)
    # each night's worst 1 - cosine: a red square is a failing night, a green one a passing night
    right.scatter(x, gaps, marker="s", zorder=3, c=["#b00020" if failed(h, gate) else "#1b7a33" for h in nights])
    right.axhline(1 - gate, color="#b00020", linewidth=0.8, linestyle=":")
    right.set_ylabel("worst 1 - cosine", color="#b00020")
    left.set_xticks(list(x), [h["time"][5:16] for h in nights], rotation=30, fontsize=7, ha="right")
    left.set_title(f"{kernel}: night by night (dotted: the gate)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def failed(night: dict, gate: float) -> bool:
    """Whether a kernel's night (a history.jsonl line) failed the gate: its verdict where the line
    has one, else a run below it or a run that raised (whose night's worst returned cosine may
    still be at the gate)."""
    if "failing" in night:
        return night["failing"]
    return bool(night.get("below") or night.get("raised")) or (night["worst_gap"] or 0.0) > 1 - gate


def night(tallies: dict, time: str) -> list[dict]:
    """This run's line per kernel in history.jsonl."""
    return [dict(time=time, kernel=name, configs=len(t.configs), at_gate=len(t.configs_at_gate),
                 below=len(t.below), raised=len(t.errors), not_run=len(t.not_run), failing=t.failing,
                 worst_gap=max((_gap(r) for r in t.ran), default=None)) for name, t in tallies.items()]


def read_history(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _failing_configs(t, gate: float) -> list[dict]:
    rows = []
    for config, runs in t.failing_by_config.items():
        raised = [r for r in runs if r.outcome in ("raised", "not_run")]
        worst = max((r for r in runs if r.returned), key=_gap, default=None)
        said = (raised[0].message if raised[0].outcome == "not_run" else f"raised {raised[0].message}") if raised else ""
        rows.append(dict(config=config, runs=len(runs), sort=1.0 if raised else _gap(worst),
                         worst=said or worst.message, by="" if raised else f"{_gap(worst) - (1 - gate):.2e}"))
    return sorted(rows, key=lambda row: -row["sort"])


def write_page(tallies: dict, gate: float, header: str, regressions: list[str], history: list[dict],
               out_dir: Path) -> Path:
    """`tallies`: ci.nightly.tally(records); `header`: the results' Markdown header."""
    try:
        import matplotlib  # noqa: F401
        plotting = True
    except ImportError:
        plotting = False
    kernels = []
    for name, t in sorted(tallies.items(), key=lambda item: (not item[1].gated, not item[1].failing, item[0])):
        slug = _slug(name)
        heatmaps = []
        if plotting:
            for sparse in (False, True):
                png = heatmap(t.runs, name, gate, out_dir / f"heatmap-{slug}{'-sparse' if sparse else ''}.png", sparse)
                if png:
                    heatmaps.append(dict(src=png.name, alt=f"{name}: worst 1 - cosine per "
                                                           f"{'sparse' if sparse else 'dense'} config"))
        png = trend(history, name, gate, out_dir / f"trend-{slug}.png") if plotting else None
        skips = Counter(r.message for r in t.skipped)
        cos = [r.metrics["cos"] for r in t.ran if r.metrics["cos"] is not None]
        kernels.append(dict(
            name=name, slug=slug, gated=t.gated, failing=t.failing, configs=len(t.configs),
            at_gate=len(t.configs_at_gate), below=len(t.below), raised=len(t.errors), skipped=sum(skips.values()),
            cos_min=f"{min(cos):.7f}" if cos else "-", failing_configs=_failing_configs(t, gate),
            heatmaps=heatmaps, trend=png.name if png else None,
            skip_reasons=sorted(((n, why) for why, n in skips.items()), reverse=True)))
    lines = [line.strip() for line in header.splitlines() if line.strip()]
    title = lines[0].lstrip("# ") if lines and lines[0].startswith("#") else "fmha nightly gate"
    command = next((line.removeprefix("Command: ") for line in lines if line.startswith("Command: ")), "")
    context = [line for line in lines[1:] if not line.startswith(("#", "Command: "))]
    environment = jinja2.Environment(loader=jinja2.PackageLoader("fmha.ci", "templates"), autoescape=True)
    page = environment.get_template("nightly.html.j2").render(
        title=title, context=context, command=command, gate=gate, kernels=kernels,
        failing=[k for k in kernels if k["failing"]], gate_failed=any(k["failing"] and k["gated"] for k in kernels),
        regressions=regressions, plotting=plotting)
    path = out_dir / "index.html"
    path.write_text(page)
    return path


def junit(tallies: dict, gate: float) -> str:
    """One test case per kernel and config: failed below the gate or raised, skipped with the
    kernel's reason when it ran nothing there. A compared kernel's (--compare) runs below the
    gate are its test case's output, not a failure: they never fail the gate."""
    suites = ET.Element("testsuites", name="fmha nightly gate")
    for name, t in tallies.items():
        by_config, failing = t.by_config, t.failing_by_config
        suite = ET.SubElement(suites, "testsuite", name=name, tests=str(len(by_config)))
        counts = Counter()
        for config, runs in by_config.items():
            case = ET.SubElement(suite, "testcase", classname=f"nightly.{name}", name=config)
            bad = failing.get(config, [])
            text = "\n".join(f"{r.run_id}: " + (f"raised {r.message}" if r.outcome == "raised" else r.message)
                             for r in bad)
            if bad and not t.gated:
                ET.SubElement(case, "system-out").text = f"compared, not gated:\n{text}"
            elif bad:
                counts["failures"] += 1
                ET.SubElement(case, "failure", message=f"{len(bad)} run(s) below the gate {gate} or raised").text = text
            elif all(r.outcome == "skipped" for r in runs):
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message=runs[0].message)
        suite.set("failures", str(counts["failures"]))
        suite.set("skipped", str(counts["skipped"]))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True)


def _natural(label: str) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", label)]


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)

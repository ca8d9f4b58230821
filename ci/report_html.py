"""The nightly gate's HTML page: per kernel, a heatmap (matplotlib PNG) of the worst 1 - cosine
over (head dim, T) rows x S columns, cells at or past the gate marked, and the runs below it."""

from __future__ import annotations

import html
import math
from pathlib import Path

from fmha.tables import Table


def worst_by_cell(runs: list[dict]) -> dict[tuple, float | None]:
    """(head_dim, q_len, kv_len) -> worst 1 - cos of one kernel's runs over layouts,
    distributions and seeds (None: the kernel ran nothing there)."""
    cells: dict[tuple, float | None] = {}
    for r in runs:
        if r.get("layout") == "dsv4-sparse":
            continue  # not on the dense grid's axes; summary.md lists them
        key = (r["head_dim"], r["q_len"], r["kv_len"])
        if "cos" in r and r["cos"] is not None:
            gap = 1 - r["cos"] if math.isfinite(r["cos"]) else 1.0
            cells[key] = max(cells.get(key) or 0.0, gap)
        else:
            cells.setdefault(key, None)
    return cells


def heatmap(runs: list[dict], kernel: str, gate: float, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    cells = worst_by_cell(runs)
    rows = sorted({(hd, t) for hd, t, _ in cells})
    cols = sorted({s for _, _, s in cells})
    values = np.full((len(rows), len(cols)), np.nan)
    for (hd, t, s), gap in cells.items():
        if gap is not None:
            values[rows.index((hd, t)), cols.index(s)] = max(gap, 1e-9)
    limit = 1 - gate
    fig, ax = plt.subplots(figsize=(1.1 * len(cols) + 2.5, 0.32 * len(rows) + 1.6))
    # One fixed scale for every kernel and night, so pictures compare; the gate (2e-6) sits at
    # its geometric middle: green passes, red fails.
    low, high = limit**2 / 4e-5, 4e-5
    image = ax.imshow(np.ma.masked_invalid(np.clip(values, low, high)), cmap="RdYlGn_r", aspect="auto",
                      norm=LogNorm(vmin=low, vmax=high))
    for i in range(len(rows)):
        for j in range(len(cols)):
            v = values[i, j]
            if (rows[i] + (cols[j],)) not in cells:
                continue  # not a grid config
            text = "n/a" if np.isnan(v) else f"{v:.1e}" + (" ✗" if v > limit else "")
            ax.text(j, i, text, ha="center", va="center", fontsize=6,
                    fontweight="bold" if not np.isnan(v) and v > limit else "normal")
    ax.set_xticks(range(len(cols)), [f"S={s}" for s in cols])
    ax.set_yticks(range(len(rows)), [f"hd{hd} T={t}" for hd, t in rows], fontsize=7)
    ax.set_title(f"{kernel}: worst 1 - cosine per config (✗: past the gate {limit:.0e}; n/a: unsupported)", fontsize=9)
    fig.colorbar(image, ax=ax, label="1 - cosine")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_page(tallies: dict, gate: float, header_lines: list[str], out_dir: Path) -> Path:
    """`tallies`: ci.nightly.tally(records), one KernelTally per kernel."""
    parts = ["<!doctype html><meta charset='utf-8'><title>fmha nightly gate</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}td,th{padding:2px 8px}"
             ".fail{color:#b00}</style>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in header_lines if line.strip()]
    table = Table(["kernel", "configs at the gate", "runs below", "runs raised", "cos min"])
    for kernel, t in tallies.items():
        low = min((r["cos"] for r in t.ran), default=float("nan"))
        table.add(kernel, f"{len(t.configs_at_gate)}/{len(t.configs)}", len(t.below), len(t.errors), f"{low:.7f}",
                  css="fail" if t.below or t.errors else "")
    parts.append(table.html())
    try:
        import matplotlib  # noqa: F401
        plotting = True
    except ImportError:
        plotting = False
        parts.append("<p>No heatmaps: matplotlib is not installed (pip install -e '.[plot]').</p>")
    for kernel, t in tallies.items():
        parts.append(f"<h2>{html.escape(kernel)}</h2>")
        if plotting:
            png = heatmap(t.runs, kernel, gate, out_dir / f"heatmap-{_slug(kernel)}.png")
            parts.append(f"<img src='{png.name}' alt='1 - cosine heatmap of {kernel}'>")
        if t.below or t.errors:
            items = [f"{r['case']} {r['distribution']} seed {r['seed']}: cos {r['cos']:.7f}" for r in t.below]
            items += [f"{r['case']} {r['distribution']} seed {r['seed']}: raised {r['error']}" for r in t.errors]
            parts.append(f"<details><summary>{len(items)} runs below the gate or raised</summary><ul>"
                         + "".join(f"<li>{html.escape(item)}</li>" for item in items[:300]) + "</ul></details>")
    path = out_dir / "index.html"
    path.write_text("\n".join(parts) + "\n")
    return path


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in name)

"""One table, written as Markdown (terminal, summary.md, docs) or as HTML (the nightly page):
the reports of fmha.bench, fmha.ci.verify, fmha.ci.nightly and the kill matrix."""

from __future__ import annotations

import html
from dataclasses import dataclass, field


@dataclass
class Table:
    header: list[str]
    rows: list[list] = field(default_factory=list)
    # Per row, a CSS class for the HTML row ("fail", ...), or "".
    classes: list[str] = field(default_factory=list)

    def add(self, *cells, css: str = "") -> None:
        if len(cells) != len(self.header):
            raise ValueError(f"row: expected {len(self.header)} cells ({', '.join(self.header)}), got {len(cells)}")
        self.rows.append(list(cells))
        self.classes.append(css)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join(lines)

    def html(self) -> str:
        head = "".join(f"<th>{html.escape(str(c))}</th>" for c in self.header)
        body = "".join(
            f"<tr{f' class={css}' if css else ''}>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
            for row, css in zip(self.rows, self.classes))
        return f"<table border=1><tr>{head}</tr>{body}</table>"

"""One table type, three renderings: plain text (terminal, CI logs), Markdown (step
summaries) and HTML (report.html). Plus the number formatting every report shares."""

from __future__ import annotations

import dataclasses
import html
import math
import re
from typing import Any, Sequence


def fmt_num(value: Any, digits: int = 3) -> str:
    """A number shown with about ``digits`` significant digits, without exponent for
    everyday magnitudes: 1234.5 -> 1235, 0.01234 -> 0.0123, 312.0 -> 312."""
    if value is None or value == "":
        return ""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value)
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "∞" if x > 0 else "-∞"
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits or float(x).is_integer() and abs(x) < 1e15:
        return f"{x:,.0f}".replace(",", " ") if abs(x) >= 1e5 else f"{x:.0f}"
    if abs(x) < 1e-4:
        return f"{x:.{digits - 1}e}"
    return f"{x:.{digits}g}"


def fmt_pct(fraction: Any, signed: bool = True) -> str:
    """0.1 -> +10.0%; None/NaN -> ''."""
    if fraction is None:
        return ""
    try:
        x = float(fraction)
    except (TypeError, ValueError):
        return ""
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "+∞%" if x > 0 else "-∞%"
    return f"{x * 100:+.1f}%" if signed else f"{x * 100:.1f}%"


def fmt_bytes(n: Any) -> str:
    """1048576 -> 1 MiB (message sizes)."""
    try:
        x = float(n)
    except (TypeError, ValueError):
        return str(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(x) < 1024 or unit == "TiB":
            return f"{x:.0f} {unit}" if float(x).is_integer() else f"{x:.1f} {unit}"
        x /= 1024
    return str(n)


def shorten(text: Any, limit: int = 160) -> str:
    text = "" if text is None else str(text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def name_list(names: Sequence[str], limit: int = 6) -> str:
    """``a, b, c … (+12)``: a list of nodes that stays short."""
    names = list(names)
    return ", ".join(names) if len(names) <= limit else ", ".join(names[:limit]) + f" … (+{len(names) - limit})"


def natural_key(text: Any) -> list:
    """Sort key that puts node-2 before node-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(text))]


@dataclasses.dataclass
class Cell:
    """A cell with display text and, for HTML, an optional CSS class and title."""

    text: str
    css: str = ""
    title: str = ""

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass
class Table:
    columns: Sequence[str]
    rows: list[list[Any]] = dataclasses.field(default_factory=list)
    align: str = ""          # one letter per column: l | r (default l)
    css: str = ""            # extra class for the HTML table
    note: str = ""           # a line shown under the table

    def add(self, *cells: Any) -> None:
        self.rows.append(list(cells))

    def __len__(self) -> int:
        return len(self.rows)

    def _al(self, i: int) -> str:
        return self.align[i] if i < len(self.align) else "l"

    def to_text(self, max_width: int = 60) -> str:
        cells = [[shorten(c, max_width) for c in row] for row in self.rows]
        widths = [len(c) for c in self.columns]
        for row in cells:
            for i, c in enumerate(row):
                widths[i] = max(widths[i], len(c))

        def line(values: Sequence[str]) -> str:
            out = []
            for i, v in enumerate(values):
                out.append(v.rjust(widths[i]) if self._al(i) == "r" else v.ljust(widths[i]))
            return "  ".join(out).rstrip()

        sep = "  ".join("-" * w for w in widths)
        return "\n".join([line(list(self.columns)), sep] + [line(r) for r in cells]) + self._note("\n\n{}")

    def _note(self, template: str) -> str:
        return template.format(self.note) if self.note else ""

    def to_markdown(self, max_width: int = 200) -> str:
        def esc(value: Any) -> str:
            return shorten(value, max_width).replace("|", "\\|")

        head = "| " + " | ".join(esc(c) for c in self.columns) + " |"
        rule = "|" + "|".join("---:" if self._al(i) == "r" else "---" for i in range(len(self.columns))) + "|"
        body = ["| " + " | ".join(esc(c) for c in row) + " |" for row in self.rows]
        return "\n".join([head, rule] + body) + self._note("\n\n{}")

    def to_html(self, sortable: bool = True) -> str:
        cls = " ".join(x for x in ("data", "sortable" if sortable else "", self.css) if x)
        head = "".join(f'<th class="{"num" if self._al(i) == "r" else ""}">{html.escape(str(c))}</th>'
                       for i, c in enumerate(self.columns))
        body = []
        for row in self.rows:
            tds = []
            for i, c in enumerate(row):
                classes = ["num"] if self._al(i) == "r" else []
                title = ""
                if isinstance(c, Cell):
                    if c.css:
                        classes.append(c.css)
                    if c.title:
                        title = f' title="{html.escape(c.title)}"'
                text = html.escape("" if c is None else str(c))
                attr = f' class="{" ".join(classes)}"' if classes else ""
                tds.append(f"<td{attr}{title}>{text}</td>")
            body.append("<tr>" + "".join(tds) + "</tr>")
        return (f'<div class="table-wrap"><table class="{cls}"><thead><tr>{head}</tr></thead>'
                f'<tbody>{"".join(body)}</tbody></table></div>'
                + self._note(f'<p class="note">{html.escape(self.note)}</p>'))

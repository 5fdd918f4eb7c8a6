"""Small, dependency-free SVG charts for report.html (line charts and grouped bars).

The SVG is inline in the page, so the report needs no network and no plotting library.
Every point carries a <title> (the browser shows it on hover); legends are HTML lists
whose items toggle their series (see report.js).
"""

from __future__ import annotations

import html
import math
from typing import Callable, Sequence

from .tables import fmt_num

# Okabe-Ito / Tableau-like palette that stays readable for colour-blind readers.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000",
           "#8C564B", "#7F7F7F", "#17BECF", "#BCBD22"]
BAND_FILLS = ["#f3f6fa", "#fbf7ef"]

W, H = 680, 300
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 14, 44


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(1, count)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.floor(lo / step) * step
    ticks, v = [round(start, 12)], start
    while v < hi - step * 1e-9 and len(ticks) < 50:   # the last tick is at or above hi
        v += step
        ticks.append(round(v, 12))
    return ticks


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _legend(names: Sequence[str], chart_id: str) -> str:
    items = "".join(
        f'<li data-series="{i}" data-chart="{_esc(chart_id)}" title="click to hide or show">'
        f'<span class="swatch" style="background:{color(i)}"></span>{_esc(n)}</li>'
        for i, n in enumerate(names))
    return f'<ul class="legend">{items}</ul>'


def figure(kind: str, title: str, svg: str, legend: str = "", note: str = "") -> str:
    note_html = f'<p class="note">{_esc(note)}</p>' if note else ""
    return (f'<figure class="plot" data-plot="{_esc(kind)}"><figcaption>{_esc(title)}</figcaption>'
            f'{svg}{legend}{note_html}</figure>')


class _Axis:
    def __init__(self, lo: float, hi: float, a: float, b: float, log2: bool = False):
        self.log2 = log2
        if log2:
            lo, hi = math.log2(lo), math.log2(hi)
        if hi <= lo:
            hi = lo + 1.0
        self.lo, self.hi, self.a, self.b = lo, hi, a, b

    def __call__(self, v: float) -> float:
        if self.log2:
            v = math.log2(v)
        return self.a + (v - self.lo) / (self.hi - self.lo) * (self.b - self.a)


def _log2_ticks(lo: float, hi: float, count: int = 8) -> list[float]:
    a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    step = max(1, math.ceil((b - a) / count))
    return [2.0 ** e for e in range(a, b + 1, step)]


def _frame(chart_id: str, title: str, x: _Axis, y: _Axis, xticks, yticks, x_fmt, y_fmt,
           x_label: str, y_label: str) -> list[str]:
    out = [f'<svg class="chart" id="{_esc(chart_id)}" viewBox="0 0 {W} {H}" role="img" '
           f'aria-label="{_esc(title)}" preserveAspectRatio="xMinYMin meet">']
    out.append('<g class="grid">')
    for t in yticks:
        py = y(t)
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{py:.1f}" y2="{py:.1f}"/>')
        out.append(f'<text class="tick" x="{LEFT - 6}" y="{py + 4:.1f}" text-anchor="end">{_esc(y_fmt(t))}</text>')
    for t in xticks:
        px = x(t)
        out.append(f'<line class="xgrid" x1="{px:.1f}" x2="{px:.1f}" y1="{TOP}" y2="{H - BOTTOM}"/>')
        out.append(f'<text class="tick" x="{px:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">'
                   f'{_esc(x_fmt(t))}</text>')
    out.append('</g>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}"/>')
    out.append(f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{H - BOTTOM}"/>')
    out.append(f'<text class="label" x="{(LEFT + W - RIGHT) / 2:.0f}" y="{H - 6}" text-anchor="middle">'
               f'{_esc(x_label)}</text>')
    out.append(f'<text class="label" transform="translate(14 {(TOP + H - BOTTOM) / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">{_esc(y_label)}</text>')
    return out


def line_chart(series: Sequence, *, chart_id: str, title: str, x_label: str, y_label: str,
               x_log2: bool = False, x_fmt: Callable = fmt_num, y_fmt: Callable = fmt_num,
               bands: Sequence[tuple[float, float, str]] = (), y_zero: bool = True,
               markers: bool = True, y_max: float | None = None) -> tuple[str, str]:
    """An SVG line chart and its HTML legend. ``series`` items have name, xs, ys.

    ``bands`` shades x ranges (phases of a run) with a label on top; ``y_max`` fixes the
    top of the y axis (100 for percentages) unless a value exceeds it."""
    pts = [(x, y) for s in series for x, y in zip(s.xs, s.ys)
           if x is not None and y is not None and math.isfinite(x) and math.isfinite(y) and (x > 0 or not x_log2)]
    if not pts:
        return "", ""
    xs = [p[0] for p in pts]
    ys = [p[1] for p in pts]
    xlo, xhi = min(xs), max(xs)
    if bands:
        xlo, xhi = min(xlo, min(b[0] for b in bands)), max(xhi, max(b[1] for b in bands))
    ylo, yhi = (min(0.0, min(ys)) if y_zero else min(ys)), max(ys)
    if x_log2:
        if xhi <= xlo:
            xlo, xhi = xlo / 2, xhi * 2
        xticks = _log2_ticks(xlo, xhi)
        xlo, xhi = min(xlo, xticks[0]), max(xhi, xticks[-1])
    else:
        xticks = nice_ticks(xlo, xhi, 6)
        xticks = [t for t in xticks if xlo - 1e-9 <= t <= xhi + 1e-9] or [xlo]
    if y_max is not None and yhi <= y_max:
        yhi = y_max
    yticks = nice_ticks(ylo, yhi, 5)
    x = _Axis(xlo, xhi, LEFT, W - RIGHT, x_log2)
    y = _Axis(yticks[0], yticks[-1], H - BOTTOM, TOP)
    out = _frame(chart_id, title, x, y, xticks, yticks, x_fmt, y_fmt, x_label, y_label)
    for j, (b0, b1, label) in enumerate(bands):
        x0, x1 = x(b0), x(b1)
        out.insert(1, f'<g class="band"><rect x="{x0:.1f}" y="{TOP}" width="{max(1.0, x1 - x0):.1f}" '
                      f'height="{H - BOTTOM - TOP}" fill="{BAND_FILLS[j % 2]}"/>'
                      f'<text x="{x0 + 3:.1f}" y="{TOP + 10}">{_esc(label)}</text></g>')
    for i, s in enumerate(series):
        pairs = [(a, b) for a, b in zip(s.xs, s.ys)
                 if a is not None and b is not None and math.isfinite(a) and math.isfinite(b) and (a > 0 or not x_log2)]
        if not pairs:
            continue
        coords = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in pairs)
        out.append(f'<g class="series" data-series="{i}" stroke="{color(i)}" fill="{color(i)}">')
        out.append(f'<polyline fill="none" stroke-width="2" points="{coords}"/>')
        if markers and len(pairs) <= 200:
            for a, b in pairs:
                out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="3"><title>{_esc(s.name)}: '
                           f'{_esc(x_fmt(a))} → {_esc(y_fmt(b))}</title></circle>')
        out.append('</g>')
    out.append('</svg>')
    return "".join(out), _legend([s.name for s in series], chart_id)


def bar_chart(categories: Sequence[str], groups: Sequence[tuple[str, Sequence[float | None]]], *,
              chart_id: str, title: str, y_label: str, x_label: str = "",
              refs: Sequence[Sequence[float | None]] | None = None, ref_name: str = "peak",
              y_fmt: Callable = fmt_num) -> tuple[str, str]:
    """Grouped bars: one group per category, one bar per named group.

    ``refs[g][c]`` draws a reference tick (e.g. the peak TFLOP/s) over bar g of category c."""
    values = [v for _, vals in groups for v in vals if v is not None]
    ref_values = [v for r in (refs or []) for v in r if v is not None]
    if not values:
        return "", ""
    yhi = max(values + ref_values)
    yticks = nice_ticks(0.0, yhi * 1.05, 5)
    y = _Axis(yticks[0], yticks[-1], H - BOTTOM, TOP)
    n_cat, n_grp = len(categories), max(1, len(groups))
    slot = (W - LEFT - RIGHT) / max(1, n_cat)
    bar_w = min(48.0, slot * 0.8 / n_grp)
    x = _Axis(0, 1, LEFT, W - RIGHT)
    out = _frame(chart_id, title, x, y, [], yticks, str, y_fmt, x_label, y_label)
    for c, cat in enumerate(categories):
        cx = LEFT + slot * (c + 0.5)
        out.append(f'<text class="tick" x="{cx:.1f}" y="{H - BOTTOM + 16}" text-anchor="middle">{_esc(cat)}</text>')
    for g, (name, vals) in enumerate(groups):
        out.append(f'<g class="series" data-series="{g}" fill="{color(g)}" stroke="{color(g)}">')
        for c, v in enumerate(vals):
            if v is None:
                continue
            x0 = LEFT + slot * (c + 0.5) - bar_w * n_grp / 2 + g * bar_w
            top = y(v)
            ref = refs[g][c] if refs and g < len(refs) and c < len(refs[g]) else None
            tip = f"{name} · {categories[c]}: {y_fmt(v)}"
            if ref:
                tip += f" of {y_fmt(ref)} {ref_name} ({v / ref:.0%})"
            out.append(f'<rect x="{x0 + 1:.1f}" y="{top:.1f}" width="{bar_w - 2:.1f}" '
                       f'height="{H - BOTTOM - top:.1f}" stroke="none"><title>{_esc(tip)}</title></rect>')
            if ref:
                ry = y(ref)
                out.append(f'<line class="ref" x1="{x0:.1f}" x2="{x0 + bar_w:.1f}" y1="{ry:.1f}" y2="{ry:.1f}" '
                           f'stroke-width="2" stroke-dasharray="4 2">'
                           f'<title>{_esc(ref_name)} {_esc(y_fmt(ref))}</title></line>')
                out.append(f'<text class="pct" x="{x0 + bar_w / 2:.1f}" y="{top - 3:.1f}" text-anchor="middle" '
                           f'stroke="none">{v / ref:.0%}</text>')
        out.append('</g>')
    out.append('</svg>')
    return "".join(out), _legend([n for n, _ in groups], chart_id)

"""report.html: one run as a self-contained page (inline CSS, JS and SVG plots).

Long: one short function per section of the page, in the page's order, and the page itself at the end.

The page leads with what failed, by node, and what was not judged; it summarizes the passes per check and pool and
lists every check record only when there are few (MAX_EMBEDDED_CHECKS): a 1,000-node run's 270,000 records stay in
the run folder's checks.parquet beside the page, which links them (issue #52: 185 MB before, about 0.3 MB now).

The page loads nothing from the network: its Content-Security-Policy forbids every
fetch, and errors.js records any script error or blocked fetch into the page, which
is how the browser test tells a clean render from a broken one.
"""

from __future__ import annotations

import dataclasses
import html
from importlib import resources

from .. import __version__
from ..results import utcnow
from .data import Run, sample_fields
from .digest import digest_of
from .inventory_diff import fleet_table
from .junit import GROUPED_FILE, by_test
from .summary import (
    benchmark_tables,
    by_check_table,
    coverage_table,
    coverage_title,
    failing_nodes_table,
    failures_intro,
    failures_table,
    matrix_table,
    run_facts,
)
from .svg import bar_chart, figure, line_chart
from .tables import Cell, Table, fmt_bytes, fmt_num, name_list, natural_key, shorten
from .views import (
    VERDICT_ORDER,
    Series,
    allreduce_series,
    inference_load_axis,
    inference_series,
    invalid_loads,
    matmul_bars,
    pool_of,
    product_pools,
)

CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"
MAX_GPUS = 64            # utilization panels drawn (the rest are listed)
OPEN_GPUS = 4            # panels open on load
MAX_POINTS = 600         # points per utilization series (downsampled above)
# At fleet scale the page shows what failed and summarizes the rest; every record stays in the run folder's files
MAX_EMBEDDED_CHECKS = 2000   # check records listed one by one; above, the failures and warnings only (up to this)
MAX_EMBEDDED_TESTS = 2000    # pytest cases listed one by one; above, one row per test
MAX_ROWS = 1000              # rows of any other table
MAX_NODE_ROWS = 500          # coverage rows one per node and reason; above, one per reason
MAX_LABELLED_NODES = 200     # inventory rows with their labels, capacity and allocatable; above, without
RUN_FILES = ("checks.parquet", "checks.jsonl", "metrics.parquet", "metrics.jsonl", "samples.parquet", "junit.xml",
             GROUPED_FILE, "failed-nodes.csv", "coverage.jsonl", "inventory.json", "run.json")


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def esc(text: object) -> str:
    return html.escape("" if text is None else str(text), quote=True)


# ------------------------------------------------------------------ sections

def _capped(table: Table, limit: int = MAX_ROWS, where: str = "checks.parquet", sortable: bool = True) -> str:
    """The table's first ``limit`` rows, and a line saying how many more there are and where."""
    extra = max(0, len(table.rows) - limit)
    table = dataclasses.replace(table, rows=table.rows[:limit])     # a copy: tables are shared between reports
    more = f'<p class="note">… and {extra} more rows: in {esc(where)} beside this page.</p>' if extra else ""
    return table.to_html(sortable=sortable) + more


def _files(run: Run) -> list[str]:
    return [name for name in RUN_FILES if (run.path / name).exists()]


def _links(run: Run, names=None) -> str:
    names = [n for n in (names or _files(run)) if (run.path / n).exists()]
    return " · ".join(f'<a href="{esc(n)}">{esc(n)}</a>' for n in names)


def _section(sid: str, title: str, body: str, intro: str = "") -> str:
    intro_html = f'<p class="note">{esc(intro)}</p>' if intro else ""
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{intro_html}{body}</section>'


def _overview(run: Run) -> str:
    c = run.check_counts()
    cards = []
    if not run.checks.empty:
        cards += [("pass", c["pass"], "checks passed"), ("fail", c["fail"], "checks failed"),
                  ("warn", c["warn"], "warnings"), ("skip", c["skip"], "checks skipped")]
    if not run.checks.empty and digest_of(run).gpu:
        d = digest_of(run)
        cards += [("", len(d.gpu), "GPU nodes"), ("fail" if d.failing_nodes() else "pass", len(d.failing_nodes()),
                                                   "nodes failed")]
    if run.junit:
        j = run.junit
        cards += [("pass", j.passed, "tests passed"), ("fail", j.failed + j.errors, "tests failed / errors"),
                  ("skip", j.skipped, "tests skipped")]
    if not run.metrics.empty:
        cards.append(("", len(run.metrics), "metric rows"))
    if not run.samples.empty:
        cards.append(("", run.samples["gpu_key"].nunique(), "GPUs sampled"))
    body = "".join(f'<div class="card {cls}"><div class="n">{n}</div><div class="l">{esc(label)}</div></div>'
                   for cls, n, label in cards)
    return f'<div class="cards">{body}</div>'


def _verdict_cells(table: Table, col: int = 0) -> Table:
    """Turn the verdict column into coloured cells."""
    for row in table.rows:
        v = str(row[col]).strip()
        row[col] = Cell(v, css=f"v-{v}")
    return table


def _failures(run: Run) -> str:
    d = digest_of(run)
    problems = run.junit.problems() if run.junit else []
    lost = (run.meta.get("extra") or {}).get("lost_nodes") or {}
    parts = []
    if lost:
        t = Table(["node", "why it was lost"])
        for node, why in sorted(lost.items(), key=lambda kv: natural_key(kv[0])):
            t.add(Cell(node, css="v-skip"), why)
        parts.append(f"<h3>Nodes lost during the run ({len(lost)})</h3><p class=\"note\">Their checks from then on "
                     f"are not judged (skipped, with the reason).</p>{_capped(t, where='failed-nodes.csv')}")
    if not d.problems and not problems:
        return "".join(parts) + '<div class="ok-box">Nothing failed.</div>'
    intro = failures_intro(d)
    if intro:
        parts.append(f'<p class="lead">{esc(intro)}</p>')
    nodes = d.failing_nodes()
    if nodes:
        parts.append(f"<h3>By node ({len(nodes)})</h3>" + '<div class="scroll">'
                     + _capped(failing_nodes_table(d, html=True), where="failed-nodes.csv") + "</div>")
    if d.problems:
        t = failures_table(d.problems, html=True, products=product_pools(run.inventory))
        title = "Every failure and warning" if nodes else ""
        parts.append((f"<h3>{title} ({len(d.problems)} records; identical ones share a row)</h3>" if title else "")
                     + '<div class="scroll">' + _capped(t) + "</div>")
    if problems:
        t = Table(["outcome", "pytest test", "message"])
        for c in problems[:MAX_ROWS]:
            t.add(Cell(c.outcome, css="v-fail"), Cell(c.id, css="code"), Cell(shorten(c.message, 400), title=c.detail))
        more = (f'<p class="note">… and {len(problems) - MAX_ROWS} more: in junit.xml beside this page.</p>'
                if len(problems) > MAX_ROWS else "")
        parts.append("<h3>pytest failures and errors</h3>" + '<div class="scroll">' + t.to_html() + "</div>" + more)
    return "".join(parts)


def _skips(run: Run) -> str:
    """Why checks were skipped: one row per check and reason, whatever the node or GPU, most records first."""
    groups = sorted(digest_of(run).skips.values(), key=lambda g: (-g.records, g.feature, g.check, g.reason))
    if not groups:
        return ""
    t = Table(["records", "targets", "which", "feature", "check", "skip reason"], align="rrllll", css="compact")
    for g in groups:
        targets = list(g.targets)
        t.add(g.records, len(targets), Cell(name_list(targets, 3), title=name_list(targets, 40)), g.feature, g.check,
              shorten(g.text, 300))
    return ("<h3>Why checks were skipped</h3><p class=\"note\">One row per check and reason; in a reason, "
            "&lt;node&gt;, &lt;uuid&gt;, GPU &lt;i&gt; and &lt;n&gt; stand for what differs from record to record.</p>"
            + '<div class="scroll">' + _capped(t) + "</div>")


def _verdict_counts(table: Table) -> Table:
    """Colour the passed / failed / warned / skipped count columns of a by-check table."""
    cols = {i: v for i, c in enumerate(table.columns) for v, name in
            (("pass", "passed"), ("fail", "failed"), ("warn", "warned"), ("skip", "skipped")) if c == name}
    for row in table.rows:
        for i, v in cols.items():
            if row[i] not in ("", 0):
                row[i] = Cell(str(row[i]), css=f"v-{v}")
    return table


def _matrix(run: Run) -> str:
    t = matrix_table(run, icons=False)
    for row in t.rows:
        for i in range(1, len(row)):
            text = str(row[i])
            worst = next((v for v in ("fail", "warn", "skip", "pass") if v in text), "")
            row[i] = Cell(text, css=f"v-{worst}" if worst else "")
    t.css = "matrix"
    return t.to_html(sortable=False)


def _checks(run: Run) -> str:
    products = product_pools(run.inventory)
    d = digest_of(run)
    everything = d.total <= MAX_EMBEDDED_CHECKS
    if everything:
        records = run.checks.to_dict("records")
    else:
        records = d.problems[:MAX_EMBEDDED_CHECKS]
    t = Table(["verdict", "feature", "check", "target", "pool", "product", "expected", "actual", "message"])
    for r in sorted(records,
                    key=lambda r: (VERDICT_ORDER.index(r["verdict"]) if r["verdict"] in VERDICT_ORDER else 9,
                                   r["feature"], r["check"], natural_key(r["target"]))):
        t.add(r["verdict"], r["feature"], r["check"], r["target"], pool_of(r, products), r["product"],
              Cell(shorten(r["expected"], 200), css="code", title=r["expected"]),
              Cell(shorten(r["actual"], 200), css="code", title=r["actual"]), shorten(r["message"], 300))
    where = ""
    if not everything:
        shown = f"the {len(records)} failures and warnings" + (f" (of {len(d.problems)})"
                                                               if len(d.problems) > len(records) else "")
        where = (f'<p class="note">{d.total} check records: this page lists {shown}, and summarizes the rest above '
                 f'(by node, by check and pool, skip reasons). Every record is in the run folder beside this page: '
                 f'{_links(run, ["checks.parquet", "checks.jsonl"]) or "checks.parquet, checks.jsonl"}. One node\'s, '
                 f'for instance: <code>python3 -c "import pandas as pd; c = pd.read_parquet(\'checks.parquet\'); '
                 f'print(c[c.target == \'NODE\'].to_string())"</code>.</p>')
    filters = ('<div class="filters">'
               '<input type="search" id="check-filter" placeholder="filter: node, feature, check…">'
               '<label><input type="checkbox" id="check-problems"> failures and warnings only</label>'
               '<span id="check-shown" class="muted"></span></div>')
    return where + filters + '<div class="scroll">' + _verdict_cells(t).to_html() + "</div>"


def _matmul(run: Run) -> str:
    bars = matmul_bars(run.metrics)
    if not bars:
        return ""
    dtypes = sorted({b.dtype for b in bars})
    products = sorted({b.product for b in bars})
    lookup = {(b.product, b.dtype): b for b in bars}
    groups = [(p, [lookup[(p, d)].tflops if (p, d) in lookup else None for d in dtypes]) for p in products]
    refs = [[lookup[(p, d)].peak if (p, d) in lookup else None for d in dtypes] for p in products]
    svg, legend = bar_chart(dtypes, groups, refs=refs, chart_id="chart-matmul",
                            title="Matmul TFLOP/s by dtype", y_label="TFLOP/s", x_label="dtype")
    has_peak = any(b.peak for b in bars)
    note = ("Bars: best TFLOP/s over the measured shapes; dashed line: the product's peak for that dtype; "
            "label: share of peak." if has_peak else "Best TFLOP/s over the measured shapes (no peak recorded).")
    return figure("matmul", "Matmul TFLOP/s by dtype and GPU product, against peak", svg, legend, note)


def _allreduce(run: Run) -> str:
    series = allreduce_series(run.metrics, "busbw_gbps")
    if not series:
        return ""
    svg, legend = line_chart(series, chart_id="chart-allreduce", title="All-reduce bus bandwidth",
                             x_label="message size", y_label="busbw (GB/s)", x_log2=True, x_fmt=fmt_bytes)
    return figure("allreduce", "All-reduce bus bandwidth against message size", svg, legend)


def _invalid_note(invalid: list[tuple[str, float, str]], product: str | None = None) -> str:
    """Which plotted loads the client limited (they are measurements of the client, not the server)."""
    loads = [f"{fmt_num(load)} req/s" + ("" if product else f" ({p})") for p, load, _ in invalid
             if product is None or p == product]
    return ("Invalid load steps, limited by the load generator (not the server's limit, no capacity): "
            + ", ".join(loads) + "." if loads else "")


def _inference(run: Run) -> str:
    axis = inference_load_axis(run.metrics)
    invalid = invalid_loads(run.metrics)
    out = []
    for i, (name, series) in enumerate(inference_series(run.metrics).items()):
        if name.startswith("latency "):
            product = name[len("latency "):]
            svg, legend = line_chart(series, chart_id=f"chart-latency-{i}", title=f"Latency percentiles, {product}",
                                     x_label=axis, y_label="latency (ms)")
            out.append(figure("latency", f"Latency percentiles against offered load · {product}", svg, legend,
                              _invalid_note(invalid, product)))
        else:
            svg, legend = line_chart(series, chart_id="chart-throughput", title="Achieved throughput",
                                     x_label=axis, y_label="requests/s")
            out.append(figure("throughput", "Achieved throughput against offered load", svg, legend,
                              _invalid_note(invalid)))
    return "".join(out)


def _mmss(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}"


def _phases(df) -> list[tuple[float, float, str]]:
    """Consecutive runs of the same phase as (start, end, name) bands."""
    if "phase" not in df.columns:
        return []
    bands: list[list] = []
    names = df["phase"].fillna("").astype(str)
    if "benchmark" in df.columns:   # samples of several benchmarks: say whose phase it is
        names = [f"{b} {p}".strip() if p else "" for b, p in zip(df["benchmark"].fillna("").astype(str), names)]
    for t, phase in zip(df["t"], names):
        if bands and bands[-1][2] == phase:
            bands[-1][1] = t
        else:
            if bands:
                bands[-1][1] = t
            bands.append([t, t, phase])
    return [(a, b, p) for a, b, p in bands if p]


def _utilization(run: Run) -> str:
    import pandas as pd

    df = run.samples
    if df.empty or "ts" not in df.columns:
        return ""
    fields = sample_fields(df)
    if not fields:
        return ""
    df = df.copy()
    if pd.api.types.is_numeric_dtype(df["ts"]):
        t = pd.to_numeric(df["ts"])
        df["t"] = t - t.min()
    else:
        ts = pd.to_datetime(df["ts"], utc=True, errors="coerce", format="ISO8601")
        df["t"] = (ts - ts.min()).dt.total_seconds()
    df = df.dropna(subset=["t"]).sort_values("t", kind="stable")
    gpus = sorted(set(df["gpu_key"]), key=natural_key)
    pct = [f for f in fields if "util" in f]
    panels = []
    for g, gpu in enumerate(gpus[:MAX_GPUS]):
        sub = df[df["gpu_key"] == gpu]
        step = max(1, len(sub) // MAX_POINTS)
        sub_ds = sub.iloc[::step]
        bands = _phases(sub)
        charts = []
        groups = ([("utilization (%)", pct)] if pct else []) + [(f, [f]) for f in fields if f not in pct]
        for c, (label, cols) in enumerate(groups):
            series = []
            for col in cols:
                vals = pd.to_numeric(sub_ds[col], errors="coerce")
                pairs = [(float(a), float(b)) for a, b in zip(sub_ds["t"], vals) if b == b]
                series.append(Series(col, [p[0] for p in pairs], [p[1] for p in pairs]))
            series = [s for s in series if s.xs]
            if not series:
                continue
            svg, legend = line_chart(series, chart_id=f"chart-util-{g}-{c}", title=f"{gpu} {label}",
                                     x_label="time since start (m:ss)", y_label=label, x_fmt=_mmss,
                                     bands=bands, markers=len(sub_ds) <= 60, y_max=100 if cols is pct else None)
            charts.append(figure("utilization", label, svg, legend if len(series) > 1 else ""))
        name = ""
        for col in ("gpu_name", "name"):
            if col in sub.columns and sub[col].notna().any():
                name = str(sub[col].dropna().iloc[0])
                break
        title = f"{gpu}" + (f" · {name}" if name else "") + f" · {len(sub)} samples"
        panels.append(f'<details class="gpu"{" open" if g < OPEN_GPUS else ""}><summary>{esc(title)}</summary>'
                      f'<div class="plots">{"".join(charts)}</div></details>')
    more = ""
    if len(gpus) > MAX_GPUS:
        more = f'<p class="note">{len(gpus) - MAX_GPUS} more GPUs not drawn: {esc(", ".join(gpus[MAX_GPUS:]))}</p>'
    return "".join(panels) + more


def _tests(run: Run) -> str:
    if not run.junit:
        return ""
    j = run.junit
    parts = [f'<p>{j.total} tests: {j.passed} passed, {j.failed} failed, {j.errors} errors, {j.skipped} skipped.</p>']
    reasons = j.skip_reasons()
    if reasons:
        t = Table(["count", "skip reason"], align="rl", css="compact")
        for reason, n in reasons:
            t.add(n, reason)
        parts.append("<h3>Skip reasons</h3>" + _capped(t, where="junit.xml"))
    if j.total <= MAX_EMBEDDED_TESTS:
        t = Table(["outcome", "test", "time (s)", "message"], align="llrl")
        for c in j.cases:
            t.add(Cell(c.outcome, css={"passed": "v-pass", "skipped": "v-skip"}.get(c.outcome, "v-fail")),
                  Cell(c.id, css="code"), f"{c.time:.2f}", shorten(c.message, 200))
        parts.append(f"<details><summary>All {j.total} tests</summary>{t.to_html()}</details>")
        return "".join(parts)
    t = Table(["test", "cases", "passed", "failed", "errors", "skipped", "time (s)"], align="lrrrrrr")
    for row in by_test(j.cases):
        worst = "v-fail" if row["failed"] or row["error"] else ("v-pass" if row["passed"] else "v-skip")
        t.add(Cell(row["test"], css=f"code {worst}"), row["cases"], row["passed"], row["failed"] or "",
              row["error"] or "", row["skipped"] or "", f"{row['time']:.1f}")
    parts.append(f"<details open><summary>{j.total} test cases as {len(t)} tests (a test's cases on each node "
                 f"together; each case: {_links(run, ['junit.xml']) or 'junit.xml'}, and "
                 f"{_links(run, [GROUPED_FILE]) or GROUPED_FILE} for CI)</summary>{_capped(t, where='junit.xml')}"
                 "</details>")
    return "".join(parts)


def _inventory(run: Run) -> str:
    inv = run.inventory
    if not inv.get("nodes"):
        return ""
    d = digest_of(run)
    labelled = len(inv["nodes"]) <= MAX_LABELLED_NODES
    parts = [f'<p class="note">Snapshot captured {esc(inv.get("captured", "?"))}; Kubernetes '
             f'{esc(inv.get("kubernetes_version", "?"))}. Nodes with the same configuration share a row.</p>',
             fleet_table(inv).to_html()]
    t = Table(["node", "pool", "product", "GPUs", "driver", "CUDA", "passed", "failed", "warned", "skipped"]
              + (["GPU labels", "capacity", "allocatable"] if labelled else []), align="llllllrrrr")
    for n in sorted(inv["nodes"], key=lambda n: natural_key(n.get("name", ""))):
        c = d.nodes[n["name"]].counts if n.get("name") in d.nodes else {}
        cells = [Cell(n.get("name", ""), css="v-fail" if c.get("fail") else ""), n.get("pool", ""),
                 n.get("product", ""), n.get("gpu_count", ""), n.get("driver_version", ""), n.get("cuda_version", ""),
                 c.get("pass", ""), c.get("fail") or "", c.get("warn") or "", c.get("skip") or ""]
        if labelled:
            cells += [Cell(shorten(" ".join(f"{k}={v}" for k, v in sorted((n.get("labels") or {}).items())), 400),
                           css="code"),
                      Cell(" ".join(f"{k}={v}" for k, v in sorted((n.get("capacity") or {}).items())), css="code"),
                      Cell(" ".join(f"{k}={v}" for k, v in sorted((n.get("allocatable") or {}).items())), css="code")]
        t.add(*cells)
    note = "" if labelled else (f" (labels, capacity and allocatable per node: "
                                f"{_links(run, ['inventory.json']) or 'inventory.json'})")
    parts.append(f"<details><summary>All {len(inv['nodes'])} nodes, with their checks' verdicts{note}</summary>"
                 f'<div class="scroll">{_capped(t, limit=max(MAX_ROWS, 5000), where="inventory.json")}</div>'
                 "</details>")
    return "".join(parts)


# ------------------------------------------------------------------ page

def render_html(run: Run) -> str:
    outcome = run.outcome or "unknown"
    facts = " · ".join(f"<b>{esc(k)}</b> {esc(v)}" for k, v in run_facts(run))
    sections: list[tuple[str, str, str, str]] = []   # (id, nav title, title, body)

    def add(sid: str, title: str, body: str, intro: str = "", nav: str = "") -> None:
        if body:
            sections.append((sid, nav or title, title, _section(sid, title, body, intro)))

    if run.is_empty:
        add("empty", "Nothing recorded", '<div class="empty"><b>This run recorded no checks, no metrics, no samples '
            'and no junit.xml.</b> It may have been interrupted before the first check ran.</div>')
    n_fail = run.check_counts()["fail"] + (len(run.junit.problems()) if run.junit else 0)
    if not run.checks.empty or run.junit:
        n_warn = run.check_counts()["warn"]
        add("failures", f"Failures ({n_fail})" + (f" and warnings ({n_warn})" if n_warn else ""), _failures(run),
            nav=f'Failures <span class="count">{n_fail}</span>' if n_fail else "Failures (0)")
    if not run.checks.empty:
        coverage = coverage_table(run, html=True, limit=MAX_NODE_ROWS)
        add("coverage", coverage_title(coverage) if coverage.rows else "Coverage",
            ('<div class="scroll">' + _capped(coverage) + "</div>" if coverage.rows else
             '<div class="ok-box">Every check ran on every GPU node it is for.</div>') + _skips(run),
            "What was not judged, and why: GPU nodes checks left out (nodes that cannot take pods, nodes offering "
            "GPUs only through DRA, simulated nodes for checks that need real GPUs, each check's own skips on a "
            "node), then every skip by check and reason.",
            nav="Not judged")
        add("matrix", "Results by feature and pool", _matrix(run),
            "Counts of check verdicts; the cell colour is the worst verdict.")
        add("by-check", "Passes by check and pool", _capped(_verdict_counts(by_check_table(digest_of(run)))),
            "Each check in each pool: how many targets it judged, its verdicts, and the figures its passes measured "
            "(the spread of a number, or the values themselves).", nav="By check")
        title = (f"All checks ({len(run.checks)})" if len(run.checks) <= MAX_EMBEDDED_CHECKS
                 else f"Check records ({len(run.checks)})")
        add("checks", title, _checks(run), nav="Checks")
    plots = _matmul(run) + _allreduce(run) + _inference(run)
    tables = "".join(f"<h3>{esc(title)}</h3>{_capped(t, where='metrics.parquet')}"
                     for title, t in benchmark_tables(run))
    if plots or tables:
        add("benchmarks", "Benchmarks", (f'<div class="plots">{plots}</div>' if plots else "") + tables)
    add("utilization", "GPU utilization", _utilization(run),
        "One panel per GPU; shaded bands are the run's phases. Click a legend entry to hide a series.")
    add("tests", "pytest", _tests(run))
    add("inventory", "Cluster inventory", _inventory(run))

    nav = "".join(f'<a href="#{sid}">{title if "<span" in title else esc(title)}</a>' for sid, title, _, _ in sections)
    body = "".join(s[3] for s in sections)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{CSP}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>gpuproof {esc(run.run_id)}: {esc(outcome)}</title>
<script>{_asset("errors.js")}</script>
<style>{_asset("report.css")}</style>
</head>
<body>
<div id="js-errors" hidden></div>
<header class="top"><div class="inner">
<h1>gpuproof run {esc(run.run_id)}<span class="badge {esc(outcome)}">{esc(outcome)}</span></h1>
<div class="facts">{facts}</div>
</div></header>
<nav class="toc"><div class="inner">{nav}</div></nav>
<main>
<section id="overview">{_overview(run)}</section>
{body}
<footer>Generated by gpuproof {esc(__version__)} at {esc(utcnow())} from {esc(run.path)}.
This page is self-contained and makes no network requests. Every record is in the run folder beside it: {_links(run)}.
</footer>
</main>
<script>{_asset("report.js")}</script>
</body>
</html>
"""

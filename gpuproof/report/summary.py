"""summary.md: one run in Markdown, fit for a CI step summary ($GITHUB_STEP_SUMMARY).

Failures come first (with expected, actual and node), then results by feature and
pool, skip reasons, the benchmark highlights and the cluster the run saw.
"""

from __future__ import annotations

import datetime as _dt

from .data import ParamLabels, Run
from .inventory_diff import fleet_table
from .tables import Cell, Table, fmt_bytes, fmt_num, name_list, shorten
from .views import (
    allreduce_peaks,
    check_matrix,
    group_problems,
    inference_table_rows,
    left_out,
    matmul_bars,
    other_metrics,
    product_pools,
    problem_checks,
    skip_reasons,
    utilization_rows,
)

OTHER_METRICS = "Other metrics"
MAX_ROWS = 50          # rows per table before "... and N more"
ICON = {"pass": "✅", "fail": "❌", "warn": "⚠️", "skip": "⏭️", "": ""}


def duration(meta: dict) -> str:
    try:
        start = _dt.datetime.fromisoformat(meta["started"])
        end = _dt.datetime.fromisoformat(meta["finished"])
    except (KeyError, TypeError, ValueError):
        return ""
    secs = int((end - start).total_seconds())
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m" if secs >= 3600 else f"{secs // 60}m{secs % 60:02d}s"


def run_facts(run: Run) -> list[tuple[str, str]]:
    """Label/value pairs describing the run, for headers."""
    nodes = run.inventory.get("nodes") or []
    gpus = sum(int(n.get("gpu_count") or 0) for n in nodes)
    pools = sorted({n.get("pool") for n in nodes if n.get("pool")})
    facts = [
        ("cluster", run.cluster),
        ("target", str(run.meta.get("target") or "")),
        ("Kubernetes", run.kubernetes_version),
        ("fleet", str(run.meta.get("fleet") or "")),
        ("nodes", f"{len(nodes)} ({gpus} GPUs, {len(pools)} pools)" if nodes else ""),
        ("started", str(run.meta.get("started") or "")),
        ("duration", duration(run.meta)),
        ("gpuproof", str(run.meta.get("gpuproof_version") or "")),
    ]
    return [(k, v) for k, v in facts if v]


def _cap(table: Table, limit: int = MAX_ROWS) -> tuple[Table, int]:
    extra = max(0, len(table.rows) - limit)
    table.rows = table.rows[:limit]
    return table, extra


def _md(table: Table, limit: int = MAX_ROWS) -> str:
    table, extra = _cap(table, limit)
    text = table.to_markdown()
    if extra:
        text += f"\n\n… and {extra} more rows (see report.html)."
    return text


def failures_table(checks: list[dict], html: bool = False, products: dict[str, str] | None = None) -> Table:
    """Failed (or warned) checks; identical ones on several nodes share a row.
    ``products`` (product -> pool) places product-level checks in their pool."""
    table = Table(["verdict" if html else "", "feature", "check", "node / target", "pool", "expected", "actual",
                   "message"])
    for g in group_problems(checks, products):
        targets = name_list(g["targets"])
        if html:
            table.add(Cell(g["verdict"], css=f"v-{g['verdict']}"), g["feature"], g["check"],
                      Cell(targets, title=", ".join(g["targets"])), ", ".join(g["pools"]),
                      Cell(shorten(g["expected"], 300), css="code", title=g["expected"]),
                      Cell(shorten(g["actual"], 300), css="code", title=g["actual"]), shorten(g["message"], 400))
        else:
            table.add(ICON[g["verdict"]], g["feature"], g["check"], targets, ", ".join(g["pools"]),
                      shorten(g["expected"], 120), shorten(g["actual"], 120), shorten(g["message"], 200))
    return table


def coverage_table(run: Run, html: bool = False) -> Table:
    """The GPU nodes checks left out, with the reason and which checks: nothing is skipped silently."""
    table = Table(["node", "pool", "reason", "left out of"])
    for r in left_out(run.coverage, run.checks):
        checks = name_list(r["checks"], limit=4)
        table.add(r["node"], r["pool"], shorten(r["reason"], 300 if html else 160),
                  Cell(checks, title=", ".join(r["checks"])) if html else checks)
    return table


def coverage_title(table: Table) -> str:
    nodes = len({str(row[0]) for row in table.rows})
    return f"Coverage: {nodes} GPU node{'s' if nodes != 1 else ''} left out of some checks"


def matrix_table(run: Run, icons: bool = True) -> Table:
    m = check_matrix(run.checks, product_pools(run.inventory))
    table = Table(["feature"] + m.pools, align="l" + "l" * len(m.pools))
    for f in m.features:
        cells = []
        for p in m.pools:
            c = m.cell(f, p)
            parts = [f"{ICON[v] if icons else v} {c[v]}" for v in ("fail", "warn", "skip", "pass") if c.get(v)]
            cells.append(" ".join(parts) if parts else "–")
        table.add(f, *cells)
    return table


def counts_table(run: Run) -> Table:
    c = run.check_counts()
    j = run.junit
    table = Table(["", "checks", "pytest tests"], align="lrr")
    table.add("✅ passed", c["pass"], j.passed if j else "–")
    table.add("❌ failed", c["fail"], j.failed if j else "–")
    table.add("💥 errors", "–", j.errors if j else "–")
    table.add("⚠️ warnings", c["warn"], "–")
    table.add("⏭️ skipped", c["skip"], j.skipped if j else "–")
    return table


def benchmark_tables(run: Run) -> list[tuple[str, Table]]:
    """The benchmark highlights: (title, table) pairs, shared with report.html."""
    out = []
    bars = matmul_bars(run.metrics)
    if bars:
        t = Table(["product", "dtype", "TFLOP/s", "peak", "of peak", "best shape", "node"], align="llrrrll")
        for b in bars:
            t.add(b.product, b.dtype, fmt_num(b.tflops), fmt_num(b.peak) if b.peak else "",
                  f"{b.tflops / b.peak:.0%}" if b.peak else "", b.shape, b.node)
        out.append(("Matmul (best over shapes)", t))
    peaks = allreduce_peaks(run.metrics)
    if peaks:
        t = Table(["product", "ranks", "dtype", "peak busbw (GB/s)", "at size", "avg busbw (GB/s)"], align="lrlrrr")
        for p in peaks:
            t.add(p["product"], p["world_size"], p["dtype"], fmt_num(p["peak_busbw"]),
                  fmt_bytes(p["at_size"]) if p["at_size"] is not None else "", fmt_num(p["avg_busbw"]))
        out.append(("All-reduce", t))
    inf = inference_table_rows(run.metrics)
    if inf:
        cols = ["p50_ms", "p90_ms", "p95_ms", "p99_ms", "throughput_rps",
                "goodput_rps", "error_rate"]
        present = [c for c in cols if any(c in r for r in inf)]
        marked = any("step_valid" in r for r in inf)   # runs that record whether the client kept up
        t = Table(["product", "offered load"] + [c.replace("_ms", " (ms)")
                                                 .replace("_rps", " (req/s)") for c in present]
                  + (["step"] if marked else []),
                  align="lr" + "r" * len(present) + ("l" if marked else ""),
                  note="invalid: the load generator, not the server, limited that step (saturated client CPU, "
                       "or the offered rate not reached while the server's latency stayed flat); it is not the "
                       "server's limit and gives no capacity" if any(r.get("invalid_reason") for r in inf) else "")
        for r in inf:
            step = ([f"⚠️ invalid: {shorten(r['invalid_reason'], 160)}" if r.get("invalid_reason") else "valid"]
                    if marked else [])
            t.add(r["product"], fmt_num(r["load"]), *[fmt_num(r.get(c)) for c in present], *step)
        out.append(("Inference latency against offered load", t))
    columns, rows = utilization_rows(run.metrics)
    if rows:
        t = Table(["node", "GPU", "benchmark", "phase"] + [c.replace("_pct", " %").replace("_", " ") for c in columns],
                  align="llll" + "r" * len(columns))
        for r in rows:
            t.add(r["node"], r["gpu"], r["of"], r["phase"], *[fmt_num(r.get(c)) for c in columns])
        out.append(("GPU utilization while benchmarks ran", t))
    rest = other_metrics(run.metrics)
    if not rest.empty:
        rows = rest.to_dict("records")
        labels = ParamLabels((r["benchmark"], r["parameters"]) for r in rows)
        t = Table(["benchmark", "metric", "parameters", "product", "node", "value"], align="lllllr",
                  note=labels.common_note())
        for r in rows:
            t.add(r["benchmark"], r["metric"], labels(r["benchmark"], r["parameters"]), r["product"], r["node"],
                  f"{fmt_num(r['value'])} {r['unit']}".strip())
        out.append((OTHER_METRICS, t))
    return out


def render_summary(run: Run) -> str:
    failed = run.failed
    outcome = run.outcome or ("failed" if failed else "passed")
    icon = "❌" if failed or outcome == "failed" else ("⚠️" if outcome == "interrupted" or "cut short" in outcome
                                                      else "✅")
    lines = [f"## {icon} gpuproof run `{run.run_id}`: {outcome}", ""]
    lost = (run.meta.get("extra") or {}).get("lost_nodes") or {}
    if lost:           # nodes deleted or NotReady during the run: their checks are skips 'not judged' (issue #41)
        lines += [f"> **Nodes lost during the run ({len(lost)}):** "
                  + "; ".join(f"`{n}`: {why}" for n, why in sorted(lost.items()))
                  + ". Their checks from then on are not judged (skipped, with the reason).", ""]
    facts = run_facts(run)
    if facts:
        lines += [" · ".join(f"**{k}** {v}" for k, v in facts), ""]
    if run.is_empty:
        lines += ["> **This run recorded no checks, no metrics, no samples and no junit.xml.** "
                  "It may have been interrupted before the first check ran.", ""]
        return "\n".join(lines)
    if not run.checks.empty or run.junit:
        lines += [counts_table(run).to_markdown(), ""]

    fails = problem_checks(run.checks, ("fail",))
    junit_problems = run.junit.problems() if run.junit else []
    if fails or junit_problems:
        lines += [f"### ❌ Failures ({len(fails) + len(junit_problems)})", ""]
        if fails:
            lines += [_md(failures_table(fails, products=product_pools(run.inventory))), ""]
        if junit_problems:
            t = Table(["", "pytest test", "message"])
            for c in junit_problems:
                t.add("💥" if c.outcome == "error" else "❌", c.id, shorten(c.message, 300))
            lines += [_md(t), ""]
    warns = problem_checks(run.checks, ("warn",))
    if warns:
        table = failures_table(warns, products=product_pools(run.inventory))
        lines += [f"### ⚠️ Warnings ({len(warns)})", "", _md(table), ""]

    if not run.checks.empty:
        lines += ["### Results by feature and pool", "", _md(matrix_table(run), 100), ""]
        coverage = coverage_table(run)
        if coverage.rows:
            lines += [f"### {coverage_title(coverage)}", "", _md(coverage), ""]
        else:
            lines += ["Coverage: every check ran on every GPU node it is for.", ""]

    reasons = skip_reasons(run.checks)
    junit_reasons = run.junit.skip_reasons() if run.junit else []
    if reasons or junit_reasons:
        t = Table(["skipped", "count", "reason"], align="lrl")
        for reason, n in reasons:
            t.add("checks", n, reason)
        for reason, n in junit_reasons:
            t.add("pytest tests", n, reason)
        lines += ["<details><summary>Skip reasons</summary>", "", _md(t), "", "</details>", ""]

    for title, table in benchmark_tables(run):
        if title == OTHER_METRICS:   # long and secondary: folded
            lines += [f"<details><summary>{title} ({len(table)})</summary>", "", _md(table), "", "</details>", ""]
        else:
            lines += [f"### {title}", "", _md(table), ""]

    if run.inventory.get("nodes"):
        lines += ["<details><summary>Cluster inventory</summary>", "", _md(fleet_table(run.inventory)), "",
                  "</details>", ""]
    lines += [f"Full report: `{run.path}/report.html` (self-contained; open it in a browser).", ""]
    return "\n".join(lines)

"""summary.md: one run in Markdown, fit for a CI step summary ($GITHUB_STEP_SUMMARY).

Failures come first, by node (with expected, actual and node), then results by feature and pool, what was not
judged and why, the passes by check and pool with the spread of their figures, the benchmark highlights and the
cluster the run saw. Every table is capped (MAX_ROWS, then "… and N more"), and the whole within SUMMARY_BUDGET:
GitHub takes at most 1 MiB per step's summary ("$GITHUB_STEP_SUMMARY upload aborted, supports content up to a size
of 1024k"; https://docs.github.com/actions/using-workflows/workflow-commands-for-github-actions#adding-a-job-summary),
and a step may add its own lines (the nightly template adds the regression check's), so summary.md takes at most
half of it, whatever the fleet's size.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt

from .data import ParamLabels, Run
from .digest import Digest, NodeSummary, digest_of
from .inventory_diff import fleet_table
from .tables import Cell, Table, fmt_bytes, fmt_num, name_list, natural_key, shorten
from .views import (
    allreduce_peaks,
    group_problems,
    inference_table_rows,
    matmul_bars,
    metric_spread,
    other_metrics,
    product_pools,
    utilization_rows,
)

OTHER_METRICS = "Other metrics"
MAX_ROWS = 50          # rows per table before "... and N more"
MAX_NODE_ROWS = 100    # coverage rows one per node and reason up to this many; above, one per reason
MAX_METRIC_ROWS = 200  # "other metrics" one per row up to this many; above, grouped across nodes and GPUs
SUMMARY_BUDGET = 512 * 1024     # bytes: half of GitHub's 1 MiB per step summary
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
    """The table's first ``limit`` rows (a copy: tables are shared between the reports) and how many are left."""
    extra = max(0, len(table.rows) - limit)
    return dataclasses.replace(table, rows=table.rows[:limit]), extra


def _md(table: Table, limit: int = MAX_ROWS, where: str = "report.html") -> str:
    table, extra = _cap(table, limit)
    text = table.to_markdown()
    if extra:
        text += f"\n\n… and {extra} more rows (see {where})."
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
                      Cell(targets, title=", ".join(g["targets"][:200])), ", ".join(g["pools"]),
                      Cell(shorten(g["expected"], 300), css="code", title=g["expected"]),
                      Cell(shorten(g["actual"], 300), css="code", title=g["actual"]), shorten(g["message"], 400))
        else:
            table.add(ICON[g["verdict"]], g["feature"], g["check"], targets, ", ".join(g["pools"]),
                      shorten(g["expected"], 120), shorten(g["actual"], 120), shorten(g["message"], 200))
    return table


def what_failed(node: NodeSummary, verdicts=("fail",)) -> str:
    """``census: census-matmul-pool ×8, census-copy-pool ×8; pytest: test_x[node] (error)``."""
    by_feature: dict[str, list[str]] = {}
    for label, n in node.what_failed(verdicts):
        feature, _, check = label.partition(": ")
        by_feature.setdefault(feature, []).append(check + (f" ×{n}" if n > 1 else ""))
    if "fail" in verdicts and not node.failed:
        by_feature["pytest"] = [f"{c.id.rpartition('::')[2]} ({c.outcome})" for c in node.tests]
    return "; ".join(f"{f}: {', '.join(checks)}" for f, checks in by_feature.items())


def failing_nodes_table(d: Digest, html: bool = False) -> Table:
    """One row per node with a failure: what failed there and the first failure's message; the most first."""
    table = Table(["node", "pool", "failed", "warnings", "what failed", "first failure"], align="llrrll")
    for node in d.failing_nodes():
        first = next((r for r in node.problems if r["verdict"] == "fail"), None)
        if first is not None:
            message = first["message"] or f"expected {first['expected']}, actual {first['actual']}"
        else:
            case = node.tests[0]
            message = f"{case.id}: {case.message or case.outcome}"
        failed = node.failed or len(node.tests)
        if html:
            table.add(Cell(node.name, css="v-fail"), node.pool, failed, node.warned,
                      what_failed(node), Cell(shorten(message, 300), title=shorten(message, 2000)))
        else:
            table.add(node.name, node.pool, failed, node.warned, shorten(what_failed(node), 200),
                      shorten(message, 200))
    return table


def failures_intro(d: Digest) -> str:
    """``17 failed checks on 1 of 1,000 GPU nodes (h100-416); the list for scripts: failed-nodes.csv``."""
    nodes = d.failing_nodes()
    on_nodes = sum(n.failed for n in nodes)
    elsewhere = sum(1 for r in d.problems if r["verdict"] == "fail" and r["target"] not in d.nodes)
    parts = []
    if nodes:
        parts.append(f"{on_nodes} failed check{'s' if on_nodes != 1 else ''}"
                     + (f" and {sum(len(n.tests) for n in nodes if not n.failed)} failed pytest tests"
                        if any(n.tests and not n.failed for n in nodes) else "")
                     + f" on {len(nodes)} of {len(d.gpu)} GPU node{'s' if len(d.gpu) != 1 else ''} "
                     f"({name_list([n.name for n in nodes], 8)})")
    if elsewhere:
        parts.append(f"{elsewhere} on the cluster, its pools and namespaces")
    text = "; ".join(parts)
    if nodes:
        text += "; the list for scripts: failed-nodes.csv in the run folder (node, verdict, pool, feature, check, " \
                "reason)"
    return text + "." if text else ""


def coverage_table(run: Run, html: bool = False, limit: int = MAX_NODE_ROWS) -> Table:
    """The GPU nodes checks left out, with the reason and which checks: nothing is skipped silently. One row per node
    and reason up to ``limit`` rows; above, one row per reason with its nodes."""
    rows = sorted(digest_of(run).left_out.values(), key=lambda r: (natural_key(r["node"]), r["reason"]))
    if len(rows) <= limit:
        table = Table(["node", "pool", "reason", "left out of"])
        for r in rows:
            checks = name_list(r["checks"], limit=4)
            reason = r["example"] if r["messages"] == 1 else r["reason"]
            table.add(r["node"], r["pool"], shorten(reason, 300 if html else 160),
                      Cell(checks, title=", ".join(r["checks"])) if html else checks)
        return table
    groups: dict[str, dict] = {}
    for r in rows:
        g = groups.setdefault(r["reason"], {"nodes": [], "pools": [], "checks": [], "example": r["example"],
                                            "several": False})
        g["nodes"].append(r["node"])
        g["several"] |= r["messages"] > 1 or r["example"] != g["example"]
        if r["pool"] not in g["pools"]:
            g["pools"].append(r["pool"])
        g["checks"] += [c for c in r["checks"] if c not in g["checks"]]
    table = Table(["nodes", "which", "pools", "reason", "left out of"], align="rllll")
    table.node_count = len({r["node"] for r in rows})
    for reason, g in sorted(groups.items(), key=lambda kv: (-len(kv[1]["nodes"]), kv[0])):
        text = reason if g["several"] else g["example"]
        checks = name_list(g["checks"], limit=4)
        table.add(len(g["nodes"]), Cell(name_list(g["nodes"], 4), title=name_list(g["nodes"], 60)) if html
                  else name_list(g["nodes"], 4), ", ".join(g["pools"]), shorten(text, 300 if html else 160),
                  Cell(checks, title=", ".join(g["checks"])) if html else checks)
    return table


def coverage_title(table: Table) -> str:
    nodes = getattr(table, "node_count", None)
    if nodes is None:
        nodes = len({str(row[0]) for row in table.rows})
    return f"Coverage: {nodes} GPU node{'s' if nodes != 1 else ''} left out of some checks"


def matrix_table(run: Run, icons: bool = True) -> Table:
    d = digest_of(run)
    table = Table(["feature"] + d.pools, align="l" + "l" * len(d.pools))
    for f in d.features:
        cells = []
        for p in d.pools:
            c = d.matrix.get((f, p), {})
            parts = [f"{ICON[v] if icons else v} {c[v]}" for v in ("fail", "warn", "skip", "pass") if c.get(v)]
            cells.append(" ".join(parts) if parts else "–")
        table.add(f, *cells)
    return table


def by_check_table(d: Digest) -> Table:
    """Per check and pool: the targets it judged, its verdicts, and the spread of the figures its passes measured."""
    table = Table(["feature", "check", "pool", "targets", "passed", "failed", "warned", "skipped",
                   "figures of the passes"], align="lllrrrrrl")
    order = {f: i for i, f in enumerate(d.features)}
    for s in sorted(d.checks.values(), key=lambda s: (order.get(s.feature or "(none)", 0), s.check, s.pool)):
        c = s.counts
        table.add(s.feature, s.check, s.pool, len(s.targets), c["pass"], c["fail"] or "", c["warn"] or "",
                  c["skip"] or "", s.spread())
    return table


def skip_reason_rows(d: Digest) -> list[tuple[str, int, int]]:
    """(reason, records, targets) of the run's skips, one row per reason whatever the node or GPU, most first."""
    groups: dict[str, list] = {}
    for g in d.skips.values():
        row = groups.setdefault(g.reason, [g.text, 0, set(), g.example])
        row[1] += g.records
        row[2].update(g.targets)
        if g.text != row[3] or g.several:
            row[0] = g.reason
    return sorted(((text, n, len(targets)) for text, n, targets, _ in groups.values()), key=lambda r: (-r[1], r[0]))


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
    """The benchmark highlights: (title, table) pairs, shared with report.html; made once per loaded run."""
    cached = run.__dict__.get("_benchmark_tables")
    if cached is None:
        cached = run.__dict__["_benchmark_tables"] = _benchmark_tables(run)
    return cached


def _benchmark_tables(run: Run) -> list[tuple[str, Table]]:
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
    if not rest.empty and len(rest) <= MAX_METRIC_ROWS:
        rows = rest.to_dict("records")
        labels = ParamLabels((r["benchmark"], r["parameters"]) for r in rows)
        t = Table(["benchmark", "metric", "parameters", "product", "node", "value"], align="lllllr",
                  note=labels.common_note())
        for r in rows:
            t.add(r["benchmark"], r["metric"], labels(r["benchmark"], r["parameters"]), r["product"], r["node"],
                  f"{fmt_num(r['value'])} {r['unit']}".strip())
        out.append((OTHER_METRICS, t))
    elif not rest.empty:
        groups = metric_spread(rest)
        labels = ParamLabels((g["benchmark"], g["parameters"]) for g in groups)
        t = Table(["benchmark", "metric", "parameters", "product", "rows", "nodes", "min", "median", "max"],
                  align="llllrrrrr",
                  note=(f"{len(rest)} rows grouped across nodes and GPUs (their node, GPU and UUID left out of the "
                       "parameters); every row is in metrics.parquet. " + labels.common_note()).strip())
        for g in groups:
            unit = f" {g['unit']}" if g["unit"] else ""
            t.add(g["benchmark"], g["metric"], labels(g["benchmark"], g["parameters"]), g["product"], g["n"],
                  g["nodes"], f"{fmt_num(g['min'])}{unit}", f"{fmt_num(g['median'])}{unit}",
                  f"{fmt_num(g['max'])}{unit}")
        out.append((OTHER_METRICS, t))
    return out


def render_summary(run: Run) -> str:
    """summary.md, within SUMMARY_BUDGET: tables cut shorter (then the text itself) when a run would need more."""
    limit = MAX_ROWS
    while True:
        text = _render(run, limit)
        size = len(text.encode("utf-8"))
        if size <= SUMMARY_BUDGET or limit <= 5:
            break
        limit //= 2
    if size > SUMMARY_BUDGET:
        note = f"\n\n… cut at {SUMMARY_BUDGET // 1024} KiB (a step summary's share); see report.html.\n"
        cut = text.encode("utf-8")[:SUMMARY_BUDGET - len(note.encode("utf-8"))].decode("utf-8", "ignore")
        text = cut[:cut.rfind("\n")] + note
    return text


def _render(run: Run, limit: int) -> str:
    failed = run.failed
    outcome = run.outcome or ("failed" if failed else "passed")
    icon = "❌" if failed or outcome == "failed" else ("⚠️" if outcome == "interrupted" or "cut short" in outcome
                                                      else "✅")
    lines = [f"## {icon} gpuproof run `{run.run_id}`: {outcome}", ""]
    lost = (run.meta.get("extra") or {}).get("lost_nodes") or {}
    if lost:           # nodes deleted or NotReady during the run: their checks are skips 'not judged' (issue #41)
        shown = sorted(lost.items(), key=lambda kv: natural_key(kv[0]))
        lines += [f"> **Nodes lost during the run ({len(lost)}):** "
                  + "; ".join(f"`{n}`: {shorten(why, 200)}" for n, why in shown[:limit])
                  + (f"; and {len(shown) - limit} more (failed-nodes.csv)" if len(shown) > limit else "")
                  + ". Their checks from then on are not judged (skipped, with the reason).", ""]
    facts = run_facts(run)
    if facts:
        lines += [" · ".join(f"**{k}** {v}" for k, v in facts), ""]
    if run.is_empty:
        lines += ["> **This run recorded no checks, no metrics, no samples and no junit.xml.** "
                  "It may have been interrupted before the first check ran.", ""]
        return "\n".join(lines)
    d = digest_of(run)
    if not run.checks.empty or run.junit:
        lines += [counts_table(run).to_markdown(), ""]

    fails = [r for r in d.problems if r["verdict"] == "fail"]
    junit_problems = run.junit.problems() if run.junit else []
    products = product_pools(run.inventory)
    if fails or junit_problems:
        lines += [f"### ❌ Failures ({len(fails) + len(junit_problems)})", ""]
        intro = failures_intro(d)
        if intro:
            lines += [intro, ""]
        if d.failing_nodes():
            lines += ["**By node**", "", _md(failing_nodes_table(d), limit, "failed-nodes.csv"), ""]
        if fails:
            lines += [_md(failures_table(fails, products=products), limit), ""]
        if junit_problems:
            t = Table(["", "pytest test", "message"])
            for c in junit_problems[:limit]:
                t.add("💥" if c.outcome == "error" else "❌", c.id, shorten(c.message, 300))
            if len(junit_problems) > limit:
                t.note = f"… and {len(junit_problems) - limit} more (see report.html)."
            lines += [t.to_markdown(), ""]
    warns = [r for r in d.problems if r["verdict"] == "warn"]
    if warns:
        table = failures_table(warns, products=products)
        lines += [f"### ⚠️ Warnings ({len(warns)})", "", _md(table, limit), ""]

    if not run.checks.empty:
        lines += ["### Results by feature and pool", "", _md(matrix_table(run), 100), ""]
        coverage = coverage_table(run)
        if coverage.rows:
            lines += [f"### {coverage_title(coverage)}", "", _md(coverage, limit), ""]
        else:
            lines += ["Coverage: every check ran on every GPU node it is for.", ""]
        by_check = by_check_table(d)
        lines += [f"<details><summary>Passes by check and pool ({len(by_check)})</summary>", "",
                  _md(by_check, max(limit, 100) if limit == MAX_ROWS else limit), "", "</details>", ""]

    reasons = skip_reason_rows(d)
    junit_reasons = run.junit.skip_reasons() if run.junit else []
    if reasons or junit_reasons:
        t = Table(["skipped", "count", "reason"], align="lrl")
        for reason, n, _ in reasons:
            t.add("checks", n, reason)
        for reason, n in junit_reasons:
            t.add("pytest tests", n, reason)
        lines += ["<details><summary>Skip reasons</summary>", "", _md(t, limit), "", "</details>", ""]

    for title, table in benchmark_tables(run):
        if title == OTHER_METRICS:   # long and secondary: folded
            lines += [f"<details><summary>{title} ({len(table)})</summary>", "", _md(table, limit), "",
                      "</details>", ""]
        else:
            lines += [f"### {title}", "", _md(table, limit), ""]

    if run.inventory.get("nodes"):
        lines += ["<details><summary>Cluster inventory</summary>", "", _md(fleet_table(run.inventory), limit), "",
                  "</details>", ""]
    lines += [f"Full report: `{run.path}/report.html` (self-contained; open it in a browser). Every record: "
              "checks.parquet and metrics.parquet (and their .jsonl) beside it.", ""]
    return "\n".join(lines)

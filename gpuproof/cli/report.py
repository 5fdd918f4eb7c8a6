"""gpuproof report: summary, html, failed-nodes, write, compare, baseline make, check.

RUN is a run folder (reports/<run-id>), a run id under ./reports, or "latest".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import GpuproofError

EXAMPLES = """\
examples:
  gpuproof report summary latest >> "$GITHUB_STEP_SUMMARY"
  gpuproof report html reports/20250101-120000-abc123
  gpuproof report failed-nodes latest | awk -F, 'NR > 1 && $2 == "fail" {print $1}' | sort -u
  gpuproof report write latest                  # every report again: what gpuproof run writes at its end
  gpuproof report compare reports/before reports/after
  gpuproof report baseline make reports/nightly-1 reports/nightly-2 -o baseline.json
  gpuproof report check latest --baseline baseline.json --rules rules.yaml

exit codes: 0 fine, 1 regression found (check), 2 bad input
"""


def _emit(text: str, output: str | None) -> None:
    if output:
        Path(output).write_text(text, encoding="utf-8")
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)


def _summary(args) -> int:
    from ..report.data import SUMMARY_FILE, load_run
    from ..report.summary import render_summary

    run = load_run(args.run, canonical=False)
    text = render_summary(run)
    if args.write:
        (run.path / SUMMARY_FILE).write_text(text, encoding="utf-8")
        print(f"wrote {run.path / SUMMARY_FILE}", file=sys.stderr)
    if args.output or not args.write:
        _emit(text, args.output)
    return 0


def _html(args) -> int:
    from ..report.data import HTML_FILE, load_run
    from ..report.html import render_html

    run = load_run(args.run, canonical=False)
    out = Path(args.output) if args.output else run.path / HTML_FILE
    out.write_text(render_html(run), encoding="utf-8")
    if run.is_empty:
        print(f"gpuproof: warning: run {run.path} recorded nothing; the report says so", file=sys.stderr)
    print(out)
    return 0


def _failed_nodes(args) -> int:
    from ..report.data import load_run
    from ..report.digest import digest_of, failed_nodes_csv

    _emit(failed_nodes_csv(digest_of(load_run(args.run, canonical=False))), args.output)
    return 0


def _write(args) -> int:
    import time

    from ..report import write_all
    from ..report.data import resolve_run

    start = time.monotonic()
    written = write_all(resolve_run(args.run))
    for path in written.values():
        print(path)
    print(f"gpuproof: {len(written)} reports written in {time.monotonic() - start:.1f}s", file=sys.stderr)
    return 0


def _compare(args) -> int:
    from ..report.compare import compare_runs
    from ..report.data import load_run

    runs = [load_run(r) for r in args.runs]
    if all(r.is_empty for r in runs):
        raise GpuproofError("none of these runs recorded anything (no checks, metrics, samples or junit.xml)")
    comparison = compare_runs(runs, by=args.by)
    _emit(comparison.render(args.format, args.min_change), args.output)
    return 0


def _baseline_make(args) -> int:
    from ..report.baseline import make_baseline, save_baseline
    from ..report.data import load_run

    baseline = make_baseline([load_run(r) for r in args.runs])
    save_baseline(baseline, args.output)
    print(f"wrote {args.output}: {len(baseline['metrics'])} metric rows from {len(args.runs)} run(s)")
    return 0


def _input_file(load, path):
    """Load a rules/baseline file; a parser's multi-line complaint (YAML marks) becomes one line."""
    try:
        return load(path)
    except GpuproofError as exc:
        raise GpuproofError(" ".join(str(exc).split())) from None


def _check(args) -> int:
    import json

    from ..report.baseline import check_run, load_baseline, load_rules
    from ..report.data import load_run

    rules = _input_file(load_rules, args.rules)
    baseline = _input_file(load_baseline, args.baseline)
    run = load_run(args.run)
    report = check_run(run, baseline, rules)
    if args.format == "json":
        text = json.dumps(report.to_json(), indent=2) + "\n"
    else:
        md = args.format == "md"
        table = report.table(markdown=md, everything=args.all)
        if not report.verdicts:
            body = "No metric matched a rule: check the rules' metric patterns against the run's metrics."
        elif not len(table):
            body = f"All {report.count('ok')} judged metrics are within their tolerance."
        else:
            body = table.to_markdown() if md else table.to_text()
            hidden = 0 if args.all else report.count("ok")
            if hidden:
                body += f"\n\n({hidden} metrics within tolerance not shown; --all shows them)"
        if md:
            icon = "❌" if report.regressions else "✅"
            text = f"## {icon} gpuproof regression check\n\n**{report.headline()}**\n\n{body}\n"
        else:
            text = f"{body}\n\n{report.headline()}\n"
    _emit(text, args.output)
    failed = bool(report.regressions) or (args.strict and report.count("missing"))
    if failed:
        what = f"{report.count('regression')} regression(s)"
        if args.strict and report.count("missing"):
            what += f", {report.count('missing')} missing metric(s)"
        print(f"gpuproof: {what} against {args.baseline}", file=sys.stderr)
    return 1 if failed else 0


def register(subparsers) -> None:
    report = subparsers.add_parser(
        "report", help="reports: summary, html, compare runs, baselines and regression checks",
        description=__doc__, epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = report.add_subparsers(dest="report_command", metavar="<report-command>")
    report.set_defaults(func=lambda args: (report.print_help(), 0)[1])

    p = sub.add_parser("summary", help="print a run's summary.md (Markdown, fit for a CI step summary)")
    p.add_argument("run", help="run folder, run id, or latest")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--write", action="store_true", help="(re)write summary.md in the run folder")
    p.set_defaults(func=_summary)

    p = sub.add_parser("html", help="write a run's self-contained report.html")
    p.add_argument("run", help="run folder, run id, or latest")
    p.add_argument("-o", "--output", help="where to write (default: RUN/report.html)")
    p.set_defaults(func=_html)

    p = sub.add_parser("failed-nodes", help="the failed nodes as CSV: node, verdict, pool, feature, check, reason",
                       description="One line per failed check on a node (verdict fail), per failed pytest test of a "
                                   "node none of whose checks failed (error) and per node lost during the run "
                                   "(lost); the run folder's failed-nodes.csv holds the same. gpuproof changes no "
                                   "node: feed this to kubectl cordon or a remediation system.")
    p.add_argument("run", help="run folder, run id, or latest")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.set_defaults(func=_failed_nodes)

    p = sub.add_parser("write", help="(re)write every report of a run: summary.md, report.html, failed-nodes.csv, "
                                     "junit-grouped.xml")
    p.add_argument("run", help="run folder, run id, or latest")
    p.set_defaults(func=_write)

    p = sub.add_parser("compare", help="runs side by side: metric deltas, verdict changes, cluster changes",
                       description="Compare runs with the first one (A): before/after an upgrade, or two GPU types.")
    p.add_argument("runs", nargs="+", metavar="RUN", help="two or more run folders; the first is the reference")
    p.add_argument("--format", choices=("text", "md", "json"), default="text")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--by", choices=("auto", "product", "none"), default="auto",
                   help="match metrics per GPU product (product), ignoring it (none), or product only when the "
                        "runs share one (auto, default)")
    p.add_argument("--min-change", type=float, default=0.0, metavar="FRACTION",
                   help="hide metric rows that changed less than this (0.02 = 2%%) in every run")
    p.set_defaults(func=_compare)

    p = sub.add_parser("baseline", help="make a baseline from one or more runs")
    bsub = p.add_subparsers(dest="baseline_command", metavar="<baseline-command>")
    p.set_defaults(func=lambda args: (p.print_help(), 0)[1])
    bm = bsub.add_parser("make", help="median of the runs' metrics, per benchmark/metric/parameters/product")
    bm.add_argument("runs", nargs="+", metavar="RUN")
    bm.add_argument("-o", "--output", required=True, help="baseline file to write (JSON)")
    bm.set_defaults(func=_baseline_make)

    p = sub.add_parser("check", help="judge a run against a baseline with a rules file; exit 1 on regression",
                       description="Judge RUN's metrics against a baseline. Exit 1 when a metric regressed.")
    p.add_argument("run", help="run folder, run id, or latest")
    p.add_argument("--baseline", required=True, help="baseline JSON from `gpuproof report baseline make`")
    p.add_argument("--rules", required=True, help="rules YAML (metric pattern, tolerance, direction)")
    p.add_argument("--format", choices=("text", "md", "json"), default="text")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")
    p.add_argument("--strict", action="store_true", help="also fail when a baseline metric is missing from the run")
    p.add_argument("--all", action="store_true", help="also list the metrics within tolerance")
    p.set_defaults(func=_check)

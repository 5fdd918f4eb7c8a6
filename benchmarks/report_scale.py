"""The reports of a 1,000-node run: build time, sizes, and report.html's load in a real browser (issue #52).

Makes the run folder with tests/fleet_runs.py (a real 4-replay-node run's records, each node's rewritten for
``--nodes`` nodes: the shapes and names a real run writes), then, in a child process, writes its reports as
``gpuproof run`` does at its end (``gpuproof.report.write_all``: summary.md, report.html, failed-nodes.csv,
junit-grouped.xml), timing it (wall and CPU seconds, peak memory); then opens report.html in headless Chromium and
reads the page's own load time (``data-gpuproof-load-ms``, set by report.js on the load event) from the DOM.

    .venv/bin/python benchmarks/report_scale.py --nodes 1000 --out /tmp/report1000.json
    .venv/bin/python benchmarks/report_scale.py --nodes 1000 --checkout /tmp/before    # another tree's reports

``--checkout`` writes the reports with another gpuproof tree (``git worktree add /tmp/before <commit>``) on the same
records: how the figures were before a change. Prints one JSON object (and writes it to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fleet_runs import make_fleet_run  # noqa: E402

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
REPORTS = ("report.html", "summary.md", "junit.xml", "junit-grouped.xml", "failed-nodes.csv", "checks.parquet",
           "checks.jsonl", "metrics.parquet")


def write_reports(run: Path, checkout: Path) -> dict:
    """write_all(run) in a child process with ``checkout``'s gpuproof: wall s, CPU s, peak RSS (MB)."""
    # the child's own peak memory: VmHWM (rusage's maxrss would count the parent's pages it was forked with)
    code = ("import re, sys, time; t = time.monotonic(); from gpuproof.report import write_all; "
            "write_all(sys.argv[1]); took = time.monotonic() - t; "
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
            "print(f'{took:.2f} {int(hwm) // 1024}')")
    env = dict(os.environ, PYTHONPATH=str(checkout))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True, text=True, env=env,
                          cwd=checkout, timeout=3600)
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"writing the reports failed: {proc.stderr[-3000:]}")
    took, peak = proc.stdout.split()[-2:]
    return {"wall_s": round(wall, 2), "in_process_s": float(took),
            "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2),
            "peak_rss_mb": int(peak)}


def open_in_browser(page: Path, timeout: int) -> dict:
    """Headless Chromium on ``page``: its whole run (start, load, DOM dumped) and the page's own load time."""
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if not browser:
        return {"skipped": "no Chromium (Debian: apt-get install chromium)"}
    with tempfile.TemporaryDirectory() as profile:
        cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
               "--disable-extensions", f"--user-data-dir={profile}", "--window-size=1280,2000", "--dump-dom",
               page.resolve().as_uri()]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"finished": False, "wall_s": timeout, "note": f"no DOM after {timeout}s"}
        wall = time.monotonic() - start
    tag = re.search(r"<html[^>]*>", proc.stdout)
    attrs = dict(re.findall(r'(data-gpuproof-[a-z-]+)="([^"]*)"', tag.group(0))) if tag else {}
    return {"finished": proc.returncode == 0 and bool(tag), "wall_s": round(wall, 2),
            "load_ms": int(attrs["data-gpuproof-load-ms"]) if "data-gpuproof-load-ms" in attrs else None,
            "ready": attrs.get("data-gpuproof-ready"), "errors": attrs.get("data-gpuproof-errors", "0")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--root", help="where to make the run folder (default: a temporary folder, removed)")
    ap.add_argument("--checkout", default=str(REPO), help="the gpuproof tree that writes the reports")
    ap.add_argument("--browser-timeout", type=int, default=600, help="seconds Chromium may take (0: do not open it)")
    ap.add_argument("--out", help="also write the JSON here")
    args = ap.parse_args()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="report-scale-"))
    try:
        start = time.monotonic()
        run = make_fleet_run(root, f"fleet-{args.nodes}", nodes=args.nodes, slow=(min(416, args.nodes - 1),))
        made = time.monotonic() - start
        out = {"nodes": args.nodes, "checkout": args.checkout, "records_made_s": round(made, 1),
               "check_records": sum(1 for _ in (run / "checks.jsonl").open()),
               "metric_rows": sum(1 for _ in (run / "metrics.jsonl").open()),
               "junit_cases": (run / "junit.xml").read_text().count("<testcase"),
               "loadavg_before": os.getloadavg()[0]}
        out["build"] = write_reports(run, Path(args.checkout))
        out["bytes"] = {name: (run / name).stat().st_size for name in REPORTS if (run / name).exists()}
        if (run / "junit-grouped.xml").exists():
            out["junit_grouped_cases"] = (run / "junit-grouped.xml").read_text().count("<testcase")
        if args.browser_timeout:
            out["browser"] = open_in_browser(run / "report.html", args.browser_timeout)
        out["loadavg_after"] = os.getloadavg()[0]
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()

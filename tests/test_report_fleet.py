"""The reports of a 1,000-node run (issue #52): they lead with the node that failed, summarize the rest, stay small,
and report.html opens in a real browser (headless Chromium) in seconds.

The run's records are tests/fleet_runs.py's: a real 4-replay-node run's records, every node's rewritten for 1,000
nodes (269,033 check records, 298,029 metric rows, 32,040 JUnit cases; h100-416 the slow node whose census failed,
17 failures). The reports are written by ``gpuproof report write`` as a process, as ``gpuproof run`` writes them at its
end. The browser test skips without Chromium unless GPUPROOF_REQUIRE_BROWSER=1 (test_report_html.py's rule).
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
from fleet_runs import make_fleet_run
from test_report_html import _browser, _render

from gpuproof.report.conformance import CHECKLISTS, anchor_matches
from gpuproof.report.summary import SUMMARY_BUDGET

pytestmark = [pytest.mark.server, pytest.mark.slow]     # `gpuproof report write` as a process, on 1,000 nodes

NODES, SLOW = 1000, "h100-416"
MB = 1024 * 1024


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    run = make_fleet_run(tmp_path_factory.mktemp("fleet"), "fleet-1000", nodes=NODES, slow=(416,))
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "report", "write", str(run)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield run, time.monotonic() - start
    for name in ("checks.jsonl", "metrics.jsonl"):     # 230 MB: pytest keeps its last temporary folders
        (run / name).unlink()


def _section(page: str, sid: str) -> str:
    m = re.search(rf'<section id="{sid}">(.*?)</section>', page, re.S)
    assert m, f"no section {sid}"
    return m.group(1)


def test_the_reports_stay_small(fleet):
    run, took = fleet
    html, md = (run / "report.html").stat().st_size, (run / "summary.md").stat().st_size
    assert html < 2 * MB, f"report.html is {html / MB:.1f} MB"
    assert md < SUMMARY_BUDGET, f"summary.md is {md} bytes"
    grouped = run / "junit-grouped.xml"
    assert grouped.stat().st_size < (run / "junit.xml").stat().st_size / 10
    assert took < 300, f"gpuproof report write took {took:.0f}s"


def test_the_page_leads_with_the_failing_node(fleet):
    run, _ = fleet
    page = (run / "report.html").read_text()
    order = [page.index(f'<section id="{s}">') for s in ("failures", "coverage", "matrix", "by-check", "checks")]
    assert order == sorted(order)
    failures = _section(page, "failures")
    assert "17 failed checks on 1 of 1000 GPU nodes (h100-416)" in failures
    by_node = re.search(r"<h3>By node \(1\)</h3>(.*?)</table>", failures, re.S).group(1)
    rows = re.findall(r"<tr>(.*?)</tr>", by_node, re.S)[1:]
    assert len(rows) == 1 and f">{SLOW}<" in rows[0] and ">17<" in rows[0]
    assert "census: census-matmul-pool ×8, census-copy-pool ×8, census-allreduce-pool" in rows[0]
    # what was not judged, by reason: the CPU path's skips on every node are rows, not 35,000 lines
    coverage = _section(page, "coverage")
    assert "Coverage: 1000 GPU nodes left out of some checks" in coverage
    assert "&lt;node&gt; GPU &lt;i&gt; (&lt;uuid&gt;): fp32 matmul &lt;n&gt; TFLOPS: no datasheet figure" in coverage
    assert len(re.findall(r"<tr>", coverage)) < 100


def test_passes_are_summarized_per_check_and_pool_with_their_spread(fleet):
    run, _ = fleet
    by_check = _section((run / "report.html").read_text(), "by-check")
    row = next(r for r in re.findall(r"<tr>(.*?)</tr>", by_check, re.S) if ">census-matmul-pool<" in r)
    cells = [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
    assert cells[:6] == ["census", "census-matmul-pool", "p5.48xlarge", "1000", "7992", "8"], cells
    assert re.fullmatch(r"min 0\.1\d* · median 0\.15\d* · max 0\.1\d* TFLOPS", cells[8]), cells[8]


def test_every_record_is_offered_not_embedded(fleet):
    run, _ = fleet
    page = (run / "report.html").read_text()
    checks = _section(page, "checks")
    assert "269033 check records" in checks and 'href="checks.parquet"' in checks
    assert checks.count("<tr>") == 1 + 17             # the header and the failures: no passing record is in the page
    for name in ("checks.parquet", "metrics.parquet", "junit.xml", "junit-grouped.xml", "failed-nodes.csv",
                 "inventory.json"):
        assert f'href="{name}"' in page, name


def test_failed_nodes_csv_lists_the_node_check_and_reason(fleet):
    run, _ = fleet
    rows = list(csv.DictReader((run / "failed-nodes.csv").open()))
    assert len(rows) == 17 and {r["node"] for r in rows} == {SLOW} and {r["verdict"] for r in rows} == {"fail"}
    assert sorted({r["check"] for r in rows}) == ["census-allreduce-pool", "census-copy-pool", "census-matmul-pool"]
    assert all(r["reason"].startswith(f"{SLOW}: ") and "of its pool's median" in r["reason"] for r in rows)


def test_summary_md_fits_a_step_summary_and_names_the_node(fleet):
    run, _ = fleet
    md = (run / "summary.md").read_text()
    assert len(md.encode()) < 64 * 1024
    assert f"| {SLOW} | p5.48xlarge | 17 | 0 | census: census-matmul-pool ×8" in md
    assert md.index("### ❌ Failures (18)") < md.index("### Results by feature and pool")


def test_junit_grouped_keeps_the_failing_case_and_the_upstream_names(fleet):
    run, _ = fleet
    root = ET.parse(run / "junit-grouped.xml").getroot()
    cases = [f"{c.get('classname')}::{c.get('name')}" for c in root.iter("testcase")]
    full = sum(1 for _ in ET.parse(run / "junit.xml").getroot().iter("testcase"))
    assert full == 32040 and len(cases) < 200, len(cases)
    assert f"suites.test_census::test_census_per_node[{SLOW}]" in cases          # failed: as pytest named it
    assert "suites.test_census::test_census_per_node[nodes]" in cases            # the 999 that passed
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == (str(len(cases)), "1")
    anchors = {a for reqs in CHECKLISTS.values() for r in reqs for p in r.parts for a in p.junit
               if a.startswith("TestSecureAcceleratorAccess/") or a.startswith("TestAcceleratorDriverRuntime")}
    for anchor in anchors:
        assert any(anchor_matches(anchor, c) for c in cases), anchor
    census = next(c for c in root.iter("testcase") if c.get("name") == "test_census_per_node[nodes]")
    assert census.find("system-out").text.startswith("passed on 999 node(s): h100-0, h100-1,")


def test_the_fleet_report_opens_in_headless_chromium_in_seconds(fleet, tmp_path):
    browser = _browser()
    run, _ = fleet
    start = time.monotonic()
    dom = _render(browser, run / "report.html", tmp_path / "profile", screenshot=tmp_path / "fleet.png")
    wall = time.monotonic() - start
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-gpuproof-ready="ok"' in html_tag and "data-gpuproof-errors" not in html_tag, html_tag
    loaded_ms = int(re.search(r'data-gpuproof-load-ms="(\d+)"', html_tag).group(1))   # the page's load event
    assert loaded_ms < 10_000 and wall < 60, f"loaded after {loaded_ms} ms; chromium ran {wall:.1f}s"
    assert re.search(r'<span id="check-shown"[^>]*>17 shown</span>', dom)
    print(f"report.html ({(run / 'report.html').stat().st_size} bytes): loaded after {loaded_ms} ms, "
          f"chromium {wall:.1f}s")

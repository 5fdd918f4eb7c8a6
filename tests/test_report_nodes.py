"""The reports by node (issue #52), on small runs: failed-nodes.csv, skip reasons taken together across nodes and
GPUs, the spread of the passes' figures, junit-grouped.xml, summary.md within a step summary's share, and the tables
that turn from one row per node into one row per reason when a fleet is large. tests/test_report_fleet.py has them
on 1,000 nodes."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

from gpuproof.cli.main import main
from gpuproof.report.data import load_run
from gpuproof.report.digest import digest_of, failed_nodes_csv, figure_of, reason_key
from gpuproof.report.html import render_html
from gpuproof.report.junit import group_by_node
from gpuproof.report.summary import MAX_METRIC_ROWS, MAX_NODE_ROWS, SUMMARY_BUDGET, render_summary
from gpuproof.results import CheckRecord, MetricRecord, RunDir

UUID = "GPU-5503dfe3-71b0-b651-64d6-1f0ea09a2d67"


def _junit(path, cases) -> None:
    """cases: (classname, name, outcome, message)."""
    body = []
    for cls, name, outcome, message in cases:
        inner = {"failed": f'<failure message="{message}">trace</failure>',
                 "error": f'<error message="{message}">trace</error>',
                 "skipped": f'<skipped type="pytest.skip" message="{message}">where</skipped>'}.get(outcome, "")
        body.append(f'<testcase classname="{cls}" name="{name}" time="1.5">{inner}</testcase>')
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
                    f'errors="0" failures="0" skipped="0" tests="{len(cases)}">{"".join(body)}</testsuite>'
                    "</testsuites>")


def _inventory(run: RunDir, names) -> None:
    run.write_inventory({"nodes": [{"name": n, "pool": "h100", "product": "H100", "gpu": True, "gpu_count": 8}
                                   for n in names]})


@pytest.mark.parametrize("message, target, key", [
    (f"h100-3 GPU 0 ({UUID}): fp32 matmul 0.156 TFLOPS: no datasheet figure", "h100-3",
     "<node> GPU <i> (<uuid>): fp32 matmul <n> TFLOPS: no datasheet figure"),
    ("needs 2 free GPUs on h100-30, h100-3 has 1", "h100-3", "needs 2 free GPUs on h100-30, <node> has 1"),
    ("pool has no MIG strategy", "pool/h100", "pool has no MIG strategy"),
    ("  spaced\nout  ", "", "spaced out"),
    ("", "n", "(no reason given)"),
])
def test_reason_key_takes_out_what_differs_by_node_and_gpu(message, target, key):
    assert reason_key(message, target) == key


@pytest.mark.parametrize("actual, figure", [
    ("0.0959 TFLOPS (62%)", (0.0959, "TFLOPS")), ("8", (8.0, "")), ("17.45 GB/s", (17.45, "GB/s")),
    ("-3", (-3.0, "")), ("1e3 W", (1000.0, "W")),
    ("true", None), ("[]", None), ("1 GPU: /dev/nvidia0", None), ('{"a": 1}', None), ("", None),
])
def test_figure_of_reads_one_figure_or_none(actual, figure):
    assert figure_of(actual) == figure


def test_failed_nodes_csv_has_each_failure_error_and_lost_node(tmp_path):
    run = RunDir(tmp_path / "r")
    _inventory(run, ["n-0", "n-1", "n-2", "n-3"])
    run.add_check(CheckRecord("health", "ecc", "n-1", "fail", expected="0", actual="3", pool="h100",
                              message="n-1: GPU 2 has 3 uncorrected, errors, \"quoted\""))
    run.add_check(CheckRecord("health", "ecc", "n-0", "pass", expected="0", actual="0", pool="h100"))
    run.add_check(CheckRecord("labels", "x", "n-1", "fail", expected="a", actual="b", pool="h100"))
    run.add_check(CheckRecord("census", "pool", "pool/h100", "fail", message="the pool's own"))   # not a node
    run.add_check(CheckRecord("health", "ecc", "n-3", "warn", message="a warning is no failure"))
    _junit(run.path / "junit.xml", [("suites.test_health", "test_health_per_node[n-1]", "failed", "ecc"),
                                     ("suites.test_health", "test_health_per_node[n-2]", "error", "pod timed out"),
                                     ("suites.test_quota", "test_quota", "failed", "not a node's")])
    run.meta.extra = {"lost_nodes": {"n-3": "NotReady at 12:00"}}
    run.finalize("failed")
    text = failed_nodes_csv(digest_of(load_run(run.path)))
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0] == "node,verdict,pool,feature,check,reason"
    assert [(r["node"], r["verdict"], r["feature"], r["check"]) for r in rows] == [
        ("n-1", "fail", "health", "ecc"), ("n-1", "fail", "labels", "x"),
        ("n-2", "error", "pytest", "suites.test_health::test_health_per_node[n-2]"), ("n-3", "lost", "", "")]
    assert rows[0]["reason"] == 'n-1: GPU 2 has 3 uncorrected, errors, "quoted"'
    assert rows[1]["reason"] == "expected a, actual b" and rows[2]["reason"] == "error: pod timed out"
    assert rows[3]["reason"] == "NotReady at 12:00" and rows[0]["pool"] == "h100"


def test_failed_nodes_command_prints_the_csv(tmp_path, capsys):
    run = RunDir(tmp_path / "r")
    run.add_check(CheckRecord("health", "ecc", "n-1", "fail", message="bad"))
    assert main(["report", "failed-nodes", str(run.path)]) == 0
    assert capsys.readouterr().out == "node,verdict,pool,feature,check,reason\nn-1,fail,other,health,ecc,bad\n"
    assert main(["report", "write", str(run.path)]) == 0
    assert (run.path / "failed-nodes.csv").read_text().endswith("n-1,fail,other,health,ecc,bad\n")
    assert (run.path / "report.html").exists() and (run.path / "summary.md").exists()


def test_junit_grouped_by_node(tmp_path):
    src = tmp_path / "junit.xml"
    nodes = [f"n-{i}" for i in range(4)]
    _junit(src, [("suites.test_a", "test_once", "passed", ""),
                 *[("suites.test_h", f"test_h[{n}]", "failed" if n == "n-2" else "passed", "bad n-2") for n in nodes],
                 *[("suites.test_g", f"test_g[{n}]", "skipped", f"no GPU on {n}" if n == "n-0" else "real GPUs")
                   for n in nodes],
                 ("suites.test_p", "test_p[fp16]", "passed", "")])
    counts = group_by_node(src, tmp_path / "grouped.xml", nodes)
    assert counts == {"cases": 10, "grouped_cases": 5}
    suite = ET.parse(tmp_path / "grouped.xml").getroot().find("testsuite")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == ["test_once", "test_h[nodes]", "test_h[n-2]", "test_g[nodes]", "test_p[fp16]"]
    assert cases["test_h[n-2]"].find("failure").get("message") == "bad n-2"
    assert cases["test_h[nodes]"].find("failure") is None and cases["test_h[nodes]"].get("time") == "4.500"
    assert cases["test_h[nodes]"].find("system-out").text == "passed on 3 node(s): n-0, n-1, n-3\n"
    skipped = cases["test_g[nodes]"].find("skipped")
    assert skipped.get("message") == "skipped on 4 node(s): real GPUs (3 nodes); no GPU on n-0 (1 nodes)"
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("5", "1", "1")


def test_summary_stays_within_its_budget_however_many_nodes_fail(tmp_path, monkeypatch):
    """Tables are cut shorter until summary.md fits (then the text itself): here with a budget of 24 KiB, as 512 KiB
    would need a fleet whose every node failed a hundred checks with long messages."""
    from gpuproof.report import summary

    run = RunDir(tmp_path / "r")
    long = "x" * 300
    for i in range(200):
        for check in range(3):
            run.add_check(CheckRecord("health", f"check-{check}", f"node-{i}", "fail", expected=long, actual=long,
                                      message=f"node-{i}: {long}"))
    run.finalize("failed")
    loaded = load_run(run.path)
    assert len(render_summary(loaded).encode()) > 24 * 1024
    monkeypatch.setattr(summary, "SUMMARY_BUDGET", 24 * 1024)
    md = render_summary(loaded)
    assert len(md.encode()) <= 24 * 1024 and SUMMARY_BUDGET == 512 * 1024
    assert "### ❌ Failures (600)" in md and "more rows (see failed-nodes.csv)" in md
    monkeypatch.setattr(summary, "SUMMARY_BUDGET", 3 * 1024)
    md = render_summary(loaded)
    assert len(md.encode()) <= 3 * 1024 and md.endswith("… cut at 3 KiB (a step summary's share); see report.html.\n")


def test_coverage_and_metrics_are_grouped_when_a_fleet_is_large(tmp_path):
    run = RunDir(tmp_path / "r")
    nodes = [f"h100-{i}" for i in range(MAX_NODE_ROWS + 1)]
    _inventory(run, nodes)
    for node in nodes:
        for gpu in range(2):
            run.add_check(CheckRecord("census", "datasheet", node, "skip", pool="h100",
                                      message=f"{node} GPU {gpu} ({UUID}): fp32 {1.5 + gpu} TFLOPS: no datasheet"))
            run.add_check(CheckRecord("census", "matmul", node, "pass", actual=f"{1 + gpu / 10} TFLOPS (100%)",
                                      pool="h100"))
            run.add_metric(MetricRecord("census", "matmul_tflops", 1 + gpu / 10, "TFLOPS",
                                        {"gpu": gpu, "uuid": f"U-{node}-{gpu}", "size": 256}, node=node))
    run.finalize("passed")
    loaded = load_run(run.path)
    md = render_summary(loaded)
    assert f"### Coverage: {len(nodes)} GPU nodes left out of some checks" in md
    assert ("| 101 | h100-0, h100-1, h100-2, h100-3 … (+97) | h100 | <node> GPU <i> (<uuid>): fp32 <n> TFLOPS: no "
            "datasheet | census: datasheet |") in md
    assert "| census | matmul | h100 | 101 | 202 |  |  |  | min 1 · median 1.05 · max 1.1 TFLOPS |" in md
    assert 2 * len(nodes) > MAX_METRIC_ROWS
    assert "<summary>Other metrics (1)</summary>" in md
    assert "| census | matmul_tflops | size=256 |  | 202 | 101 | 1 TFLOPS | 1.05 TFLOPS | 1.1 TFLOPS |" in md
    page = render_html(loaded)
    assert "202 rows grouped across nodes and GPUs" in page


def test_the_page_lists_every_record_of_a_small_run(tmp_path):
    run = RunDir(tmp_path / "r")
    for i in range(30):
        run.add_check(CheckRecord("nodes", "node-ready", f"n-{i}", "pass", actual="True"))
    page = render_html(load_run(run.path))
    assert "All checks (30)" in page and page.count(">node-ready<") >= 30
    assert json.dumps("n-29")[1:-1] in page

"""summary.md, write_all, and loading run folders (including bad ones)."""

import re

import pytest

from gpuproof.cli.main import main
from gpuproof.errors import GpuproofError
from gpuproof.report import write_all
from gpuproof.report.data import load_run, resolve_run
from gpuproof.report.junit import read_junit
from gpuproof.report.summary import render_summary
from synthetic_runs import make_run
from gpuproof.results import CheckRecord, MetricRecord, RunDir


@pytest.fixture(scope="module")
def run_path(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("summary"), "20250101-120000-abc123")


def test_summary_puts_failures_first_with_expected_actual_and_node(run_path):
    md = render_summary(load_run(run_path))
    assert md.startswith("## ❌ gpuproof run `20250101-120000-abc123`: failed")
    assert "**Kubernetes** v1.35.4" in md and "**duration** 3m12s" in md and "5 (32 GPUs, 3 pools)" in md
    order = [md.index(s) for s in ("| ✅ passed | 14 | 3 |", "### ❌ Failures (2)", "### ⚠️ Warnings (1)",
                                   "### Results by feature and pool", "### Coverage: 2 GPU nodes left out of some "
                                   "checks", "Skip reasons", "### Matmul",
                                   "### All-reduce", "### Inference", "Cluster inventory")]
    assert order == sorted(order)
    failure_row = next(line for line in md.splitlines() if "gfd-labels-present" in line and "❌" in line)
    cells = [c.strip() for c in failure_row.strip("|").split("|")]
    assert cells[:5] == ["❌", "labels", "gfd-labels-present", "h100-1", "h100"]
    assert cells[5] == '{"nvidia.com/gpu.count": "8"}' and cells[6] == '{"nvidia.com/gpu.count": null}'
    assert "| ❌ | suites.test_labels::test_gfd_labels_present | AssertionError: node h100-1 lacks label" in md
    assert "| pytest tests | 1 | no MIG-enabled pool in this fleet |" in md
    assert "| labels | ✅ 2 | – | ❌ 1 ✅ 1 | – |" in md
    assert "| NVIDIA-H100-80GB-HBM3 | fp16 | 658 | 989 | 67% | 8192x8192x8192 | h100-0 |" in md


def test_summary_escapes_table_cells(tmp_path):
    run = RunDir(tmp_path / "r")
    run.add_check(CheckRecord("quota", "limit|pipe", "cluster", "fail", expected="a|b", actual="line1\nline2",
                              message="bad | very"))
    md = render_summary(load_run(run.path))
    row = next(line for line in md.splitlines() if "limit" in line)
    assert "limit\\|pipe" in row and "a\\|b" in row and "line1 line2" in row
    assert len(re.split(r"(?<!\\)\|", row.strip("|"))) == 8   # 8 columns, no stray separators


def test_identical_failures_on_many_nodes_share_a_row(tmp_path):
    run = RunDir(tmp_path / "r")
    for i in range(12, 0, -1):
        run.add_check(CheckRecord("advertisement", "capacity", f"node-{i}", "fail", expected="8", actual="0",
                                  pool="a100" if i % 2 else "h100", message="no nvidia.com/gpu capacity"))
    run.add_check(CheckRecord("advertisement", "capacity", "node-13", "fail", expected="8", actual="4", pool="a100"))
    md = render_summary(load_run(run.path))
    assert "### ❌ Failures (13)" in md
    rows = [line for line in md.splitlines() if line.startswith("| ❌ | advertisement")]
    assert len(rows) == 2
    assert "| node-1, node-2, node-3, node-4, node-5, node-6 … (+6) | a100, h100 | 8 | 0 |" in rows[0]
    assert "| node-13 | a100 | 8 | 4 |" in rows[1]


def test_summary_command_prints_and_writes(run_path, capsys):
    assert main(["report", "summary", str(run_path)]) == 0
    assert capsys.readouterr().out.startswith("## ❌ gpuproof run")
    assert main(["report", "summary", str(run_path), "--write"]) == 0
    assert (run_path / "summary.md").read_text().startswith("## ❌ gpuproof run")


def test_write_all_writes_summary_and_html(tmp_path):
    path = make_run(tmp_path, "run1", fail_labels=False)
    written = write_all(path)
    assert set(written) == {"summary.md", "report.html", "failed-nodes.csv", "junit-grouped.xml"}
    assert (path / "failed-nodes.csv").read_text() == "node,verdict,pool,feature,check,reason\n"   # none failed
    assert (path / "summary.md").read_text().startswith("## ✅ gpuproof run `run1`: passed")
    assert "<!DOCTYPE html>" in (path / "report.html").read_text()
    assert not list(path.glob("*.tmp"))


def test_empty_run_says_so(tmp_path, capsys):
    run = RunDir.create(tmp_path, run_id="empty", cluster="embedded")
    write_all(run.path)
    md = (run.path / "summary.md").read_text()
    assert "recorded no checks, no metrics, no samples and no junit.xml" in md
    assert "recorded no checks" in (run.path / "report.html").read_text()
    assert main(["report", "html", str(run.path)]) == 0
    assert "recorded nothing" in capsys.readouterr().err
    assert main(["report", "compare", str(run.path), str(run.path)]) == 2
    assert "none of these runs recorded anything" in capsys.readouterr().err


def test_partial_run_checks_only(tmp_path):
    run = RunDir(tmp_path / "partial")
    run.add_check(CheckRecord("advertisement", "capacity", "a100-0", "pass", pool="a100"))
    run.add_metric(MetricRecord("custom", "widgets", 3, "1/s", {"x": 1}))
    md = render_summary(load_run(run.path))
    assert "## ✅" in md and "<summary>Other metrics (1)</summary>" in md and "| custom | widgets | x=1 |" in md
    assert "Failures" not in md and "pytest" not in md.split("|")[0]


def test_sampler_summaries_get_their_own_table(tmp_path):
    run = RunDir(tmp_path / "r")
    for gpu in (0, 1):
        params = {"of": "matmul", "phase": "measure", "gpu": gpu}
        run.add_metric(MetricRecord("utilization", "gpu_util_pct_mean", 97.5, "%", params, node="n1"))
        run.add_metric(MetricRecord("utilization", "power_w_mean", 612, "W", params, node="n1"))
        run.add_metric(MetricRecord("utilization", "power_w_p95", 650, "W", params, node="n1"))
    md = render_summary(load_run(run.path))
    assert "### GPU utilization while benchmarks ran" in md and "Other metrics" not in md
    assert "| node | GPU | benchmark | phase | gpu util % mean | power w mean |" in md
    assert "| n1 | 1 | matmul | measure | 97.5 | 612 |" in md


def test_missing_and_non_run_folders(tmp_path, capsys, monkeypatch):
    with pytest.raises(GpuproofError, match="not found"):
        load_run(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(GpuproofError, match="is not a gpuproof run folder"):
        load_run(tmp_path / "plain")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(GpuproofError, match="is a file"):
        resolve_run(tmp_path / "file.txt")
    assert main(["report", "summary", str(tmp_path / "nope")]) == 2
    assert "gpuproof: error: run folder" in capsys.readouterr().err
    bad = RunDir(tmp_path / "badjunit")
    (bad.path / "junit.xml").write_text("<testsuite><testcase")
    with pytest.raises(GpuproofError, match="not valid JUnit XML"):
        load_run(bad.path)


def test_run_ids_and_latest_resolve_under_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GpuproofError, match="no run folders under reports"):
        resolve_run("latest")
    RunDir.create("reports", run_id="20250101-000000-aaaaaa")
    RunDir.create("reports", run_id="20250102-000000-bbbbbb")
    assert resolve_run("latest").name == "20250102-000000-bbbbbb"
    assert resolve_run("20250101-000000-aaaaaa").name == "20250101-000000-aaaaaa"


def test_junit_counts_and_reasons(run_path):
    j = read_junit(run_path / "junit.xml")
    assert (j.total, j.passed, j.failed, j.errors, j.skipped) == (6, 3, 1, 0, 2)
    assert j.skip_reasons() == [("no MIG-enabled pool in this fleet", 1), ("needs a real GPU (embedded cluster)", 1)]
    assert j.problems()[0].detail == "assert None == '8'"


def test_metric_names_as_gpuproof_bench_writes_them(tmp_path):
    """busbw_gbps, p99_ms, a ratio_to_peak carrying peak_tflops, an "overall" step:
    the views accept these as well as the plain names."""
    from gpuproof.report.html import render_html

    run = RunDir(tmp_path / "bench")
    shape = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "dtype": "bf16", "m": 8192, "n": 8192,
             "k": 8192, "iters": 50}
    run.add_metric(MetricRecord("matmul", "tflops", 700.0, "TFLOPS", shape, node="local", product="H100"))
    run.add_metric(MetricRecord("matmul", "ratio_to_peak", 700 / 989.4, "ratio", {**shape, "peak_tflops": 989.4},
                                node="local", product="H100"))
    base = {"device": "cuda", "backend": "nccl", "world_size": 8, "nnodes": 1}
    for size, bw in ((1024, 1.5), (1 << 20, 120.0), (1 << 28, 360.0)):
        run.add_metric(MetricRecord("allreduce", "busbw_gbps", bw, "GB/s",
                                    {**base, "size_bytes": size, "dtype": "float32", "redop": "sum"}, product="H100"))
    run.add_metric(MetricRecord("allreduce", "avg_busbw_gbps", 160.5, "GB/s", base, product="H100"))
    for step, rps in ((0, 50.0), (1, 100.0), ("overall", None)):
        for pct, ms in (("p50", 5.0), ("p99", 12.0)):
            run.add_metric(MetricRecord("inference", f"{pct}_ms", ms + (step if step != "overall" else 0), "ms",
                                        {"step": step, "target_rps": rps}, product="H100"))
    md = render_summary(load_run(run.path))
    assert "| H100 | bf16 | 700 | 989 | 71% | 8192x8192x8192 | local |" in md
    assert "| H100 | 8 | float32 | 360 | 256 MiB | 160 |" in md
    assert "| H100 | 50 | 5 | 12 |" in md and "| H100 | 100 | 6 | 13 |" in md
    assert "Other metrics" not in md                          # every record was recognised
    plots = re.findall(r'data-plot="([a-z]+)"', render_html(load_run(run.path)))
    assert sorted(plots) == ["allreduce", "latency", "matmul"]


def test_coverage_lists_every_node_left_out_with_the_reason(tmp_path):
    """Nodes checks left out when they ran and the checks' own skips on a node, one row per node and reason;
    skips of a pool, a product or the cluster are not nodes left out."""
    run = RunDir(tmp_path / "r")
    run.add_coverage([{"check": "test_health_per_node", "feature": "health", "node": "kwok-10", "pool": "a",
                       "reason": "simulated (kwok): no GPU executes there, and this check needs real GPUs"},
                      {"check": "test_health_per_node", "feature": "health", "node": "kwok-2", "pool": "a",
                       "reason": "simulated (kwok): no GPU executes there, and this check needs real GPUs"}])
    run.add_check(CheckRecord("labels", "label-present", "gke-0", "skip", pool="g",
                              message="labelled by gke, not GPU Feature Discovery"))
    run.add_check(CheckRecord("mig", "mig-placement", "profile/1g.10gb", "skip", message="every one is taken"))
    run.add_check(CheckRecord("quota", "quota-admits-within", "cluster", "pass"))
    md = render_summary(load_run(run.path))
    assert "### Coverage: 3 GPU nodes left out of some checks" in md
    rows = [line for line in md.splitlines() if line.startswith(("| kwok-", "| gke-"))]
    assert rows == ["| gke-0 | g | labelled by gke, not GPU Feature Discovery | labels: label-present |",
                    "| kwok-2 | a | simulated (kwok): no GPU executes there, and this check needs real GPUs | "
                    "health: test_health_per_node |",
                    "| kwok-10 | a | simulated (kwok): no GPU executes there, and this check needs real GPUs | "
                    "health: test_health_per_node |"]


def test_coverage_says_when_nothing_was_left_out(tmp_path):
    run = RunDir(tmp_path / "r")
    run.add_check(CheckRecord("nodes", "node-ready", "n-0", "pass"))
    assert "Coverage: every check ran on every GPU node it is for." in render_summary(load_run(run.path))

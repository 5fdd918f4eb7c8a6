"""gpuproof report compare: metric deltas, verdict changes, cluster changes."""

import copy
import json

import pytest

from gpuproof.cli.main import main
from gpuproof.errors import GpuproofError
from gpuproof.report.compare import compare_runs
from gpuproof.report.data import load_run
from synthetic_runs import A100, H100, fleet_inventory, gpu_node, make_run, set_driver


@pytest.fixture(scope="module")
def upgrade(tmp_path_factory):
    """Before and after an upgrade: a100-0's driver changes, h100-1's labels get fixed,
    fp16 matmul gets 10% slower."""
    root = tmp_path_factory.mktemp("compare")
    before = make_run(root, "before", fail_labels=True)
    after = make_run(root, "after", fail_labels=False, scale={"matmul/tflops/fp16": 0.9},
                     inventory=set_driver(fleet_inventory(), "a100-0", "560.35.03"))
    return root, before, after


def test_metric_deltas_and_direction(upgrade):
    _, before, after = upgrade
    cmp = compare_runs([load_run(before), load_run(after)])
    assert cmp.by_product
    rows = {(m.metric, json.loads(m.parameters).get("dtype"), json.loads(m.parameters).get("m"), m.product): m
            for m in cmp.metrics}
    fp16 = rows[("tflops", "fp16", 8192, A100)]
    assert fp16.delta(1) == pytest.approx(-0.10)
    assert fp16.assessment(1) == "worse"
    assert rows[("tflops", "bf16", 8192, H100)].delta(1) == pytest.approx(0.0)
    latency = next(m for m in cmp.metrics if m.metric == "p99_ms")
    assert latency.assessment(1) == ""                         # unchanged: no verdict


def test_verdict_changes_and_test_outcomes(upgrade):
    _, before, after = upgrade
    cmp = compare_runs([load_run(before), load_run(after)])
    assert cmp.verdict_changes == [(("labels", "gfd-labels-present", "h100-1"), ["fail", "pass"])]
    assert cmp.test_changes == [("suites.test_labels::test_gfd_labels_present", ["failed", "passed"])]


def test_inventory_diff_is_part_of_the_comparison(upgrade):
    _, before, after = upgrade
    cmp = compare_runs([load_run(before), load_run(after)])
    assert [str(c) for c in cmp.inventory_changes[0]] == ["a100-0: driver_version 550.54.15 -> 560.35.03"]


def test_compare_command_text(upgrade, capsys):
    _, before, after = upgrade
    assert main(["report", "compare", str(before), str(after), "--min-change", "0.05"]) == 0
    out = capsys.readouterr().out
    assert "Checks whose verdict changed (1)" in out
    assert "pytest tests whose outcome changed (1)" in out
    assert "gfd-labels-present  h100-1  fail  pass" in out
    assert "Cluster changes A -> B (1)" in out and "driver_version  550.54.15  560.35.03  a100-0" in out
    metric_lines = [line for line in out.splitlines() if line.startswith("matmul/tflops")]
    assert len(metric_lines) == 2 and all("-10.0% worse" in line for line in metric_lines)
    assert "bf16" not in out                                   # --min-change hides unchanged rows


def test_compare_command_markdown_and_json(upgrade, tmp_path, capsys):
    _, before, after = upgrade
    assert main(["report", "compare", str(before), str(after), "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("## gpuproof compare: 2 runs")
    assert "| labels | gfd-labels-present | h100-1 | ❌ fail | ✅ pass |" in md
    assert "-10.0% 🔻" in md
    out = tmp_path / "cmp.json"
    assert main(["report", "compare", str(before), str(after), "--format", "json", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["inventory_changes"][0] == [{"node": "a100-0", "field": "driver_version", "before": "550.54.15",
                                             "after": "560.35.03", "also": ""}]
    assert data["verdict_changes"][0]["verdicts"] == ["fail", "pass"]


def test_two_gpu_types_are_matched_without_product(tmp_path):
    """Comparing an A100 fleet with an H100 fleet: the products differ, so metrics are
    matched on benchmark/metric/parameters and the product is shown per run."""
    a100 = fleet_inventory()
    a100["nodes"] = [n for n in a100["nodes"] if n["pool"] == "a100"]
    h100 = copy.deepcopy(a100)
    h100["nodes"] = [gpu_node(f"h100-{i}", "h100", H100) for i in range(2)]
    a = make_run(tmp_path, "a100-run", inventory=a100, samples=False)
    b = make_run(tmp_path, "h100-run", inventory=h100, samples=False)
    cmp = compare_runs([load_run(a), load_run(b)])
    assert not cmp.by_product
    assert cmp.run_label(0) == f"A: a100-run ({A100})" and cmp.run_label(1) == f"B: h100-run ({H100})"
    fp16 = next(m for m in cmp.metrics if m.metric == "tflops" and json.loads(m.parameters) ==
                {"device": "cuda", "dtype": "fp16", "iters": 50, "k": 8192, "m": 8192, "n": 8192})
    assert fp16.delta(1) == pytest.approx(989.4 / 312 - 1)
    assert fp16.assessment(1) == "better"
    text = cmp.render("text")
    assert "matched on benchmark, metric, parameters" in text
    assert {c.field for c in cmp.inventory_changes[0]} == {"node"}   # different nodes entirely
    assert compare_runs([load_run(a), load_run(b)], by="product").by_product


def test_three_runs_each_against_the_first(upgrade):
    root, before, after = upgrade
    third = make_run(root, "third", scale={"allreduce/busbw_gbps": 1.2}, samples=False)
    cmp = compare_runs([load_run(p) for p in (before, after, third)])
    busbw = next(m for m in cmp.metrics if m.metric == "busbw_gbps")
    assert busbw.delta(1) == pytest.approx(0) and busbw.delta(2) == pytest.approx(0.2)
    assert len(cmp.inventory_changes) == 2 and cmp.inventory_changes[1] == []
    assert list(cmp.metrics_table().columns[-2:]) == ["B vs A", "C vs A"]


def test_compare_needs_two_runs_and_existing_folders(upgrade, tmp_path, capsys):
    _, before, _ = upgrade
    with pytest.raises(GpuproofError, match="at least two runs"):
        compare_runs([load_run(before)])
    assert main(["report", "compare", str(before), str(tmp_path / "nope")]) == 2
    assert "nope not found" in capsys.readouterr().err


def test_targets_named_after_the_run_match_across_runs(tmp_path):
    from gpuproof.results import CheckRecord, RunDir

    paths = []
    for run_id, verdict in (("run-a", "pass"), ("run-b", "fail")):
        run = RunDir.create(tmp_path, run_id=run_id)
        run.add_check(CheckRecord("quota", "quota-refuses-over", f"namespace/gpuproof-{run_id}-quota", "pass"))
        run.add_check(CheckRecord("quota", "quota-admits-within", f"namespace/gpuproof-{run_id}-quota", verdict))
        paths.append(run.path)
    cmp = compare_runs([load_run(p) for p in paths])
    assert cmp.verdict_changes == [(("quota", "quota-admits-within", "namespace/gpuproof-<run-id>-quota"),
                                    ["pass", "fail"])]

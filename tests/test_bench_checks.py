"""The bench suites' verdicts are checks like every other suite's (issue #40 item 3): each product's run is a
``check.true`` on the node it ran on, and a run that raised, or a result that says not ok, fails naming that node,
what was expected and what the benchmark gave. Here the suites' own test functions run with the benchmark's
outcome made up in the shapes the workloads return it (the pods themselves run in tests/test_kubelet_pods.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from test_real_gpu_checks import suite

from gpuproof.bench import get
from gpuproof.plugin import bench_checks
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir

PRODUCTS = {"NVIDIA-H100-80GB-HBM3": ["h100-1", "h100-0"], "NVIDIA-L4": ["l4-0"]}
OK = {"ok": True}
NOT_OK = {"ok": False, "error": "rel_err 0.31 above tolerance 0.005 (bf16)"}
RAISED = "h100-0: pod bench-matmul-h100 failed: ImagePullBackOff"


# case: (suite, its test function, what run_per_product gives,
#        [(check, node, expected, actual)] that must fail)
RUNS = {
    "matmul-result-not-ok": (
        "bench_matmul", "test_matmul_per_product", {"NVIDIA-H100-80GB-HBM3": NOT_OK, "NVIDIA-L4": OK},
        [("matmul-result", "h100-0", bench_checks.RESULT_OK, f"result not ok: {NOT_OK['error']}")]),
    "hbm-pod-failed": (
        "bench_hbm", "test_hbm_per_product", {"NVIDIA-H100-80GB-HBM3": RAISED, "NVIDIA-L4": OK},
        [("hbm-result", "h100-0", bench_checks.RESULT_OK, RAISED)]),
    "probe-result-not-ok": (
        "bench_probe", "test_probe_per_product", {"NVIDIA-L4": {"ok": False, "problems": ["0 NVML devices"]}},
        [("probe-result", "l4-0", bench_checks.RESULT_OK, "result not ok: ['0 NVML devices']")]),
    "inference-load-did-not-run": (
        "bench_inference", "test_inference_per_product", {"NVIDIA-L4": "l4-0: load generator pod: OOMKilled"},
        [("inference-load-ran", "l4-0", "the load test ran", "l4-0: load generator pod: OOMKilled")]),
    "allreduce-wrong-elements": (
        "bench_allreduce", "test_allreduce_single_node_per_product",
        {"NVIDIA-H100-80GB-HBM3": {"ok": False, "error": "17 wrong elements"}},
        [("allreduce-result", "h100-0", bench_checks.RESULT_OK + " (no wrong element)",
          "result not ok: 17 wrong elements")]),
    "inference-endpoint-refused": (
        "bench_inference", "test_inference_endpoint",
        {"load": {"steps": [], "error": "connect to http://vllm.ml:8000: connection refused"}},
        [("inference-endpoint-load-ran", "endpoint", "load steps against the endpoint",
          "connect to http://vllm.ml:8000: connection refused")]),
}


def run_suite(case, monkeypatch, tmp_path):
    name, function, given, _ = RUNS[case]
    module = suite(name)
    monkeypatch.setattr(bench_checks, "require_real_gpus", lambda *a: None)
    monkeypatch.setattr(bench_checks, "node_gpus", lambda discovery, node, all_gpus=False: ("nvidia.com/gpu", 8))
    monkeypatch.setattr(bench_checks, "run_per_product", lambda bench, run, run_dir, products, *a, **k: {
        p: r for p, r in given.items() if p in products})
    if function == "test_inference_endpoint":
        monkeypatch.setenv(module.URL_ENV, "http://vllm.ml:8000")
        monkeypatch.setattr(bench_checks, "is_simulated", lambda *a: False)

        class Endpoint(type(get("inference"))):       # the real benchmark, its load pod's outcome made up
            def run_in_cluster(self, *a, **k):
                return given

            def to_records(self, result, node, product):
                return []
        monkeypatch.setattr(module, "get", lambda name: Endpoint())
    run_dir = RunDir.create(tmp_path, "bench")
    nodes = {n: SimpleNamespace(name=n, pool=n.rsplit("-", 1)[0], product=p) for p, ns in PRODUCTS.items() for n in ns}
    checker = Checker(run_dir, module.__name__.rsplit("_", 1)[-1], known_nodes=nodes)
    products = {p: ns for p, ns in PRODUCTS.items() if function != "test_probe_per_product" or p == "NVIDIA-L4"}
    kwargs = {"target": None, "run": SimpleNamespace(workload_image=None), "run_dir": run_dir,
              "gpu_products": products, "discovery": None, "check": checker}
    if function == "test_inference_endpoint":
        kwargs = {k: kwargs[k] for k in ("target", "run", "run_dir", "check")}
    getattr(module, function)(**kwargs)
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("case", RUNS)
def test_bench_check_fails_on_its_fault(case, monkeypatch, tmp_path):
    checker, rows = run_suite(case, monkeypatch, tmp_path)
    failed = {(r["check"], r["target"], str(r["expected"]), str(r["actual"])) for r in rows if r["verdict"] == "fail"}
    assert failed == set(RUNS[case][-1]), rows
    for _check, node, expected, actual in RUNS[case][-1]:
        assert any(m.startswith(f"{node}: ") and repr(expected) in m and repr(actual) in m
                   for m in checker.failures), checker.failures
    passed = {r["target"] for r in rows if r["verdict"] == "pass"}
    assert not passed & {node for _, node, _, _ in RUNS[case][-1]}, rows      # no pass beside the failure


def test_a_healthy_run_passes_each_product_on_its_node(monkeypatch, tmp_path):
    RUNS["healthy"] = ("bench_matmul", "test_matmul_per_product", {p: OK for p in PRODUCTS}, [])
    try:
        checker, rows = run_suite("healthy", monkeypatch, tmp_path)
    finally:
        del RUNS["healthy"]
    assert not checker.failures
    assert sorted((r["check"], r["target"], r["verdict"]) for r in rows) == [
        ("matmul-result", "h100-0", "pass"), ("matmul-result", "l4-0", "pass")]

"""Each fabric check fails on its fault (issue #50), naming node or pair, expected and actual: the suite's own test
functions run with gpuproof's real schedule, judgement and retests, and each pair's outcome made up in the shape the
workload returns it; the transports are NCCL's own logs, recorded (tests/data/nccl/SOURCES.md), read by
workloads/nccl_log.py. The pods themselves run in tests/test_fabric_kubelet.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_real_gpu_checks import suite

from gpuproof.bench import fabric, fabric_checks
from gpuproof.bench.workloads import import_workload
from gpuproof.plugin import bench_checks
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir

NCCL = Path(__file__).parent / "data" / "nccl"
H100 = "NVIDIA-H100-80GB-HBM3"
FAST, SLOW = 190.0, 60.0       # a slow pair still above the IB floor (40 GB/s): each case one fault


def read(log: str) -> dict:
    """A recorded NCCL log as the workload reads it (one node's side of a pair)."""
    return {"backend": "nccl", **import_workload("nccl_log").read((NCCL / log).read_text(errors="replace"))}


def recorded(transport: str) -> str:
    """A recorded log whose transport NCCL's reader gives as ``transport`` (SOURCES.md's table)."""
    nccl_log = import_workload("nccl_log")
    for path in sorted(NCCL.iterdir()):
        if path.suffix == ".md":
            continue
        if nccl_log.read(path.read_text(errors="replace")).get("transport") == transport:
            return path.name
    raise AssertionError(f"no recorded NCCL log reads as {transport}")


def fabric_model(slow_node=None, slow_link=None, transport="IB", failed=None, wrong=None, figure=None):
    """What each job gives on a made-up fabric: (nodes) -> result dict or an error text."""
    def result(nodes):
        pair = tuple(sorted(nodes))
        if failed and pair == tuple(sorted(failed)):
            return "pod fab-x-3-1 failed: exit code 1 (NCCL WARN NET/IB : Got completion with error 12)"
        busbw = figure or (SLOW if slow_node in nodes or (slow_link and pair == tuple(sorted(slow_link))) else FAST)
        bad = wrong if wrong and len(nodes) > 2 else 0
        return {"ok": not bad, "wrong_total": bad, "wrong_total_all": bad,
                "at_size": {"all_reduce": {"busbw_gbps": busbw, "size_bytes": 1 << 30}},
                "fabric": {"by_node": {n: read(transport) for n in nodes}}}
    return result


# case: (nodes, GPUPROOF_FABRIC_PAIRS, node -> allocatable besides GPUs, model, [(check, target, in actual)])
CASES = {
    "slow-node": (4, "", {}, dict(slow_node="h100-3"), [
        ("fabric-node", "h100-3", "measured again with known-good")]),
    "slow-link": (5, "all", {}, dict(slow_link=("h100-1", "h100-2")), [
        ("fabric-link", "h100-1<->h100-2", "each node is fast with a known-good node")]),
    "socket-with-rdma-offered": (2, "", {"h100-1": {"rdma/ib": "1"}}, dict(transport="socket"), [
        ("fabric-transport", "h100-1", "rdma/ib")]),
    "pair-did-not-run": (4, "", {}, dict(failed=("h100-0", "h100-3")), [
        ("fabric-pair-result", "h100-0<->h100-3", "Got completion with error 12")]),
    "ib-below-its-floor": (2, "", {}, dict(figure=30.0), [
        ("fabric-floor", "h100-0<->h100-1", "30 GB/s over IB")]),
    "ring-wrong-elements": (3, "", {}, dict(wrong=17), [
        ("fabric-ring-result", "h100-0", "17 wrong elements")]),
}
TRANSPORTS = {"IB": "IB", "socket": "Socket"}


def run_fabric(case, monkeypatch, tmp_path):
    count, pairs, offered, model, _ = CASES[case]
    model = dict(model)
    model["transport"] = recorded(TRANSPORTS[model.get("transport", "IB")])
    give = fabric_model(**model)
    module = suite("fabric")
    nodes = [f"h100-{i}" for i in range(count)]
    monkeypatch.setenv("GPUPROOF_FABRIC_PAIRS", pairs)
    monkeypatch.delenv(fabric.POD_ENV, raising=False)
    monkeypatch.setattr(bench_checks, "require_real_gpus", lambda *a: None)
    monkeypatch.setattr(bench_checks, "node_gpus", lambda discovery, node, all_gpus=False: ("nvidia.com/gpu", 8))
    monkeypatch.setattr(bench_checks, "node_tolerations", lambda *a: None)
    monkeypatch.setattr(fabric, "ensure_configmap", lambda run: None)

    def one(self, job_nodes, params, retest=False):
        outcome = give(job_nodes)
        job = fabric.JobRun(tuple(job_nodes), retest=retest)
        if isinstance(outcome, str):
            job.error = outcome
        else:
            job.result = outcome
        return job
    monkeypatch.setattr(fabric.Runner, "one", one)
    known = {n: SimpleNamespace(name=n, pool="h100", product=H100, taints=[],
                                allocatable={"nvidia.com/gpu": "8", **offered.get(n, {})}) for n in nodes}
    discovery = SimpleNamespace(node=lambda n: known[n], gpu_nodes=list(known.values()))
    run_dir = RunDir.create(tmp_path, "fabric")
    checker = Checker(run_dir, "fabric", known_nodes=known)
    run = SimpleNamespace(workload_image=None, labels={}, namespace="gpuproof-x", quick_bench=False)
    fan = SimpleNamespace(parallel=16, say=lambda msg: None)
    kwargs = dict(target=None, run=run, run_dir=run_dir, gpu_products={H100: nodes}, discovery=discovery, fanout=fan,
                  check=checker)
    module.test_fabric_pairs(**kwargs)
    module.test_fabric_ring(**kwargs)
    rows = [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]
    return checker, rows, run_dir


@pytest.mark.parametrize("case", CASES)
def test_fabric_check_fails_on_its_fault(case, monkeypatch, tmp_path):
    checker, rows, _ = run_fabric(case, monkeypatch, tmp_path)
    failed = {(r["check"], r["target"]) for r in rows if r["verdict"] == "fail"}
    want = CASES[case][-1]
    assert failed == {(c, t) for c, t, _ in want}, [r for r in rows if r["verdict"] == "fail"]
    for check, target, words in want:
        (row,) = [r for r in rows if (r["check"], r["target"], r["verdict"]) == (check, target, "fail")]
        assert words in str(row["actual"]), row
        assert any(m.startswith(f"{target}: ") and words in m for m in checker.failures), checker.failures


def test_a_healthy_fabric_passes_every_node_and_pair(monkeypatch, tmp_path):
    CASES["healthy"] = (6, "", {n: {"rdma/ib": "1"} for n in ("h100-0", "h100-5")}, {}, [])
    try:
        checker, rows, run_dir = run_fabric("healthy", monkeypatch, tmp_path)
    finally:
        del CASES["healthy"]
    assert not checker.failures
    verdicts = {(r["check"], r["target"]): r["verdict"] for r in rows}
    assert all(verdicts[("fabric-node", f"h100-{i}")] == "pass" for i in range(6))
    assert verdicts[("fabric-transport", "h100-0")] == "pass"            # offers RDMA, NCCL used IB
    assert verdicts[("fabric-transport", "h100-1")] == "skip"            # offers nothing to hold NCCL to
    pairs = [r for r in rows if r["check"] == "fabric-pair-result"]
    assert len(pairs) == 6 and all(r["verdict"] == "pass" for r in pairs)  # 6 nodes, 2 rounds of 3
    metrics = [json.loads(line) for line in (run_dir.path / "metrics.jsonl").read_text().splitlines()]
    assert {m["metric"] for m in metrics if m["benchmark"] == "fabric"} >= {
        "pair_busbw_gbps", "node_best_pair_busbw_gbps", "reference_busbw_gbps", "bad_nodes", "bad_links", "rounds"}


CHECKS_FAILED_HERE = {c for *_, want in CASES.values() for c, _, _ in want}


def test_every_fabric_check_has_a_case():
    assert set(fabric_checks.CHECKS) | {"fabric-ring-result"} == CHECKS_FAILED_HERE


def test_the_rings_records_keep_all_reduces_parameters_and_add_each_collectives():
    """all_reduce's records are what earlier runs wrote (a report still joins them); the other collectives' carry
    their name."""
    from gpuproof.bench import get

    row = {"size_bytes": 1 << 20, "type": "float32", "redop": "sum", "busbw_gbps": 1.5, "algbw_gbps": 1.0,
           "time_us": 9.0, "wrong": 0}
    result = {"device": "cpu", "backend": "gloo", "world_size": 4, "nnodes": 4,
              "results": [{**row, "collective": "all_reduce"}],
              "results_all": [{**row, "collective": "all_reduce"},
                              {**row, "collective": "all_gather", "redop": "none"}],
              "collectives": {"all_reduce": {"measured": True, "avg_busbw_gbps": 1.5, "wrong_total": 0},
                              "all_gather": {"measured": True, "avg_busbw_gbps": 0.7, "wrong_total": 0},
                              "reduce_scatter": {"measured": False, "why_not": "gloo runs it as an all-reduce"}},
              "avg_busbw_gbps": 1.5, "max_busbw_gbps": 1.5, "wrong_total": 0}
    recs = get("allreduce").to_records(result, node="4 nodes", product="P")
    busbw = {(r.parameters.get("collective"), r.metric) for r in recs if "busbw" in r.metric}
    assert busbw == {(None, "busbw_gbps"), (None, "avg_busbw_gbps"), (None, "max_busbw_gbps"),
                     ("all_gather", "busbw_gbps"), ("all_gather", "avg_busbw_gbps")}

"""gpuproof's pods on kubelet nodes (issue #28): the health workload, the probe and the benchmarks run in pods
on the embedded cluster's kubelet nodes, in the image those nodes lend (the host's Python over NVIDIA's mock
NVML), through the user's entry point (``gpuproof run``); faults injected into a node's mock with NVIDIA's
``nvml-mock-ctl`` are caught by the health check in that node's pod. The whole suite on lab, every pod path
included, runs from the bundle (tests/test_bundle_lab.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim import kubelet

NEEDS = kubelet.missing()
needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")

# one fault per GPU of node 0 (GPU 3 healthy); node 1 has none and must pass every item
FAULTS = {  # nvml-mock-ctl command -> (GPU, the health item that must fail, words of its actual value)
    "fail --gpu 0 --mode ecc_uncorrectable --xid 79": (0, "xid_during_run", "[79]"),
    "fail --gpu 1 --mode lost": (1, "gpu_reachable", "false"),
    "throttle --gpu 2 hw_thermal_slowdown": (2, "clock_events_during_load", "hw_thermal_slowdown"),
}
FAULT_FLEET = {"name": "kfaults", "pools": [
    {"name": "a100", "count": 2, "backend": "kubelet", "instanceType": "a2-highgpu-4g",
     "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 4},
     "faults": [{"node": 0, "nvmlCtl": list(FAULTS)}]}]}


def gpuproof_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--report-dir", str(reports), *args],
                          capture_output=True, text=True, timeout=1500)
    runs = sorted(p for p in reports.iterdir() if p.is_dir()) if reports.exists() else []
    assert runs, f"gpuproof run wrote no report (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    return proc, runs[-1]


def records(run: Path, name: str) -> list[dict]:
    f = run / name
    return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []


def uuids(node: str) -> list[str]:
    """The node's GPU UUIDs as its mock NVML config says them (the config the node was started with)."""
    from gpuproof.sim import nvidia
    from gpuproof.sim.gpunodes import mock_config

    pool = parse_fleet(FAULT_FLEET, source="kfaults.yaml").pools[0]
    cfg = mock_config(nvidia.locate(), pool.gpu, seed=f"{FAULT_FLEET['name']}/{node}")
    return [d["uuid"] for d in cfg["devices"]]


def test_nvml_ctl_faults_are_refused_off_kubelet_nodes():
    from gpuproof.errors import FleetError

    kwok = {"name": "k", "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 1},
            "faults": [{"nvmlCtl": ["fail --gpu 0 --mode lost"]}]}
    with pytest.raises(FleetError, match="is for kubelet nodes"):
        parse_fleet({"name": "x", "pools": [kwok]}, source="x.yaml")
    bad = {**kwok, "backend": "kubelet", "faults": [{"nvmlCtl": ["explode --gpu 0"]}]}
    with pytest.raises(FleetError, match="'explode' is not an nvml-mock-ctl fault command"):
        parse_fleet({"name": "x", "pools": [bad]}, source="x.yaml")
    labels = {**kwok, "backend": "kubelet", "faults": [{"setLabels": {"nvidia.com/gpu.count": "9"}}]}
    with pytest.raises(FleetError, match="kubelet nodes take NVML faults only"):
        parse_fleet({"name": "x", "pools": [labels]}, source="x.yaml")


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet` as a process, kubelet nodes
@needs_kubelet
def test_health_pod_catches_the_faults_nvidia_mock_injects(tmp_path):
    """ECC uncorrectable with XID 79, a lost GPU and HW thermal slowdown, each on one GPU of a100-0: the health
    check in that node's pod fails on the right item, naming the node, the GPU's UUID, expected and actual;
    a100-1, without faults, passes."""
    fleet = tmp_path / "kfaults.yaml"
    fleet.write_text(yaml.safe_dump(FAULT_FLEET))
    proc, run = gpuproof_run(tmp_path, "--fleet", str(fleet), "-k", "health")
    assert proc.returncode == 1, f"expected the health checks to fail:\n{proc.stdout[-3000:]}"
    checks = [r for r in records(run, "checks.jsonl") if r["feature"] == "health"]
    failed = [r for r in checks if r["verdict"] == "fail"]
    assert {r["target"] for r in failed} == {"a100-0"}, f"only a100-0 has faults: {failed}"
    assert [r for r in checks if r["target"] == "a100-1" and r["verdict"] == "pass"], "a100-1's health items"
    ids = uuids("a100-0")
    for command, (gpu, item, actual) in FAULTS.items():
        hits = [r for r in failed if r["check"] == item and f"GPU {gpu} ({ids[gpu]})" in r["message"]]
        assert hits, f"{command}: expected {item} to fail on a100-0 GPU {gpu} ({ids[gpu]}); failed: " + \
            "; ".join(f"{r['check']}: {r['message'] if r['check'] == 'health-pod' else r['message'][:120]}"
                      for r in failed)
        assert actual in str(hits[0]["actual"]) and hits[0]["expected"], hits[0]
        assert f"a100-0: GPU {gpu} ({ids[gpu]}): {item}" in proc.stdout, "the failure line names node and GPU"
    assert not [r for r in failed if f"GPU 3 ({ids[3]})" in r["message"]], "GPU 3 has no fault"

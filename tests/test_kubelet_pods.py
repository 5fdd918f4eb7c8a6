"""gpuproof's pods on kubelet nodes (issue #28): the health workload, the probe and the benchmarks run in pods
on the embedded cluster's kubelet nodes, in the image those nodes lend (the host's Python over NVIDIA's mock
NVML), through the user's entry point (``gpuproof run``); faults injected into a node's mock with NVIDIA's
``nvml-mock-ctl`` are caught by the health check in that node's pod."""

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


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet` as a process, kubelet nodes
@needs_kubelet
def test_the_whole_suite_passes_on_lab_with_its_pod_paths(tmp_path):
    """``gpuproof run --fleet lab --quick-bench``: the whole suite passes, and on the kubelet nodes the checks that
    skip on kwok nodes run and pass: health in a pod on every kubelet GPU node, the time-sliced GPU's pods seeing one
    UUID,
    NVIDIA's device plugin refusing a pod 2 of them (its own Allocate, over the pool's config file), its pods
    Ready, the claim's GPU seen in the pod (NVIDIA's DRA driver), and every benchmark through its pod path (probe,
    matmul, HBM, all-reduce in one pod and as an indexed Job over 2 nodes, inference Deployment + Service with
    its load pods, the NVML sampler in their pods), recorded like real ones: at the benchmarks' smallest sizes
    (``--quick-bench``, marked so in their records), since the paths, not the CPU's figures, are under test here
    (tests/test_bench_cpu_path.py runs each benchmark's CPU path at those sizes too)."""
    proc, run = gpuproof_run(tmp_path, "--fleet", "lab", "--quick-bench")
    assert proc.returncode == 0, f"gpuproof run --fleet lab --quick-bench failed:\n{proc.stdout[-6000:]}"
    checks = records(run, "checks.jsonl")
    kubelet_gpu_nodes = {"a100-0", "a100-1", "l4-shared-0"}
    health = {r["target"] for r in checks if r["feature"] == "health" and r["verdict"] == "pass"}
    assert health == kubelet_gpu_nodes, f"health items passed on {health}"
    same = [r for r in checks if r["check"] == "same-gpu-uuid"]
    assert [(r["target"], r["verdict"]) for r in same] == [("l4-shared-0", "pass")], same
    refused = [(r["check"], r["target"], r["verdict"]) for r in checks if r["check"].startswith("shared-request-gt1")]
    assert refused == [("shared-request-gt1-refused", "l4-shared-0", "pass")], \
        f"NVIDIA's device plugin refuses 2 shared GPUs, judged from the pool's config file: {refused}"
    ready = {r["target"] for r in checks if r["check"] == "device-plugin-ready" and r["verdict"] == "pass"}
    assert kubelet_gpu_nodes <= ready, f"device-plugin-ready passed on {ready}"
    dra_probe = [(r["target"], r["verdict"]) for r in checks if r["check"] == "dra-probe-uuid"]
    assert dra_probe == [("a100-dra-0", "pass")], f"the claim's GPU, and only it, in the pod: {dra_probe}"
    nvlink = {r["target"]: r["verdict"] for r in checks if r["check"] == "nvlink-set"}
    assert nvlink == {"a100-0": "pass", "a100-1": "pass"}, nvlink
    metrics = records(run, "metrics.jsonl")
    for bench in ("probe", "matmul", "hbm", "inference"):
        nodes = {m["node"] for m in metrics if m["benchmark"] == bench}
        assert nodes == {"a100-0", "l4-shared-0"}, f"{bench}: records on {nodes} (one node per product)"
    benches = [m for m in metrics if m["benchmark"] in ("probe", "matmul", "hbm", "inference", "allreduce")]
    assert benches and all(json.loads(m["parameters"]).get("sizes") == "quick" for m in benches), benches[:2]
    multi = {m["node"] for m in metrics if m["benchmark"] == "allreduce"}
    assert {"a100-0", "a100-1", "2 nodes"} <= multi, f"all-reduce across a100-0 and a100-1: records on {multi}"
    visible = {m["node"]: m["value"] for m in metrics if m["metric"] == "nvml_visible_devices"}
    assert visible == {"a100-0": 2, "l4-shared-0": 1}, f"GPUs NVML shows the probe pod: {visible}"
    util = [m for m in metrics if m["benchmark"] == "utilization" and m["metric"] == "gpu_util_pct_mean"]
    assert util and all(json.loads(m["parameters"]).get("run_mode") == "cluster" for m in util), util[:2]
    # driver_runtime_management: a probe pod granted a GPU by NVIDIA's device plugin, and by a claim on NVIDIA's DRA
    # driver, reads through the mock NVML the driver and CUDA driver versions GFD labelled and the DRA driver published
    got = {(r["check"], r["target"]): (r["verdict"], str(r["actual"])) for r in checks if r["feature"] == "driver"}
    for node in (*kubelet_gpu_nodes, "a100-dra-0"):
        assert got[("driver-version-in-pod", node)] == ("pass", "550.163.01"), got
        assert got[("cuda-driver-version-in-pod", node)] == ("pass", "12.4"), got
        assert got[("driver-version-advertised", node)][0] == "pass", got
    assert "DRA driverVersion of gpu-0, gpu-1=550.163.1" in got[("driver-version-advertised", "a100-dra-0")][1]
    # secure_accelerator_access on runc (device plugin, time-sliced too) and DRA nodes: every check passes, the
    # granted container reaches exactly its one GPU (tests/test_access_kubelet.py: the toolkit's own fault)
    access = {(r["check"], r["target"]): r for r in checks if r["feature"] == "access"}
    access_nodes = (*kubelet_gpu_nodes, "a100-dra-0")
    assert {k for k, r in access.items() if r["verdict"] == "pass"} == {
        (c, n) for c in ("access-granted-one-gpu", "access-ungranted-none", "access-envvar-none",
                         "access-sibling-none") for n in access_nodes}, sorted(access)
    assert all(access[("access-granted-one-gpu", n)]["actual"].startswith("1 GPU: /dev/nvidia") for n in access_nodes)
    junit = (run / "junit.xml").read_text()
    for sub in ("PositiveAccessTest", "NegativeIsolationTest", "EnvVarIsolationTest", "MultiContainerIsolationTest"):
        assert f'classname="suites.test_access.TestSecureAcceleratorAccess" name="test_{sub}[a100-dra-0]"' in junit
    # the Kubernetes AI Conformance 1.37 evidence folder made from this run, checked by the CNCF CI's rules: what the
    # run shows is Implemented with anchors that exist; only metadata and the MUSTs gpuproof does not test are left
    from gpuproof.report.conformance import CHECKLISTS, write_evidence

    ev = write_evidence(run, tmp_path / "evidence")
    doc = yaml.safe_load((tmp_path / "evidence" / "PRODUCT.yaml").read_text())
    status = {r["id"]: r["status"] for items in doc["spec"].values() for r in items}
    assert {status[r] for r in ("secure_accelerator_access", "driver_runtime_management", "gpu_sharing")} == {
        "Implemented"}, status
    untested = {r.id for r in CHECKLISTS["1.37"] if r.level == "MUST"} - {"secure_accelerator_access"}
    assert {p.split(":")[0].rsplit(".", 1)[1] for p in ev.problems if p.startswith("spec.")} == untested, ev.problems
    assert all(p.startswith("spec.") or "still a placeholder" in p for p in ev.problems), ev.problems
    assert (tmp_path / "evidence" / "PRODUCT.md").is_file()

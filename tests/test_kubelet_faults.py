"""Node faults on kubelet nodes (issue #28) that fail the checks about pods on the node: NVIDIA's device plugin
crash-looping, and gpuproof's health pod that cannot start. Each fault changes only what one node holds; the
kubelet, containerd and NVIDIA's plugin make the failure (``gpuproof/sim/kubelet/faults.py``), and the check fails
on that node through the user's entry point (``gpuproof run``), naming node, expected and actual, while the
healthy node beside it passes.

- ``devicePluginConfig``: a100-0's own device-plugin config (NVIDIA's chart picks one per node by its
  ``nvidia.com/device-plugin.config`` label) asks for CDI (``deviceListStrategy: cdi-cri``). NVIDIA's plugin v0.19.3
  then builds a CDI spec at start, finds no ``libcuda.so`` in the node's driver root and exits 1 ("unable to create
  cdi spec file: ... failed to locate libcuda.so"), again at every restart: its pod crash-loops. GFD, which reads
  the same file but makes no CDI spec, still labels the node, so it stays a GPU node by its labels.
- ``labelsOverGfd``: a100-0's ``nvidia.com/cuda.driver-version.full`` set to 535.104.05 over GFD's once NFD's master
  has applied GFD's labels (a hand's ``kubectl label --overwrite``; NFD leaves it until its hourly resync). The
  driver suite's probe pod there reads 550.54.15 through NVML: ``driver-version-in-pod`` fails naming the label.
- ``missingImages: [workloads]``: a100-0's containerd lacks the image gpuproof's workload pods run in (an
  air-gapped node built without it). The health pod stays ``ErrImageNeverPull`` there; the wait for it ends at
  once, saying so, instead of at the workload's deadline.
"""

from __future__ import annotations

import pytest
import yaml
from test_kubelet_pods import NEEDS, gpuproof_run, records

from gpuproof.errors import FleetError
from gpuproof.sim.fleet_file import parse_fleet

needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")

CDI = {"devicePluginConfig": {"flags": {"plugin": {"deviceListStrategy": "cdi-cri"}}}}
NO_WORKLOAD_IMAGE = {"missingImages": ["workloads"]}
LYING_DRIVER_LABEL = {"labelsOverGfd": {"nvidia.com/cuda.driver-version.full": "535.104.05"}}
GFD_DRIVER_LABELS = ("nvidia.com/cuda.driver-version.full; nvidia.com/cuda.driver-version.major; "
                     "nvidia.com/cuda.driver-version.minor; nvidia.com/cuda.driver-version.revision; "
                     "nvidia.com/cuda.driver.major; nvidia.com/cuda.driver.minor; nvidia.com/cuda.driver.rev")
# case: (the fault on a100-0, the checks `-k` selects, [(check, node, expected, words of the actual)] that must fail)
# case: (the node it is on, the fault, the checks run, [(check, node, expected, words of the actual)] that must fail)
FAULTS = {
    "device-plugin-asked-for-cdi-without-libcuda": ("a100-0", CDI, "device_plugin_pod_ready", [
        ("device-plugin-ready", "a100-0", "a Ready nvidia-device-plugin pod",
         "nvidia-device-plugin-ctr not ready: last exit 1")]),
    "driver-label-set-over-gfds": ("a100-1", LYING_DRIVER_LABEL, "TestAcceleratorDriverRuntimeManagement", [
        ("driver-version-in-pod", "a100-1", f"the driver version NVML reports in a pod granted a GPU, as "
         f"{GFD_DRIVER_LABELS} advertise", "nvidia.com/cuda.driver-version.full=535.104.05 but NVML in the pod "
         "reports 550.54.15")]),
    "workload-image-missing-on-the-node": ("a100-0", NO_WORKLOAD_IMAGE, "health", [
        ("health-pod", "a100-0", "the health pod finishes with a JSON result",
         "can never start on node a100-0: container workload: ErrImageNeverPull")]),
}
# one cluster per fleet, its faults judged apart in one run: faults whose nodes fail no check but their own (a node
# without its device plugin has no GPU for the driver suite's probe: it skips there). A node without the workload
# image fails every check that runs a pod on it, so it has a fleet of its own.
FLEETS = {"plugin-and-label": ("device-plugin-asked-for-cdi-without-libcuda", "driver-label-set-over-gfds"),
          "image": ("workload-image-missing-on-the-node",)}
HEALTHY = "a100-2"


def fleet(faults: dict) -> dict:
    """Three kubelet A100 nodes with one GPU each; ``faults`` {node index: fault}, the others healthy."""
    return {"name": "knodefaults", "pools": [
        {"name": "a100", "count": 3, "backend": "kubelet", "instanceType": "a2-highgpu-1g",
         "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 1},
         "faults": [{"node": i, **fault} for i, fault in sorted(faults.items())]}]}


def one(fault: dict) -> dict:
    return fleet({0: fault})


def test_node_faults_are_refused_off_kubelet_nodes_and_checked():
    kwok = one(CDI)["pools"][0] | {"backend": "kwok"}
    with pytest.raises(FleetError, match=r"faults\[0\].devicePluginConfig: is for kubelet nodes"):
        parse_fleet({"name": "x", "pools": [kwok]}, source="x.yaml")
    with pytest.raises(FleetError, match=r"faults\[0\].missingImages: is for kubelet nodes"):
        parse_fleet(one(NO_WORKLOAD_IMAGE) | {"pools": [kwok | {"faults": [NO_WORKLOAD_IMAGE]}]}, source="x.yaml")
    with pytest.raises(FleetError, match=r"faults\[0\].labelsOverGfd: is for kubelet nodes"):
        parse_fleet({"name": "x", "pools": [kwok | {"faults": [LYING_DRIVER_LABEL]}]}, source="x.yaml")
    assert parse_fleet(one(LYING_DRIVER_LABEL), source="x.yaml").pools[0].labels_over_gfd(0) == {
        "nvidia.com/cuda.driver-version.full": "535.104.05"}
    with pytest.raises(FleetError, match=r"missingImages\[0\]: 'pause' is not an image a kubelet node can lack"):
        parse_fleet(one({"missingImages": ["pause"]}), source="x.yaml")
    with pytest.raises(FleetError, match=r"devicePluginConfig.plugin: NVIDIA's device-plugin config has the mapping"):
        parse_fleet(one({"devicePluginConfig": {"plugin": {"deviceListStrategy": "cdi-cri"}}}), source="x.yaml")
    pool = parse_fleet(one(CDI), source="x.yaml").pools[0]
    base = {"version": "v1", "flags": {"migStrategy": "none"}}
    assert pool.node_plugin_config(0, base) == {"version": "v1", "flags": {
        "migStrategy": "none", "plugin": {"deviceListStrategy": "cdi-cri"}}}
    assert pool.node_plugin_config(1, base) == base


@pytest.mark.parametrize("group", list(FLEETS))
@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet` as a process, kubelet nodes
@needs_kubelet
def test_the_node_fault_fails_its_check_and_the_healthy_node_passes(tmp_path, group):
    cases = [FAULTS[c] for c in FLEETS[group]]
    path = tmp_path / "knodefaults.yaml"
    path.write_text(yaml.safe_dump(fleet({int(node.rsplit("-", 1)[1]): fault for node, fault, _, _ in cases})))
    selection = " or ".join(sel for _, _, sel, _ in cases)
    proc, run = gpuproof_run(tmp_path, "--fleet", str(path), "-k", selection)
    assert proc.returncode == 1, f"expected {selection} to fail:\n{proc.stdout[-3000:]}"
    checks = records(run, "checks.jsonl")
    failed = [r for r in checks if r["verdict"] == "fail"]
    listed = [e for *_, expectations in cases for e in expectations]
    assert sorted((r["check"], r["target"]) for r in failed) == sorted((c, n) for c, n, *_ in listed), failed
    for check, node, expected, actual in listed:
        rec, = [r for r in failed if (r["check"], r["target"]) == (check, node)]
        assert rec["expected"] == expected and actual in str(rec["actual"]), rec
        assert f"{node}: " in proc.stdout and actual in proc.stdout, "the failure line names node and actual"
        beside = [r["verdict"] for r in checks if r["feature"] == rec["feature"] and r["target"] == HEALTHY]
        assert "pass" in beside and "fail" not in beside, f"{HEALTHY} has no fault: {beside}"
    if any(fault is CDI for _, fault, _, _ in cases):     # NVIDIA's plugin said why, as the cluster came up
        assert "a100-0: NVIDIA's device plugin crash-loops: error starting plugins: error getting plugins: unable " \
               "to create cdi spec file" in proc.stdout + proc.stderr, proc.stdout[-3000:]

"""Checks on a fleet of real kubelet nodes among kwok ones (issue #28), without a cluster.

- Real and simulated is a fact of each node: a check that needs real GPUs is offered the real nodes only,
  each kwok node is left out with the reason, and the ``needs_real_gpus`` fixture judges a test by its own
  node or pool (by the whole cluster only when the test has neither).
- NVIDIA's chart names GFD's DaemonSet ``<release>-nvidia-device-plugin-gpu-feature-discovery`` and gives its
  pods the device plugin's own labels: a GFD pod alone on a node is not a device-plugin pod.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes.client import V1Container, V1ObjectMeta, V1Pod, V1PodCondition, V1PodSpec, V1PodStatus
from test_real_gpu_checks import suite

from gpuproof.plugin.coverage import SIMULATED_REASON, split
from gpuproof.discovery.nodes import KWOK_ANNOTATION, discover
from gpuproof.plugin.target import REAL_GPU_REASON
from gpuproof.plugin.fixtures import Checker, real_gpu_skip_reason
from gpuproof.plugin.checks import Pool
from gpuproof.results import RunDir


def gpu_node(name: str, kwok: bool) -> dict:
    meta = {"name": name, "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2",
                                     "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "pool": name.rsplit("-", 1)[0]}}
    if kwok:
        meta["annotations"] = {KWOK_ANNOTATION: "fake"}
    return {"metadata": meta, "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"},
                                         "conditions": [{"type": "Ready", "status": "True"}]}}


# the lab fleet's shape: kubelet nodes (not kwok) and kwok nodes in one cluster
LAB = discover([gpu_node("a100-0", kwok=False), gpu_node("a100-1", kwok=False), gpu_node("h100-mig-0", kwok=True)],
               pool_label="pool")
ALL_KWOK = discover([gpu_node("h100-mig-0", kwok=True)], pool_label="pool")


def test_real_gpu_checks_are_offered_the_real_nodes_and_leave_each_kwok_node_out_with_why():
    kept, left_out = split(LAB.gpu_nodes, places_pods=True, device_plugin=True, real_gpus=True)
    assert [n.name for n in kept] == ["a100-0", "a100-1"]
    assert left_out == [{"node": "h100-mig-0", "pool": "h100-mig", "reason": SIMULATED_REASON}]
    kept, left_out = split(LAB.gpu_nodes, places_pods=True, device_plugin=True, real_gpus=False)
    assert len(kept) == 3 and left_out == []          # kwok nodes take the checks that need no GPU code


@pytest.mark.parametrize("params, discovery, reason", [
    ({"gpu_node": LAB.node("a100-0")}, LAB, ""),
    ({"gpu_node": LAB.node("h100-mig-0")}, LAB, f"h100-mig-0: {SIMULATED_REASON}"),
    ({"gpu_pool": Pool("a100", [LAB.node("a100-0"), LAB.node("a100-1")])}, LAB, ""),
    ({"gpu_pool": Pool("h100-mig", [LAB.node("h100-mig-0")])}, LAB, f"h100-mig-0: {SIMULATED_REASON}"),
    ({}, LAB, ""),                                     # a test picking its own node, on a cluster with real ones
    ({}, ALL_KWOK, REAL_GPU_REASON),
], ids=["real-node", "kwok-node", "real-pool", "kwok-pool", "mixed-cluster", "kwok-cluster"])
def test_needs_real_gpus_judges_a_test_by_its_own_node_or_pool(params, discovery, reason):
    assert real_gpu_skip_reason(params, discovery) == reason


LAB_SESSION = f"""
import sys

import pytest

sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_kubelet_checks import LAB


@pytest.fixture(scope="session")
def discovery():
    return LAB


def pytest_configure(config):
    from gpuproof.plugin.target import get_target

    get_target(config)._discovery = LAB          # what parametrization reads; no cluster is started
"""
LAB_CHECKS = """
from gpuproof.plugin.checks import for_nodes


def test_each_node(gpu_node, needs_real_gpus):
    pass


@for_nodes(lambda n: n.name.startswith("h100-mig"))
def test_each_mig_pool(gpu_pool, needs_real_gpus):
    pass


def test_each_node_needing_no_gpu_code(gpu_node):
    pass
"""


@pytest.mark.server  # tier: a pytest session as a process (no cluster)
def test_on_a_lab_shaped_cluster_real_gpu_checks_run_on_kubelet_nodes_and_name_the_kwok_ones(tmp_path):
    (tmp_path / "conftest.py").write_text(LAB_SESSION)
    (tmp_path / "test_lab.py").write_text(LAB_CHECKS)
    res = subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "--progress-after=0",
                          f"--report-dir={tmp_path / 'reports'}", "--run-id=lab", "test_lab.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    assert "test_each_node[a100-0] PASSED" in out and "test_each_node[a100-1] PASSED" in out, out
    assert "test_each_node[h100-mig-0]" not in out, out
    assert "test_each_node_needing_no_gpu_code[h100-mig-0] PASSED" in out, out
    # the line is the test's: a marked test (for_nodes is the gpu_nodes marker) is not folded to its file
    assert ("SKIPPED [1] test_lab.py:9: no GPU node of the kind this check is for (filtered; left out: h100-mig-0: "
            f"{SIMULATED_REASON})") in out, out
    rows = [json.loads(line) for line in (tmp_path / "reports" / "lab" / "coverage.jsonl").read_text().splitlines()]
    assert sorted((r["check"], r["node"], r["reason"]) for r in rows) == [
        ("test_each_mig_pool", "h100-mig-0", SIMULATED_REASON), ("test_each_node", "h100-mig-0", SIMULATED_REASON)]


def chart_pod(name: str, container: str, ready: bool = True) -> V1Pod:
    """A pod of NVIDIA's chart (v0.19.3, release ``nvidia-device-plugin``): both DaemonSets' pods carry its
    template labels (``_helpers.tpl`` nvidia-device-plugin.templateLabels)."""
    labels = {"app.kubernetes.io/name": "nvidia-device-plugin", "app.kubernetes.io/instance": "nvidia-device-plugin"}
    return V1Pod(metadata=V1ObjectMeta(name=name, namespace="nvidia-device-plugin", labels=labels),
                 spec=V1PodSpec(node_name="a100-0", containers=[V1Container(name=container)]),
                 status=V1PodStatus(phase="Running",
                                    conditions=[V1PodCondition(type="Ready", status=str(ready))]))


GFD_POD = chart_pod("nvidia-device-plugin-gpu-feature-discovery-7xk2p", "gpu-feature-discovery-ctr")
PLUGIN_POD = chart_pod("nvidia-device-plugin-q8v4d", "nvidia-device-plugin-ctr")


def plugin_ready_check(tmp_path, pods: list[V1Pod]) -> tuple[Checker, list[dict]]:
    """The suite's device-plugin-ready check on node a100-0 with these pods on it."""
    module = suite("advertisement")
    node = LAB.node("a100-0")
    def listed(field_selector=None, label_selector=None):      # the API server's answer to either list
        if label_selector is None:
            return SimpleNamespace(items=pods)
        key, value = label_selector.split("=", 1)
        return SimpleNamespace(items=[p for p in pods if (p.metadata.labels or {}).get(key) == value])

    core = SimpleNamespace(list_pod_for_all_namespaces=listed)
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, node)
    module.test_device_plugin_pod_ready_on_node(gpu_node=node, target=SimpleNamespace(cluster=SimpleNamespace(
        core=core)), check=checker, plugin_pods=module.plugin_pods_by_node(core))
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def test_a_gfd_pod_alone_is_not_a_device_plugin_pod(tmp_path):
    module = suite("advertisement")
    assert not module._is_device_plugin(GFD_POD) and module._is_device_plugin(PLUGIN_POD)
    checker, (rec,) = plugin_ready_check(tmp_path, [GFD_POD])
    assert (rec["check"], rec["target"], rec["verdict"]) == ("device-plugin-ready", "a100-0", "fail")
    assert rec["expected"] == "a Ready nvidia-device-plugin pod" and rec["actual"] == "none", rec
    assert len(checker.failures) == 1


def test_the_device_plugin_pod_next_to_gfd_counts(tmp_path):
    checker, (rec,) = plugin_ready_check(tmp_path, [GFD_POD, PLUGIN_POD])
    assert rec["verdict"] == "pass" and checker.failures == []


def test_a_plugin_pod_without_a_known_label_is_found_on_its_node(tmp_path):
    """A deployment of the plugin with labels of its own: no label list names its node, which is listed alone."""
    own = V1Pod(metadata=V1ObjectMeta(name="gpu-plugin-x", namespace="kube-system", labels={"team": "gpu"}),
                spec=PLUGIN_POD.spec, status=PLUGIN_POD.status)
    checker, (rec,) = plugin_ready_check(tmp_path / "own", [own])
    assert rec["verdict"] == "pass", rec
    checker, (rec,) = plugin_ready_check(tmp_path / "gfd", [GFD_POD])
    assert rec["verdict"] == "fail" and rec["actual"] == "none", rec

"""``secure_accelerator_access`` (issue #38 items 1-2): what a container reached, judged against its grant.

The judging (gpuproof.discovery.access) and the suite (suites/test_access.py) run with a real ``Checker`` on a
discovered node, where only the per-node pod work (start the pod, collect each container's ``access.py`` JSON) is
given the outputs such pods print: each check fails on its fault naming node, pod and container, the grant, and the
GPUs the container reached (UUIDs and device files). Pure: no cluster. On kubelet nodes the suite runs for real:
tests/test_access_kubelet.py.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuproof.discovery import access
from gpuproof.discovery.nodes import discover
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir

REPO = Path(__file__).resolve().parents[1]
NODE = "a100-0"
GPU0, GPU1 = "GPU-6b1f2d2e-7a86-4c8f-9b0a-1f5d2c3e4a01", "GPU-6b1f2d2e-7a86-4c8f-9b0a-1f5d2c3e4a02"


def gpu_node(name: str = NODE):
    obj = {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "2",
                                                 "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
           "status": {"capacity": {"nvidia.com/gpu": "2"}, "allocatable": {"nvidia.com/gpu": "2"},
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    n, = discover([obj]).gpu_nodes
    return n


def result(files=(), gpus=(), env=None, mock=True, nvml=True, container="") -> dict:
    """What access.py prints in a container with these device files (GPU numbers) and NVML GPUs (UUIDs)."""
    return {"workload": "access", "container": container, "mock_nvml": mock,
            "device_files": [{"path": f"/dev/nvidia{i}", "minor": i} for i in files],
            "control_files": [], "env": {"NVIDIA_VISIBLE_DEVICES": None, **(env or {})},
            "nvml": ({"available": True, "gpus": [{"index": i, "uuid": u} for i, u in enumerate(gpus)]} if nvml else
                     {"available": False, "reason": "NVML unavailable: NVML Shared Library Not Found", "gpus": []})}


GRANTED = result([0], [GPU0], {"NVIDIA_VISIBLE_DEVICES": GPU0})        # the plugin's envvar strategy names GPU 0
UNGRANTED = result([], [GPU0, GPU1])                                      # the mock's host view: not counted
ENV_ALL = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}
HEALTHY = {
    "PositiveAccessTest": {"granted": GRANTED},
    "NegativeIsolationTest": {"ungranted": UNGRANTED},
    "EnvVarIsolationTest": {"ungranted-env-all": result([], [GPU0, GPU1], ENV_ALL)},
    "MultiContainerIsolationTest": {"granted": GRANTED, "ungranted": UNGRANTED},
}


def test_what_a_container_reaches():
    assert access.seen(GRANTED).describe() == f"1 GPU: /dev/nvidia0; NVML lists 1: {GPU0}"
    s = access.seen(UNGRANTED)
    assert s.count == 0 and s.describe() == ("no GPU: no /dev/nvidia<N>; NVIDIA's mock NVML lists its 2 GPU(s) to a "
                                             "container without /dev/nvidia<N> (its host view, not counted)")
    # a real NVML listing GPUs counts, device files or not
    assert access.seen(result([], [GPU0], mock=False)).count == 1
    assert access.seen(result([], nvml=False)).describe() == ("no GPU: no /dev/nvidia<N>; NVML unavailable (NVML "
                                                              "unavailable: NVML Shared Library Not Found)")
    assert access.allocated_by_plugin(GRANTED) == [GPU0]
    assert access.allocated_by_plugin(result(env={"NVIDIA_VISIBLE_DEVICES": f"{GPU0}::2"})) == [GPU0]   # time-sliced
    assert access.allocated_by_plugin(result(env={"NVIDIA_VISIBLE_DEVICES": "0"})) is None       # an index
    assert access.allocated_by_plugin(result(env={"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"})) \
        is None
    assert access.granted_one(GRANTED, [GPU0])[0] and not access.granted_one(GRANTED, [GPU1])[0]
    assert not access.granted_one(result([0], nvml=False), None)[0]          # NVML must list the one GPU


# ---------------------------------------------------------------------------- the suite, with the pods' output given


def suite():
    spec = importlib.util.spec_from_file_location("gpuproof_suite_access", REPO / "suites" / "test_access.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_suite(tmp_path, monkeypatch, test: str, results: dict, allocated=None, node=None):
    module = suite()
    node = node or gpu_node()
    pod = f"{module.PODS[test][0]}-{node.name}"
    monkeypatch.setattr(module, "outcome", lambda *a: {"pod": pod, "results": results, "allocated": allocated,
                                                       "why": ""})
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, known_nodes={node.name: node})
    method = getattr(module.TestSecureAcceleratorAccess(), f"test_{test}")
    method(gpu_node=node, run=None, target=None, discovery=None, check=checker, needs_real_gpus=None, fanout=None,
           request=None)
    records = [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]
    return checker, records


@pytest.mark.parametrize("test", list(HEALTHY))
def test_a_healthy_node_passes(tmp_path, monkeypatch, test):
    checker, records = run_suite(tmp_path, monkeypatch, test, HEALTHY[test])
    checker.finish()
    assert {(r["check"], r["target"], r["verdict"]) for r in records} == {(suite().CHECKS[test], NODE, "pass")}


TWO = f"2 GPUs: /dev/nvidia0, /dev/nvidia1; NVML lists 2: {GPU0}, {GPU1}"
ONE_EXPECTED = f"exactly 1 GPU, the one allocated ({GPU0}): 1 /dev/nvidia<N>, NVML lists 1 with that UUID"
NONE_EXPECTED = "no GPU: no /dev/nvidia<N>, none listed by NVML"
# id: (the test, its containers' results, [(check, node, expected, actual, words of the failure line)])
FAULTS = {
    "granted-pod-reaches-every-gpu": ("PositiveAccessTest", {"granted": result([0, 1], [GPU0, GPU1],
                                                                               {"NVIDIA_VISIBLE_DEVICES": GPU0})},
                                      [("access-granted-one-gpu", NODE, ONE_EXPECTED, TWO,
                                        f"pod access-pos-{NODE} container granted on {NODE}, granted 1 "
                                        "nvidia.com/gpu")]),
    "granted-pod-reaches-another-gpu": ("PositiveAccessTest", {"granted": result([1], [GPU1],
                                                                                 {"NVIDIA_VISIBLE_DEVICES": GPU0})},
                                        [("access-granted-one-gpu", NODE, ONE_EXPECTED,
                                          f"1 GPU: /dev/nvidia1; NVML lists 1: {GPU1} (allocated: {GPU0})",
                                          "granted 1 nvidia.com/gpu")]),
    "ungranted-pod-given-dev-nvidia0": ("NegativeIsolationTest", {"ungranted": result([0], [GPU0])},
                                        [("access-ungranted-none", NODE, NONE_EXPECTED,
                                          f"1 GPU: /dev/nvidia0; NVML lists 1: {GPU0}",
                                          f"pod access-neg-{NODE} container ungranted on {NODE}, granted nothing")]),
    "runtime-honours-nvidia-visible-devices": ("EnvVarIsolationTest", {
        "ungranted-env-all": result([0, 1], [GPU0, GPU1], ENV_ALL)},
        [("access-envvar-none", NODE, NONE_EXPECTED,
          f"{TWO} (env in the container: NVIDIA_DRIVER_CAPABILITIES=all, NVIDIA_VISIBLE_DEVICES=all)",
          f"container ungranted-env-all on {NODE}, granted nothing with NVIDIA_VISIBLE_DEVICES=all, "
          "NVIDIA_DRIVER_CAPABILITIES=all")]),
    "sibling-container-reaches-the-gpu": ("MultiContainerIsolationTest", {"granted": GRANTED,
                                                                          "ungranted": result([0], [GPU0])},
                                          [("access-sibling-none", NODE, NONE_EXPECTED,
                                            f"1 GPU: /dev/nvidia0; NVML lists 1: {GPU0}",
                                            f"pod access-two-{NODE} container ungranted on {NODE}")]),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_access_check_fails_on_its_fault(tmp_path, monkeypatch, case):
    test, results, expectations = FAULTS[case]
    checker, records = run_suite(tmp_path, monkeypatch, test, results)
    with pytest.raises(pytest.fail.Exception) as failed:
        checker.finish()
    for check, target, expected, actual, words in expectations:
        rec = next((r for r in records if r["check"] == check and r["verdict"] == "fail"), None)
        assert rec is not None, records
        assert (rec["target"], rec["expected"], rec["actual"]) == (target, expected, actual), rec
        assert rec["message"].startswith(f"{target}: ") and words in rec["message"], rec["message"]
        assert rec["message"] in str(failed.value).splitlines()
    if test == "MultiContainerIsolationTest":     # the granted container beside it still passes
        assert [r["verdict"] for r in records] == ["pass", "fail"]


def test_a_claim_names_the_allocated_gpu(tmp_path, monkeypatch):
    """DRA: the allocated GPU is the claim's device (its uuid attribute), not the container's env."""
    seen_other = {"granted": result([0], [GPU1])}
    checker, records = run_suite(tmp_path, monkeypatch, "PositiveAccessTest", seen_other, allocated=[GPU0])
    assert records[0]["verdict"] == "fail" and f"(allocated: {GPU0})" in records[0]["actual"]
    checker2, records2 = run_suite(tmp_path / "2", monkeypatch, "PositiveAccessTest", copy.deepcopy(seen_other),
                                   allocated=[GPU1])
    checker2.finish()
    assert records2[0]["verdict"] == "pass"


def test_a_node_whose_gpus_others_hold_skips_saying_so(tmp_path, monkeypatch):
    module = suite()
    node = gpu_node()
    monkeypatch.setattr(module, "free_on", lambda cluster, n, r: 0)
    work = module.node_work(None, SimpleNamespace(cluster=None), None, "PositiveAccessTest")
    with pytest.raises(module.NodeSkip, match=f"{NODE} has no free GPU: other pods hold them all"):
        work(node, None)

    def held(*a):
        raise module.NodeSkip("access-granted-one-gpu", f"{NODE} has no free GPU: other pods hold them all")

    monkeypatch.setattr(module, "outcome", held)
    checker = Checker(RunDir(tmp_path / "run"), module.FEATURE, known_nodes={node.name: node})
    with pytest.raises(pytest.skip.Exception, match="other pods hold them all"):
        module.TestSecureAcceleratorAccess().test_PositiveAccessTest(
            gpu_node=node, run=None, target=None, discovery=None, check=checker, needs_real_gpus=None, fanout=None,
            request=None)


def test_pods_and_claims_as_the_suite_makes_them():
    """The pods' shape: pinned to the node, every taint tolerated, only the granted container holds the grant
    (the extended resource, or the claim from the template on a DRA-only node)."""
    module = suite()
    run = SimpleNamespace(namespace="ns", labels={"gpuproof.dev/run": "r"}, image=None)
    node = gpu_node()
    two = module.manifest(run, node, "MultiContainerIsolationTest", run.labels)
    granted, ungranted = two["spec"]["containers"]
    assert (granted["name"], ungranted["name"]) == ("granted", "ungranted")
    assert granted["resources"]["limits"] == {"nvidia.com/gpu": 1} and "limits" not in ungranted.get("resources", {})
    assert two["spec"]["tolerations"] == [{"operator": "Exists"}]
    assert node.name in json.dumps(two["spec"]["affinity"])
    env = module.manifest(run, node, "EnvVarIsolationTest", run.labels)["spec"]["containers"][0]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"} in env["env"]
    dra_only = SimpleNamespace(name="a100-dra-0", gpu_resource="nvidia.com/gpu", mig_resources={}, dra=True,
                               allocatable_of=lambda r: 0)
    claimed = module.manifest(run, dra_only, "MultiContainerIsolationTest", run.labels)
    assert claimed["spec"]["resourceClaims"] == [{"name": "gpu", "resourceClaimTemplateName": "access-one"}]
    c0, c1 = claimed["spec"]["containers"]
    assert c0["resources"].get("claims") == [{"name": "gpu"}] and "claims" not in c1.get("resources", {})
    assert "limits" not in c0["resources"]

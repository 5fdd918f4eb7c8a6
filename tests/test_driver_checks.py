"""``driver_runtime_management`` (issue #38 item 3): the driver a pod granted a GPU gets against what its node says.

The pure comparison (gpuproof.discovery.driver) first: shared precision, each label on its own, missing labels
skipped with the reason. Then the suite (suites/test_driver.py) run with a real ``Checker`` on a node discovered
from real labels (tests/data/names/vks-a100-vgpu.yaml: a VKS node's GFD labels and DRA slice, SOURCES.md), where
only ``probe_on`` (start the probe pod, collect its JSON) returns what such a pod prints: a lying label fails,
naming node, label and in-pod value. Pure: no cluster.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpuproof.discovery import driver
from gpuproof.discovery.nodes import discover
from gpuproof.plugin.fixtures import Checker, GpuproofWarning
from gpuproof.results import RunDir

REPO = Path(__file__).resolve().parents[1]
VKS = yaml.safe_load((REPO / "tests" / "data" / "names" / "vks-a100-vgpu.yaml").read_text())
NODE_40C = VKS["nodes"][0]["name"]
IN_POD = {"driver_version": "580.126.09", "cuda_driver_version": "13.0"}      # what NVML says on that node


@pytest.mark.parametrize("advertised, actual, part, same", [
    ("580.65.6", "580.65.06", None, True),        # DRA's semver against NVML's zero-padded revision
    ("580.65.06", "580.65.6", None, True),
    ("13.0.0", "13.0", None, True),               # cudaDriverVersion against NVML's CUDA driver version
    ("13.0", "13.0", None, True),
    ("580", "580.126.09", 0, True),               # a .major label
    ("09", "580.126.09", 2, True),                # a .revision label, zero-padded as GFD writes it
    ("9", "580.126.09", 2, True),
    ("580.126", "580.126.09", None, True),        # shared precision: the first two numbers
    ("535.104.05", "580.126.09", None, False),
    ("580.126.08", "580.126.09", None, False),    # the vGPU host driver's version is not the guest's
    ("12.9", "13.0", None, False),
    ("126", "580.126.09", 0, False),
    ("580", "", None, False),
    ("", "580.126.09", None, False),
])
def test_versions_compare_at_shared_precision(advertised, actual, part, same):
    assert driver.same_version(advertised, actual, part) is same


def _node(labels: dict | None = None, drop: tuple[str, ...] = (), slices: bool = True, edit=None):
    data = yaml.safe_load(yaml.safe_dump(VKS))
    row = data["nodes"][0]
    row["labels"] = {k: v for k, v in {**row["labels"], **(labels or {})}.items() if not k.startswith(drop or "\0")}
    if edit:
        edit(data)
    obj = {"metadata": {"name": row["name"], "labels": row["labels"]},
           "status": {"capacity": {"nvidia.com/gpu": "1"}, "allocatable": {"nvidia.com/gpu": "1"},
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    n, = discover([obj], slices=data["resourceSlices"] if slices else None).gpu_nodes
    return n


def test_a_real_node_agrees_with_its_pod_through_every_label_and_attribute():
    n = _node()
    for kind in ("driver", "cuda"):
        c = driver.compare(n, IN_POD, kind)
        assert c.ok, c
    assert driver.compare(n, IN_POD, "driver").compared == [
        "nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.driver-version.major",
        "nvidia.com/cuda.driver-version.minor", "nvidia.com/cuda.driver-version.revision",
        "nvidia.com/cuda.driver.major", "nvidia.com/cuda.driver.minor", "nvidia.com/cuda.driver.rev",
        "DRA driverVersion of gpu-0"]
    assert driver.compare(n, IN_POD, "cuda").compared[-1] == "DRA cudaDriverVersion of gpu-0"


def test_a_lying_label_fails_by_label_and_in_pod_value():
    c = driver.compare(_node({"nvidia.com/cuda.driver-version.full": "535.104.05"}), IN_POD, "driver")
    assert c.bad == ["nvidia.com/cuda.driver-version.full=535.104.05 but NVML in the pod reports 580.126.09"]
    c = driver.compare(_node({"nvidia.com/cuda.driver.rev": "08"}), IN_POD, "driver")
    assert c.bad == ["nvidia.com/cuda.driver.rev=08 but NVML in the pod reports 580.126.09"]
    c = driver.compare(_node({"nvidia.com/cuda.runtime-version.full": "12.9"}), IN_POD, "cuda")
    assert c.bad == ["nvidia.com/cuda.runtime-version.full=12.9 but NVML in the pod reports 13.0"]


def test_a_lying_dra_attribute_fails():
    def edit(d):
        d["resourceSlices"][0]["spec"]["devices"][0]["attributes"]["driverVersion"] = {"version": "570.133.20"}
    c = driver.compare(_node(edit=edit), IN_POD, "driver")
    assert c.bad == ["DRA driverVersion of gpu-0=570.133.20 but NVML in the pod reports 580.126.09"]


def test_missing_labels_skip_with_the_reason():
    n = _node(drop=("nvidia.com/cuda.",), slices=False)
    for kind in ("driver", "cuda"):
        c = driver.compare(n, IN_POD, kind)
        assert not c.ok and c.bad == [] and f"{NODE_40C} advertises no" in c.skip and "nvidia.com/cuda." in c.skip
    only_dra = _node(drop=("nvidia.com/cuda.",))
    assert driver.compare(only_dra, IN_POD, "driver").compared == ["DRA driverVersion of gpu-0"]
    only_old = _node(drop=("nvidia.com/cuda.driver-version", "nvidia.com/cuda.runtime-version"), slices=False)
    assert driver.compare(only_old, IN_POD, "cuda").compared == ["nvidia.com/cuda.runtime.major",
                                                                  "nvidia.com/cuda.runtime.minor"]


def test_a_pod_whose_nvml_cannot_say_fails_every_source():
    c = driver.compare(_node(slices=False), {"available": False, "reason": "libnvidia-ml.so.1 not found"}, "driver")
    assert len(c.bad) == 7 and c.bad[0].endswith("reports no driver version (libnvidia-ml.so.1 not found)")


# ---------------------------------------------------------------------------- the suite, with the pod's output given


def suite():
    spec = importlib.util.spec_from_file_location("gpuproof_suite_driver", REPO / "suites" / "test_driver.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe_result(**nvml) -> dict:
    return {"workload": "probe", "host": f"driver-probe-{NODE_40C}-0", "nvml": {"available": True, **IN_POD, **nvml}}


# the fan-out's item side, its work run at once in the item's thread (no lane: probe_on is given below)
FANOUT = SimpleNamespace(result=lambda item, node, work, name=None: work(node, None))


def run_suite(tmp_path, monkeypatch, node, result):
    module = suite()
    asked = []

    def probe_on(run, target, n, count, limits, args=(), prefix="probe", lane=None):
        asked.append((n.name, count, limits, prefix))
        return [result]

    monkeypatch.setattr(module, "probe_on", probe_on)
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, known_nodes={node.name: node})
    # the suite's two tests, as pytest runs them (one Checker for both: the fault rows list the failures of either)
    tests = module.TestAcceleratorDriverRuntimeManagement()
    for call in (lambda: tests.test_VerifiableMechanismExposed(gpu_node=node, check=checker, needs_real_gpus=None),
                 lambda: tests.test_DriverAndRuntimeCompatibility(
                     gpu_node=node, run=None, target=SimpleNamespace(cluster=None), check=checker,
                     needs_real_gpus=None, fanout=FANOUT, request=SimpleNamespace(node=None))):
        try:
            call()
        except pytest.skip.Exception:
            pass
    records = [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]
    return checker, records, asked


LIE = "nvidia.com/cuda.driver-version.full=535.104.05 but NVML in the pod reports 580.126.09"
# id: (node labels changed, the probe's nvml changed, [(check, node, expected, actual)] that must fail)
FAULTS = {
    "gfd-driver-label-lies": (
        {"nvidia.com/cuda.driver-version.full": "535.104.05"}, {},
        [("driver-version-in-pod", NODE_40C, "the driver version NVML reports in a pod granted a GPU, as "
          "nvidia.com/cuda.driver-version.full; nvidia.com/cuda.driver-version.major; "
          "nvidia.com/cuda.driver-version.minor; nvidia.com/cuda.driver-version.revision; "
          "nvidia.com/cuda.driver.major; nvidia.com/cuda.driver.minor; nvidia.com/cuda.driver.rev; "
          "DRA driverVersion of gpu-0 advertise", LIE)]),
    "pod-gets-another-cuda-driver": (
        {}, {"cuda_driver_version": "12.9"},
        [("cuda-driver-version-in-pod", NODE_40C, "the CUDA driver version NVML reports in a pod granted a GPU, as "
          "nvidia.com/cuda.runtime-version.full; nvidia.com/cuda.runtime-version.major; "
          "nvidia.com/cuda.runtime-version.minor; nvidia.com/cuda.runtime.major; nvidia.com/cuda.runtime.minor; "
          "DRA cudaDriverVersion of gpu-0 advertise",
          "nvidia.com/cuda.runtime-version.full=13.0 but NVML in the pod reports 12.9; "
          "nvidia.com/cuda.runtime-version.major=13 but NVML in the pod reports 12.9; "
          "nvidia.com/cuda.runtime-version.minor=0 but NVML in the pod reports 12.9; "
          "nvidia.com/cuda.runtime.major=13 but NVML in the pod reports 12.9; "
          "nvidia.com/cuda.runtime.minor=0 but NVML in the pod reports 12.9; "
          "DRA cudaDriverVersion of gpu-0=13.0.0 but NVML in the pod reports 12.9")]),
}


def test_healthy_node_passes(tmp_path, monkeypatch):
    node = _node()
    checker, records, asked = run_suite(tmp_path, monkeypatch, node, probe_result())
    assert asked == [(NODE_40C, 1, {"nvidia.com/gpu": 1}, "driver-probe")]
    checker.finish()
    assert {r["check"]: r["verdict"] for r in records} == {
        "driver-version-advertised": "pass", "driver-version-in-pod": "pass", "cuda-driver-version-in-pod": "pass"}


def test_a_node_advertising_nothing_warns_and_skips(tmp_path, monkeypatch):
    node = _node(drop=("nvidia.com/cuda.",), slices=False)
    with pytest.warns(GpuproofWarning, match="advertises neither its driver version nor its CUDA driver version"):
        checker, records, asked = run_suite(tmp_path, monkeypatch, node, probe_result())
    assert asked == [] and [(r["check"], r["verdict"]) for r in records] == [
        ("driver-version-advertised", "warn"), ("driver-version-in-pod", "skip")]
    # VerifiableMechanismExposed's JUnit case skips on the warning (a warning alone shows no mechanism)
    with pytest.warns(GpuproofWarning), pytest.raises(pytest.skip.Exception, match="advertises no driver version"):
        suite().TestAcceleratorDriverRuntimeManagement().test_VerifiableMechanismExposed(
            gpu_node=node, check=Checker(RunDir(tmp_path / "again"), "driver", known_nodes={node.name: node}),
            needs_real_gpus=None)


@pytest.mark.parametrize("case", list(FAULTS))
def test_driver_check_fails_on_its_fault(tmp_path, monkeypatch, case):
    labels, nvml, expectations = FAULTS[case]
    checker, records, _ = run_suite(tmp_path, monkeypatch, _node(labels), probe_result(**nvml))
    with pytest.raises(pytest.fail.Exception) as failed:
        checker.finish()
    for check, target, expected, actual in expectations:
        rec = next((r for r in records if r["check"] == check and r["target"] == target and r["verdict"] == "fail"),
                   None)
        assert rec is not None, records
        assert (rec["expected"], rec["actual"]) == (expected, actual), rec
        assert rec["message"].startswith(f"{target}: ") and rec["message"] in str(failed.value).splitlines()
        assert actual in rec["message"]


# ---------------------------------------------------------------------------- on kubelet nodes over NVIDIA's mock NVML


# On kubelet nodes (NVIDIA's device plugin and DRA driver granting the probe pod its GPU) the driver suite runs in
# the lab fleet's whole-suite run, from the bundle:
# tests/test_bundle_lab.py::test_the_whole_suite_passes_on_lab_from_the_bundle_with_its_pod_paths.
# A lying label there: tests/test_kubelet_faults.py ("driver-label-set-over-gfds").

"""The real-GPU checks of the MIG and time-slicing suites, failing: a suite run with the probe pods' output given.

On the embedded cluster no pod executes, so these checks skip there; their verdicts are judged from
what the probe pods print (``workloads/probe.py``: NVML UUIDs, visible memory, an allocation beyond
the slice). Here the suite's own test function runs with the node discovered from its labels and a
real ``Checker``; only ``probe_on`` (start the pods, collect their JSON) returns what such pods print.
Each case asserts the record (node, expected, actual) and the message a person reads.

The same checks failing on kubelet nodes over NVIDIA's mock NVML is issue #28's fleet.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuproof.discovery.nodes import discover
from gpuproof.plugin.fixtures import Checker
from gpuproof.plugin.checks import Pool
from gpuproof.results import RunDir


# the fan-out, run in line: the suite's per-node work on this one node, in this thread (tests/test_fanout.py tests the
# fan-out itself)
INLINE = SimpleNamespace(result=lambda item, node, work, **kw: work(node, None))

REPO = Path(__file__).resolve().parents[1]

GPU_A = "GPU-a091da16-0f3c-4d2e-9b1a-111111111111"
GPU_B = "GPU-b7c2e4f0-1234-4d2e-9b1a-222222222222"
MIG = [f"MIG-5f2d3c4b-aaaa-5bbb-8ccc-00000000000{i}" for i in range(4)]
SLICE_MIB = 9728            # what a 1g.10gb slice of an H100 shows (10 GB x 0.95)


def suite(name: str):
    """A suite module, loaded from its file as pytest would."""
    spec = importlib.util.spec_from_file_location(f"gpuproof_suite_{name}", REPO / "suites" / f"test_{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def node(name: str, labels: dict, capacity: dict) -> Pool:
    """A pool of one GPU node, discovered from what GFD and the device plugin put on it."""
    obj = {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", **labels}},
           "status": {"capacity": capacity, "allocatable": capacity,
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    n, = discover([obj]).gpu_nodes
    return Pool(name, [n])


H100_MIG = node("h100-mig-0", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                               "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "24",
                               "nvidia.com/mig-2g.20gb.count": "16"},
                {"nvidia.com/mig-1g.10gb": "24", "nvidia.com/mig-2g.20gb": "16"})
L4_SHARED = node("l4-shared-0", {"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "1",
                                 "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                 {"nvidia.com/gpu": "4"})


def probe(i: int, prefix: str, uuids: list[str], memory: list[int] | None = None, alloc_ok: bool | None = None):
    """One probe pod's JSON result (the fields the checks read)."""
    r = {"workload": "probe", "host": f"{prefix}-{i}", "nvml_uuids": uuids,
         "nvml": {"available": True, "devices": []},
         "torch_devices": [{"index": j, "memory_total_mib": m} for j, m in enumerate(memory or [])]}
    if alloc_ok is not None:
        r["alloc"] = {"mib": int(SLICE_MIB * 1.1), "ok": alloc_ok}
    return r


def mig_pod(i: int, uuids: list[str], memory: list[int], alloc_ok: bool) -> dict:
    return probe(i, "mig-probe-h100-mig-0", uuids, memory, alloc_ok)


def shared_pod(i: int, uuids: list[str]) -> dict:
    return probe(i, "share-probe-l4-shared-0", uuids)


HEALTHY_MIG = [mig_pod(i, [MIG[i]], [SLICE_MIB], False) for i in range(4)]
# id: (suite, test function, pool, the probe pods' output, [(check, node, expected, actual)] that must fail)
RUNS = {
    "mig-pods-share-and-see-whole-gpus": (
        "mig", "test_each_pod_gets_its_own_mig_device", H100_MIG,
        [mig_pod(0, [MIG[0]], [SLICE_MIB], False), mig_pod(1, [MIG[0]], [SLICE_MIB], False),
         mig_pod(2, [GPU_A], [81559], True), mig_pod(3, [MIG[2], MIG[3]], [SLICE_MIB, SLICE_MIB], False)],
        [("one-mig-device-per-pod", "h100-mig-0", "[1, 1, 1, 1]", "[1, 1, 0, 2]"),
         ("mig-devices-distinct", "h100-mig-0", "4", "3"),
         ("mig-memory-capped", "h100-mig-0", "about 9728 MiB per device (1g.10gb)",
          f"[{SLICE_MIB}, {SLICE_MIB}, 81559, {SLICE_MIB}, {SLICE_MIB}]"),
         ("mig-alloc-beyond-fails", "h100-mig-0", "[false, false, false, false]", "[false, false, true, false]")]),
    "time-sliced-pods-on-two-gpus": (
        "timeslicing", "test_pods_on_one_gpu_see_the_same_uuid", L4_SHARED,
        [shared_pod(0, [GPU_A]), shared_pod(1, [GPU_B]), shared_pod(2, [GPU_A]), shared_pod(3, [GPU_A])],
        [("same-gpu-uuid", "l4-shared-0", "1", "2")]),
}


def run_suite_function(tmp_path, monkeypatch, name: str, function: str, pool: Pool, results: list[dict]):
    """The suite's test function with a real Checker; returns (checker, records, what probe_on was asked)."""
    module = suite(name)
    asked = []

    def probe_on(run, target, n, count, limits, args=(), prefix="probe", lane=None):
        asked.append((n.name, count, limits, tuple(args), prefix))
        return results

    monkeypatch.setattr(module, "probe_on", probe_on)
    monkeypatch.setattr(module, "free_on", lambda cluster, n, resource: n.allocatable_of(resource), raising=False)
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, known_nodes={n.name: n for n in pool.nodes})
    target = SimpleNamespace(cluster=None)         # probe_on and free_on are the only ones to use it
    kwargs = {"fanout": INLINE, "request": SimpleNamespace(node=None)} if name == "timeslicing" else {}
    getattr(module, function)(gpu_pool=pool, run=None, target=target, check=checker, needs_real_gpus=None, **kwargs)
    records = [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]
    return checker, records, asked


def test_healthy_mig_pods_pass(tmp_path, monkeypatch):
    checker, records, asked = run_suite_function(tmp_path, monkeypatch, "mig", "test_each_pod_gets_its_own_mig_device",
                                                 H100_MIG, HEALTHY_MIG)
    assert asked == [("h100-mig-0", 4, {"nvidia.com/mig-1g.10gb": 1}, ("--alloc-mib", "10700"), "mig-probe")]
    assert checker.failures == []
    assert {r["check"]: r["verdict"] for r in records} == {
        "one-mig-device-per-pod": "pass", "mig-devices-distinct": "pass", "mig-memory-capped": "pass",
        "mig-alloc-beyond-fails": "pass"}


def test_healthy_time_sliced_pods_pass(tmp_path, monkeypatch):
    checker, records, asked = run_suite_function(tmp_path, monkeypatch, "timeslicing",
                                                 "test_pods_on_one_gpu_see_the_same_uuid", L4_SHARED,
                                                 [shared_pod(i, [GPU_A]) for i in range(4)])
    assert asked == [("l4-shared-0", 4, {"nvidia.com/gpu": 1}, (), "share-probe")]
    assert checker.failures == [] and [(r["check"], r["verdict"]) for r in records] == [("same-gpu-uuid", "pass")]


@pytest.mark.parametrize("case", list(RUNS))
def test_real_gpu_check_fails_on_its_fault(tmp_path, monkeypatch, case):
    name, function, pool, results, expectations = RUNS[case]
    checker, records, _ = run_suite_function(tmp_path, monkeypatch, name, function, pool, results)
    with pytest.raises(pytest.fail.Exception) as failed:
        checker.finish()
    message = str(failed.value)
    for check, target, expected, actual in expectations:
        rec = next((r for r in records if r["check"] == check and r["target"] == target and r["verdict"] == "fail"),
                   None)
        assert rec is not None, records
        assert (rec["expected"], rec["actual"]) == (expected, actual), rec
        line = next((ln for ln in message.splitlines() if rec["message"] == ln), None)
        assert line is not None and line.startswith(f"{target}: "), message
        assert f"expected {_shown(expected)}, actual {_shown(actual)}" in line, line


def _shown(text: str) -> str:
    """How the message prints a recorded value: JSON lists and numbers as Python, strings quoted."""
    try:
        return str(json.loads(text))
    except ValueError:
        return repr(text)

"""Device identity from NVML (the probe's ``nvml_uuids``) and the real-GPU checks built on it:
time-sliced pods see one and the same GPU, MIG pods one distinct MIG device each."""

from __future__ import annotations

import pytest

from gpuproof.plugin.checks import mig_device_checks, normalize_uuid, nvml_device_ids, shared_gpu_check
from gpuproof.bench.workloads import import_workload

probe = import_workload("probe")

GPU_A = "GPU-a091da16-0f3c-4d2e-9b1a-111111111111"
GPU_B = "GPU-b7c2e4f0-1234-4d2e-9b1a-222222222222"
MIG_1 = "MIG-5f2d3c4b-aaaa-5bbb-8ccc-000000000001"
MIG_2 = "MIG-5f2d3c4b-aaaa-5bbb-8ccc-000000000002"


@pytest.mark.parametrize("raw,kind,want", [
    ("a091da16-0f3c-4d2e-9b1a-111111111111", "GPU", GPU_A),          # torch: no prefix
    ("A091DA16-0F3C-4D2E-9B1A-111111111111", "GPU", GPU_A),
    (GPU_A, "GPU", GPU_A),
    ("gpu-a091da16-0f3c-4d2e-9b1a-111111111111", "GPU", GPU_A),
    (b"GPU-a091da16-0f3c-4d2e-9b1a-111111111111", "GPU", GPU_A),     # pynvml < 11.5 returns bytes
    ("5f2d3c4b-aaaa-5bbb-8ccc-000000000001", "MIG", MIG_1),
    (MIG_1, "GPU", MIG_1),                                            # a prefix says what it is
    ("MIG-GPU-a091da16-0f3c-4d2e-9b1a-111111111111/1/0", "GPU",      # R450-R465 MIG form
     "MIG-GPU-a091da16-0f3c-4d2e-9b1a-111111111111/1/0"),
    (None, "GPU", ""), ("", "GPU", ""), ("None", "GPU", ""),
])
def test_uuid_normalisation(raw, kind, want):
    assert probe.normalize_uuid(raw, kind) == want
    assert normalize_uuid(raw, kind) == want


def test_torch_uuids_get_nvml_prefixes():
    devs = [{"index": 0, "uuid": "a091da16-0f3c-4d2e-9b1a-111111111111"},
            {"index": 1, "uuid": "5f2d3c4b-aaaa-5bbb-8ccc-000000000001"}, {"index": 2, "uuid": None}]
    probe.normalize_torch_uuids(devs, [GPU_A, MIG_1])
    assert [d["uuid"] for d in devs] == [GPU_A, MIG_1, None]


def nvml(*devices, available=True, reason=None) -> dict:
    return {"available": available, "reason": reason, "devices": list(devices)}


def test_visible_uuids_are_gpus_or_the_mig_devices_of_mig_gpus():
    inv = nvml({"index": 0, "uuid": GPU_A, "mig_mode": False},
               {"index": 1, "uuid": GPU_B, "mig_mode": True,
                "mig_devices": [{"index": 0, "uuid": MIG_1}, {"index": 1, "uuid": MIG_2}]})
    assert probe.visible_uuids(inv) == [GPU_A, MIG_1, MIG_2]
    assert probe.visible_uuids(nvml(available=False, reason="NVML unavailable")) == []


def pod(name: str, uuids: list[str] | None, env: dict | None = None, reason: str | None = None) -> dict:
    """A probe result as a pod prints it (only the fields the checks read)."""
    r = {"workload": "probe", "host": name, "env": env or {"NVIDIA_VISIBLE_DEVICES": "0"},
         "nvml": nvml(available=reason is None, reason=reason)}
    if uuids is not None:
        r["nvml_uuids"] = uuids
    return r


def test_ids_come_from_nvml_never_from_nvidia_visible_devices():
    assert nvml_device_ids(pod("p0", [GPU_A], env={"NVIDIA_VISIBLE_DEVICES": "0"})) == [GPU_A]
    assert nvml_device_ids(pod("p0", [], env={"NVIDIA_VISIBLE_DEVICES": GPU_B})) == []
    # an older probe without nvml_uuids: derived from its NVML inventory
    old = {"host": "p1", "env": {}, "torch_devices": [{"uuid": "b7c2e4f0-1234-4d2e-9b1a-222222222222"}],
           "nvml": nvml({"index": 0, "uuid": GPU_A.upper(), "mig_mode": None})}
    assert nvml_device_ids(old) == [GPU_A]


def test_time_sliced_pods_on_the_same_gpu_pass():
    ok, expected, actual, what = shared_gpu_check([pod(f"share-{i}", [GPU_A]) for i in range(4)])
    assert ok and expected == actual == 1 and GPU_A in what


def test_time_sliced_pods_on_different_gpus_fail():
    ok, expected, actual, what = shared_gpu_check([pod("share-0", [GPU_A]), pod("share-1", [GPU_B])])
    assert not ok and expected == 1 and actual == 2 and GPU_A in what and GPU_B in what


def test_a_pod_without_nvml_devices_fails_and_says_so():
    ok, expected, actual, what = shared_gpu_check(
        [pod("share-0", [GPU_A]), pod("share-1", [], reason="NVML unavailable: Driver Not Loaded")])
    assert not ok
    assert "share-1: NVML unavailable: Driver Not Loaded" in actual and "no NVML devices" in what
    ok, _, actual, _ = shared_gpu_check([pod("share-0", []), pod("share-1", [])])
    assert not ok and "share-0: NVML lists no GPU or MIG device" in actual


def test_distinct_mig_devices_pass():
    checks = mig_device_checks([pod("mig-0", [MIG_1]), pod("mig-1", [MIG_2])])
    assert checks["one-mig-device-per-pod"][:3] == (True, [1, 1], [1, 1])
    assert checks["mig-devices-distinct"][:3] == (True, 2, 2)


def test_duplicated_mig_devices_fail():
    checks = mig_device_checks([pod("mig-0", [MIG_1]), pod("mig-1", [MIG_1])])
    assert checks["one-mig-device-per-pod"][0] is True
    ok, expected, actual, what = checks["mig-devices-distinct"]
    assert not ok and (expected, actual) == (2, 1) and f"seen by more than one pod: {MIG_1}" in what


def test_mig_pods_seeing_no_device_or_a_whole_gpu_fail():
    checks = mig_device_checks([pod("mig-0", [MIG_1]), pod("mig-1", [], reason="NVML unavailable: no permission")])
    ok, expected, actual, what = checks["one-mig-device-per-pod"]
    assert not ok and (expected, actual) == ([1, 1], [1, 0]) and "mig-1: NVML unavailable: no permission" in what
    checks = mig_device_checks([pod("mig-0", [GPU_A]), pod("mig-1", [MIG_2, MIG_1])])
    ok, expected, actual, what = checks["one-mig-device-per-pod"]
    assert not ok and actual == [0, 2] and f"whole GPUs visible too: mig-0: ['{GPU_A}']" in what
    none = mig_device_checks([pod("mig-0", []), pod("mig-1", [])])["mig-devices-distinct"]
    assert none[0] is False and "none reported" in none[3]


def test_each_node_gets_pod_names_of_its_own():
    """vocab.name_on (checks.name_on for the suites): a node's name in its pods' names, at most 63 characters, the
    index kept, no trailing '-'."""
    from gpuproof.plugin.checks import name_on

    assert name_on("l40s-ts-0", "share-two") == "share-two-l40s-ts-0"
    assert name_on("l40s-ts-0", "share", 3) == "share-l40s-ts-0-3"
    names = [name_on("gke-prod-a100-pool-" + "x" * 60, "share", i) for i in range(12)]
    assert len(set(names)) == 12 and all(len(n) <= 63 and n.endswith(f"-{i}") for i, n in enumerate(names))
    assert name_on("a" * 51 + "-" + "b" * 20, "tolerating") == "tolerating-" + "a" * 51     # cut at '-': dropped

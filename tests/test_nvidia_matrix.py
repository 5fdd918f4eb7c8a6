"""The whole suite passes every healthy shape NVIDIA's own software gives a GPU node.

Each pool of the matrix fleet is one of NVIDIA's mock GPU profiles x one device-plugin set-up. Nothing
about a node is typed in here: NVIDIA's GFD v0.19.3 writes its labels and NVIDIA's device plugin v0.19.3
advertises its resources, both over NVIDIA's mock NVML with the pool's real device-plugin config file.
(MPS: the plugin cannot serve it here, so its resources are gpuproof's model, and the node says so.)
"""

from __future__ import annotations

import json
import re

import pytest

pytestmark = pytest.mark.sim

# NVIDIA's mock profiles (pkg/gpu/mocknvml/configs) by the product each one is; GB300 is left out because
# gpuproof's catalog has no datasheet values for it yet
PROFILES = {"a100": "NVIDIA-A100-SXM4-40GB", "h100": "NVIDIA-H100-80GB-HBM3", "b200": "NVIDIA-B200",
            "gb200": "NVIDIA-GB200", "l40s": "NVIDIA-L40S", "t4": "Tesla-T4"}
SETUPS = {
    "plain": {},
    "ts": {"timeSlicing": {"replicas": 4}},
    "ts-rename": {"timeSlicing": {"replicas": 4, "renameByDefault": True}},
    "ts-fail": {"timeSlicing": {"replicas": 2, "failRequestsGreaterThanOne": True}},
    "mps": {"mps": {"replicas": 3}},
    "mig-none": {"mig": {"strategy": "none"}},
    "mig-single-off": {"mig": {"strategy": "single"}},        # strategy set, MIG mode off on every GPU
    "mig-mixed-off": {"mig": {"strategy": "mixed"}},
}


def matrix_fleet() -> dict:
    pools = [{"name": f"{profile}-{setup}", "count": 1, "gpu": {"product": product, "count": 2},
              "taints": ["nvidia.com/gpu=present:NoSchedule"], "labels": {"gpuproof.dev/case": f"{profile}-{setup}"},
              **extra}
             for profile, product in PROFILES.items() for setup, extra in SETUPS.items()]
    return {"name": "nvidia-matrix", "defaults": {"gpu": {"driverVersion": "550.163.01", "cudaVersion": "12.4"}},
            "pools": pools + [{"name": "cpu", "count": 1}]}


# every shape of the matrix must give these a passing record (and no check may fail)
MUST_PASS = {"capacity-matches-count", "allocatable-matches-count", "co-running-peak", "one-more-waits",
             "shared-allocatable", "shared-product-suffix", "shared-suffix", "shared-resource-name",
             "shared-request-gt1-refused", "shared-request-gt1-allowed", "gfd-labels-on-gpu-node",
             "label-well-formed", "mig-single-valid", "no-shared-resource", "pool-uniform",
             "memory-plausible", "compute-plausible", "family-plausible", "product-known",
             "driver-version-consistent", "gfd-fresh", "node-selector-product", "required-affinity-product"}
# the only skips a healthy matrix run may have, by reason
MAY_SKIP = [r"needs real GPUs: the target's GPU nodes are simulated",
            r"simulated node: no device-plugin pod runs on kwok nodes",
            r"NVIDIA's DRA driver is not installed",
            r"no node advertises MIG resources", r"no GPU node of the kind this check is for",
            r"no GPU pools in the cluster",
            r"no gang scheduler in the cluster", r"no training operator installed"]     # the matrix runs neither


def assert_green(res) -> None:
    assert res.code == 0, res
    assert [c for c in res.checks if c["verdict"] == "fail"] == [], res
    passed = {c["check"] for c in res.checks if c["verdict"] == "pass"}
    assert sorted(MUST_PASS - passed) == [], res
    reasons = [c["message"] for c in res.checks if c["verdict"] == "skip"]
    reasons += re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", res.output, flags=re.M)
    assert [r for r in reasons if not any(re.search(p, r) for p in MAY_SKIP)] == [], res


def refused_pools() -> str:
    """Pools whose device plugin refuses a request for 2: the ones with failRequestsGreaterThanOne, and MPS."""
    return ",".join(f"{p}-{s}" for p in PROFILES for s in ("ts-fail", "mps"))


@pytest.fixture(scope="module")
def matrix(embedded):
    with embedded.fleet_loaded(matrix_fleet()) as fleet:
        yield fleet


def test_nodes_are_what_nvidia_software_made(matrix, embedded):
    """Every GPU node's labels came from GFD and its resources from the device plugin (MPS: modelled)."""
    nodes = {n["metadata"]["name"]: n for n in embedded.client.node_dicts()}
    assert len(nodes) == len(PROFILES) * len(SETUPS) + 1
    for name, node in nodes.items():
        if name.startswith("cpu"):
            continue
        ann = node["metadata"]["annotations"]
        assert ann["gpuproof.dev/labels-by"] == "gpu-feature-discovery v0.19.3", name
        expected = "gpuproof model (MPS" if "-mps-" in name else "k8s-device-plugin v0.19.3"
        assert ann["gpuproof.dev/resources-by"].startswith(expected), (name, ann)
        labels = node["metadata"]["labels"]
        assert "nvidia.com/gfd.timestamp" in labels, name            # only GFD writes it


def test_shapes_are_nvidias(matrix, embedded):
    """The shapes the issue measured, as NVIDIA's software writes them (read back, not assumed)."""
    nodes = {n["metadata"]["name"]: n for n in embedded.client.node_dicts()}

    def of(case):
        n = nodes[f"{case}-0"]
        return n["metadata"]["labels"], n["status"]["capacity"]

    labels, cap = of("h100-plain")
    assert "nvidia.com/mig.strategy" not in labels                  # GFD writes none for strategy none
    assert (labels["nvidia.com/gpu.product"], cap["nvidia.com/gpu"]) == ("NVIDIA-H100-80GB-HBM3", "2")
    labels, cap = of("h100-mig-single-off")                         # MIG off: whole GPUs, plain product
    assert (labels["nvidia.com/mig.strategy"], labels["nvidia.com/gpu.product"], cap["nvidia.com/gpu"]) == \
        ("single", "NVIDIA-H100-80GB-HBM3", "2")
    labels, cap = of("l40s-ts")
    assert (labels["nvidia.com/gpu.product"], cap["nvidia.com/gpu"]) == ("NVIDIA-L40S-SHARED", "8")
    labels, cap = of("l40s-ts-rename")                              # renamed: no -SHARED, only gpu.shared
    assert (labels["nvidia.com/gpu.product"], cap.get("nvidia.com/gpu"), cap["nvidia.com/gpu.shared"]) == \
        ("NVIDIA-L40S", None, "8")
    labels, _ = of("t4-mps")
    assert labels["nvidia.com/gpu.sharing-strategy"] == "mps"


def test_whole_suite_green_on_the_matrix(matrix, embedded, tmp_path):
    res = embedded.run_suite("suites", "-m", "not bench", f"--shared-requests-refused={refused_pools()}",
                             "--pool-label=gpuproof.dev/case", report_dir=tmp_path, run_id="matrix", timeout=900)
    assert_green(res)
    inventory = json.loads((res.run_path / "inventory.json").read_text())
    by = {n["name"]: n for n in inventory["nodes"]}
    assert by["t4-mps-0"]["resources_by"].startswith("gpuproof model"), by["t4-mps-0"]
    assert by["a100-plain-0"]["labels_by"] == "gpu-feature-discovery v0.19.3", by["a100-plain-0"]

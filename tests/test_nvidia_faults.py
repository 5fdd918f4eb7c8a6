"""Faults made by NVIDIA's software over its mock NVML, and faults gpuproof models, each caught by name.

- NVIDIA's mock loses the last GPU of one node: NVIDIA's GFD then exits and writes no labels (its IMEX
  labeler reads the lost GPU), while NVIDIA's device plugin still advertises all 8. The suite fails
  that node, saying its GPU labels are missing while it advertises GPUs.
- A fleet fault puts a node's allocatable below its count (what a plugin does when it marks a GPU
  unhealthy; the plugin's health check never sees the mock's faults, so this stays gpuproof's model):
  the check fails naming node, expected and actual, and the inventory marks the resources as modelled.
"""

from __future__ import annotations

import json

import pytest
import yaml

from gpuproof.sim.fleet_file import resolve_fleet_path

pytestmark = pytest.mark.sim


def faulty_mixed() -> dict:
    fleet = yaml.safe_load(resolve_fleet_path("mixed").read_text())
    fleet["name"] = "nvidia-faults"
    a100 = next(p for p in fleet["pools"] if p["name"] == "a100")
    a100["faults"] = [{"node": 1, "nvmlFailures": {"7": "lost"}},
                      {"node": 0, "setAllocatable": {"nvidia.com/gpu": "7"}}]
    return fleet


@pytest.fixture(scope="module")
def faulty(embedded, tmp_path_factory):
    with embedded.fleet_loaded(faulty_mixed()):
        out = tmp_path_factory.mktemp("nvidia-faults")
        yield embedded.run_suite("suites/test_labels.py", "suites/test_advertisement.py", report_dir=out,
                                 run_id="faults")


def test_lost_gpu_leaves_node_without_gfd_labels(faulty):
    assert faulty.code == 1, faulty
    (rec,) = faulty.failed_checks("gfd-labels-on-gpu-node")
    assert rec["target"] == "a100-1"
    assert rec["expected"] == ("GPU Feature Discovery's labels (nvidia.com/gpu.product, gpu.count, ...): "
                               "1 other node(s) of pool p4de.24xlarge have them")
    assert rec["actual"] == "no GPU labels, while it advertises {'nvidia.com/gpu': '8'}"
    assert ("a100-1: GPU labels missing: expected \"GPU Feature Discovery's labels (nvidia.com/gpu.product, "
            "gpu.count, ...): 1 other node(s) of pool p4de.24xlarge have them\", actual \"no GPU labels, while it "
            "advertises {'nvidia.com/gpu': '8'}\"") in faulty.output
    inventory = json.loads((faulty.run_path / "inventory.json").read_text())
    node = next(n for n in inventory["nodes"] if n["name"] == "a100-1")
    assert node["labels_by"].startswith("gpu-feature-discovery v0.19.3 (failed: GFD exited 1: ")
    assert node["labels_by"].endswith("ERROR_GPU_IS_LOST)")
    assert node["resources_by"] == "k8s-device-plugin v0.19.3"


def test_modelled_allocatable_below_count_fails_and_is_marked(faulty):
    (rec,) = faulty.failed_checks("allocatable-matches-count")
    assert (rec["target"], rec["expected"], rec["actual"]) == ("a100-0", "8", "7")
    assert "a100-0: allocatable of nvidia.com/gpu vs nvidia.com/gpu.count=8: expected 8, actual 7" in faulty.output
    inventory = json.loads((faulty.run_path / "inventory.json").read_text())
    node = next(n for n in inventory["nodes"] if n["name"] == "a100-0")
    assert node["resources_by"] == "k8s-device-plugin v0.19.3 + gpuproof model (fleet fault: nvidia.com/gpu)"
    assert node["labels_by"] == "gpu-feature-discovery v0.19.3"

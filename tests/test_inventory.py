"""Inventory snapshots from fleets, and the upgrade diff between two of them."""

import copy

import pytest
import yaml

from gpuproof.sim.fleet_file import parse_fleet, resolve_fleet_path
from gpuproof.discovery.inventory import snapshot_from_nodes
from gpuproof.report.inventory_diff import diff_inventories

pytestmark = pytest.mark.server  # tier: each fleet's labels come from GFD run under the mock NVML


def _mixed() -> dict:
    return yaml.safe_load(resolve_fleet_path("mixed").read_text())


def _inventory(fleet: dict) -> dict:
    return snapshot_from_nodes(parse_fleet(fleet).node_objects(), cluster="embedded",
                               kubernetes_version="v1.35.4")


def test_inventory_records_what_gfd_says():
    inv = _inventory(_mixed())
    by_name = {n["name"]: n for n in inv["nodes"]}
    assert inv["gpu_nodes"] == 5 and by_name["cpu-0"] == {"name": "cpu-0", "gpu": False}
    a100 = by_name["a100-0"]
    assert (a100["product"], a100["gpu_count"], a100["gpu_memory_mib"]) == ("NVIDIA-A100-SXM4-80GB", 8, 81920)
    assert (a100["driver_version"], a100["cuda_version"]) == ("550.54.15", "12.4")
    assert a100["taints"] == ["nvidia.com/gpu=present:NoSchedule"]
    l4 = by_name["l4-shared-0"]
    assert (l4["sharing_strategy"], l4["replicas"], l4["capacity"]["nvidia.com/gpu"]) == ("time-slicing", 4, "4")
    assert by_name["h100-mig-0"]["mig_strategy"] == "mixed"
    assert all(k.startswith(("nvidia.com/", "feature.node.kubernetes.io/")) for k in a100["labels"])


def test_upgrade_diff_shows_exactly_the_two_changes():
    before = _mixed()
    after = copy.deepcopy(before)
    h100 = next(p for p in after["pools"] if p["name"] == "h100-mig")
    h100["gpu"]["driverVersion"] = "560.35.03"
    l4 = next(p for p in after["pools"] if p["name"] == "l4-shared")
    l4["cpu"] = "32"
    changes = diff_inventories(_inventory(before), _inventory(after))
    got = sorted((c.node, c.field, str(c.before), str(c.after)) for c in changes)
    assert got == [("h100-mig-0", "driver_version", "550.54.15", "560.35.03"),
                   ("l4-shared-0", "capacity/cpu", "16", "32")]


def test_identical_fleets_have_no_diff():
    assert diff_inventories(_inventory(_mixed()), _inventory(_mixed())) == []


def test_gfd_timestamp_is_not_part_of_the_inventory():
    """GFD stamps each labelling: two runs of one cluster, a minute apart, show no difference."""
    fleet = parse_fleet(_mixed())
    nodes = fleet.node_objects()
    later = copy.deepcopy(nodes)
    for n in later:
        if "nvidia.com/gfd.timestamp" in n["metadata"]["labels"]:
            n["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = "1"
    first, second = (snapshot_from_nodes(x, cluster="embedded", kubernetes_version="v1.35.4") for x in (nodes, later))
    assert diff_inventories(first, second) == []
    assert all("nvidia.com/gfd.timestamp" not in n.get("labels", {}) for n in first["nodes"])

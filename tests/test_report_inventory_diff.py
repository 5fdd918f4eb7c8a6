"""The inventory diff reports changes at the level a person thinks in."""

import copy

from gpuproof.report.inventory_diff import Change, changes_table, diff_inventories, fleet_table
from synthetic_runs import fleet_inventory, gpu_node, set_driver


def _node(inv, name):
    return next(n for n in inv["nodes"] if n["name"] == name)


def test_identical_fleets_have_no_changes():
    assert diff_inventories(fleet_inventory(), fleet_inventory()) == []


def test_one_driver_and_one_capacity_are_exactly_two_changes():
    before = fleet_inventory()
    after = set_driver(before, "a100-1", "560.35.03")      # rewrites 4 driver labels too
    _node(after, "h100-0")["capacity"]["cpu"] = "64"
    _node(after, "h100-0")["allocatable"]["cpu"] = "64"     # follows from capacity: not a change of its own
    changes = diff_inventories(before, after)
    assert changes == [
        Change("a100-1", "driver_version", "550.54.15", "560.35.03"),
        Change("h100-0", "capacity/cpu", "96", "64", also='allocatable/cpu 96 -> 64'),
    ]
    assert str(changes[0]) == "a100-1: driver_version 550.54.15 -> 560.35.03"
    # the driver labels are really different, they are just represented by driver_version
    assert _node(before, "a100-1")["labels"] != _node(after, "a100-1")["labels"]


def test_gpu_capacity_change_is_one_change_including_gpu_count_and_label():
    before = fleet_inventory()
    after = copy.deepcopy(before)
    _node(after, "a100-0").update(gpu_node("a100-0", "a100", "NVIDIA-A100-SXM4-80GB", gpus=7))
    changes = diff_inventories(before, after)
    assert [(c.node, c.field, c.before, c.after) for c in changes] == [("a100-0", "capacity/nvidia.com/gpu", "8", "7")]
    assert "gpu_count 8 -> 7" in changes[0].also


def test_cuda_version_that_moves_with_the_driver_is_folded_into_it():
    before = fleet_inventory()
    after = copy.deepcopy(before)
    n = _node(after, "a100-0")
    n.update(gpu_node("a100-0", "a100", n["product"], driver="560.35.03", cuda="12.6"))
    changes = diff_inventories(before, after)
    assert len(changes) == 1
    assert changes[0].field == "driver_version" and changes[0].also == "cuda_version 12.4 -> 12.6"


def test_nodes_added_removed_taints_labels_and_kubernetes_version():
    before = fleet_inventory()
    after = copy.deepcopy(before)
    after["kubernetes_version"] = "v1.36.0"
    after["captured"] = "later"                               # not a change
    after["nodes"] = [n for n in after["nodes"] if n["name"] != "cpu-0"]
    after["nodes"].append(gpu_node("h100-9", "h100", "NVIDIA-H100-80GB-HBM3"))
    _node(after, "a100-0")["taints"] = []
    _node(after, "h100-1")["labels"]["nvidia.com/gpu.clique"] = "x"   # not represented by any field
    got = {(c.node, c.field): c for c in diff_inventories(before, after)}
    assert set(got) == {("", "kubernetes_version"), ("cpu-0", "node"), ("h100-9", "node"), ("a100-0", "taint"),
                        ("h100-1", "label/nvidia.com/gpu.clique")}
    assert got[("cpu-0", "node")].after is None and "no GPU" in got[("cpu-0", "node")].before
    assert "8 x NVIDIA-H100-80GB-HBM3" in got[("h100-9", "node")].after
    assert str(got[("a100-0", "taint")]) == "a100-0: taint removed nvidia.com/gpu=present:NoSchedule"
    assert str(got[("", "kubernetes_version")]) == "cluster: kubernetes_version v1.35.4 -> v1.36.0"


def test_pool_wide_upgrade_is_grouped_for_display():
    before = fleet_inventory()
    after = set_driver(set_driver(before, "a100-0", "560.35.03"), "a100-1", "560.35.03")
    changes = diff_inventories(before, after)
    assert len(changes) == 2                                  # one per node...
    table = changes_table(changes)
    assert len(table) == 1                                    # ...shown as one row
    assert table.rows[0][3] == "a100-0, a100-1" and table.rows[0][4] == "2"


def test_fleet_table_groups_identical_nodes():
    table = fleet_table(fleet_inventory(nodes_per_pool=3))
    rows = {r[0]: r for r in table.rows}
    assert rows["a100"][1] == "3" and rows["h100"][5] == "550.54.15" and rows["cpu"][2] == "(no GPU)"


def test_mig_profile_change_is_one_change_per_resource():
    before = fleet_inventory()
    node = _node(before, "h100-0")
    node["mig_strategy"] = "mixed"
    for profile, count, mem in (("1g.10gb", 24, 9856), ("2g.20gb", 16, 19456)):
        node["capacity"][f"nvidia.com/mig-{profile}"] = node["allocatable"][f"nvidia.com/mig-{profile}"] = str(count)
        node["labels"].update({f"nvidia.com/mig-{profile}.count": str(count),
                               f"nvidia.com/mig-{profile}.memory": str(mem)})
    after = copy.deepcopy(before)
    n = _node(after, "h100-0")
    for table in (n["capacity"], n["allocatable"]):
        table["nvidia.com/mig-1g.10gb"] = "56"
        del table["nvidia.com/mig-2g.20gb"]
    n["labels"]["nvidia.com/mig-1g.10gb.count"] = "56"
    del n["labels"]["nvidia.com/mig-2g.20gb.count"], n["labels"]["nvidia.com/mig-2g.20gb.memory"]
    changes = diff_inventories(before, after)
    assert [(c.field, c.before, c.after) for c in changes] == [
        ("capacity/nvidia.com/mig-1g.10gb", "24", "56"), ("capacity/nvidia.com/mig-2g.20gb", "16", None)]
    assert "label/nvidia.com/mig-2g.20gb.memory 19456 -> (none)" in changes[1].also

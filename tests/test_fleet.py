"""The fleet: each pool type becomes Node objects whose GPU labels and resources NVIDIA's GFD and device
plugin wrote over NVIDIA's mock NVML (MIG devices: gpuproof's model, named as GFD's source names them).

The values below are what those programs were measured to write (issue #26), not what gpuproof renders."""

from __future__ import annotations

import re
import textwrap

import pytest

from gpuproof.errors import FleetError
from gpuproof.sim.fleet_file import load_fleet, parse_fleet, shipped_fleets

BASE = {"feature.node.kubernetes.io/pci-10de.present": "true", "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.driver-version.major": "550", "nvidia.com/cuda.driver-version.minor": "54",
        "nvidia.com/cuda.driver-version.revision": "15", "nvidia.com/cuda.runtime-version.full": "12.4"}
NODE_BASE = {"cpu": "32", "memory": "256Gi", "pods": "110", "ephemeral-storage": "500Gi"}
TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]

# pool spec -> (extended resources, labels that must be present with these values, labels that must be absent)
CASES = {
    "whole-gpus": (
        {"gpu": {"product": "NVIDIA-A100-SXM4-80GB", "count": 8}},
        {"nvidia.com/gpu": "8"},
        {**BASE, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
         "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8",
         "nvidia.com/gpu.compute.minor": "0", "nvidia.com/gpu.replicas": "1",
         "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/mig.capable": "true"},
        ["nvidia.com/mig-1g.10gb.count", "nvidia.com/mig.strategy", "nvidia.com/gpu.present"],
    ),
    "time-sliced": (
        {"gpu": {"product": "NVIDIA-L4", "count": 2}, "timeSlicing": {"replicas": 4}},
        {"nvidia.com/gpu": "8"},
        {**BASE, "nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.count": "2",
         "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
         "nvidia.com/gpu.family": "ada-lovelace"},      # mig.capable: see test_mock_says_every_gpu_can_mig
        [],
    ),
    "time-sliced-renamed": (
        {"gpu": {"product": "NVIDIA-L4", "count": 1}, "timeSlicing": {"replicas": 3, "renameByDefault": True}},
        {"nvidia.com/gpu.shared": "3"},
        {**BASE, "nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1", "nvidia.com/gpu.replicas": "3",
         "nvidia.com/gpu.sharing-strategy": "time-slicing"},
        [],
    ),
    "mig-mixed": (
        {"gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 2},
         "mig": {"strategy": "mixed", "profiles": {"1g.10gb": 3, "2g.20gb": 2}}},
        {"nvidia.com/mig-1g.10gb": "6", "nvidia.com/mig-2g.20gb": "4"},
        {**BASE, "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2",
         "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.capable": "true", "nvidia.com/gpu.family": "hopper",
         "nvidia.com/mig-1g.10gb.count": "6", "nvidia.com/mig-2g.20gb.count": "4",
         "nvidia.com/mig-1g.10gb.memory": "9728", "nvidia.com/mig-1g.10gb.slices.gi": "1",
         "nvidia.com/mig-2g.20gb.slices.gi": "2"},
        [],
    ),
    "mig-single": (
        {"gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 4},
         "mig": {"strategy": "single", "profiles": {"1g.5gb": 7}}},
        {"nvidia.com/gpu": "28"},
        {**BASE, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.count": "28",
         "nvidia.com/gpu.memory": "4864", "nvidia.com/mig.strategy": "single"},
        ["nvidia.com/mig-1g.5gb.count"],
    ),
    "cpu-only": (
        {"taints": []},
        {},
        {"kubernetes.io/os": "linux"},
        ["nvidia.com/gpu.present", "nvidia.com/gpu.product", "nvidia.com/gpu.count"],
    ),
}


def _pool(name: str, spec: dict) -> dict:
    return {"name": name, "count": 2, **({"taints": ["nvidia.com/gpu=present:NoSchedule"]} | spec)}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.server  # tier: GFD run under the mock NVML
def test_pool_nodes_match_device_plugin_and_gfd(case):
    spec, resources, labels, absent = CASES[case]
    fleet = parse_fleet({"name": "t", "pools": [_pool(case, spec)]})
    nodes = fleet.node_objects()
    assert [n["metadata"]["name"] for n in nodes] == [f"{case}-0", f"{case}-1"]
    for node in nodes:
        assert node["status"]["capacity"] == {**NODE_BASE, **resources}
        assert node["status"]["allocatable"] == {**NODE_BASE, **resources}
        got = node["metadata"]["labels"]
        assert {k: got.get(k) for k in labels} == labels
        assert [k for k in absent if k in got] == []
        assert node["spec"]["taints"] == ([] if case == "cpu-only" else TAINT)
        assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        made_by = {k: v for k, v in node["metadata"]["annotations"].items() if k.endswith("-by")}
        if case == "cpu-only":
            assert made_by == {}
        elif case.startswith("mig"):
            assert made_by == {"gpuproof.dev/labels-by": "gpu-feature-discovery v0.19.3 + gpuproof model (MIG "
                                                         "devices: the mock enumerates none)",
                               "gpuproof.dev/resources-by": "gpuproof model (MIG devices: the mock enumerates none)"}
        else:
            assert made_by == {"gpuproof.dev/labels-by": "gpu-feature-discovery v0.19.3",
                               "gpuproof.dev/resources-by": "k8s-device-plugin v0.19.3"}


def test_shipped_fleets_are_valid():
    assert {"mixed", "minimal"} <= set(shipped_fleets())
    mixed = load_fleet("mixed")
    assert [p.name for p in mixed.pools] == ["a100", "h100-mig", "a100-mig-single", "l4-shared", "cpu"]
    assert mixed.node_count == 6


@pytest.mark.server  # tier: GFD run under the mock NVML
def test_faults_change_only_the_named_node():
    fleet = parse_fleet({"pools": [{"name": "a", "count": 2, "gpu": {"product": "NVIDIA-L4", "count": 1},
                                    "faults": [{"node": 1, "setCapacity": {"nvidia.com/gpu": "3"},
                                                "dropLabels": ["nvidia.com/gpu.product"]}]}]})
    a0, a1 = fleet.node_objects()
    assert a0["status"]["capacity"]["nvidia.com/gpu"] == "1"
    assert a1["status"]["capacity"]["nvidia.com/gpu"] == "3"
    assert a1["status"]["allocatable"]["nvidia.com/gpu"] == "1"
    assert "nvidia.com/gpu.product" in a0["metadata"]["labels"]
    assert "nvidia.com/gpu.product" not in a1["metadata"]["labels"]


def test_defaults_apply_to_gpu_pools_only():
    fleet = parse_fleet({"defaults": {"gpu": {"driverVersion": "560.35.03"}, "taints": ["x=y:NoSchedule"]},
                         "pools": [{"name": "g", "gpu": {"product": "NVIDIA-L4", "count": 1}},
                                   {"name": "c", "taints": []}]})
    g, c = fleet.pools
    assert g.gpu.driver_version == "560.35.03" and str(g.taints[0]) == "x=y:NoSchedule"
    assert c.gpu is None and c.taints == []


BAD = [
    ("pools: []", "pools", "non-empty list"),
    ("pools: [{name: a, count: two}]", "pools[0].count", "whole number"),
    ("pools: [{name: A_B}]", "pools[0].name", "lowercase"),
    ("pools: [{name: a, gpus: {}}]", "pools[0].gpus", "unknown field"),
    ("pools: [{name: a, gpu: {count: 1}}]", "pools[0].gpu.product", "is required"),
    ("pools: [{name: a, gpu: {product: NVIDIA-L4, count: 0}}]", "pools[0].gpu.count", "between 1 and 64"),
    ("pools: [{name: a, gpu: {product: Mystery-GPU, count: 1}}]", "pools[0].gpu.memoryMiB", "does not know"),
    ("pools: [{name: a, gpu: {product: NVIDIA-L4, count: 1, driverVersion: latest}}]",
     "pools[0].gpu.driverVersion", "not valid"),
    ("pools: [{name: a, taints: [nvidia.com/gpu]}]", "pools[0].taints[0]", "not a taint"),
    ("pools: [{name: a, gpu: {product: NVIDIA-L4, count: 1}, mig: {strategy: mixed, profiles: {1g.10gb: 1}}}]",
     "pools[0].mig", "does not support MIG"),
    ("pools: [{name: a, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 1}, mig: {profiles: {1g.5gb: 1}}}]",
     "pools[0].mig.profiles.1g.5gb", "has no MIG profile"),
    ("pools: [{name: a, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 1}, mig: {profiles: {1g.10gb: 8}}}]",
     "pools[0].mig.profiles.1g.10gb", "at most 7"),
    ("pools: [{name: a, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 1}, mig: {profiles: {3g.40gb: 2, 2g.20gb: 1}}}]",
     "pools[0].mig.profiles", "8 compute slices"),
    ("pools: [{name: a, gpu: {product: NVIDIA-H100-80GB-HBM3, count: 1}, "
     "mig: {strategy: single, profiles: {1g.10gb: 3, 2g.20gb: 2}}}]", "pools[0].mig.profiles", "one profile"),
    ("pools: [{name: a, gpu: {product: NVIDIA-L4, count: 1}, timeSlicing: {replicas: 2, rename: true}}]",
     "pools[0].timeSlicing.rename", "unknown field"),
    ("pools: [{name: a, timeSlicing: {replicas: 2}}]", "pools[0].timeSlicing", "needs a gpu"),
    ("pools: [{name: a}, {name: a}]", "pools[1].name", "earlier pool"),
    ("pools: [{name: a, count: 1, faults: [{node: 3}]}]", "pools[0].faults[0].node", "below 1"),
    ("pools: [{name: a, count: 0}]", "pools", "no nodes"),
    ("pools: {name: a}", "pools", "non-empty list"),
    ("[1, 2]", "(top level)", "must be a mapping"),
]


@pytest.mark.parametrize("text,field,problem", BAD, ids=[b[1] + ":" + b[2] for b in BAD])
def test_malformed_fleet_is_refused_naming_the_field(tmp_path, text, field, problem):
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    with pytest.raises(FleetError) as err:
        load_fleet(path)
    assert err.value.field == field
    assert problem in str(err.value)
    assert str(path) in str(err.value)


def test_unparseable_yaml_names_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(textwrap.dedent("""\
        pools:
          - name: a
           count: 2
        """))
    with pytest.raises(FleetError, match=r"not valid YAML: line \d+, column \d+"):
        load_fleet(path)


def test_missing_and_empty_fleet_files(tmp_path):
    with pytest.raises(FleetError, match="cannot read the fleet file"):
        load_fleet(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(FleetError, match="the file is empty"):
        load_fleet(tmp_path / "empty.yaml")


@pytest.mark.server  # tier: GFD run under the mock NVML
def test_mock_says_every_gpu_can_mig():
    """A limit of NVIDIA's mock, kept as it is: its GetMigMode answers for every GPU (engine/device.go), so
    GFD labels mig.capable=true on an L4 too, where real NVML answers Not Supported."""
    fleet = parse_fleet({"pools": [{"name": "l4", "gpu": {"product": "NVIDIA-L4", "count": 1}}]})
    (node,) = fleet.node_objects()
    assert node["metadata"]["labels"]["nvidia.com/mig.capable"] == "true"


@pytest.mark.parametrize("pool, field, problem", [
    ({"gpu": {"product": "NVIDIA-L4", "count": 1}, "faults": [{"nvmlFailures": {"0": "melted"}}]},
     "pools[0].faults[0].nvmlFailures.0", "'melted' is not one of the mock's failure modes: lost, fallen_off_bus, "
                                          "ecc_uncorrectable"),
    ({"gpu": {"product": "NVIDIA-L4", "count": 1}, "faults": [{"nvmlFailures": {"first": "lost"}}]},
     "pools[0].faults[0].nvmlFailures.first", "keys are GPU indexes (0, 1, ...)"),
    ({"gpu": {"product": "NVIDIA-L4", "count": 1}, "mps": {"replicas": 2}, "timeSlicing": {"replicas": 2}},
     "pools[0].mps", "a pool shares its GPUs one way: timeSlicing or mps, not both"),
])
def test_nvidia_settings_refused_by_field(pool, field, problem):
    with pytest.raises(FleetError, match=re.escape(problem)) as err:
        parse_fleet({"pools": [{"name": "p", **pool}]})
    assert (err.value.field, err.value.problem) == (field, problem)


def test_mps_and_mig_off_parse():
    fleet = parse_fleet({"pools": [{"name": "t4", "gpu": {"product": "Tesla-T4", "count": 4}, "mps": {"replicas": 3}},
                                   {"name": "l40s", "gpu": {"product": "NVIDIA-L40S", "count": 2},
                                    "mig": {"strategy": "single"}}]})
    t4, l40s = fleet.pools
    assert (t4.time_slicing.strategy, t4.time_slicing.replicas, t4.time_slicing.fail_requests_greater_than_one) == \
        ("mps", 3, True)
    assert (l40s.mig.strategy, l40s.mig.profiles, l40s.mig_enabled) == ("single", {}, False)

"""DRA: reading NVIDIA's ResourceSlices, the embedded cluster's DRA pools, and the DRA suite's faults.

Unit tests read slices and judge nodes without a cluster; the embedded-cluster tests show the
DRA suite passing on a healthy DRA fleet (and every other suite passing beside it) and each DRA
check failing on its own fault: a slice missing a device, an attribute disagreeing with GFD's
labels, no DeviceClass, a device published twice (the scheduler's DynamicResources plugin off, and a
DeviceClass selecting the other type: tests/test_suite_faults_more.py).
"""

from __future__ import annotations

import copy
import re

import pytest
import yaml

from gpuproof.discovery import dra
from gpuproof.sim import slices
from gpuproof.discovery.nodes import discover
from gpuproof.errors import FleetError
from gpuproof.sim.fleet_file import load_fleet, parse_fleet, resolve_fleet_path


def dra_fleet() -> dict:
    return yaml.safe_load(resolve_fleet_path("dra").read_text())


def _published(fleet_dict: dict):
    fleet = parse_fleet(fleet_dict, "test")
    objs = fleet.dra_objects({})
    return fleet, [o for o in objs if o["kind"] == "ResourceSlice"], [o for o in objs if o["kind"] == "DeviceClass"]


def _discovered(fleet_dict: dict):
    fleet, slices, classes = _published(fleet_dict)
    return discover(fleet.node_objects(), slices=slices, device_classes=classes)


def _pool(fleet: dict, name: str) -> dict:
    return next(p for p in fleet["pools"] if p["name"] == name)


# ---------------------------------------------------------------------------- what the embedded cluster publishes


def test_slices_are_shaped_like_nvidias_driver():
    _, slices, classes = _published(dra_fleet())
    assert {c["metadata"]["name"] for c in classes} == {"gpu.nvidia.com", "mig.nvidia.com"}
    assert {dra.class_selects_type(c) for c in classes} == {"gpu", "mig"}
    h100 = next(s for s in slices if s["spec"]["nodeName"] == "h100-dra-0")
    assert h100["spec"]["driver"] == "gpu.nvidia.com"
    assert h100["spec"]["pool"] == {"name": "h100-dra-0", "generation": 1, "resourceSliceCount": 1}
    dev = h100["spec"]["devices"][0]
    assert dev["name"] == "gpu-0"
    assert set(dev["attributes"]) >= {"type", "uuid", "productName", "brand", "architecture", "cudaComputeCapability",
                                      "driverVersion", "cudaDriverVersion", "pcieBusID", dra.PCIE_ROOT}
    assert dev["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert dev["attributes"]["architecture"] == {"string": "Hopper"}
    assert dev["attributes"]["cudaComputeCapability"] == {"version": "9.0.0"}
    assert dev["attributes"]["driverVersion"] == {"version": "570.133.20"}
    assert dev["capacity"] == {"memory": {"value": "81559Mi"}}
    mig = next(s for s in slices if s["spec"]["nodeName"] == "a100-mig-dra-0")["spec"]["devices"]
    names = sorted(d["name"] for d in mig)
    # gpu-<minor>-mig-<GI profile id>-<start>-<size>: 3g.40gb (id 9) at 4, 2g.20gb (14) at 2, 1g.10gb (19) at 0 and 1
    assert names[:4] == ["gpu-0-mig-14-2-2", "gpu-0-mig-19-0-1", "gpu-0-mig-19-1-1", "gpu-0-mig-9-4-4"], names
    three = next(d for d in mig if d["name"] == "gpu-0-mig-9-4-4")
    assert three["attributes"]["profile"] == {"string": "3g.40gb"}
    assert three["attributes"]["type"] == {"string": "mig"}
    assert {f"memorySlice{i}" for i in range(4, 8)} <= set(three["capacity"])
    assert set(three["capacity"]) >= {"multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines",
                                      "ofaEngines", "memory"}


def test_every_catalog_product_has_an_nvml_name_gfd_would_label_back():
    from gpuproof import catalog

    for label in catalog.PRODUCTS:
        assert slices.nvml_name(label).replace(" ", "-") == label
    assert slices.nvml_name("NVIDIA-H100-80GB-HBM3") == "NVIDIA H100 80GB HBM3"
    assert slices.nvml_name("NVIDIA-A100-SXM4-80GB") == "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize("product, profiles, want", [
    ("NVIDIA-A100-SXM4-80GB", {"1g.10gb": 7}, [(p, i, 1) for p, i in zip(["1g.10gb"] * 7, range(7))]),
    ("NVIDIA-A100-SXM4-40GB", {"1g.10gb": 4}, [("1g.10gb", s, 2) for s in (6, 4, 2, 0)]),
    ("NVIDIA-A100-SXM4-80GB", {"3g.40gb": 2}, [("3g.40gb", 4, 4), ("3g.40gb", 0, 4)]),
    ("NVIDIA-H100-80GB-HBM3", {"7g.80gb": 1}, [("7g.80gb", 0, 8)]),
])
def test_mig_placements(product, profiles, want):
    assert slices.placements(profiles, product) == want


def test_quantities():
    assert dra.mib("80Gi") == 81920
    assert dra.mib("81559Mi") == 81559
    assert dra.mib(str(80 * 2**30)) == 81920
    assert dra.mib("lots") is None
    assert dra.version_key("12.8.0") == (12, 8, 0)


# ---------------------------------------------------------------------------- reading the cluster


@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_discovery_tells_how_gpus_are_offered():
    d = _discovered(dra_fleet())
    offers = {n.name: n.offers for n in d.gpu_nodes}
    assert offers == {"a100-mig-dra-0": "dra", "h100-dra-0": "dra", "h100-dra-1": "dra",
                      "l40s-both-0": "both", "l4-device-plugin-0": "device-plugin"}
    assert len(d.dra_devices) == 8 + 8 + 8 + 4
    assert d.node("h100-dra-0").dra_only and not d.node("l40s-both-0").dra_only


@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_node_known_only_through_slices_is_a_gpu_node():
    """No GFD, no capacity, no cloud label: the slices alone make it a GPU node, with product and count."""
    fleet = dra_fleet()
    fleet["pools"] = [_pool(fleet, "h100-dra")]
    fleet_obj, slices, _ = _published(fleet)
    nodes = fleet_obj.node_objects()
    for n in nodes:
        n["metadata"]["labels"] = {"kubernetes.io/hostname": n["metadata"]["name"]}
    d = discover(nodes, slices=slices)
    node = d.node("h100-dra-0")
    assert (node.scheme, node.product, node.count_label) == ("dra", "NVIDIA-H100-80GB-HBM3", 8)
    assert node.catalog_product.label == "NVIDIA-H100-80GB-HBM3"
    assert dra.expected_devices(node) == (None, "nothing but the slices themselves")
    assert dra.attribute_mismatches(node)[0] == []          # checked against the catalog instead


@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_cluster_without_the_dra_api_is_not_a_dra_cluster():
    fleet = load_fleet("mixed")
    d = discover(fleet.node_objects(), slices=None)
    assert d.dra_devices is None and all(not n.dra for n in d.gpu_nodes)


@pytest.mark.parametrize("attribute, value, needle", [
    ("productName", "NVIDIA A100-SXM4-40GB", "productName 'NVIDIA A100-SXM4-40GB'"),
    ("architecture", "Ampere", "architecture 'Ampere' != 'Hopper'"),
    ("cudaComputeCapability", "8.0.0", "cudaComputeCapability '8.0.0' != 9.0"),
    ("driverVersion", "535.104.5", "driverVersion '535.104.5' != '570.133.20'"),
])
@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_each_attribute_disagreement_is_named(attribute, value, needle):
    fleet = dra_fleet()
    _pool(fleet, "h100-dra")["faults"] = [{"node": 1, "draSetAttributes": {attribute: value}}]
    d = _discovered(fleet)
    assert dra.attribute_mismatches(d.node("h100-dra-0"))[0] == []
    bad, compared = dra.attribute_mismatches(d.node("h100-dra-1"))
    assert len(bad) == 8 and all(needle in b for b in bad), bad
    assert bad[0].startswith("gpu-0 ")


@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_memory_against_labels_and_mig_memory():
    fleet = dra_fleet()
    _pool(fleet, "h100-dra")["faults"] = [{"node": 0, "setLabels": {"nvidia.com/gpu.memory": "40000"}}]
    _pool(fleet, "a100-mig-dra")["faults"] = [{"setLabels": {"nvidia.com/mig-3g.40gb.memory": "20000"}}]
    d = _discovered(fleet)
    bad, _ = dra.attribute_mismatches(d.node("h100-dra-0"))
    assert bad and "!= nvidia.com/gpu.memory 40000 MiB" in bad[0]
    bad, _ = dra.attribute_mismatches(d.node("a100-mig-dra-0"))
    assert len(bad) == 2 and all("3g.40gb" in b for b in bad), bad


@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_device_counts_against_labels():
    fleet = dra_fleet()
    _pool(fleet, "h100-dra")["faults"] = [{"node": 1, "draDropDevices": ["gpu-7"]}]
    _pool(fleet, "a100-mig-dra")["faults"] = [{"draDropDevices": ["gpu-1-mig-9-4-4"]}]
    d = _discovered(fleet)
    assert dra.published_devices(d.node("h100-dra-1")) == {"gpu": 7}
    assert dra.expected_devices(d.node("h100-dra-1")) == ({"gpu": 8}, "nvidia.com/gpu.count")
    assert dra.published_devices(d.node("a100-mig-dra-0"))["mig:3g.40gb"] == 1
    assert dra.expected_devices(d.node("a100-mig-dra-0"))[0]["mig:3g.40gb"] == 2


@pytest.mark.server  # tier: the fleet's labels come from GFD run under the mock NVML
def test_a_device_published_twice_is_found():
    fleet = dra_fleet()
    _pool(fleet, "h100-dra")["faults"] = [{"node": 0, "draDuplicateDevice": True}]
    d = _discovered(fleet)
    dupes = dra.duplicates(d.dra_devices)
    assert len(dupes) == 2, dupes
    assert "published 2 times: h100-dra-0/gpu-0" in dupes[0]
    assert dupes[1].startswith("device h100-dra-0/gpu-0 in 2 slices")
    assert dra.duplicates(_discovered(dra_fleet()).dra_devices) == []


def test_class_selector_reading():
    assert dra.class_selects_type(slices.device_class("mig.nvidia.com")) == "mig"
    other = {"spec": {"selectors": [{"cel": {"expression": "device.driver == 'other.example.com'"}}]}}
    assert dra.class_selects_type(other) is None
    two = {"spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.nvidia.com"'}},
                                  {"cel": {"expression": "device.attributes[\"gpu.nvidia.com\"].type == 'gpu'"}}]}}
    assert dra.class_selects_type(two) == "gpu"


@pytest.mark.parametrize("edit, field, problem", [
    (lambda f: _pool(f, "h100-dra").update(offer="plugin"), "pools[0].offer", "is not one of"),
    (lambda f: _pool(f, "cpu").update(offer="dra"), "pools[4].offer", "without GPUs"),
    (lambda f: _pool(f, "l4-device-plugin").update(offer="dra", timeSlicing={"replicas": 2}), "pools[3].offer",
     "time-slicing through DRA"),
    (lambda f: f.update(dra={"deviceClasses": ["gpu.example.com"]}), "dra.deviceClasses[0]", "NVIDIA's DeviceClasses"),
    (lambda f: _pool(f, "h100-dra")["faults"].append({"draDropDevices": "gpu-0"})
     if "faults" in _pool(f, "h100-dra") else _pool(f, "h100-dra").update(faults=[{"draDropDevices": "gpu-0"}]),
     "pools[0].faults[0].draDropDevices", "list of strings"),
])
def test_bad_dra_fleet_settings_are_named(edit, field, problem):
    fleet = dra_fleet()
    edit(fleet)
    with pytest.raises(FleetError) as exc:
        parse_fleet(fleet, "bad.yaml")
    assert field in str(exc.value) and problem in str(exc.value), str(exc.value)


# ---------------------------------------------------------------------------- on the embedded cluster



def _fault(pool_name: str, **fault) -> dict:
    fleet = dra_fleet()
    fleet["name"] = f"dra-fault-{pool_name}"
    _pool(fleet, pool_name).setdefault("faults", []).append(fault)
    return fleet


def _classes(*names: str) -> dict:
    fleet = dra_fleet()
    fleet["name"] = "dra-classes"
    fleet["dra"] = {"deviceClasses": list(names)}
    return fleet


ATTRS = ("every device agrees (architecture vs nvidia.com/gpu.family; "
         "cudaComputeCapability vs nvidia.com/gpu.compute.*; driverVersion vs nvidia.com/cuda.driver-version.full; "
         "memory vs nvidia.com/gpu.memory; productName vs "
         "nvidia.com/gpu.product)")
PCIE = ("productName 'NVIDIA H100 PCIe' (as a label 'NVIDIA-H100-PCIe') != "
        "nvidia.com/gpu.product 'NVIDIA-H100-80GB-HBM3'")
MIGS = '"mig:1g.10gb": 4, "mig:2g.20gb": {}, "mig:3g.40gb": 2'


def no_class(kind: str, pod: str) -> re.Pattern:
    """A pod whose claim names a DeviceClass that is gone: the scheduler's word, and its claim (generated name)."""
    return re.compile(re.escape(
        f"unschedulable: 0/6 nodes are available: request {kind}: device class {kind}.nvidia.com does not exist. no "
        "new claims to deallocate, preemption: 0/6 nodes are available: 6 Preemption is not helpful for scheduling.; "
        f"claim {pod}-gpus-") + "[a-z0-9]{5}: not allocated")


# id: (fleet, pytest -k, [(check, target, expected, actual: the value, or a pattern for generated names)])
DRA_FAULTS = {
    "slice-missing-a-device": (_fault("h100-dra", node=1, draDropDevices=["gpu-5"]), "slices_match",
                               [("dra-device-count", "h100-dra-1", '{"gpu": 8}', '{"gpu": 7}')]),
    "mig-device-missing": (_fault("a100-mig-dra", draDropDevices=["gpu-1-mig-14-2-2"]), "slices_match",
                           [("dra-device-count", "a100-mig-dra-0", "{" + MIGS.format(2) + "}",
                             "{" + MIGS.format(1) + "}")]),
    "attribute-disagrees-with-labels": (
        _fault("h100-dra", node=0, draSetAttributes={"productName": "NVIDIA H100 PCIe"}), "attributes",
        [("dra-attributes", "h100-dra-0", ATTRS, "; ".join(f"gpu-{i} {PCIE}" for i in range(6)) + "; and 2 more")]),
    "driver-version-disagrees": (
        _fault("l40s-both", draSetAttributes={"driverVersion": "550.54.15"}), "attributes",
        [("dra-attributes", "l40s-both-0", ATTRS,
          "; ".join(f"gpu-{i} driverVersion '550.54.15' != '570.133.20'" for i in range(4)))]),
    "no-mig-deviceclass": (_classes("gpu.nvidia.com"), "classes or mig_devices",
                           [("dra-deviceclass", "type/mig", "a DeviceClass selecting gpu.nvidia.com devices of type "
                             "'mig' (NVIDIA's chart: mig.nvidia.com)", "none among ['gpu.nvidia.com']"),
                            ("dra-mig-placement", "profile/1g.10gb",
                             "Running on one of ['a100-mig-dra-0'] with a 1g.10gb MIG device",
                             no_class("mig", "mig-0"))]),
    "no-deviceclass-at-all": (_classes(), "classes or one_gpu",
                              [("dra-deviceclass", "type/gpu", "a DeviceClass selecting gpu.nvidia.com devices of "
                                "type 'gpu' (NVIDIA's chart: gpu.nvidia.com)", "none among no DeviceClasses"),
                               ("dra-claim-allocated", "product/NVIDIA-H100-80GB-HBM3",
                                "Running, 1 NVIDIA H100 80GB HBM3 allocated on the pod's node",
                                no_class("gpu", "one-gpu-0"))]),
    "device-published-twice": (_fault("h100-dra", node=1, draDuplicateDevice=True), "twice",
                               [("dra-unique", "cluster", "each device (UUID, and name within its pool) once",
                                 re.compile(r"GPU-[-0-9a-f]{36} published 2 times: h100-dra-1/gpu-0 \(slice (\S+)\), "
                                            r"h100-dra-1/gpu-0 \(slice \1-dup\); device h100-dra-1/gpu-0 in 2 slices "
                                            r"of the pool: \1, \1-dup"))]),
}


@pytest.mark.sim
def test_healthy_dra_fleet_passes_every_suite(embedded, tmp_path):
    """Whole GPUs, MIG, device plugin beside DRA: every suite green; only the both-ways node warns."""
    with embedded.fleet_loaded(dra_fleet()):
        res = embedded.run_suite("suites", "-m", "not bench", report_dir=tmp_path, run_id="dra-healthy")
    assert res.code == 0, res
    assert res.failed_checks() == []
    dra_checks = {c["check"] for c in res.checks if c["feature"] == "dra" and c["verdict"] == "pass"}
    assert dra_checks >= {"dra-deviceclass", "dra-device-count", "dra-attributes", "dra-unique", "dra-claim-allocated",
                          "dra-unsatisfiable-waits", "dra-cel-product", "dra-cel-memory", "dra-cel-compute",
                          "dra-shared-claim", "dra-template-distinct", "dra-match-attribute", "dra-mig-placement",
                          "dra-mig-absent-waits", "dra-exhaust", "dra-freed-claim-reused"}, dra_checks
    warned = {(c["check"], c["target"]) for c in res.checks if c["verdict"] == "warn"}
    assert warned == {("dra-and-device-plugin", "l40s-both-0")}, warned
    # the device-plugin suites left the DRA-only nodes alone, and still judged the others
    adv = {c["target"] for c in res.checks if c["feature"] == "advertisement"}
    assert "l4-device-plugin-0" in adv and "l40s-both-0" in adv and not adv & {"h100-dra-0", "a100-mig-dra-0"}


@pytest.mark.sim
@pytest.mark.parametrize("case", list(DRA_FAULTS))
def test_dra_check_fails_on_its_fault(embedded, tmp_path, case):
    from test_suite_faults import assert_failed

    fleet, keyword, expectations = DRA_FAULTS[case]
    with embedded.fleet_loaded(copy.deepcopy(fleet)):
        res = embedded.run_suite("suites/test_dra.py", "-k", keyword, report_dir=tmp_path, run_id=case)
    assert_failed(res, expectations)

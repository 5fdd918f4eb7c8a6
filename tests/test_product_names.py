"""Product names as real drivers spell them (issue #38 item 4): gpuproof.catalog.resolve, and the DRA and plausibility
judgements that use it.

NVML names with or without a vendor or ``Tesla`` prefix, GFD's label forms, and NVIDIA vGPU profiles (``GRID
A100-40C``: a profile of a physical product, judged as that product with the profile's framebuffer as memory). Real
outputs are in tests/data/names (SOURCES.md names each); a name no catalog product or profile can be, and a memory
that product or profile cannot have, still fail. Pure: no cluster.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

from gpuproof import catalog
from gpuproof.discovery import dra
from gpuproof.discovery.nodes import discover
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir

DATA = Path(__file__).parent / "data" / "names"
REAL = yaml.safe_load((DATA / "real-names.yaml").read_text())
VKS = yaml.safe_load((DATA / "vks-a100-vgpu.yaml").read_text())


@pytest.mark.parametrize("row", REAL, ids=[f"{r['name']}@{r['source']}" for r in REAL])
def test_real_names_are_read_as_their_product(row):
    named = catalog.resolve(row["name"])
    if row["product"] is None:
        assert named is None and catalog.why_unknown(row["name"]), row
        return
    assert named is not None, catalog.why_unknown(row["name"])
    assert (named.product.label, named.vgpu) == (row["product"], row["vgpu"])
    if row["memoryMiB"] is not None:
        assert named.memory_plausible(row["memoryMiB"]), (named.what, named.memory_mib, row["memoryMiB"])


@pytest.mark.parametrize("name, label, vgpu, memory", [
    # NVML's names by driver and GPU, and GFD's labels of them (spaces as '-')
    ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "", 81920),
    ("A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "", 81920),
    ("NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "", 81920),
    ("A100-SXM4-80GB-MIG-1g.10gb-SHARED", "NVIDIA-A100-SXM4-80GB", "", 81920),
    ("Tesla T4", "Tesla-T4", "", 15360),
    ("NVIDIA Tesla T4", "Tesla-T4", "", 15360),
    ("Tesla-T4", "Tesla-T4", "", 15360),
    ("Tesla V100-SXM2-16GB", "Tesla-V100-SXM2-16GB", "", 16384),
    ("V100-SXM2-16GB", "Tesla-V100-SXM2-16GB", "", 16384),
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "", 81559),
    ("H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", "", 81559),
    ("NVIDIA A100 80GB PCIe", "NVIDIA-A100-80GB-PCIe", "", 81920),
    # NVIDIA vGPU profiles: GRID (older guest drivers) or NVIDIA brand, time-sliced and MIG-backed
    ("GRID A100-40C", "NVIDIA-A100-PCIE-40GB", "A100-40C", 40960),
    ("NVIDIA A100-4C", "NVIDIA-A100-PCIE-40GB", "A100-4C", 4096),
    ("GRID H100-80C", "NVIDIA-H100-PCIe", "H100-80C", 81920),
    ("NVIDIA H100XM-40C", "NVIDIA-H100-80GB-HBM3", "H100XM-40C", 40960),
    ("GRID A100DX-1-10C", "NVIDIA-A100-SXM4-80GB", "A100DX-1-10C", 10240),
    ("GRID-A100X-7-40C", "NVIDIA-A100-SXM4-40GB", "A100X-7-40C", 40960),
    ("NVIDIA H100L-1-12CME", "NVIDIA-H100-NVL", "H100L-1-12CME", 12288),
    ("GRID T4-16Q", "Tesla-T4", "T4-16Q", 16384),
    ("GRID V100DX-32C", "Tesla-V100-SXM2-32GB", "V100DX-32C", 32768),
    ("GRID-A100-40C-SHARED", "NVIDIA-A100-PCIE-40GB", "A100-40C", 40960),
])
def test_each_spelling_names_its_product(name, label, vgpu, memory):
    named = catalog.resolve(name)
    assert named is not None, catalog.why_unknown(name)
    assert (named.product.label, named.vgpu, named.memory_mib) == (label, vgpu, memory)
    assert named.memory_plausible(memory) and catalog.why_unknown(name) == ""
    if not vgpu:
        assert catalog.lookup(name) is named.product


@pytest.mark.parametrize("name, why", [
    ("NVIDIA A10", "neither a catalog product nor an NVIDIA vGPU type"),
    ("Tesla K80", "neither a catalog product nor an NVIDIA vGPU type"),
    ("NVIDIA-A100-SXM4-96GB", "neither a catalog product nor an NVIDIA vGPU type"),
    ("GRID Z999-8C", "board Z999 is no catalog product's"),
    ("GRID V100D-8C", "board V100D is no catalog product's"),      # real (SOURCES.md), but not in the catalog
    ("GRID A100-80C", "80 GB does not fit a NVIDIA-A100-PCIE-40GB"),
    ("NVIDIA T4-32Q", "32 GB does not fit a Tesla-T4"),
    ("GRID A100-2-5C", "NVIDIA-A100-PCIE-40GB has no MIG profile 2g.5gb"),
    ("GRID A100D-1-5C", "NVIDIA-A100-80GB-PCIe has no MIG profile 1g.5gb"),
    ("GRID L4-1-6C", "NVIDIA-L4 has no MIG profile 1g.6gb"),
    ("", "no product name"),
])
def test_a_product_that_cannot_be_is_not_read_as_one(name, why):
    assert catalog.resolve(name) is None
    assert catalog.lookup(name) is None
    assert why in catalog.why_unknown(name)


@pytest.mark.parametrize("name, memory", [
    ("GRID A100-40C", 81920),          # a 40 GB profile cannot have 80 GB
    ("GRID A100-4C", 40960),           # nor a 4 GB one a whole A100's
    ("NVIDIA A100-SXM4-80GB", 40960),  # a physical A100 80GB cannot have 40 GB
    ("Tesla T4", 32768),
])
def test_a_memory_the_product_cannot_have_is_implausible(name, memory):
    assert not catalog.resolve(name).memory_plausible(memory)


# ---------------------------------------------------------------------------- judged on nodes (pure: discover())


def _node_objects(rows) -> list[dict]:
    return [{"metadata": {"name": r["name"], "labels": dict(r.get("labels") or {})},
             "status": {"capacity": {}, "allocatable": {}}} for r in rows]


def _vks(labels: bool = True, edit=None) -> dict:
    data = yaml.safe_load(yaml.safe_dump(VKS))
    if not labels:
        for n in data["nodes"]:
            n["labels"] = {}
    if edit:
        edit(data)
    d = discover(_node_objects(data["nodes"]), slices=data["resourceSlices"])
    return {n.name.split("-")[5]: n for n in d.gpu_nodes}


def test_real_vgpu_nodes_agree_with_their_slices_and_the_catalog():
    nodes = _vks()
    assert sorted(nodes) == ["40c", "4c"]
    for key, memory in (("40c", 40960), ("4c", 4096)):
        n = nodes[key]
        assert n.catalog_product.label == "NVIDIA-A100-PCIE-40GB"
        assert n.catalog_name.vgpu == f"A100-{key.upper()}" and n.catalog_name.memory_plausible(memory)
        bad, compared = dra.attribute_mismatches(n)
        assert bad == [], bad
        assert "productName vs nvidia.com/gpu.product" in compared


def test_real_vgpu_devices_alone_are_judged_by_their_profile():
    """Without GFD's labels the devices are judged against the catalog: a profile of an A100 PCIe 40GB."""
    nodes = _vks(labels=False)
    for n in nodes.values():
        assert n.scheme == "dra" and n.catalog_product.label == "NVIDIA-A100-PCIE-40GB"
        assert dra.attribute_mismatches(n)[0] == []


def _device(data, key):
    return next(s for s in data["resourceSlices"] if f"-{key}-" in s["metadata"]["name"])["spec"]["devices"][0]


def test_a_vgpu_device_with_another_profiles_memory_fails():
    nodes = _vks(labels=False, edit=lambda d: _device(d, "40c")["capacity"].update(memory={"value": "80Gi"}))
    bad, _ = dra.attribute_mismatches(nodes["40c"])
    assert len(bad) == 1 and "memory 81920 MiB is implausible for vGPU A100-40C of a NVIDIA-A100-PCIE-40GB" in bad[0]
    assert dra.attribute_mismatches(nodes["4c"])[0] == []


def test_a_vgpu_profile_the_product_cannot_have_fails():
    nodes = _vks(labels=False, edit=lambda d: _device(d, "40c")["attributes"].update(
        productName={"string": "GRID A100-80C"}))
    bad, _ = dra.attribute_mismatches(nodes["40c"])
    assert any("productName 'GRID A100-80C' is not a product gpuproof knows (vGPU type A100-80C: 80 GB does not "
               "fit a NVIDIA-A100-PCIE-40GB" in b for b in bad), bad


def test_a_device_naming_another_profile_than_its_label_fails():
    nodes = _vks(edit=lambda d: _device(d, "40c")["attributes"].update(productName={"string": "GRID A100-4C"}))
    bad, _ = dra.attribute_mismatches(nodes["40c"])
    assert any("productName 'GRID A100-4C'" in b and "!= nvidia.com/gpu.product 'GRID-A100-40C'" in b for b in bad)


def test_nvml_spellings_of_the_labelled_product_agree():
    """GFD's label from one NVML spelling, the device's productName in another: the same product, no failure."""
    def edit(d):
        d["nodes"][0]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-PCIE-40GB"
        d["nodes"][0]["labels"]["nvidia.com/gpu.memory"] = "40536"
        dev = _device(d, "40c")
        dev["attributes"]["productName"] = {"string": "A100-PCIE-40GB"}
        dev["capacity"]["memory"] = {"value": "40536Mi"}
    nodes = _vks(edit=edit)
    assert dra.attribute_mismatches(nodes["40c"])[0] == []
    nodes = _vks(edit=lambda d: (edit(d), _device(d, "40c")["attributes"].update(
        productName={"string": "A100-SXM4-40GB"})))
    bad, _ = dra.attribute_mismatches(nodes["40c"])
    assert any("productName 'A100-SXM4-40GB'" in b for b in bad), bad


def _plausibility(tmp_path, node):
    """suites/test_plausibility.py's node tests on one node, with a real Checker; (checker, records)."""
    spec = importlib.util.spec_from_file_location("gpuproof_suite_plausibility",
                                                  Path(__file__).parents[1] / "suites" / "test_plausibility.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, known_nodes={node.name: node})
    module.test_product_in_catalog(gpu_node=node, check=checker)
    module.test_gpus_fit_product(gpu_node=node, check=checker)
    return checker, [json.loads(ln) for ln in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def test_the_plausibility_suite_judges_a_real_vgpu_node_by_its_profile(tmp_path):
    checker, records = _plausibility(tmp_path, _vks()["4c"])
    checker.finish()
    assert {(r["check"], r["verdict"]) for r in records} == {
        ("product-known", "pass"), ("memory-plausible", "pass"), ("family-plausible", "pass"),
        ("compute-plausible", "pass")}
    assert next(r for r in records if r["check"] == "product-known")["actual"] == "NVIDIA-A100-PCIE-40GB"


def test_the_plausibility_suite_fails_a_vgpu_node_with_a_memory_its_profile_cannot_have(tmp_path):
    node = _vks(edit=lambda d: d["nodes"][1]["labels"].update({"nvidia.com/gpu.memory": "40960"}))["4c"]
    checker, records = _plausibility(tmp_path, node)
    with pytest.raises(pytest.fail.Exception):
        checker.finish()
    rec, = [r for r in records if r["verdict"] == "fail"]
    assert (rec["check"], rec["actual"]) == ("memory-plausible", "40960 MiB")
    assert rec["expected"] == "4096 MiB +-7% (vGPU A100-4C of a NVIDIA-A100-PCIE-40GB)"

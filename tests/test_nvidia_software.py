"""NVIDIA's node software: built and found like the control plane, refused in one line where it cannot run."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from gpuproof.errors import ControlPlaneError, FleetError
from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim import dradriver, gpunodes, nvidia


@pytest.fixture(scope="module")
def sw():
    try:
        return nvidia.locate(build_missing=bool(os.environ.get("CI")))
    except ControlPlaneError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"NVIDIA's node software is not built here: {exc}")


def test_without_go_one_line_names_what_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPROOF_CACHE", str(tmp_path))
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name in ("go", "gcc", "cc") else
                        real_which(name, *a, **k))
    with pytest.raises(ControlPlaneError, match=r"lacks Go 1\.25 or newer and a C compiler \(gcc\)") as err:
        nvidia.locate()
    assert "\n" not in str(err.value)
    assert "$GPUPROOF_NVIDIA_DIR" in str(err.value) and "Pools without GPUs need none of it" in str(err.value)


def test_a_broken_override_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUPROOF_NVIDIA_DIR", str(tmp_path))
    with pytest.raises(ControlPlaneError, match=re.escape(f"$GPUPROOF_NVIDIA_DIR={tmp_path} does not hold a complete "
                                                          "build")):
        nvidia.locate()


def test_missing_snapshot_is_named(monkeypatch, tmp_path):
    monkeypatch.setenv(nvidia.SOURCES_ENV, str(tmp_path))
    with pytest.raises(ControlPlaneError, match=re.escape(f"has no {nvidia.TEST_INFRA.tarball}")):
        nvidia._fetch(nvidia.TEST_INFRA, tmp_path, progress=lambda m: None)


def test_cache_key_is_content_not_place():
    assert nvidia.build_key() == nvidia.build_key()
    assert re.fullmatch(r"[0-9a-f]{16}", nvidia.build_key())
    assert nvidia.cache_dir().name == f"{nvidia.DEVICE_PLUGIN_VERSION}-{nvidia.build_key()}"


def test_device_plugin_without_unshare_is_one_line(sw, monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    cfg, pcfg = tmp_path / "mock.yaml", tmp_path / "plugin.yaml"
    cfg.write_text("a: 1\n")
    pcfg.write_text("b: 2\n")
    with pytest.raises(ControlPlaneError, match=r"needs `unshare` \(util-linux\)"):
        gpunodes.run_device_plugin(sw, cfg, pcfg, tmp_path)


def test_chart_device_classes_rendered(sw):
    classes = {c["metadata"]["name"]: c for c in dradriver.device_classes(sw)}
    assert sorted(classes) == ["gpu.nvidia.com", "mig.nvidia.com"]
    gpu = classes["gpu.nvidia.com"]
    assert gpu["apiVersion"] == "resource.k8s.io/v1"
    assert gpu["spec"]["selectors"] == [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && "
                                                                "device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]
    assert gpu["spec"]["extendedResourceName"] == "nvidia.com/gpu"        # the v1 branch of the template


def test_mock_config_follows_the_pool(sw):
    (pool,) = parse_fleet({"pools": [{"name": "l4", "gpu": {"product": "NVIDIA-L4", "count": 3,
                                                            "driverVersion": "560.35.03", "cudaVersion": "12.6"},
                                      "faults": [{"node": 0, "nvmlFailures": {"2": "lost"}}]}]}).pools
    cfg = gpunodes.mock_config(sw, pool.gpu, seed="a", failures=pool.nvml_failures(0))
    assert cfg["device_defaults"]["name"] == "NVIDIA L4"
    assert cfg["device_defaults"]["memory"]["total_bytes"] == 23034 * 2**20
    assert (cfg["system"]["driver_version"], cfg["system"]["cuda_version"]) == ("560.35.03", "12.6")
    assert [d["index"] for d in cfg["devices"]] == [0, 1, 2]
    assert [d.get("failure") for d in cfg["devices"]] == [None, None, {"mode": "lost"}]
    other = gpunodes.mock_config(sw, pool.gpu, seed="b")
    assert {d["uuid"] for d in cfg["devices"]}.isdisjoint(d["uuid"] for d in other["devices"])


def test_more_than_eight_gpus_cannot_be_simulated():
    with pytest.raises(FleetError, match=re.escape("pools[0].gpu.count: the embedded cluster's GPUs are NVIDIA's "
                                                   "mock NVML, which shows at most 8 GPUs per node, got 16")):
        parse_fleet({"pools": [{"name": "x", "gpu": {"product": "NVIDIA-L4", "count": 16}}]})


def test_allocatable_is_what_the_plugin_lists_healthy():
    """The kubelet's rule: capacity counts every device the plugin lists, allocatable its Healthy ones."""
    record = {"resources": [{"name": "nvidia.com/gpu", "devices": [{"id": "a", "health": "Healthy"},
                                                                   {"id": "b", "health": "Unhealthy"}]}]}
    capacity, healthy = gpunodes.advertised(record)
    assert (capacity, healthy) == ({"nvidia.com/gpu": "2"}, {"nvidia.com/gpu": "1"})
    view = gpunodes.NodeView(labels={}, labels_by="", resources=capacity, resources_by="", healthy=healthy)
    assert view.allocatable == {"nvidia.com/gpu": "1"}
    assert gpunodes.NodeView({}, "", capacity, "").allocatable == capacity        # modelled: no health to read

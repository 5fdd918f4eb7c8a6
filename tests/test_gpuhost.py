"""The gpu-host fleet (issue #42 item 2): the driver library and the GPUs' device nodes under the driver root
($GPUPROOF_HOST_DRIVER_ROOT), its one-line refusals, and the fleet over a driver root whose library is NVIDIA's mock
NVML (a CPU machine has no other): the GPUs asked of that NVML, and the manifests over it. A whole run on its
kubelet node, from the bundle the GPU machine carries, is tests/test_bundle_lab.py's."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
import yaml

from gpuproof.errors import FleetError
from gpuproof.sim import gpuhost
from gpuproof.sim.fleet_file import load_fleet, parse_fleet



@pytest.mark.unit
def test_the_driver_and_gpus_are_found_under_the_driver_root(tmp_path, monkeypatch):
    root = tmp_path / "driver"
    (root / "usr" / "lib64").mkdir(parents=True)
    (root / "dev").mkdir()
    monkeypatch.setenv(gpuhost.ROOT_ENV, str(root))
    assert "no NVIDIA GPU (no /dev/nvidia<N> under" in gpuhost.refusal()
    for name in ("nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm", "nvidia10"):
        (root / "dev" / name).touch()
    assert "no NVIDIA driver library (libnvidia-ml.so.1" in gpuhost.refusal()
    (root / "usr" / "lib64" / "libnvidia-ml.so.1").touch()
    lib, gpus = gpuhost.find_driver()
    assert lib == root / "usr" / "lib64" / "libnvidia-ml.so.1"
    assert [g.name for g in gpus] == ["nvidia0", "nvidia1", "nvidia10"]
    assert gpuhost.refusal() == ""
    assert gpuhost.host_driver().devices == ()            # empty files, not character devices


@pytest.mark.server    # tier: NVML asked in a child process
def test_a_driver_whose_nvml_does_not_answer_is_refused_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "usr" / "lib64").mkdir(parents=True)
    (tmp_path / "usr" / "lib64" / "libnvidia-ml.so.1").write_text("not a library")
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    monkeypatch.setenv(gpuhost.ROOT_ENV, str(tmp_path))
    with pytest.raises(FleetError) as err:
        load_fleet("gpu-host")
    assert str(err.value).startswith(f"fleet gpu-host: NVML in {tmp_path / 'usr' / 'lib64'} failed: ")
    assert "\n" not in str(err.value) and "NVML" in str(err.value).split("failed: ")[1], str(err.value)


@pytest.mark.unit
def test_without_a_gpu_the_fleet_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(gpuhost.ROOT_ENV, str(tmp_path))
    with pytest.raises(FleetError) as err:
        load_fleet("gpu-host")
    assert str(err.value).startswith("fleet gpu-host: this machine has no NVIDIA GPU") and "\n" not in str(err.value)


# ------------------------------------------------------------------ over a driver root of NVIDIA's mock NVML

A100 = {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}


def mock_driver_root(tmp_path: Path, monkeypatch) -> tuple[Path, dict]:
    """A driver root as a host's: NVIDIA's mock ``libnvidia-ml.so.1`` in ``usr/lib64`` (copied: the nodes mount the
    folder into pods), ``dev/nvidia0``, ``dev/nvidia1`` and ``dev/nvidiactl`` with NVIDIA's device numbers, and the
    mock's config (two A100s) in ``$MOCK_NVML_CONFIG``. Returns the root and that config."""
    from gpuproof.sim import nvidia
    from gpuproof.sim.gpunodes import mock_config

    sw = nvidia.locate()
    root = tmp_path / "driver"
    (root / "usr" / "lib64").mkdir(parents=True)
    (root / "dev").mkdir()
    shutil.copyfile((sw.lib / gpuhost.LIB).resolve(), root / "usr" / "lib64" / gpuhost.LIB)
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255)):
        os.mknod(root / "dev" / name, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
    pool = parse_fleet({"name": "h", "pools": [{"name": "h", "count": 1, "gpu": dict(A100)}]}, source="h").pools[0]
    config = mock_config(sw, pool.gpu, seed="gpu-host/this-machine")
    (tmp_path / "mock-nvml.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    monkeypatch.setenv(gpuhost.ROOT_ENV, str(root))
    monkeypatch.setenv(gpuhost.MOCK_ENV, str(tmp_path / "mock-nvml.yaml"))
    return root, config


@pytest.mark.build     # tier: NVIDIA's mock NVML (built by setup.sh) loaded in a child process
@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes needs root")
def test_the_fleet_is_what_the_drivers_nvml_says(tmp_path, monkeypatch):
    """Product, count, memory, compute capability, driver and CUDA versions are NVML's answers, never assumed; the
    node's device files are the driver root's (GPUs and control files, with their device numbers)."""
    root, config = mock_driver_root(tmp_path, monkeypatch)
    fleet = load_fleet("gpu-host")
    (pool,) = fleet.pools
    assert (fleet.name, pool.name, pool.count, pool.backend) == ("gpu-host", "gpu-host", 1, "kubelet")
    want = config["device_defaults"]
    assert pool.gpu.product == want["name"].replace(" ", "-") == "NVIDIA-A100-SXM4-40GB"
    assert pool.gpu.count == 2 and pool.gpu.memory_mib == want["memory"]["total_bytes"] // 2**20
    assert pool.gpu.compute == (8, 0) and pool.gpu.family == "ampere"
    assert pool.gpu.driver_version == config["system"]["driver_version"]
    assert pool.gpu.cuda_version == config["system"]["cuda_version"]
    driver = pool.host_driver
    assert driver.lib_dir == str(root / "usr" / "lib64") and not driver.cuda      # the mock has no libcuda.so.1
    assert driver.devices == (("nvidia0", os.makedev(195, 0)), ("nvidia1", os.makedev(195, 1)),
                              ("nvidiactl", os.makedev(195, 255)))
    assert driver.mock_config == str(tmp_path / "mock-nvml.yaml")


@pytest.mark.unit
def test_nvidias_pods_and_the_workloads_load_the_host_drivers_library():
    """Over a host driver, NVIDIA's DaemonSets mount the driver's library folder and put it first on
    LD_LIBRARY_PATH (before the image's mock), privileged (the toolkit's part on a real node); workload pods are lent
    the folder the same way and compute on CUDA only where the driver has libcuda.so.1."""
    from gpuproof.sim.kubelet import device_plugin_daemonset, gfd_daemonset, workload_image
    from gpuproof.sim.kubelet.host import HOST_DRIVER_IN_POD

    driver = gpuhost.HostDriver("/usr/lib/x86_64-linux-gnu", (("nvidia0", os.makedev(195, 0)),))
    for make in (device_plugin_daemonset, gfd_daemonset):
        plain, host = (make("img")["spec"]["template"]["spec"], make("img", driver)["spec"]["template"]["spec"])
        (c,) = host["containers"]
        assert {"name": "LD_LIBRARY_PATH", "value": HOST_DRIVER_IN_POD} in c["env"]
        assert c["securityContext"] == {"privileged": True} and "securityContext" not in plain["containers"][0]
        mount = next(m for m in c["volumeMounts"] if m["mountPath"] == HOST_DRIVER_IN_POD)
        vol = next(v for v in host["volumes"] if v["name"] == mount["name"])
        assert vol["hostPath"]["path"] == driver.lib_dir and mount["readOnly"]
    image = workload_image("w", driver)
    env = dict(image.env)
    lent = dict((c, h) for h, c in image.host_paths)
    first = env["LD_LIBRARY_PATH"].split(":")[0]
    assert lent[first] == driver.lib_dir
    assert image.device == ("cuda" if driver.cuda else "cpu") and workload_image("w").device == "cpu"
    assert "LD_LIBRARY_PATH" not in dict(workload_image("w").env)

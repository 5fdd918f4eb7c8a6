"""The gpu-host fleet's view of the host (issue #42 item 2): the driver library and the GPUs' device nodes under the
driver root ($GPUPROOF_HOST_DRIVER_ROOT: here laid out as the DRA nodes' mock driver root is), and its one-line
refusal without them."""

from __future__ import annotations

import pytest

from gpuproof.errors import FleetError
from gpuproof.sim import gpuhost
from gpuproof.sim.fleet_file import load_fleet

pytestmark = pytest.mark.unit


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
    with pytest.raises(FleetError, match=r"^fleet gpu-host: found 3 GPU\(s\) .* not built yet"):
        load_fleet("gpu-host")


def test_without_a_gpu_the_fleet_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(gpuhost.ROOT_ENV, str(tmp_path))
    with pytest.raises(FleetError) as err:
        load_fleet("gpu-host")
    assert str(err.value).startswith("fleet gpu-host: this machine has no NVIDIA GPU") and "\n" not in str(err.value)

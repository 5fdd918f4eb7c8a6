"""The ``gpu-host`` fleet (issue #42 item 2): the embedded cluster over this machine's own GPUs.

One kubelet node, ``gpu-host-0``, over the host's NVIDIA driver (:func:`find_driver`: ``libnvidia-ml.so.1`` and
``/dev/nvidia<N>``, under ``$GPUPROOF_HOST_DRIVER_ROOT`` when set). What the node's GPUs are is asked of that
driver's NVML (:func:`ask_nvml`), never assumed: the product GFD will label (NVML's name, spaces as dashes), the
count, memory, compute capability, driver and CUDA versions. The node then runs as the kubelet fleets' nodes do
(``gpuproof.sim.kubelet``), with what differs because the driver is real (:class:`HostDriver`):

- NVIDIA's device plugin and GFD load the driver's library (its folder mounted into their pods, first on
  ``LD_LIBRARY_PATH``) and see the GPUs' device files (privileged, as NVIDIA's container toolkit would give them);
- the node's ``/dev/nvidia*`` (where the device plugin's device specs point) are the driver's own device numbers,
  so a container allocated a GPU gets that GPU, ``nvidiactl`` and ``nvidia-uvm`` included;
- workload pods are lent the driver's library folder beside the host's Python and torch, and compute on CUDA when
  the driver has ``libcuda.so.1`` (a driver root without it, such as NVIDIA's mock, keeps the CPU path).

A driver root whose library is NVIDIA's mock NVML (the project's tests: a CPU machine has no other) reads its GPUs
from ``$MOCK_NVML_CONFIG``, as the mock itself does; the node's pods get that file. Without a GPU, ``--fleet
gpu-host`` is refused in one line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

from ..errors import FleetError

NAME = "gpu-host"
ROOT_ENV = "GPUPROOF_HOST_DRIVER_ROOT"
MOCK_ENV = "MOCK_NVML_CONFIG"          # NVIDIA's mock NVML reads its GPUs from this file
LIB = "libnvidia-ml.so.1"
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "usr/local/nvidia/lib64",
            "usr/lib/wsl/lib")
CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def find_driver(root: str | os.PathLike | None = None) -> tuple[Path | None, list[Path]]:
    """(the driver's ``libnvidia-ml.so.1`` or None, the GPUs' ``/dev/nvidia<N>``) under the driver root (``/``, or
    ``$GPUPROOF_HOST_DRIVER_ROOT``)."""
    base = driver_root(root)
    lib = next((base / d / LIB for d in LIB_DIRS if (base / d / LIB).exists()), None)
    dev = base / "dev"
    gpus = sorted((p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)),
                  key=lambda p: int(p.name[6:])) if dev.is_dir() else []
    return lib, gpus


def driver_root(root: str | os.PathLike | None = None) -> Path:
    return Path(root or os.environ.get(ROOT_ENV) or "/")


def refusal(root: str | os.PathLike | None = None) -> str:
    """Why this machine cannot be the gpu-host fleet's node (one line), '' when it has a driver and GPUs."""
    lib, gpus = find_driver(root)
    where = os.environ.get(ROOT_ENV) or "/"
    if not gpus:
        return (f"fleet {NAME}: this machine has no NVIDIA GPU (no /dev/nvidia<N> under {where}); the gpu-host fleet "
                "runs the embedded cluster over the host's own GPUs (the kubelet fleets, such as lab, run over "
                "NVIDIA's mock)")
    if lib is None:
        return (f"fleet {NAME}: {len(gpus)} GPU device(s) under {where}dev but no NVIDIA driver library ({LIB} in "
                f"{', '.join(LIB_DIRS)}); set ${ROOT_ENV} to the driver's root")
    return ""


@dataclasses.dataclass(frozen=True)
class HostDriver:
    """The host's driver as the gpu-host node uses it."""

    lib_dir: str                                    # the folder of its libnvidia-ml.so.1 (and libcuda.so.1)
    devices: tuple[tuple[str, int], ...]            # (name under /dev, device number) of its GPUs and control files
    mock_config: str = ""                           # $MOCK_NVML_CONFIG's file, where the library is NVIDIA's mock

    @property
    def cuda(self) -> bool:
        """Whether pods can compute on these GPUs (the driver has CUDA's library)."""
        return (Path(self.lib_dir) / "libcuda.so.1").exists()


def host_driver(root: str | os.PathLike | None = None) -> HostDriver:
    lib, gpus = find_driver(root)
    dev = driver_root(root) / "dev"
    devices = []
    for p in [*gpus, *(dev / n for n in CONTROL_DEVICES)]:
        try:
            st = os.stat(p)
        except OSError:                     # a control file this driver has not made
            continue
        if stat.S_ISCHR(st.st_mode):
            devices.append((p.name, st.st_rdev))
    return HostDriver(str(lib.parent), tuple(devices), os.environ.get(MOCK_ENV, ""))


# what NVML says about the GPUs, asked in a child process that loads the driver's library (nvidia-ml-py loads
# libnvidia-ml.so.1 by name: LD_LIBRARY_PATH picks the driver root's)
_ASK = r"""
import json, pynvml
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
s = lambda v: v.decode() if isinstance(v, bytes) else v
cuda = pynvml.nvmlSystemGetCudaDriverVersion()
print(json.dumps({"count": n, "name": s(pynvml.nvmlDeviceGetName(h)),
                  "memory_mib": pynvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
                  "compute": list(pynvml.nvmlDeviceGetCudaComputeCapability(h)),
                  "driver": s(pynvml.nvmlSystemGetDriverVersion()),
                  "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}"}))
"""


def ask_nvml(lib_dir: str) -> dict:
    """The GPUs as the driver's NVML reports them; FleetError in one line when it cannot answer."""
    env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [lib_dir, os.environ.get(
        "LD_LIBRARY_PATH")]))}
    try:
        proc = subprocess.run([sys.executable, "-c", _ASK], capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        raise FleetError("", "", f"fleet {NAME}: NVML in {lib_dir} did not answer within 120 s") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise FleetError("", "", f"fleet {NAME}: NVML in {lib_dir} failed: {last}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fleet_data(root: str | os.PathLike | None = None) -> tuple[dict, HostDriver, str]:
    """The gpu-host fleet over this machine's GPUs, as a fleet file would say it, the driver its node runs over, and
    where it came from (``gpuproof.sim.fleet_file.load_fleet`` parses it); refused in one line (FleetError) without
    a GPU or where its driver's NVML does not answer."""
    from .. import catalog

    why = refusal(root)
    if why:
        raise FleetError("", "", why)
    driver = host_driver(root)
    facts = ask_nvml(driver.lib_dir)
    compute = tuple(facts["compute"])
    gpu = {"product": facts["name"].strip().replace(" ", "-"), "count": facts["count"],
           "memoryMiB": facts["memory_mib"], "family": catalog.family_for(compute) or "unknown",
           "computeCapability": f"{compute[0]}.{compute[1]}", "driverVersion": facts["driver"],
           "cudaVersion": facts["cuda"]}
    data = {"name": NAME, "pools": [{"name": NAME, "count": 1, "backend": "kubelet", "instanceType": NAME,
                                     "gpu": gpu}]}
    return data, driver, f"{NAME} (this machine's GPUs: NVML in {driver.lib_dir})"

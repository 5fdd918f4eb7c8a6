"""The ``gpu-host`` fleet (issue #42 item 2): the embedded cluster over this machine's own GPUs.

What is built: finding the host's NVIDIA driver and GPUs (:func:`find_driver`: ``libnvidia-ml.so.1`` and
``/dev/nvidia<N>``, under ``$GPUPROOF_HOST_DRIVER_ROOT`` when set, so the tests point it at the mock's driver
root), and the fleet's refusal in one line where there is none. Not built yet: the kubelet node that runs NVIDIA's
device plugin and GFD over that driver instead of the mock, and lends workload pods the driver's libraries; on a
machine with GPUs, ``--fleet gpu-host`` says so in one line rather than pretend.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..errors import FleetError

NAME = "gpu-host"
ROOT_ENV = "GPUPROOF_HOST_DRIVER_ROOT"
LIB = "libnvidia-ml.so.1"
LIB_DIRS = ("usr/lib/x86_64-linux-gnu", "usr/lib64", "usr/lib", "lib64", "usr/local/nvidia/lib64",
            "usr/lib/wsl/lib")


def find_driver(root: str | os.PathLike | None = None) -> tuple[Path | None, list[Path]]:
    """(the driver's ``libnvidia-ml.so.1`` or None, the GPUs' ``/dev/nvidia<N>``) under the driver root (``/``, or
    ``$GPUPROOF_HOST_DRIVER_ROOT``)."""
    base = Path(root or os.environ.get(ROOT_ENV) or "/")
    lib = next((base / d / LIB for d in LIB_DIRS if (base / d / LIB).exists()), None)
    dev = base / "dev"
    gpus = sorted((p for p in dev.glob("nvidia*") if re.fullmatch(r"nvidia\d+", p.name)),
                  key=lambda p: int(p.name[6:])) if dev.is_dir() else []
    return lib, gpus


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


def fleet():
    """The gpu-host fleet; refused in one line (FleetError) without a GPU, and while its wiring is not built."""
    why = refusal()
    if why:
        raise FleetError("", "", why)
    lib, gpus = find_driver()
    raise FleetError("", "", f"fleet {NAME}: found {len(gpus)} GPU(s) and {lib}, but the kubelet node over the "
                             f"host's driver is not built yet (issue #42 item 2)")

"""What GPUs this container can reach: its NVIDIA device files and what NVML lists in it.

Kubernetes AI Conformance's ``secure_accelerator_access`` (upstream ``TestSecureAcceleratorAccess``) counts the
container's ``/dev/nvidia[0-9]*`` device files (one per GPU; ``nvidiactl``, ``nvidia-uvm``, ``nvidia-caps`` are the
driver's control nodes, not GPUs). This program reports them, with each file's minor number (the GPU's number on
the node), the control nodes apart, the GPUs NVML lists (index, UUID) when NVML initialises here, and the
``NVIDIA_VISIBLE_DEVICES`` / ``NVIDIA_DRIVER_CAPABILITIES`` the container was started with. It judges nothing:
``gpuproof/discovery/access.py`` does, against what the pod was granted. No torch: it runs in a few seconds.

Over NVIDIA's mock NVML (``MOCK_NVML_CONFIG`` set), ``mock_nvml`` says so: the mock lists only the GPUs whose
``/dev/nvidia<N>`` the container has, and every GPU of its config when it has none (engine.go
``detectVisibleDevicesAt``: it takes that for the host).

Prints one JSON object on stdout; exit 0.
"""

from __future__ import annotations

import glob
import os
import re
import stat
import sys

import workload_common as common

GPU_FILES = "/dev/nvidia[0-9]*"           # the upstream test's DevicePattern


def device_files(pattern: str = GPU_FILES) -> list[dict]:
    """Each GPU device file: its path and minor number (None when it is not a character device)."""
    out = []
    for path in sorted(glob.glob(pattern), key=lambda p: (len(p), p)):
        if not re.fullmatch(r".*/nvidia\d+", path):
            continue
        try:
            st = os.stat(path)
            minor = os.minor(st.st_rdev) if stat.S_ISCHR(st.st_mode) else None
        except OSError:
            minor = None
        out.append({"path": path, "minor": minor})
    return out


def control_files() -> list[str]:
    """The driver's other device nodes in /dev (nvidiactl, nvidia-uvm, nvidia-caps, ...): reported, not GPUs."""
    return sorted(p for p in glob.glob("/dev/nvidia*") if not re.fullmatch(r".*/nvidia\d+", p))


def nvml_gpus() -> dict:
    """NVML's GPUs (index, UUID) here, or why NVML cannot say."""
    nvml, why = common.load_nvml()
    if nvml is None:
        return {"available": False, "reason": why, "gpus": []}
    out: dict = {"available": True, "gpus": []}
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        return {"available": False, "reason": f"NVML could not list devices: {exc}", "gpus": []}
    for i in range(count):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu = {"index": i, "uuid": common.nvml_str(nvml.nvmlDeviceGetUUID(h))}
            try:
                gpu["minor"] = nvml.nvmlDeviceGetMinorNumber(h)
            except Exception:
                gpu["minor"] = None
        except Exception as exc:
            gpu = {"index": i, "error": f"NVML: {exc}"}
        out["gpus"].append(gpu)
    return out


def main(argv: list[str] | None = None) -> int:
    p = common.parser("access.py", "Report the NVIDIA device files and NVML GPUs this container can reach.",
                      epilog="example:\n  python access.py\n")
    p.add_argument("--name", default="", help="a name for this container in the result (multi-container pods)")
    args = p.parse_args(argv)
    result = common.base_result("access")
    result.update(
        container=args.name,
        device_files=device_files(),
        control_files=control_files(),
        nvml=nvml_gpus(),
        env={k: os.environ.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES",
                                            "CUDA_VISIBLE_DEVICES")},
        mock_nvml=bool(os.environ.get("MOCK_NVML_CONFIG")),
        ok=True,
    )
    files = [f["path"] for f in result["device_files"]]
    common.log(f"{len(files)} GPU device file(s) {files}; NVML: "
               + (f"{len(result['nvml']['gpus'])} GPU(s)" if result["nvml"]["available"]
                  else result["nvml"]["reason"]))
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

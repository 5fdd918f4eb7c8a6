"""In-pod GPU probe: what this container can see, and whether a small kernel computes right.

Reports torch, CUDA (build) and driver versions; the devices torch sees (name, compute
capability, memory, UUID); the devices NVML sees, whether or not CUDA works (name, UUID,
memory, MIG mode and the UUIDs of MIG instances; a GPU NVML cannot answer for, with the error);
the NVLink links and PCIe paths among those GPUs (:func:`nvml_topology`); CUDA_VISIBLE_DEVICES
and NVIDIA_VISIBLE_DEVICES; and runs a small elementwise + matmul kernel on every visible
device (or on the CPU) whose result is checked exactly against an integer reference.

Device identity: ``nvml_uuids`` lists what this container can use as NVML names it: the
``GPU-...`` UUID of each GPU, or the ``MIG-...`` UUIDs of the MIG devices of a GPU in MIG
mode. Torch's UUIDs lack the prefix; they are normalised to the same form
(:func:`normalize_uuid`). NVIDIA_VISIBLE_DEVICES is reported but not trusted: it may hold
an index (``0``) or, with CDI, nothing.

Prints one JSON object on stdout; exit 0 when every check passed.
"""

from __future__ import annotations

import platform
import re
import sys
import time

import workload_common as common


_s = common.nvml_str


_PREFIXED = re.compile(r"^(GPU|MIG)-(.*)$", re.IGNORECASE)


def normalize_uuid(uuid, kind: str = "GPU") -> str:
    """A device UUID in NVML's form: 'GPU-<hex>' or 'MIG-<hex>' (hex lower-case).

    Torch reports '<hex>' without a prefix; ``kind`` ('GPU' or 'MIG') says which prefix it
    gets. Prefixed UUIDs keep their kind, including the old 'MIG-GPU-<hex>/<gi>/<ci>'
    form. '' for no UUID.
    """
    s = (uuid.decode() if isinstance(uuid, bytes) else str(uuid or "")).strip()
    if not s or s.lower() == "none":
        return ""
    m = _PREFIXED.match(s)
    if not m:
        return f"{kind.upper()}-{s.lower()}"
    rest = m.group(2)
    return f"{m.group(1).upper()}-{normalize_uuid(rest) if _PREFIXED.match(rest) else rest.lower()}"


def visible_uuids(nvml: dict) -> list[str]:
    """NVML UUIDs of what the container can run on: each GPU, or a MIG-mode GPU's MIG devices."""
    out = []
    for dev in nvml.get("devices") or []:
        if dev.get("mig_mode"):
            out += [normalize_uuid(m["uuid"], "MIG") for m in dev.get("mig_devices") or [] if m.get("uuid")]
        elif dev.get("uuid"):
            out.append(normalize_uuid(dev["uuid"], "GPU"))
    return out


def normalize_torch_uuids(torch_devices: list[dict], nvml_uuids: list[str]) -> None:
    """Give torch's bare UUIDs NVML's prefix, in place: 'MIG-' when NVML lists that MIG device, else 'GPU-'."""
    mig = {u[4:] for u in nvml_uuids if u.startswith("MIG-")}
    for d in torch_devices:
        raw = normalize_uuid(d.get("uuid"))          # 'GPU-<hex>' unless torch gave a prefix itself
        d["uuid"] = normalize_uuid(raw[4:], "MIG" if raw[4:] in mig else raw[:3]) if raw else None


def nvml_inventory() -> dict:
    """Driver version and devices as NVML reports them (MIG instances included), whatever torch sees.

    A GPU NVML cannot answer for (lost, fallen off the bus) is listed with its index and the error."""
    nvml, why = common.load_nvml()
    if nvml is None:
        return {"available": False, "reason": why}
    out: dict = {"available": True, "devices": []}
    try:
        out["driver_version"] = _s(nvml.nvmlSystemGetDriverVersion())
        cuda = nvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040
        out["cuda_driver_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}"
    except Exception as exc:
        out["driver_error"] = str(exc)
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as exc:
        return {**out, "available": False, "reason": f"NVML could not list devices: {exc}"}
    for i in range(count):
        try:
            out["devices"].append(_nvml_device(nvml, i))
        except Exception as exc:
            out["devices"].append({"index": i, "error": f"NVML: {exc}"})
    return out


def _nvml_device(nvml, i: int) -> dict:
    h = nvml.nvmlDeviceGetHandleByIndex(i)
    dev = {
        "index": i,
        "name": _s(nvml.nvmlDeviceGetName(h)),
        "uuid": _s(nvml.nvmlDeviceGetUUID(h)),
        "memory_total_mib": nvml.nvmlDeviceGetMemoryInfo(h).total // 2**20,
    }
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(h)
        dev["mig_mode"] = bool(current == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1))
    except Exception:  # not MIG capable
        dev["mig_mode"] = None
    if dev["mig_mode"]:
        dev["mig_devices"] = []
        for j in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                m = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
            except Exception:  # empty slot
                continue
            dev["mig_devices"].append({
                "index": j,
                "uuid": _s(nvml.nvmlDeviceGetUUID(m)),
                "memory_total_mib": nvml.nvmlDeviceGetMemoryInfo(m).total // 2**20,
            })
    return dev


# nvmlGpuTopologyLevel_t as ``nvidia-smi topo -m`` names the PCIe path between two GPUs
PCIE_PATHS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
# nvmlGpuP2PStatus_t
P2P_STATUS = {0: "OK", 1: "CHIPSET_NOT_SUPPORTED", 2: "GPU_NOT_SUPPORTED", 3: "IOH_TOPOLOGY_NOT_SUPPORTED",
              4: "DISABLED_BY_REGKEY", 5: "NOT_SUPPORTED", 6: "UNKNOWN"}
NVLINK_TO_SWITCH = 2        # NVML_NVLINK_DEVICE_TYPE_SWITCH
P2P_OVER_NVLINK = 2         # NVML_P2P_CAPS_INDEX_NVLINK


def nvml_topology(inventory: dict) -> dict:
    """The NVLink links among the GPUs this process sees, and the PCIe path between each pair.

    Per GPU (``gpus``): its NVML index here, its minor number (``/dev/nvidia<N>`` on the node), its
    active NVLinks, how many reach an NVSwitch and how many reach each GPU by PCI bus id (a GPU this
    process does not see included); ``nvlink`` is null with ``nvlink_unavailable`` (NVML's answer)
    where NVML reads no link state (a GPU without NVLink). Per pair (``pairs``): the NVLinks between
    them (``direct``, plus ``through_nvswitch`` when both GPUs have links to NVSwitches: every GPU on
    a node's NVSwitch fabric reaches every other, as ``nvidia-smi topo -m`` counts NV#), NVML's P2P
    status over NVLink, and the PCIe path (``nvidia-smi topo -m``'s names), or NVML's error."""
    if not inventory.get("available"):
        return {"available": False, "reason": inventory.get("reason")}
    nvml, why = common.load_nvml()
    if nvml is None:
        return {"available": False, "reason": why}
    try:
        gpus = [_nvlink_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(d["index"]), d)
                for d in inventory["devices"] if not d.get("error")]
        pairs = [_nvlink_pair(nvml, a, b) for i, a in enumerate(gpus) for b in gpus[i + 1:]]
    except Exception as exc:       # a GPU lost while it was read: the rest of the result still counts
        return {"available": False, "reason": f"NVML: {exc}"}
    return {"available": True, "gpus": [g for g, _ in gpus], "pairs": pairs}


def _nvml_answer(fn, names: dict):
    """NVML's answer (by its name in ``names`` where it has one), or its error."""
    try:
        value = fn()
    except Exception as exc:      # NotSupported, or a call this nvidia-ml-py lacks
        return f"NVML: {exc}"
    return names.get(value, value)


def _nvlink_gpu(nvml, h, dev: dict) -> tuple[dict, object]:
    gpu = {"index": dev["index"], "uuid": normalize_uuid(dev["uuid"]),
           "minor": _nvml_answer(lambda: nvml.nvmlDeviceGetMinorNumber(h), {}),
           "pci_bus_id": _s(nvml.nvmlDeviceGetPciInfo(h).busId).upper()}
    links = {"active": 0, "switch": 0, "gpus": {}}
    for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nvml.nvmlDeviceGetNvLinkState(h, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except nvml.NVMLError as exc:  # InvalidArgument: past the GPU's last link; NotSupported: no NVLink
            if link == 0 and not isinstance(exc, nvml.NVMLError_InvalidArgument):
                return {**gpu, "nvlink": None, "nvlink_unavailable": f"NVML: {exc}"}, h
            break
        links["active"] += 1
        remote = _nvml_answer(lambda: nvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, link), {})
        if remote == NVLINK_TO_SWITCH:
            links["switch"] += 1
        else:
            bus = _s(nvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId).upper()
            links["gpus"][bus] = links["gpus"].get(bus, 0) + 1
    return {**gpu, "nvlink": links}, h


def _nvlink_pair(nvml, a: tuple[dict, object], b: tuple[dict, object]) -> dict:
    (ga, ha), (gb, hb) = a, b
    la, lb = ga["nvlink"] or {}, gb["nvlink"] or {}
    direct = la.get("gpus", {}).get(gb["pci_bus_id"], 0)
    switch = la["switch"] if la.get("switch") and lb.get("switch") else 0
    return {"a": ga["uuid"], "b": gb["uuid"], "nvlink": direct + switch, "direct": direct,
            "through_nvswitch": switch,
            "p2p_nvlink": _nvml_answer(lambda: nvml.nvmlDeviceGetP2PStatus(ha, hb, P2P_OVER_NVLINK), P2P_STATUS),
            "common_ancestor": _nvml_answer(lambda: nvml.nvmlDeviceGetTopologyCommonAncestor(ha, hb), PCIE_PATHS)}


def torch_devices() -> list[dict]:
    import torch

    devs = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = getattr(p, "uuid", None)
        devs.append({
            "index": i,
            "name": p.name,
            "compute_capability": f"{p.major}.{p.minor}",
            "memory_total_mib": p.total_memory // 2**20,
            "multiprocessors": p.multi_processor_count,
            "uuid": str(uuid) if uuid is not None else None,
        })
    return devs


def kernel_check(device: str, n: int = 64) -> dict:
    """Elementwise + matmul on small integer-valued data; exact compare with int64 on the CPU."""
    import torch

    t0 = time.perf_counter()
    idx = torch.arange(n * n, dtype=torch.int64)
    a_ref = (idx % 7 - 3).reshape(n, n)
    b_ref = (idx % 5 - 2).reshape(n, n).t().contiguous()
    want = (a_ref @ b_ref) * 2 + 1
    saved = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # exact fp32 (|values| stay far below 2^24)
    try:
        a = a_ref.to(device=device, dtype=torch.float32)
        b = b_ref.to(device=device, dtype=torch.float32)
        got = ((a @ b) * 2 + 1).round().to(torch.int64).cpu()
        common.sync(device)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved
    wrong = int((got != want).sum())
    return {"device": device, "n": n, "wrong": wrong, "ok": wrong == 0,
            "elapsed_ms": (time.perf_counter() - t0) * 1e3}


def try_alloc(device: str, mib: int) -> dict:
    """Allocate ``mib`` MiB on ``device`` in one tensor; report success or the allocator's error."""
    import torch

    t0 = time.perf_counter()
    try:
        buf = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
        buf.fill_(1)                       # touch it: some allocators are lazy
        common.sync(device)
        del buf
        ok, error = True, None
    except (RuntimeError, MemoryError) as exc:   # torch.cuda.OutOfMemoryError is a RuntimeError
        ok, error = False, str(exc).splitlines()[0][:300]
    finally:
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    return {"device": device, "mib": mib, "ok": ok, "error": error,
            "elapsed_ms": (time.perf_counter() - t0) * 1e3}


def build_parser():
    p = common.parser(
        "probe.py",
        "Report torch/CUDA/driver versions and visible GPUs (torch and NVML, MIG too), "
        "and check a small kernel on each device.",
        epilog="examples:\n  python probe.py\n  python probe.py --expect-gpus 8\n  python probe.py --device cpu\n",
    )
    common.add_device_arg(p)
    p.add_argument("--alloc-mib", type=int, default=None, metavar="MIB",
                   help="also try to allocate this many MiB on each device and report whether it worked "
                        "(a MIG slice must refuse more than its memory)")
    p.add_argument("--expect-gpus", type=int, default=None,
                   help="fail unless torch sees exactly this many CUDA devices (--device cpu: NVML this many GPUs)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import torch

    device = common.setup_device(args)
    result = common.base_result("probe")
    # asking for the cuDNN version loads the library (slow): only where it can matter
    cudnn = torch.backends.cudnn.version() if device == "cuda" and torch.backends.cudnn.is_available() else None
    result.update(
        device=device,
        python=platform.python_version(),
        torch=torch.__version__,
        cuda_build=torch.version.cuda,
        cudnn=cudnn,
        cuda_available=torch.cuda.is_available(),
        torch_devices=torch_devices() if device == "cuda" else [],
        nvml=nvml_inventory(),
    )
    result["driver_version"] = result["nvml"].get("driver_version")
    result["topology"] = nvml_topology(result["nvml"])
    targets = [f"cuda:{d['index']}" for d in result["torch_devices"]] if device == "cuda" else ["cpu"]
    result["kernel_checks"] = [kernel_check(t) for t in targets]
    if args.alloc_mib is not None:
        allocs = [try_alloc(t, args.alloc_mib) for t in targets]
        result["allocs"] = allocs
        result["alloc"] = {"mib": args.alloc_mib, "ok": all(a["ok"] for a in allocs)}
    result["nvml_uuids"] = visible_uuids(result["nvml"])
    normalize_torch_uuids(result["torch_devices"], result["nvml_uuids"])
    problems = [f"kernel check on {c['device']}: {c['wrong']} wrong elements"
                for c in result["kernel_checks"] if not c["ok"]]
    if args.expect_gpus is not None and device == "cuda" and len(result["torch_devices"]) != args.expect_gpus:
        problems.append(f"expected {args.expect_gpus} CUDA devices, torch sees {len(result['torch_devices'])}")
    if args.expect_gpus is not None and device != "cuda" and len(result["nvml_uuids"]) != args.expect_gpus:
        # no CUDA (NVIDIA's mock NVML): the GPUs the process can use are the ones NVML shows it
        problems.append(f"expected {args.expect_gpus} GPUs, NVML shows {len(result['nvml_uuids'])}")
    problems += [f"NVML GPU {d['index']}: {d['error']}" for d in result["nvml"].get("devices") or [] if d.get("error")]
    result["problems"] = problems
    result["ok"] = not problems
    for p in problems:
        common.log(f"problem: {p}")
    common.log(f"torch {torch.__version__}, {len(result['torch_devices'])} CUDA device(s), "
               f"{len(result['nvml'].get('devices') or [])} NVML GPU(s) {result['nvml_uuids']}, "
               f"driver {result['driver_version']}, {'ok' if result['ok'] else 'FAILED'}")
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

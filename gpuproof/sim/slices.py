"""What the embedded cluster publishes for its DRA pools: the ResourceSlices NVIDIA's GPU kubelet plugin would
write for a node's GPUs (or MIG devices), and NVIDIA's DeviceClasses.

Read from the driver's source (``cmd/gpu-kubelet-plugin/deviceinfo.go`` and ``nvlib.go``); the words
(``gpu.nvidia.com``, ``resource.k8s.io/v1``, the classes) are :mod:`gpuproof.vocab`'s, the reader of
published slices is :mod:`gpuproof.discovery.dra`.
"""

from __future__ import annotations

import hashlib
import uuid as _uuid

from .. import catalog
from ..vocab import ARCHITECTURES, CLASS_TYPES, DRA_API, DRA_DRIVER, PCIE_ROOT, SIM_DRA_LABEL

# NVML GPU instance profile ids by compute slices and memory slices ("nvidia-smi mig -lgip")
_GI_PROFILE_IDS = {(1, 1): 19, (1, 2): 15, (2, 2): 14, (3, 4): 9, (4, 4): 5, (7, 8): 0}


def nvml_name(label: str) -> str:
    """The NVML device name for a GFD product label."""
    known = catalog.lookup(label)
    if known is not None and known.nvml:
        return known.nvml
    brand, _, rest = label.partition("-")
    return f"{brand} {rest}" if rest else label


def _uuid_for(*parts: str) -> str:
    return str(_uuid.UUID(bytes=hashlib.sha1("/".join(parts).encode()).digest()[:16], version=5))


def placements(profiles: dict[str, int], product: str) -> list[tuple[str, int, int]]:
    """(profile, start, size) of each MIG instance on one GPU, largest first, in the first free slot.

    A GPU has 8 memory slices; an instance takes 1, 2, 4 or 8 of them (its memory over the whole
    GPU's, the 7g profile's) at a start that is a multiple of its size: 1-slice instances at 0-6,
    2g at 0/2/4. Larger instances take the highest free start, 1-slice ones the lowest, which gives
    NVML's layouts for the usual mixes (e.g. 1g@0, 1g@1, 2g@2, 3g@4).
    """
    free = [True] * 8
    out = []
    sizes = {name: memory_slices(name, product) for name in profiles}
    for name, per_gpu in sorted(profiles.items(), key=lambda kv: -sizes[kv[0]]):
        size = sizes[name]
        for _ in range(per_gpu):
            start = next((s for s in _starts(name, size) if all(free[s:s + size])), None)
            if start is None:
                raise ValueError(f"MIG profiles {profiles} do not fit on one {product}")
            free[start:start + size] = [False] * size
            out.append((name, start, size))
    return out


def _starts(profile: str, size: int) -> list[int]:
    if size == 1:
        return list(range(7))
    starts = list(range(0, 8 - size + 1, size))
    if size == 2 and not profile.startswith("1g."):
        starts = [0, 2, 4]
    return starts[::-1]


def memory_slices(profile: str, product: str) -> int:
    """Memory slices (of 8) a MIG profile occupies on a product, e.g. 1g.10gb: 2 on an A100 40GB, 1 on 80GB."""
    known = catalog.lookup(product)
    g, mem = (int(x) for x in catalog.MIG_NAME.match(profile).groups())
    whole = max((p.memory_gb for p in known.mig), default=0) if known else 0
    if g == 7 or not whole:
        return 8 if g == 7 else {1: 1, 2: 2, 3: 4, 4: 4}.get(g, 8)
    share = mem * 8 / whole
    return min((1, 2, 4, 8), key=lambda n: abs(n - share))


def gpu_devices(node: str, gpu, mig) -> list[dict]:
    """The ``devices`` of the slice NVIDIA's kubelet plugin would publish for a node's GPUs."""
    known = catalog.lookup(gpu.product)
    name = nvml_name(gpu.product)
    brand = "Tesla" if gpu.product.startswith("Tesla") else "Nvidia"
    arch = ARCHITECTURES.get(gpu.family, gpu.family.title())
    cc = f"{gpu.compute[0]}.{gpu.compute[1]}.0"
    drv = ".".join((gpu.driver_version.split(".") + ["0", "0"])[:3])
    cuda = ".".join((gpu.cuda_version.split(".") + ["0", "0"])[:3])
    devices = []
    for minor in range(gpu.count):
        gpu_uuid = "GPU-" + _uuid_for(node, str(minor))
        bus = f"0000:{0x18 + 0x10 * minor:02x}:00.0"
        common = {
            "productName": {"string": name}, "brand": {"string": brand}, "architecture": {"string": arch},
            "cudaComputeCapability": {"version": cc}, "driverVersion": {"version": drv},
            "cudaDriverVersion": {"version": cuda}, "pcieBusID": {"string": bus},
            "addressingMode": {"string": "None"},
            PCIE_ROOT: {"string": f"pci0000:{0x10 * (minor // 2):02x}"},
        }
        if not mig:
            devices.append({"name": f"gpu-{minor}", "attributes": {
                "type": {"string": "gpu"}, "uuid": {"string": gpu_uuid}, **common},
                "capacity": {"memory": {"value": f"{gpu.memory_mib}Mi"}}})
            continue
        for profile, start, size in placements(mig.profiles, gpu.product):
            prof = known.mig_profile(profile) if known else None
            g = int(profile.split("g.")[0])
            gi = _GI_PROFILE_IDS.get((g, size), 0)
            capacity = {"multiprocessors": {"value": str((known.sms if known else 0) * g // 7)},
                        "copyEngines": {"value": str(g)}, "decoders": {"value": "0"}, "encoders": {"value": "0"},
                        "jpegEngines": {"value": "0"}, "ofaEngines": {"value": "0"},
                        "memory": {"value": f"{prof.memory_mib if prof else gpu.memory_mib * size // 8}Mi"}}
            capacity.update({f"memorySlice{i}": {"value": "1"} for i in range(start, start + size)})
            devices.append({"name": f"gpu-{minor}-mig-{gi}-{start}-{size}", "attributes": {
                "type": {"string": "mig"}, "uuid": {"string": "MIG-" + _uuid_for(node, str(minor), profile,
                                                                                   str(start))},
                "parentUUID": {"string": gpu_uuid}, "profile": {"string": profile}, **common},
                "capacity": capacity})
    return devices


def resource_slice(node: str, node_uid: str, devices: list[dict], *, index: int = 0, count: int = 1,
                   generation: int = 1) -> dict:
    """One ResourceSlice of the node's pool (named after the node, as the kubelet plugin names it)."""
    owner = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}] \
        if node_uid else []
    return {"apiVersion": DRA_API, "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRA_DRIVER}-{index}", "labels": {SIM_DRA_LABEL: "true"},
                         "ownerReferences": owner},
            "spec": {"driver": DRA_DRIVER, "nodeName": node, "devices": devices,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count}}}


def device_class(name: str) -> dict:
    selector = f"device.driver == '{DRA_DRIVER}' && device.attributes['{DRA_DRIVER}'].type == '{CLASS_TYPES[name]}'"
    return {"apiVersion": DRA_API, "kind": "DeviceClass",
            "metadata": {"name": name, "labels": {SIM_DRA_LABEL: "true"}},
            "spec": {"selectors": [{"cel": {"expression": selector}}]}}

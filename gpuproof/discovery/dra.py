"""GPUs through Dynamic Resource Allocation (``resource.k8s.io/v1``), as NVIDIA's DRA driver offers them.

NVIDIA's GPU kubelet plugin (driver ``gpu.nvidia.com``) publishes one ResourceSlice per node
(pool name = node name) whose devices are the node's GPUs, or, on a GPU with MIG enabled,
its MIG devices instead. What it writes, read from the driver's source
(``cmd/gpu-kubelet-plugin/deviceinfo.go`` and ``nvlib.go``):

- device names ``gpu-<minor>`` and ``gpu-<minor>-mig-<gi profile id>-<placement start>-<size>``;
- attributes (domain ``gpu.nvidia.com``): ``type`` (``gpu``/``mig``), ``uuid``, ``productName``
  (the NVML name, e.g. ``NVIDIA A100-SXM4-80GB``; GFD's ``gpu.product`` is it with spaces as '-'),
  ``brand``, ``architecture`` (``Ampere``, ``Ada Lovelace``, ``Hopper``...), ``cudaComputeCapability``,
  ``driverVersion`` and ``cudaDriverVersion`` (versions, semver), ``pcieBusID``, ``addressingMode``;
  MIG devices add ``parentUUID`` and ``profile``; ``resource.kubernetes.io/pcieRoot`` where known;
- capacity ``memory`` (bytes, binary SI); MIG devices add ``multiprocessors``, ``copyEngines``,
  ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines`` and ``memorySlice<i>`` = 1 per memory
  slice the instance occupies.

Its Helm chart installs DeviceClasses ``gpu.nvidia.com`` (type ``gpu``) and ``mig.nvidia.com``
(type ``mig``). This module reads slices into :class:`Device` objects for discovery and the DRA
suite, and builds the claims the suite makes; the slices the embedded cluster publishes are
:mod:`gpuproof.sim.slices`'s, the words both use :mod:`gpuproof.vocab`'s.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable

from .. import catalog
from ..vocab import ARCHITECTURES, CLASS_TYPES, GPU_CLASS, MIG_CLASS, PCIE_ROOT  # noqa: F401  (the suite's words)
from ..vocab import DRA_API as API, DRA_DRIVER as DRIVER, DRA_GROUP as GROUP, DRA_VERSION as VERSION  # noqa: F401
from ..vocab import SIM_DRA_LABEL as SIM_LABEL  # noqa: F401
from .values import as_int, mib, quantity, version_key  # noqa: F401



# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass
class Device:
    """One device of a ResourceSlice, with its attributes as plain values."""

    driver: str
    pool: str
    node: str                      # spec.nodeName ('' for network-attached devices)
    slice: str
    name: str
    attributes: dict[str, Any]     # the driver's own domain unqualified ('productName'), others qualified
    capacity: dict[str, str]       # name -> quantity as written
    generation: int = 0            # of its pool, as its slice says

    @property
    def type(self) -> str:
        return str(self.attributes.get("type", ""))

    @property
    def uuid(self) -> str:
        return str(self.attributes.get("uuid", ""))

    @property
    def product(self) -> str:
        """The product in GFD's spelling (NVML name, spaces -> '-')."""
        return str(self.attributes.get("productName", "")).replace(" ", "-")

    @property
    def memory_mib(self) -> int | None:
        return mib(self.capacity.get("memory"))

    @property
    def profile(self) -> str:
        return str(self.attributes.get("profile", ""))

    @property
    def ref(self) -> str:
        return f"{self.pool}/{self.name}"


def _value(attr: dict) -> Any:
    for kind in ("string", "int", "bool", "version"):
        if kind in attr:
            return attr[kind]
    return None


def _generation(s: dict) -> int:
    return int(((s.get("spec") or {}).get("pool") or {}).get("generation") or 0)


def _pool_key(s: dict) -> tuple[str, str]:
    spec = s.get("spec") or {}
    return spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")


def current(slices: Iterable[dict]) -> list[dict]:
    """The slices the scheduler uses: of each pool (driver, pool name), only those of its newest generation.

    A driver that restarts publishes its pool again under a higher generation; until the old slices
    are deleted they stay beside the new ones, and the scheduler ignores them.
    """
    slices = list(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        newest[_pool_key(s)] = max(newest.get(_pool_key(s), 0), _generation(s))
    return [s for s in slices if _generation(s) == newest[_pool_key(s)]]


def devices_of(slices: Iterable[dict], driver: str | None = DRIVER) -> list[Device]:
    """Devices the scheduler sees in the ResourceSlices (of one driver, or all with driver=None): each pool's
    newest generation, in slice order."""
    out = []
    for s in current(slices):
        spec = s.get("spec") or {}
        drv = spec.get("driver", "")
        if driver is not None and drv != driver:
            continue
        for dev in spec.get("devices") or []:
            attrs = {}
            for key, val in (dev.get("attributes") or {}).items():
                name = key[len(drv) + 1:] if key.startswith(drv + "/") else key
                attrs[name] = _value(val)
            out.append(Device(driver=drv, pool=(spec.get("pool") or {}).get("name", ""),
                              node=spec.get("nodeName") or "", slice=(s.get("metadata") or {}).get("name", ""),
                              name=dev.get("name", ""), attributes=attrs,
                              capacity={k: str((v or {}).get("value", "")) for k, v in
                                        (dev.get("capacity") or {}).items()},
                              generation=_generation(s)))
    return out


@dataclasses.dataclass
class Pool:
    """One driver's pool of devices, as its ResourceSlices say at the pool's newest generation."""

    driver: str
    name: str
    node: str                      # spec.nodeName of its slices ('' for network-attached pools)
    generation: int
    slice_count: int               # resourceSliceCount: how many slices make the pool at this generation
    slices: list[str]              # names of the slices present at this generation
    stale: list[str]               # names of slices of older generations (ignored by the scheduler)

    @property
    def complete(self) -> bool:
        return len(self.slices) == self.slice_count


def pools_of(slices: Iterable[dict], driver: str | None = DRIVER) -> list[Pool]:
    """The pools of the ResourceSlices (of one driver, or all with driver=None), sorted by driver and name."""
    slices = [s for s in slices if driver is None or (s.get("spec") or {}).get("driver") == driver]
    keep = {id(s) for s in current(slices)}
    out: dict[tuple[str, str], Pool] = {}
    for s in slices:
        spec, name = s.get("spec") or {}, (s.get("metadata") or {}).get("name", "")
        key = _pool_key(s)
        pool = out.setdefault(key, Pool(driver=key[0], name=key[1], node="", generation=0, slice_count=0,
                                        slices=[], stale=[]))
        if id(s) not in keep:
            pool.stale.append(name)
            continue
        pool.generation = _generation(s)
        pool.slice_count = int((spec.get("pool") or {}).get("resourceSliceCount") or 1)
        pool.node = pool.node or spec.get("nodeName") or ""
        pool.slices.append(name)
    return [out[k] for k in sorted(out)]


def by_node(devices: Iterable[Device]) -> dict[str, list[Device]]:
    out: dict[str, list[Device]] = {}
    for d in devices:
        out.setdefault(d.node, []).append(d)
    return out


def class_selects_type(device_class: dict) -> str | None:
    """The device type ('gpu'/'mig') a DeviceClass's CEL selectors admit from NVIDIA's driver, or None.

    Reads the one shape NVIDIA's chart (and every guide) writes: ``device.driver == 'gpu.nvidia.com' &&
    device.attributes['gpu.nvidia.com'].type == '<type>'``. Other selectors are proven by allocation.
    """
    exprs = [(sel.get("cel") or {}).get("expression", "") for sel in
             (device_class.get("spec") or {}).get("selectors") or []]
    text = " && ".join(exprs)
    if not re.search(r"device\.driver\s*==\s*['\"]" + re.escape(DRIVER) + r"['\"]", text):
        return None
    m = re.search(r"device\.attributes\[['\"]" + re.escape(DRIVER) + r"['\"]\]\.type\s*==\s*['\"](\w+)['\"]", text)
    return m.group(1) if m else None


# ----------------------------------------------------------------------------- publishing (embedded cluster)


# ----------------------------------------------------------------------------- claims the suite makes


def request(name: str, device_class: str, count: int = 1, selectors: Iterable[str] = ()) -> dict:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}
    sel = [{"cel": {"expression": e}} for e in selectors]
    if sel:
        exactly["selectors"] = sel
    return {"name": name, "exactly": exactly}


def claim_spec(requests: list[dict], match_attribute: str | None = None) -> dict:
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    if match_attribute:
        spec["devices"]["constraints"] = [{"requests": [r["name"] for r in requests],
                                           "matchAttribute": match_attribute}]
    return spec


def claim(name: str, requests: list[dict], match_attribute: str | None = None) -> dict:
    return {"apiVersion": API, "kind": "ResourceClaim", "metadata": {"name": name},
            "spec": claim_spec(requests, match_attribute)}


def claim_template(name: str, requests: list[dict], match_attribute: str | None = None) -> dict:
    return {"apiVersion": API, "kind": "ResourceClaimTemplate", "metadata": {"name": name},
            "spec": {"spec": claim_spec(requests, match_attribute)}}


def use_claims(pod: dict, claim: str | None = None, template: str | None = None) -> dict:
    """Make a pod manifest use one ResourceClaim (shared) or one claim from a template (its own)."""
    ref = {"name": "gpus"}
    if claim:
        ref["resourceClaimName"] = claim
    else:
        ref["resourceClaimTemplateName"] = template
    pod["spec"]["resourceClaims"] = [ref]
    for c in pod["spec"]["containers"]:
        c.setdefault("resources", {})["claims"] = [{"name": "gpus"}]
    return pod


def allocated(claim_obj: dict) -> list[tuple[str, str, str]]:
    """(driver, pool, device) of each device allocated to a claim (dict as the API returns it)."""
    results = (((claim_obj.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []
    return [(r.get("driver", ""), r.get("pool", ""), r.get("device", "")) for r in results]


def reserved_for(claim_obj: dict) -> list[str]:
    return [r.get("name", "") for r in (claim_obj.get("status") or {}).get("reservedFor") or []]


# ----------------------------------------------------------------------------- what a node's slices must say


def expected_devices(node) -> tuple[dict[str, int] | None, str]:
    """Devices NVIDIA's driver must publish for a node, by kind ('gpu' or 'mig:<profile>'), and the source.

    From GFD's labels: MIG-enabled GPUs appear as their MIG devices only (mixed: ``mig-<p>.count``;
    single: ``gpu.count`` instances of the product's profile), others as whole GPUs (``gpu.count``,
    which time-slicing does not multiply). Without GFD: the GPUs the instance type or Karpenter
    labels say. None: nothing on the node says (a DRA-only node without labels).
    """
    if node.gfd:
        if node.mig_strategy == "mixed":
            counts = {f"mig:{p}": c for p, c in node.mig_count_labels.items() if c}
            return counts, "nvidia.com/mig-<profile>.count"
        count = node.count_label
        if count is None:
            return None, "nvidia.com/gpu.count (missing)"
        if node.mig_strategy == "single" and node.single_mig_profile:
            return {f"mig:{node.single_mig_profile}": count}, "nvidia.com/gpu.count (MIG single strategy)"
        return {"gpu": count}, "nvidia.com/gpu.count"
    if node.scheme == "dra" or node.physical_count is None:
        return None, "nothing but the slices themselves"
    return {"gpu": node.physical_count}, node.count_source


def published_devices(node) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in node.dra_devices:
        kind = f"mig:{d.profile}" if d.type == "mig" else d.type or "(no type)"
        out[kind] = out.get(kind, 0) + 1
    return dict(sorted(out.items()))


def attribute_mismatches(node) -> tuple[list[str], list[str]]:
    """(disagreements, what was compared) between each published device and the node's labels.

    Where GFD labels a fact, the device must say the same: product (``gpu.product`` without its
    ``-SHARED``/``-MIG-`` suffix), memory (``gpu.memory``; a MIG device: ``mig-<p>.memory``),
    architecture (``gpu.family``), compute capability (``gpu.compute.major/minor``) and driver version
    (``cuda.driver-version.full``). Where no label says, the product catalog must find it plausible.
    """
    lab = node.labels
    product_label = catalog.base_product(lab.get("nvidia.com/gpu.product", "")) if node.gfd else ""
    labelled = catalog.resolve(product_label) if product_label else None     # GRID-A100-40C: a vGPU profile
    known = labelled.product if labelled else None
    family = lab.get("nvidia.com/gpu.family", "")
    cmaj, cmin = lab.get("nvidia.com/gpu.compute.major"), lab.get("nvidia.com/gpu.compute.minor")
    driver = node.driver_version if node.gfd else ""
    whole_mem = as_int(lab.get("nvidia.com/gpu.memory")) if node.mig_strategy == "none" else None
    bad, compared = [], set()
    for d in node.dra_devices:
        where = f"{d.name}"
        named = catalog.resolve(d.product)          # NVML's spellings and vGPU profiles (catalog.resolve)
        named_here = labelled or named
        known_here = known or (named.product if named else None)
        if product_label:
            compared.add("productName vs nvidia.com/gpu.product")
            if d.product != product_label and not (labelled and labelled.same(named)):
                bad.append(f"{where} productName {d.attributes.get('productName')!r} (as a label "
                           f"{d.product!r}) != nvidia.com/gpu.product {product_label!r}")
        elif named is None:
            bad.append(f"{where} productName {d.attributes.get('productName')!r} is not a product gpuproof knows "
                       f"({catalog.why_unknown(d.product)})")
        mem = d.memory_mib
        if d.type == "mig":
            want = as_int(lab.get(f"nvidia.com/mig-{d.profile}.memory"))
            if want is None and node.mig_strategy == "single":
                want = as_int(lab.get("nvidia.com/gpu.memory"))
            if want is not None:
                compared.add("MIG memory vs nvidia.com/mig-<profile>.memory")
                if mem is None or abs(mem - want) > 1:
                    bad.append(f"{where} memory {d.capacity.get('memory')} ({mem} MiB) != {want} MiB labelled "
                               f"for {d.profile}")
            elif known_here is not None:
                prof = known_here.mig_profile(d.profile)
                if prof is None or mem is None or not prof.memory_plausible(mem):
                    bad.append(f"{where} MIG {d.profile} with {mem} MiB is not a {known_here.label} profile")
        elif whole_mem is not None:
            compared.add("memory vs nvidia.com/gpu.memory")
            if mem is None or abs(mem - whole_mem) > 1:
                bad.append(f"{where} memory {d.capacity.get('memory')} ({mem} MiB) != nvidia.com/gpu.memory "
                           f"{whole_mem} MiB")
        elif named_here is not None and (mem is None or not named_here.memory_plausible(mem)):
            bad.append(f"{where} memory {mem} MiB is implausible for {named_here.what} "
                       f"(catalog: {named_here.memory_mib} MiB)")
        arch = str(d.attributes.get("architecture", ""))
        want_family = family or (known_here.family if known_here else "")
        if want_family:
            compared.add("architecture vs nvidia.com/gpu.family" if family else "architecture vs catalog")
            if arch != ARCHITECTURES.get(want_family, want_family):
                bad.append(f"{where} architecture {arch!r} != {ARCHITECTURES.get(want_family, want_family)!r} "
                           f"({'nvidia.com/gpu.family ' + family if family else 'catalog'})")
        cc = version_key(str(d.attributes.get("cudaComputeCapability", "")))[:2]
        want_cc = (int(cmaj), int(cmin)) if (cmaj or "").isdigit() and (cmin or "").isdigit() else \
            (known_here.compute if known_here else None)
        if want_cc:
            compared.add("cudaComputeCapability vs nvidia.com/gpu.compute.*" if cmaj else
                         "cudaComputeCapability vs catalog")
            if cc != tuple(want_cc):
                bad.append(f"{where} cudaComputeCapability {d.attributes.get('cudaComputeCapability')!r} != "
                           f"{want_cc[0]}.{want_cc[1]}")
        if driver:
            compared.add("driverVersion vs nvidia.com/cuda.driver-version.full")
            if version_key(str(d.attributes.get("driverVersion", ""))) != version_key(driver):
                bad.append(f"{where} driverVersion {d.attributes.get('driverVersion')!r} != {driver!r}")
    return bad, sorted(compared)


def duplicates(devices: Iterable[Device]) -> list[str]:
    """Devices published twice: a UUID in more than one device, or a name twice in one driver's pool."""
    by_uuid: dict[str, list[str]] = {}
    by_name: dict[tuple[str, str, str], list[str]] = {}
    for d in devices:
        if d.uuid:
            by_uuid.setdefault(d.uuid, []).append(f"{d.ref} (slice {d.slice})")
        by_name.setdefault((d.driver, d.pool, d.name), []).append(d.slice)
    out = [f"{uuid} published {len(refs)} times: {', '.join(refs)}" for uuid, refs in sorted(by_uuid.items())
           if len(refs) > 1]
    out += [f"device {pool}/{name} in {len(slices)} slices of the pool: {', '.join(slices)}"
            for (_, pool, name), slices in sorted(by_name.items()) if len(slices) > 1]
    return out


# ----------------------------------------------------------------------------- claims on a live cluster


def claims_of_pod(run, pod) -> list[dict]:
    """The ResourceClaims a pod uses (its own from a template, or shared ones), as API JSON."""
    names = [s.resource_claim_name for s in (pod.status.resource_claim_statuses or []) if s.resource_claim_name]
    names += [r.resource_claim_name for r in (pod.spec.resource_claims or []) if r.resource_claim_name]
    out = []
    for name in names:
        obj = run.cluster.custom.get_namespaced_custom_object(GROUP, VERSION, run.namespace, "resourceclaims", name)
        out.append(obj)
    return out


def allocated_devices(cluster) -> set[tuple[str, str]]:
    """(pool, device) of every gpu.nvidia.com device allocated to a claim, in any namespace."""
    items = cluster.custom.list_cluster_custom_object(GROUP, VERSION, "resourceclaims")["items"]
    return {(pool, dev) for c in items for drv, pool, dev in allocated(c) if drv == DRIVER}


def describe_allocation(claims: list[dict], devices: dict[tuple[str, str], Device]) -> str:
    parts = []
    for c in claims:
        got = allocated(c)
        name = c["metadata"]["name"]
        if not got:
            parts.append(f"claim {name}: not allocated")
            continue
        for _driver, pool, dev in got:
            d = devices.get((pool, dev))
            extra = f" ({d.attributes.get('productName')}{', ' + d.profile if d.profile else ''})" if d else ""
            parts.append(f"claim {name}: {pool}/{dev}{extra}")
    return "; ".join(parts) or "no claims"

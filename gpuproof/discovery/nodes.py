"""Find GPU nodes and group them into pools, from labels and capacity only.

Long: GpuNode reads every label scheme in one place, so each fact of a node has one source and names it.

A node is a GPU node when GPU Feature Discovery labelled it, when a managed offering's own
GPU labels say so (GKE, Karpenter, AKS), or when it advertises any NVIDIA GPU resource.
What the checks need (product, GPU count, sharing, MIG partitioning) is read from the first
label scheme the node has, and where each value came from is recorded (``sources``):

- ``gfd``: GPU Feature Discovery (``nvidia.com/gpu.*``), also run by the GPU operator (OpenShift);
- ``gke``: ``cloud.google.com/gke-accelerator``, ``gke-gpu-partition-size``,
  ``gke-max-shared-clients-per-gpu``, ``gke-gpu-sharing-strategy``;
- ``karpenter``: ``karpenter.k8s.aws/instance-gpu-name|count|memory``;
- ``instance-type``: ``node.kubernetes.io/instance-type`` looked up in the catalog (EKS, AKS);
- ``dra``: nothing but the devices NVIDIA's DRA driver publishes for the node (ResourceSlices);
- ``resources``: nothing but the advertised ``nvidia.com/*`` resources.

GPUs reach pods through the device plugin (extended resources in the node's capacity), through
Dynamic Resource Allocation (devices of driver ``gpu.nvidia.com`` in ResourceSlices), or both:
``GpuNode.offers`` says which.

Pools are the values of the first node-pool label a node has (GKE, EKS, AKS, Karpenter, or
the well-known instance-type label), or ``--pool-label`` when given; with none, the product.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Iterable

from .. import catalog
from .values import as_int

# the words discovery shares with the embedded cluster (re-exported: the suites import them from here)
from ..vocab import (AKS_ACCELERATOR, GKE_ACCELERATOR, GKE_MAX_CLIENTS, GKE_PARTITION, GKE_SHARING, GPU, GPU_SHARED,
                     INSTANCE_TYPE, KARPENTER_GPU_COUNT, KARPENTER_GPU_MAKER, KARPENTER_GPU_MEMORY,
                     KARPENTER_GPU_NAME, KWOK_ANNOTATION, LABELS_BY, RESOURCES_BY,
                     SIMULATED, SLICES_BY)
from ..vocab import OPERATOR_COMPONENT_APPS as OPERATOR_COMPONENT_APPS  # noqa: F401  (re-exported: suites/test_stack)

MADE_BY = {"labels": LABELS_BY, "resources": RESOURCES_BY, "slices": SLICES_BY}
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb)$")
BYTES_FROM = 2**30                       # a gpu.memory label this large is bytes: no GPU has 1 PiB


POOL_LABELS = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "karpenter.sh/nodepool",
    INSTANCE_TYPE,
)


# conditions a healthy node has False; Ready must be True
PRESSURE_CONDITIONS = ("MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable")


@dataclasses.dataclass
class GpuNode:
    name: str
    labels: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    taints: list[dict]
    pool: str = ""
    simulated: bool = False          # a kwok node: no GPU really executes there
    conditions: dict[str, dict] = dataclasses.field(default_factory=dict)   # type -> status, reason, message
    unschedulable: bool = False      # cordoned
    node_info: dict = dataclasses.field(default_factory=dict)               # status.nodeInfo
    dra_devices: list = dataclasses.field(default_factory=list)             # dra.Device of gpu.nvidia.com
    # on the embedded cluster: which software wrote the node's GPU labels, resources and slices
    made_by: dict[str, str] = dataclasses.field(default_factory=dict)       # labels|resources|slices -> who

    def label(self, key: str) -> str | None:
        return self.labels.get(key)

    # ---- where the GPU facts come from

    @property
    def gfd(self) -> bool:
        """GPU Feature Discovery labelled this node."""
        lab = self.labels
        return lab.get("nvidia.com/gpu.present") == "true" or "nvidia.com/gpu.product" in lab \
            or "nvidia.com/gpu.count" in lab

    @property
    def scheme(self) -> str:
        if self.gfd:
            return "gfd"
        if GKE_ACCELERATOR in self.labels:
            return "gke"
        if KARPENTER_GPU_NAME in self.labels:
            return "karpenter"
        if self.dra_devices:        # what the driver read from the GPUs beats what the instance type should hold
            return "dra"
        if catalog.instance_type(self.labels.get(INSTANCE_TYPE)):
            return "instance-type"
        return "resources"

    # ---- how GPUs reach pods

    @property
    def device_plugin(self) -> bool:
        """The node advertises GPU extended resources (nvidia.com/gpu, .shared, mig-*)."""
        return advertises_gpus(self.capacity)

    @property
    def dra(self) -> bool:
        """NVIDIA's DRA driver publishes devices for the node."""
        return bool(self.dra_devices)

    @property
    def offers(self) -> str:
        """'device-plugin', 'dra', 'both' or 'none'."""
        return {(True, True): "both", (True, False): "device-plugin", (False, True): "dra"}.get(
            (self.device_plugin, self.dra), "none")

    @property
    def dra_only(self) -> bool:
        """GPUs only through DRA: the device-plugin checks do not apply to this node."""
        return self.dra and not self.device_plugin

    @property
    def dra_physical_gpus(self) -> int:
        """GPUs behind the node's DRA devices: whole GPUs, plus the parents of its MIG devices."""
        whole = {d.uuid for d in self.dra_devices if d.type == "gpu"}
        parents = {d.attributes.get("parentUUID") for d in self.dra_devices if d.type == "mig"}
        return len(whole | parents)

    @property
    def instance(self) -> catalog.InstanceType | None:
        return catalog.instance_type(self.labels.get(INSTANCE_TYPE))

    @functools.cached_property
    def catalog_name(self) -> catalog.Named | None:
        """The product GFD's label or the DRA devices name, read however the driver spells it: a vGPU profile
        (``GRID-A100-40C``) is its physical product with the profile's memory (:func:`catalog.resolve`)."""
        if self.scheme in ("gfd", "dra"):
            return catalog.resolve(self.product)
        return None

    @functools.cached_property
    def catalog_product(self) -> catalog.Product | None:
        """The catalog's entry for the product, by whichever scheme names it."""
        scheme, lab = self.scheme, self.labels
        found = None
        if scheme in ("gfd", "dra"):
            return self.catalog_name.product if self.catalog_name else None
        if scheme == "gke":
            found = catalog.by_alias("gke", lab[GKE_ACCELERATOR])
        elif scheme == "karpenter":
            found = catalog.by_alias("karpenter", lab[KARPENTER_GPU_NAME], as_int(lab.get(KARPENTER_GPU_MEMORY)))
        if found is None and self.instance is not None:
            found = catalog.PRODUCTS.get(self.instance.product)
        return found

    @property
    def product(self) -> str:
        """GFD's product label; on other schemes the catalog's name for what they label."""
        if self.gfd:
            return self.labels.get("nvidia.com/gpu.product", "")
        if self.scheme == "dra":
            return next((d.product for d in self.dra_devices if d.product), "")
        if self.catalog_product is not None:
            return self.catalog_product.label
        return self.labels.get(GKE_ACCELERATOR) or self.labels.get(KARPENTER_GPU_NAME) or ""

    @property
    def physical_count(self) -> int | None:
        """GPUs in the node per a source other than the device plugin (None where none says)."""
        if self.scheme == "karpenter" and as_int(self.labels.get(KARPENTER_GPU_COUNT)) is not None:
            return as_int(self.labels.get(KARPENTER_GPU_COUNT))
        if self.scheme == "dra":
            return self.dra_physical_gpus
        return self.instance.count if self.instance else None

    @property
    def count_label(self) -> int | None:
        """Devices before sharing, per the labels: GFD's ``gpu.count`` (MIG instances under the single
        strategy); elsewhere the node's GPUs (x partitions per GPU on a GKE MIG node). None: unknown."""
        if self.gfd:
            return as_int(self.labels.get("nvidia.com/gpu.count"))
        physical = self.physical_count
        if physical is None:
            return None
        partition = self.labels.get(GKE_PARTITION)
        if partition:
            prof = self.catalog_product.mig_profile(partition) if self.catalog_product else None
            return physical * prof.max_per_gpu if prof else None
        return physical

    @property
    def count_source(self) -> str:
        if self.gfd:
            return "nvidia.com/gpu.count"
        if self.scheme == "karpenter" and KARPENTER_GPU_COUNT in self.labels:
            return KARPENTER_GPU_COUNT
        if self.scheme == "dra":
            return "ResourceSlices of gpu.nvidia.com"
        return f"instance type {self.instance.name} (gpuproof catalog)" if self.instance else ""

    @property
    def replicas(self) -> int:
        """GFD's ``gpu.replicas`` (written since GFD v0.6; 1 before time-slicing existed), GKE's max clients."""
        if self.gfd:
            return as_int(self.labels.get("nvidia.com/gpu.replicas")) or 1
        if self.labels.get(GKE_SHARING):
            return as_int(self.labels.get(GKE_MAX_CLIENTS)) or 1
        return 1

    @property
    def sharing_strategy(self) -> str:
        """GFD's ``gpu.sharing-strategy``; GFD releases before it (before MPS) shared only by time-slicing, so
        replicas above 1 without the label mean time-slicing."""
        if self.gfd:
            return self.labels.get("nvidia.com/gpu.sharing-strategy") or \
                ("time-slicing" if self.replicas > 1 else "none")
        gke = self.labels.get(GKE_SHARING)
        return {"time-sharing": "time-slicing", "mps": "mps"}.get(gke or "", gke or "none")

    @property
    def mig_strategy(self) -> str:
        """How the node's GPUs are partitioned, from what it has, not only from what a label says.

        GFD writes ``mig.strategy`` only when the device plugin's strategy is single or mixed, and under
        either, GPUs with MIG mode off are advertised whole under their plain product name (the GPU
        operator's everyday default). So: ``mixed`` when the node has per-profile MIG labels or advertises
        ``nvidia.com/mig-*`` resources above 0 (whatever the labels say, or without any: the node's own
        resources are the evidence), ``single`` when its product names a MIG profile (GFD) or GKE labels a
        partition size, else ``none``.
        """
        if self.mig_resources or (self.gfd and any((c or 0) > 0 for c in self.mig_count_labels.values())):
            return "mixed"
        if self.gfd:
            return "single" if "-MIG-" in (self.product or "") else "none"
        return "single" if self.labels.get(GKE_PARTITION) else "none"

    @property
    def single_mig_profile(self) -> str | None:
        """The MIG profile every device has under the single strategy (GFD product suffix, GKE partition)."""
        if self.mig_strategy != "single":
            return None
        if self.gfd:
            profile = self.product.removesuffix("-SHARED").partition("-MIG-")[2]
            return profile or None
        return self.labels.get(GKE_PARTITION)

    @property
    def memory_in_bytes(self) -> bool:
        """``nvidia.com/gpu.memory`` holds bytes, not MiB (GFD v0.6 wrote NVML's byte count; later releases MiB)."""
        value = as_int(self.labels.get("nvidia.com/gpu.memory"))
        return value is not None and value >= BYTES_FROM

    @property
    def memory_mib(self) -> int | None:
        """``nvidia.com/gpu.memory`` in MiB (a label pods can select on; GFD only), whichever unit GFD wrote."""
        value = as_int(self.labels.get("nvidia.com/gpu.memory"))
        return value // 2**20 if self.memory_in_bytes else value

    @property
    def driver_version(self) -> str:
        return self._version("nvidia.com/cuda.driver-version", ("major", "minor", "revision"),
                             "nvidia.com/cuda.driver", ("major", "minor", "rev"))

    @property
    def cuda_version(self) -> str:
        return self._version("nvidia.com/cuda.runtime-version", ("major", "minor"),
                             "nvidia.com/cuda.runtime", ("major", "minor"))

    def _version(self, prefix: str, parts: tuple[str, ...], old_prefix: str, old_parts: tuple[str, ...]) -> str:
        """A version from GFD's ``<prefix>.full`` or its parts, or from the parts older GFD releases wrote."""
        lab = self.labels
        for pre, names in ((prefix, parts), (old_prefix, old_parts)):
            full = lab.get(f"{pre}.full") or ".".join(v for v in (lab.get(f"{pre}.{p}") for p in names) if v)
            if full:
                return full
        return ""

    @property
    def time_sliced(self) -> bool:
        return self.sharing_strategy == "time-slicing" or self.replicas > 1

    @property
    def product_selector(self) -> dict[str, str]:
        """Node labels that pick nodes of this node's product (what a user's nodeSelector would say)."""
        lab, scheme = self.labels, self.scheme
        if scheme == "gfd":
            return {"nvidia.com/gpu.product": self.product} if self.product else {}
        if scheme == "gke":
            return {GKE_ACCELERATOR: lab[GKE_ACCELERATOR]}
        if scheme == "karpenter":
            return {k: lab[k] for k in (KARPENTER_GPU_NAME, KARPENTER_GPU_MEMORY) if k in lab}
        if scheme in ("instance-type", "dra") and self.instance is not None:
            return {INSTANCE_TYPE: lab[INSTANCE_TYPE]}
        return {}

    @property
    def sources(self) -> dict[str, str]:
        """Where product, count, sharing and partitioning were read from."""
        scheme, lab = self.scheme, self.labels
        if scheme == "gfd":
            return {"product": "nvidia.com/gpu.product", "count": "nvidia.com/gpu.count",
                    "sharing": "nvidia.com/gpu.sharing-strategy", "partitioning": "nvidia.com/mig.strategy"}
        product = {"gke": GKE_ACCELERATOR, "karpenter": KARPENTER_GPU_NAME, "dra": "ResourceSlice productName",
                   "instance-type": f"{INSTANCE_TYPE} (gpuproof catalog)"}.get(scheme, "(unknown)")
        return {"product": product, "count": self.count_source or "(unknown)",
                "sharing": GKE_SHARING if GKE_SHARING in lab else "(none labelled)",
                "partitioning": GKE_PARTITION if GKE_PARTITION in lab else "(none labelled)"}

    # ---- device plugin resources

    def allocatable_of(self, resource: str) -> int | None:
        return as_int(self.allocatable.get(resource))

    def capacity_of(self, resource: str) -> int | None:
        return as_int(self.capacity.get(resource))

    def advertised(self, resource: str) -> int | None:
        """Capacity of a resource the node advertises; None where absent or left over at 0 (after a MIG or
        sharing change the kubelet keeps the old extended resources at 0: they are not advertised)."""
        value = self.capacity_of(resource)
        return value if value else None

    @property
    def gpu_resource(self) -> str:
        """The resource a one-GPU pod asks for on this node."""
        return GPU_SHARED if self.shared_renamed else GPU

    @property
    def shared_renamed(self) -> bool:
        """Shared GPUs are advertised as ``nvidia.com/gpu.shared`` (the device plugin's renameByDefault)."""
        return self.advertised(GPU_SHARED) is not None

    @property
    def mig_resources(self) -> dict[str, int]:
        """MIG profile -> advertised capacity (mixed strategy resources)."""
        return {m.group(1): self.advertised(res) for res in self.capacity
                if (m := MIG_RESOURCE.match(res)) and self.advertised(res)}

    @property
    def mig_count_labels(self) -> dict[str, int | None]:
        out = {}
        for key, val in self.labels.items():
            m = re.match(r"^nvidia\.com/mig-(\d+g\.\d+gb)\.count$", key)
            if m:
                out[m.group(1)] = as_int(val)
        return out

    def taint_strings(self) -> list[str]:
        return [f"{t['key']}={t.get('value') or ''}:{t['effect']}".replace("=:", ":") for t in self.taints]

    # ---- node state

    def condition(self, kind: str) -> str:
        return (self.conditions.get(kind) or {}).get("status", "Unknown" if kind == "Ready" else "")

    @property
    def ready(self) -> bool:
        return self.condition("Ready") == "True"

    @property
    def unfit_for_placement(self) -> str:
        """Why pods cannot land here whatever the suite asks ('' when they can)."""
        if not self.ready:
            c = self.conditions.get("Ready") or {}
            return f"not Ready (Ready={self.condition('Ready')}{', ' + c['reason'] if c.get('reason') else ''})"
        if self.unschedulable:
            return "cordoned (spec.unschedulable)"
        lifecycle = [s for t, s in zip(self.taints, self.taint_strings())
                     if t["key"].startswith("node.kubernetes.io/") and t["effect"] in ("NoSchedule", "NoExecute")]
        return f"tainted {', '.join(lifecycle)}" if lifecycle else ""


@dataclasses.dataclass
class Discovery:
    gpu_nodes: list[GpuNode]
    other_nodes: list[str]
    pool_label: str | None
    # DRA: every gpu.nvidia.com device the scheduler sees (each pool's newest generation; None: the cluster
    # does not serve resource.k8s.io/v1, or we may not list ResourceSlices), the pools, and the DeviceClasses
    dra_devices: list | None = None
    device_classes: list[dict] | None = None
    dra_pools: list | None = None

    @property
    def pools(self) -> dict[str, list[GpuNode]]:
        """pool -> its GPU nodes; grouped once (a check per node asks it: issue #52), again if the nodes change."""
        cached = self.__dict__.get("_pools")
        if cached is not None and cached[0] == len(self.gpu_nodes):
            return cached[1]
        out: dict[str, list[GpuNode]] = {}
        for n in self.gpu_nodes:
            out.setdefault(n.pool, []).append(n)
        self.__dict__["_pools"] = (len(self.gpu_nodes), out)
        self.__dict__.pop("_taint_counts", None)
        return out

    @property
    def products(self) -> dict[str, list[str]]:
        return products_of(self.gpu_nodes)

    @property
    def placeable(self) -> list[GpuNode]:
        """GPU nodes device-plugin pods can land on (Ready, not cordoned, no node-lifecycle taint, not DRA-only)."""
        return [n for n in self.gpu_nodes if not n.unfit_for_placement and not n.dra_only]

    @property
    def dra_placeable(self) -> list[GpuNode]:
        """GPU nodes with DRA devices that pods can land on."""
        return [n for n in self.gpu_nodes if not n.unfit_for_placement and n.dra]

    @property
    def simulated(self) -> bool:
        """True when every GPU node is a kwok node (no real GPU anywhere)."""
        return bool(self.gpu_nodes) and all(n.simulated for n in self.gpu_nodes)

    @property
    def real_nodes(self) -> list[GpuNode]:
        """GPU nodes that are not kwok's: real GPUs execute there (real and simulated is per node)."""
        return [n for n in self.gpu_nodes if not n.simulated]

    def taint_counts(self, pool: str) -> dict[str, int]:
        """taint text -> how many of the pool's nodes carry it; counted once per pool, not once per node's check."""
        cache = self.__dict__.setdefault("_taint_counts", {})
        if pool not in cache:
            counts: dict[str, int] = {}
            for n in self.pools.get(pool, []):
                for text in set(n.taint_strings()):
                    counts[text] = counts.get(text, 0) + 1
            cache[pool] = counts
        return cache[pool]

    def by_name(self) -> dict[str, GpuNode]:
        """name -> GPU node, built once (every check's checker and :meth:`node` ask it: issue #52)."""
        index = self.__dict__.get("_by_name")
        if index is None or len(index) != len(self.gpu_nodes):
            index = self.__dict__["_by_name"] = {n.name: n for n in self.gpu_nodes}
        return index

    def node(self, name: str) -> GpuNode:
        """The GPU node of this name (StopIteration if none)."""
        index = self.by_name()
        if name not in index:
            raise StopIteration(name)
        return index[name]


def _as_dict(node) -> dict:
    """Accept kubernetes client V1Node objects or plain dicts."""
    if isinstance(node, dict):
        return node
    return node.to_dict() if hasattr(node, "to_dict") else dict(node)


def is_gpu_node(labels: dict, capacity: dict, dra_devices: list | None = None) -> bool:
    if dra_devices:
        return True
    if labels.get("nvidia.com/gpu.present") == "true" or "nvidia.com/gpu.count" in labels:
        return True
    if GKE_ACCELERATOR in labels or labels.get(AKS_ACCELERATOR) == "nvidia":
        return True
    if KARPENTER_GPU_NAME in labels and labels.get(KARPENTER_GPU_MAKER, "nvidia") == "nvidia":
        return True
    if catalog.instance_type(labels.get(INSTANCE_TYPE)):
        return True
    return advertises_gpus(capacity)


def advertises_gpus(capacity: dict) -> bool:
    """Some NVIDIA GPU extended resource (nvidia.com/gpu, nvidia.com/gpu.shared, nvidia.com/mig-*) above 0."""
    return any((res == GPU or res == GPU_SHARED or MIG_RESOURCE.match(res)) and (as_int(v) or 0) > 0
               for res, v in capacity.items())


def products_of(nodes: Iterable[GpuNode]) -> dict[str, list[str]]:
    """Product -> names of those nodes."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        out.setdefault(n.product or "(no product label)", []).append(n.name)
    return out


def discover(nodes: Iterable, pool_label: str | None = None, slices: list[dict] | None = None,
             device_classes: list[dict] | None = None) -> Discovery:
    """GPU nodes and pools from Node objects, and (given ``slices``) from NVIDIA's DRA ResourceSlices."""
    from . import dra

    raw = [_as_dict(n) for n in nodes]
    devices = dra.devices_of(slices) if slices is not None else None
    pools = dra.pools_of(slices) if slices is not None else None
    per_node = dra.by_node(devices or [])
    gpu, other = [], []
    used: dict[str, int] = {}
    for r in raw:
        meta = r.get("metadata") or {}
        status = r.get("status") or {}
        spec = r.get("spec") or {}
        labels = meta.get("labels") or {}
        capacity = {k: str(v) for k, v in (status.get("capacity") or {}).items()}
        if not is_gpu_node(labels, capacity, per_node.get(meta["name"])):
            other.append(meta["name"])
            continue
        taints = [{"key": t.get("key"), "value": t.get("value"), "effect": t.get("effect")}
                  for t in (spec.get("taints") or [])]
        chosen = pool_label or next((k for k in POOL_LABELS if k in labels), None)
        if chosen:
            used[chosen] = used.get(chosen, 0) + 1
        conditions = {c.get("type"): {"status": c.get("status"), "reason": c.get("reason") or "",
                                      "message": c.get("message") or ""}
                      for c in (status.get("conditions") or [])}
        node = GpuNode(
            name=meta["name"], labels=dict(labels), capacity=capacity,
            allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
            taints=taints, simulated=(meta.get("annotations") or {}).get(KWOK_ANNOTATION) in SIMULATED,
            conditions=conditions, unschedulable=bool(spec.get("unschedulable")),
            node_info=dict(status.get("nodeInfo") or status.get("node_info") or {}),
            dra_devices=per_node.get(meta["name"], []),
            made_by={what: ann[key] for what, key in MADE_BY.items()
                     if key in (ann := meta.get("annotations") or {})},
        )
        node.pool = (labels.get(chosen) if chosen else None) or node.product or "unknown"
        gpu.append(node)
    gpu.sort(key=lambda n: n.name)
    chosen_label = pool_label or (max(used, key=used.get) if used else None)
    return Discovery(gpu_nodes=gpu, other_nodes=sorted(other), pool_label=chosen_label, dra_devices=devices,
                     device_classes=device_classes, dra_pools=pools)

"""Find GPU nodes and group them into pools, from labels and capacity only.

A node is a GPU node when GFD labelled it (``nvidia.com/gpu.present=true`` or a
``nvidia.com/gpu.count`` label) or when it advertises any NVIDIA GPU resource. Pools
are the values of the first node-pool label the cluster uses (GKE, EKS, AKS,
Karpenter, or the well-known instance-type label), or ``--pool-label`` when given;
with none of them, the GPU product.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable

GPU = "nvidia.com/gpu"
GPU_SHARED = "nvidia.com/gpu.shared"
MIG_RESOURCE = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb)$")
KWOK_ANNOTATION = "kwok.x-k8s.io/node"

POOL_LABELS = (
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "agentpool",
    "karpenter.sh/nodepool",
    "node.kubernetes.io/instance-type",
)


def _int(value) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None


@dataclasses.dataclass
class GpuNode:
    name: str
    labels: dict[str, str]
    capacity: dict[str, str]
    allocatable: dict[str, str]
    taints: list[dict]
    pool: str = ""
    simulated: bool = False          # a kwok node: no GPU really executes there

    # ---- GFD labels
    def label(self, key: str) -> str | None:
        return self.labels.get(key)

    @property
    def product(self) -> str:
        return self.labels.get("nvidia.com/gpu.product", "")

    @property
    def count_label(self) -> int | None:
        return _int(self.labels.get("nvidia.com/gpu.count"))

    @property
    def replicas(self) -> int:
        return _int(self.labels.get("nvidia.com/gpu.replicas")) or 1

    @property
    def sharing_strategy(self) -> str:
        return self.labels.get("nvidia.com/gpu.sharing-strategy", "none")

    @property
    def mig_strategy(self) -> str:
        return self.labels.get("nvidia.com/mig.strategy", "none")

    @property
    def memory_mib(self) -> int | None:
        return _int(self.labels.get("nvidia.com/gpu.memory"))

    @property
    def driver_version(self) -> str:
        return self.labels.get("nvidia.com/cuda.driver-version.full") or ".".join(
            v for v in (self.labels.get(f"nvidia.com/cuda.driver-version.{p}") for p in
                        ("major", "minor", "revision")) if v)

    @property
    def cuda_version(self) -> str:
        return self.labels.get("nvidia.com/cuda.runtime-version.full") or ".".join(
            v for v in (self.labels.get(f"nvidia.com/cuda.runtime-version.{p}") for p in ("major", "minor")) if v)

    @property
    def time_sliced(self) -> bool:
        return self.sharing_strategy == "time-slicing" or self.replicas > 1

    # ---- device plugin resources
    def allocatable_of(self, resource: str) -> int | None:
        return _int(self.allocatable.get(resource))

    def capacity_of(self, resource: str) -> int | None:
        return _int(self.capacity.get(resource))

    @property
    def gpu_resource(self) -> str:
        """The resource a one-GPU pod asks for on this node."""
        if (self.capacity_of(GPU_SHARED) or 0) > 0:
            return GPU_SHARED
        return GPU

    @property
    def mig_resources(self) -> dict[str, int]:
        """MIG profile -> advertised capacity (mixed strategy resources)."""
        out = {}
        for res, val in self.capacity.items():
            m = MIG_RESOURCE.match(res)
            if m:
                out[m.group(1)] = _int(val) or 0
        return out

    @property
    def mig_count_labels(self) -> dict[str, int | None]:
        out = {}
        for key, val in self.labels.items():
            m = re.match(r"^nvidia\.com/mig-(\d+g\.\d+gb)\.count$", key)
            if m:
                out[m.group(1)] = _int(val)
        return out

    def taint_strings(self) -> list[str]:
        return [f"{t['key']}={t.get('value') or ''}:{t['effect']}".replace("=:", ":") for t in self.taints]


@dataclasses.dataclass
class Discovery:
    gpu_nodes: list[GpuNode]
    other_nodes: list[str]
    pool_label: str | None

    @property
    def pools(self) -> dict[str, list[GpuNode]]:
        out: dict[str, list[GpuNode]] = {}
        for n in self.gpu_nodes:
            out.setdefault(n.pool, []).append(n)
        return out

    @property
    def products(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.gpu_nodes:
            out.setdefault(n.product or "(no product label)", []).append(n.name)
        return out

    @property
    def simulated(self) -> bool:
        """True when every GPU node is a kwok node (no real GPU anywhere)."""
        return bool(self.gpu_nodes) and all(n.simulated for n in self.gpu_nodes)

    def node(self, name: str) -> GpuNode:
        return next(n for n in self.gpu_nodes if n.name == name)

def _as_dict(node) -> dict:
    """Accept kubernetes client V1Node objects or plain dicts."""
    if isinstance(node, dict):
        return node
    return node.to_dict() if hasattr(node, "to_dict") else dict(node)


def is_gpu_node(labels: dict, capacity: dict) -> bool:
    if labels.get("nvidia.com/gpu.present") == "true" or "nvidia.com/gpu.count" in labels:
        return True
    return any((res == GPU or res == GPU_SHARED or MIG_RESOURCE.match(res)) and (_int(v) or 0) > 0
               for res, v in capacity.items())


def discover(nodes: Iterable, pool_label: str | None = None) -> Discovery:
    raw = [_as_dict(n) for n in nodes]
    gpu, other = [], []
    all_labels = [((r.get("metadata") or {}).get("labels") or {}) for r in raw]
    chosen = pool_label or next((k for k in POOL_LABELS if any(k in lab for lab in all_labels)), None)
    for r in raw:
        meta = r.get("metadata") or {}
        status = r.get("status") or {}
        spec = r.get("spec") or {}
        labels = meta.get("labels") or {}
        capacity = {k: str(v) for k, v in (status.get("capacity") or {}).items()}
        if not is_gpu_node(labels, capacity):
            other.append(meta["name"])
            continue
        taints = [{"key": t.get("key"), "value": t.get("value"), "effect": t.get("effect")}
                  for t in (spec.get("taints") or [])]
        pool = (labels.get(chosen) if chosen else None) or labels.get("nvidia.com/gpu.product") or "unknown"
        gpu.append(GpuNode(
            name=meta["name"], labels=dict(labels), capacity=capacity,
            allocatable={k: str(v) for k, v in (status.get("allocatable") or {}).items()},
            taints=taints, pool=pool,
            simulated=(meta.get("annotations") or {}).get(KWOK_ANNOTATION) == "fake",
        ))
    gpu.sort(key=lambda n: n.name)
    return Discovery(gpu_nodes=gpu, other_nodes=sorted(other), pool_label=chosen)

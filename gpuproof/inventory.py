"""A snapshot of what the cluster says about its GPUs, written to every run's folder.

The shape (consumed by the report layer and by ``gpuproof report compare``)::

    {"captured", "cluster", "kubernetes_version",
     "nodes": [{"name", "pool", "gpu", "product", "gpu_count", "gpu_memory_mib",
                "driver_version", "cuda_version", "sharing_strategy", "replicas",
                "mig_strategy", "labels" (GPU-related only), "capacity", "allocatable", "taints"}]}
"""

from __future__ import annotations

from typing import Iterable

from .discovery import GpuNode, discover
from .results import utcnow

GPU_LABEL_PREFIXES = ("nvidia.com/", "feature.node.kubernetes.io/pci-10de")


def node_entry(node: GpuNode) -> dict:
    return {
        "name": node.name,
        "pool": node.pool,
        "gpu": True,
        "simulated": node.simulated,
        "product": node.product,
        "gpu_count": node.count_label,
        "gpu_memory_mib": node.memory_mib,
        "driver_version": node.driver_version,
        "cuda_version": node.cuda_version,
        "sharing_strategy": node.sharing_strategy,
        "replicas": node.replicas,
        "mig_strategy": node.mig_strategy,
        "labels": {k: v for k, v in sorted(node.labels.items()) if k.startswith(GPU_LABEL_PREFIXES)},
        "capacity": dict(sorted(node.capacity.items())),
        "allocatable": dict(sorted(node.allocatable.items())),
        "taints": node.taint_strings(),
    }


def snapshot_from_nodes(nodes: Iterable, cluster: str = "", kubernetes_version: str = "",
                        pool_label: str | None = None) -> dict:
    d = discover(nodes, pool_label=pool_label)
    entries = [node_entry(n) for n in d.gpu_nodes]
    entries += [{"name": name, "gpu": False} for name in d.other_nodes]
    return {
        "captured": utcnow(),
        "cluster": cluster,
        "kubernetes_version": kubernetes_version,
        "pool_label": d.pool_label,
        "gpu_nodes": len(d.gpu_nodes),
        "nodes": sorted(entries, key=lambda e: e["name"]),
    }


def snapshot(cluster, pool_label: str | None = None) -> dict:
    """Inventory of a live cluster (a gpuproof.cluster.Cluster)."""
    return snapshot_from_nodes(cluster.node_dicts(), cluster=cluster.name,
                               kubernetes_version=cluster.version(), pool_label=pool_label)

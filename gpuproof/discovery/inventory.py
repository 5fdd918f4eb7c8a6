"""A snapshot of what the cluster says about its GPUs, written to every run's folder.

The shape (consumed by the report layer and by ``gpuproof report compare``)::

    {"captured", "cluster", "kubernetes_version",
     "nodes": [{"name", "pool", "gpu", "product", "gpu_count", "gpu_memory_mib",
                "driver_version", "cuda_version", "sharing_strategy", "replicas",
                "mig_strategy", "labels" (GPU-related only), "capacity", "allocatable", "taints",
                "label_scheme", "sources", "kubelet_version", "container_runtime", "kernel", "os_image",
                "mig_config", "mig_config_state", "driver_upgrade_state",
                "labels_by", "resources_by", "slices_by" (embedded cluster: which software made them),
                "stack/<component>" (image of each NVIDIA component's pod on the node)}]}

Every flat field is compared by ``gpuproof report compare``, so an upgrade shows exactly which
of driver, CUDA, device plugin, GFD, operator components, kubelet, runtime and kernel changed.
"""

from __future__ import annotations

from typing import Iterable

from .nodes import GpuNode, discover
from ..results import utcnow

# labels that change every time their writer runs (GFD stamps the time it labelled): not part of what a
# node is, so never recorded (two runs of the same cluster must show no difference)
VOLATILE_LABELS = ("nvidia.com/gfd.timestamp",)
GPU_LABEL_PREFIXES = ("nvidia.com/", "feature.node.kubernetes.io/pci-10de", "cloud.google.com/gke-accelerator",
                      "cloud.google.com/gke-gpu", "cloud.google.com/gke-max-shared", "karpenter.k8s.aws/instance-gpu",
                      "kubernetes.azure.com/accelerator")
# NVIDIA components whose pods' images are recorded: (inventory name, pod name or app label fragments). A pod is
# the first component it matches: GFD before the device plugin, since NVIDIA's chart names GFD's pods
# "nvidia-device-plugin-gpu-feature-discovery-..."
STACK_COMPONENTS = (
    ("gpu-feature-discovery", ("gpu-feature-discovery",)),
    ("device-plugin", ("nvidia-device-plugin", "nvidia-gpu-device-plugin")),
    ("driver", ("nvidia-driver-daemonset", "nvidia-driver-installer")),
    ("container-toolkit", ("nvidia-container-toolkit",)),
    ("dcgm-exporter", ("nvidia-dcgm-exporter", "dcgm-exporter")),
    ("mig-manager", ("nvidia-mig-manager",)),
    ("operator-validator", ("nvidia-operator-validator",)),
    ("dra-driver", ("nvidia-dra-driver",)),
)


def stack_images(pods: Iterable[dict]) -> dict[str, dict[str, str]]:
    """node -> {"stack/<component>": image} from the pods of NVIDIA's components (raw pod JSON)."""
    out: dict[str, dict[str, str]] = {}
    for p in pods:
        meta, spec = p.get("metadata") or {}, p.get("spec") or {}
        node = spec.get("nodeName")
        text = " ".join([meta.get("name", ""), *((meta.get("labels") or {}).values())])
        for component, fragments in STACK_COMPONENTS:
            if node and any(f in text for f in fragments):
                images = sorted({c.get("image", "") for c in spec.get("containers") or []})
                out.setdefault(node, {})[f"stack/{component}"] = ",".join(images)
                break
    return out


def node_entry(node: GpuNode, stack: dict[str, str] | None = None) -> dict:
    info = node.node_info
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
        "labels": {k: v for k, v in sorted(node.labels.items())
                   if k.startswith(GPU_LABEL_PREFIXES) and k not in VOLATILE_LABELS},
        "capacity": dict(sorted(node.capacity.items())),
        "allocatable": dict(sorted(node.allocatable.items())),
        "taints": node.taint_strings(),
        "label_scheme": node.scheme,
        "sources": node.sources,
        "kubelet_version": info.get("kubeletVersion", info.get("kubelet_version", "")),
        "container_runtime": info.get("containerRuntimeVersion", info.get("container_runtime_version", "")),
        "kernel": info.get("kernelVersion", info.get("kernel_version", "")),
        "os_image": info.get("osImage", info.get("os_image", "")),
        "mig_config": node.labels.get("nvidia.com/mig.config", ""),
        "mig_config_state": node.labels.get("nvidia.com/mig.config.state", ""),
        "driver_upgrade_state": node.labels.get("nvidia.com/gpu-driver-upgrade-state", ""),
        "offers": node.offers,
        "dra_devices": len(node.dra_devices),
        "dra_device_types": ",".join(sorted({d.profile or d.type for d in node.dra_devices})),
        # embedded cluster: NVIDIA's software (e.g. "gpu-feature-discovery v0.19.3") or "gpuproof model (why)"
        **{f"{what}_by": who for what, who in node.made_by.items()},
        **(stack or {}),
    }


def snapshot_from_nodes(nodes: Iterable, cluster: str = "", kubernetes_version: str = "",
                        pool_label: str | None = None, pods: Iterable[dict] = (),
                        slices: list[dict] | None = None) -> dict:
    d = discover(nodes, pool_label=pool_label, slices=slices)
    stack = stack_images(pods)
    entries = [node_entry(n, stack.get(n.name)) for n in d.gpu_nodes]
    entries += [{"name": name, "gpu": False} for name in d.other_nodes]
    return {
        "captured": utcnow(),
        "cluster": cluster,
        "kubernetes_version": kubernetes_version,
        "pool_label": d.pool_label,
        "gpu_nodes": len(d.gpu_nodes),
        "dra": None if d.dra_devices is None else {"devices": len(d.dra_devices),
                                                   "slices": len({x.slice for x in d.dra_devices})},
        "nodes": sorted(entries, key=lambda e: e["name"]),
    }


def snapshot(cluster, pool_label: str | None = None) -> dict:
    """Inventory of a live cluster (a gpuproof.cluster.api.Cluster)."""
    return snapshot_from_nodes(cluster.node_dicts(), cluster=cluster.name,
                               kubernetes_version=cluster.version(), pool_label=pool_label,
                               pods=_pod_dicts(cluster), slices=cluster.dra_objects("resourceslices"))


def _pod_dicts(cluster) -> list[dict]:
    """Raw pod JSON of the whole cluster (for component images); none where pods cannot be listed."""
    try:
        resp = cluster.core.list_pod_for_all_namespaces(_preload_content=False)
        import json

        return json.loads(resp.data).get("items") or []
    except Exception:      # the inventory is a record: a cluster that hides its pods still gets one
        return []

"""Discovery reads the node shapes of managed offerings, not only what GPU Feature Discovery writes.

The node objects below are trimmed from the shapes public clusters show (GKE, EKS managed node
groups, Karpenter, AKS, OpenShift with the GPU operator, a bare-metal GFD node); each test says
where product, count, sharing and partitioning come from, and what the checks will expect.
"""

from __future__ import annotations

import pytest

from gpuproof import catalog
from gpuproof.discovery.nodes import discover


def node(name, labels, capacity=None, taints=(), ready="True", unschedulable=False, conditions=()):
    res = {"cpu": "8", "memory": "32Gi", **(capacity or {})}
    conds = [{"type": "Ready", "status": ready, "reason": "KubeletReady" if ready == "True" else "KubeletNotReady"},
             *({"type": t, "status": s} for t, s in conditions)]
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"taints": list(taints), "unschedulable": unschedulable},
            "status": {"capacity": res, "allocatable": res, "conditions": conds,
                       "nodeInfo": {"kubeletVersion": "v1.33.5", "containerRuntimeVersion": "containerd://1.7.27",
                                    "kernelVersion": "6.6.97", "osImage": "Container-Optimized OS"}}}


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}

GKE_T4_SHARED = node("gke-ml-t4-pool-5c0b", {
    "cloud.google.com/gke-nodepool": "t4-pool", "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
    "cloud.google.com/gke-max-shared-clients-per-gpu": "2", "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing",
    "cloud.google.com/gke-gpu-driver-version": "default", "node.kubernetes.io/instance-type": "n1-standard-8"},
    {"nvidia.com/gpu": "2"}, [GPU_TAINT])
GKE_A100_MIG = node("gke-ml-a100-mig-9f2e", {
    "cloud.google.com/gke-nodepool": "a100-mig", "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
    "cloud.google.com/gke-gpu-partition-size": "1g.5gb", "node.kubernetes.io/instance-type": "a2-highgpu-2g"},
    {"nvidia.com/gpu": "14"}, [GPU_TAINT])
EKS_P4D_PLUGIN_ONLY = node("ip-10-0-12-34.ec2.internal", {
    "eks.amazonaws.com/nodegroup": "gpu-p4d", "eks.amazonaws.com/capacityType": "ON_DEMAND",
    "node.kubernetes.io/instance-type": "p4d.24xlarge"}, {"nvidia.com/gpu": "8"})
EKS_P4D_PLUGIN_DEAD = node("ip-10-0-12-35.ec2.internal", {
    "eks.amazonaws.com/nodegroup": "gpu-p4d", "node.kubernetes.io/instance-type": "p4d.24xlarge"})
KARPENTER_G5 = node("ip-10-0-40-7.ec2.internal", {
    "karpenter.sh/nodepool": "gpu", "karpenter.k8s.aws/instance-gpu-name": "a10g",
    "karpenter.k8s.aws/instance-gpu-manufacturer": "nvidia", "karpenter.k8s.aws/instance-gpu-count": "1",
    "karpenter.k8s.aws/instance-gpu-memory": "24576", "node.kubernetes.io/instance-type": "g5.2xlarge"},
    {"nvidia.com/gpu": "1"}, [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
AKS_T4 = node("aks-gpunp-12345678-vmss000000", {
    "kubernetes.azure.com/agentpool": "gpunp", "agentpool": "gpunp", "kubernetes.azure.com/accelerator": "nvidia",
    "node.kubernetes.io/instance-type": "Standard_NC4as_T4_v3"}, {"nvidia.com/gpu": "1"},
    [{"key": "sku", "value": "gpu", "effect": "NoSchedule"}])
OPENSHIFT_A100 = node("worker-gpu-0.ocp.example.com", {
    "node-role.kubernetes.io/worker": "", "feature.node.kubernetes.io/pci-10de.present": "true",
    "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8",
    "nvidia.com/gpu.memory": "81920", "nvidia.com/gpu.deploy.driver": "true", "nvidia.com/mig.config": "all-disabled",
    "nvidia.com/mig.config.state": "success", "nvidia.com/gpu-driver-upgrade-state": "upgrade-done"},
    {"nvidia.com/gpu": "8"})
BARE_METAL_NO_LABELS = node("dgx-07", {"kubernetes.io/hostname": "dgx-07"}, {"nvidia.com/gpu": "8"})
CPU = node("cpu-1", {"node.kubernetes.io/instance-type": "m7i.8xlarge"})

ALL = [GKE_T4_SHARED, GKE_A100_MIG, EKS_P4D_PLUGIN_ONLY, EKS_P4D_PLUGIN_DEAD, KARPENTER_G5, AKS_T4, OPENSHIFT_A100,
       BARE_METAL_NO_LABELS, CPU]


@pytest.fixture(scope="module")
def found():
    d = discover(ALL)
    return d, {n.name: n for n in d.gpu_nodes}


@pytest.mark.parametrize("name, scheme, product, count, replicas, mig, pool", [
    ("gke-ml-t4-pool-5c0b", "gke", "Tesla-T4", None, 2, "none", "t4-pool"),            # n1 + attached T4: count unknown
    ("gke-ml-a100-mig-9f2e", "gke", "NVIDIA-A100-SXM4-40GB", 14, 1, "single", "a100-mig"),   # 2 GPUs x 7 x 1g.5gb
    ("ip-10-0-12-34.ec2.internal", "instance-type", "NVIDIA-A100-SXM4-40GB", 8, 1, "none", "gpu-p4d"),
    ("ip-10-0-12-35.ec2.internal", "instance-type", "NVIDIA-A100-SXM4-40GB", 8, 1, "none", "gpu-p4d"),
    ("ip-10-0-40-7.ec2.internal", "karpenter", "NVIDIA-A10G", 1, 1, "none", "gpu"),
    ("aks-gpunp-12345678-vmss000000", "instance-type", "Tesla-T4", 1, 1, "none", "gpunp"),
    ("worker-gpu-0.ocp.example.com", "gfd", "NVIDIA-A100-SXM4-80GB", 8, 1, "none", "NVIDIA-A100-SXM4-80GB"),
    ("dgx-07", "resources", "", None, 1, "none", "unknown"),
])
def test_each_scheme_is_read(found, name, scheme, product, count, replicas, mig, pool):
    n = found[1][name]
    assert (n.scheme, n.product, n.count_label, n.replicas, n.mig_strategy, n.pool) == \
        (scheme, product, count, replicas, mig, pool)


def test_cpu_nodes_are_not_gpu_nodes(found):
    assert found[0].other_nodes == ["cpu-1"]


def test_a_dead_device_plugin_still_leaves_a_gpu_node(found):
    """An EKS GPU instance whose plugin advertises nothing is a GPU node with 0 GPUs, not a CPU node."""
    n = found[1]["ip-10-0-12-35.ec2.internal"]
    assert n.capacity_of("nvidia.com/gpu") is None and n.count_label == 8


def test_sources_say_where_each_fact_came_from(found):
    n = found[1]["gke-ml-t4-pool-5c0b"]
    assert n.sources == {"product": "cloud.google.com/gke-accelerator", "count": "(unknown)",
                         "sharing": "cloud.google.com/gke-gpu-sharing-strategy", "partitioning": "(none labelled)"}
    assert found[1]["ip-10-0-40-7.ec2.internal"].sources["count"] == "karpenter.k8s.aws/instance-gpu-count"
    assert found[1]["ip-10-0-12-34.ec2.internal"].sources["product"].startswith("node.kubernetes.io/instance-type")


def test_product_selectors_pick_the_product_by_the_scheme_own_labels(found):
    nodes = found[1]
    assert nodes["gke-ml-a100-mig-9f2e"].product_selector == {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}
    assert nodes["ip-10-0-40-7.ec2.internal"].product_selector == {
        "karpenter.k8s.aws/instance-gpu-name": "a10g", "karpenter.k8s.aws/instance-gpu-memory": "24576"}
    assert nodes["dgx-07"].product_selector == {}


def test_karpenter_ambiguous_name_is_settled_by_memory():
    assert catalog.by_alias("karpenter", "a100", 40960).label == "NVIDIA-A100-SXM4-40GB"
    assert catalog.by_alias("karpenter", "a100", 81920).label == "NVIDIA-A100-SXM4-80GB"
    assert catalog.by_alias("karpenter", "a100", 12000) is None


@pytest.mark.parametrize("kwargs, why", [
    ({"ready": "False"}, "not Ready (Ready=False, KubeletNotReady)"),
    ({"unschedulable": True}, "cordoned (spec.unschedulable)"),
    ({"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
     "tainted node.kubernetes.io/unreachable:NoExecute"),
    ({}, ""),
])
def test_nodes_unfit_for_placement_say_why(kwargs, why):
    d = discover([node("n", {"nvidia.com/gpu.present": "true"}, {"nvidia.com/gpu": "1"}, **kwargs)])
    assert d.gpu_nodes[0].unfit_for_placement == why
    assert [n.name for n in d.placeable] == ([] if why else ["n"])


def test_catalog_covers_the_products_platform_teams_run():
    for label in ("Tesla-T4", "NVIDIA-A10G", "NVIDIA-L4", "NVIDIA-L40S", "NVIDIA-A100-SXM4-40GB",
                  "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-PCIe", "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-NVL",
                  "NVIDIA-H200", "NVIDIA-B200", "NVIDIA-GB200"):
        assert catalog.lookup(label) is not None, label
    assert catalog.lookup("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED").label == "NVIDIA-A100-SXM4-40GB"
    assert not catalog.lookup("NVIDIA-GB200").mig_known
    for it in catalog.INSTANCE_TYPES.values():
        assert it.product in catalog.PRODUCTS, it


def test_inventory_records_versions_and_stack_images():
    from gpuproof.discovery.inventory import snapshot_from_nodes

    pods = [{"metadata": {"name": "nvidia-device-plugin-daemonset-x7k2p",
                          "labels": {"app": "nvidia-device-plugin-daemonset"}},
             "spec": {"nodeName": "worker-gpu-0.ocp.example.com",
                      "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"}]}}]
    inv = snapshot_from_nodes([OPENSHIFT_A100], pods=pods)
    entry = inv["nodes"][0]
    assert entry["kubelet_version"] == "v1.33.5" and entry["container_runtime"] == "containerd://1.7.27"
    assert entry["kernel"] == "6.6.97" and entry["mig_config"] == "all-disabled"
    assert entry["stack/device-plugin"] == "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"
    assert entry["label_scheme"] == "gfd"


def test_inventory_tells_gfd_from_the_device_plugin():
    """NVIDIA's chart names GFD's pods nvidia-device-plugin-gpu-feature-discovery-...: GFD, not the plugin."""
    from gpuproof.discovery.inventory import stack_images

    node = "worker-gpu-0"
    pods = [{"metadata": {"name": "nvidia-device-plugin-daemonset-x7k2p",
                          "labels": {"app.kubernetes.io/name": "nvidia-device-plugin"}},
             "spec": {"nodeName": node, "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.2"}]}},
            {"metadata": {"name": "nvidia-device-plugin-gpu-feature-discovery-9wq2d",
                          "labels": {"app.kubernetes.io/name": "gpu-feature-discovery"}},
             "spec": {"nodeName": node, "containers": [{"image": "nvcr.io/nvidia/k8s-device-plugin:v0.17.3"}]}}]
    for order in (pods, pods[::-1]):
        assert stack_images(order)[node] == {"stack/device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.17.2",
                                             "stack/gpu-feature-discovery": "nvcr.io/nvidia/k8s-device-plugin:v0.17.3"}

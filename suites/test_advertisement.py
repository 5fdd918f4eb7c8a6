"""Advertisement: what the device plugin advertises agrees with what GPU Feature Discovery labelled.

On every GPU node, capacity and allocatable of the GPU resource equal ``nvidia.com/gpu.count``
(times ``nvidia.com/gpu.replicas`` when time-sliced), and the resource names fit the
sharing and MIG strategy. A resource left at 0 capacity (the kubelet keeps the old extended
resources at 0 after a MIG or sharing change) is not advertised. On real clusters the
device-plugin pods are Ready on every GPU node.
"""

from datetime import datetime, timezone

import pytest

from gpuproof.catalog import lookup
from gpuproof.cluster.api import watch_until
from gpuproof.discovery.nodes import GPU, GPU_SHARED
from gpuproof.plugin.checks import for_nodes

FEATURE = "advertisement"
pytestmark = pytest.mark.device_plugin      # DRA-only nodes: see test_dra.py


@for_nodes(lambda n: n.mig_strategy != "mixed")
def test_gpu_capacity_matches_count_label(gpu_node, check):
    """nodes exposing whole, shared or single-strategy MIG devices"""
    n = gpu_node
    count = n.count_label
    if count is None and n.gfd:
        check.true("count-label-present", False, expected="nvidia.com/gpu.count label", actual=None,
                   what="cannot check the advertised GPUs: label nvidia.com/gpu.count")
        return
    if count is None:
        check.skip("capacity-matches-count", f"labelled by {n.scheme}: nothing but the capacity itself says how "
                   f"many GPUs the node has (instance type {n.labels.get('node.kubernetes.io/instance-type')!r} "
                   "is not in gpuproof's catalog)")
    expected = count * n.replicas
    if n.scheme not in ("gfd", "gke") and (n.capacity_of(GPU) or 0) > expected and \
            (n.capacity_of(GPU) or 0) % expected == 0:
        check.warn("capacity-matches-count", f"advertises {n.capacity_of(GPU)} {GPU} for {count} GPUs "
                   f"({n.count_source}): time-slicing without GFD's replicas label cannot be verified",
                   expected=expected, actual=n.capacity_of(GPU))
        return
    resource = n.gpu_resource
    why = f"{resource} vs {n.count_source}={count}" + (f" x replicas={n.replicas}" if n.replicas > 1 else "")
    check.equal("capacity-matches-count", expected, n.capacity_of(resource), what=f"capacity of {why}")
    check.equal("allocatable-matches-count", expected, n.allocatable_of(resource), what=f"allocatable of {why}")


@for_nodes(lambda n: n.mig_strategy == "mixed")
def test_mixed_mig_node_advertises_no_whole_gpus(gpu_node, check):
    """nodes with the mixed MIG strategy"""
    check.equal("no-whole-gpus-under-mixed-mig", 0, gpu_node.allocatable_of(GPU) or 0,
                what=f"allocatable {GPU} on a node whose GPUs are all MIG-partitioned (mixed strategy)")


def test_resource_names_fit_strategy(gpu_node, check):
    n = gpu_node
    mig = n.mig_resources
    shared = n.advertised(GPU_SHARED)
    if n.mig_strategy == "mixed":
        check.true("mig-resources-present", bool(mig), expected="nvidia.com/mig-<profile> resources",
                   actual=sorted(n.capacity), what="mixed MIG strategy but no MIG resources advertised")
        product = lookup(n.product)
        if product is not None:
            valid = sorted(p.name for p in product.mig)
            for profile in sorted(mig):
                check.true("mig-profile-valid", profile in valid, expected=f"one of {valid}",
                           actual=f"nvidia.com/mig-{profile}",
                           what=f"MIG resource name for a {n.product}")
    renamed = n.time_sliced and n.shared_renamed
    if n.time_sliced:
        expected = GPU_SHARED if renamed else GPU
        check.true("shared-resource-name", renamed or (shared is None and n.advertised(GPU) is not None),
                   expected=f"GPUs advertised as {expected}",
                   actual={k: v for k, v in n.capacity.items() if k.startswith("nvidia.com/gpu")},
                   what="time-sliced resource name")
    else:
        check.equal("no-shared-resource", None, shared,
                    what=f"{GPU_SHARED} on a node that is not time-sliced (sharing-strategy={n.sharing_strategy})")


# How a device-plugin pod is told from GFD's. NVIDIA's chart gives both of its DaemonSets' pods the same labels
# (app.kubernetes.io/name=nvidia-device-plugin) and names GFD's `<release>-nvidia-device-plugin-gpu-feature-discovery`,
# so neither the pod's name nor that label says which it is; its container does: the plugin's container in NVIDIA's
# chart and static manifest (EKS, AKS), the GPU operator and GKE. The app labels only device-plugin pods carry:
# the GPU operator, GKE, the static manifest.
PLUGIN_CONTAINERS = {"nvidia-device-plugin-ctr", "nvidia-device-plugin", "nvidia-gpu-device-plugin"}
PLUGIN_LABELS = {("app", "nvidia-device-plugin-daemonset"), ("k8s-app", "nvidia-gpu-device-plugin"),
                 ("name", "nvidia-device-plugin-ds")}


# the label each known deployment's device-plugin pods carry, listed once per check across the cluster (one request
# each, not one per node: issue #52); a node none of them names is listed on its own
PLUGIN_SELECTORS = [f"{k}={v}" for k, v in sorted(PLUGIN_LABELS)] + ["app.kubernetes.io/name=nvidia-device-plugin"]


def plugin_pods_by_node(core) -> dict[str, list]:
    """node name -> the device-plugin pods on it, from one list per label of :data:`PLUGIN_SELECTORS`."""
    out: dict[str, dict] = {}
    for selector in PLUGIN_SELECTORS:
        for p in core.list_pod_for_all_namespaces(label_selector=selector).items:
            if p.spec and p.spec.node_name and _is_device_plugin(p):
                out.setdefault(p.spec.node_name, {})[(p.metadata.namespace, p.metadata.name)] = p
    return {node: list(pods.values()) for node, pods in out.items()}


@pytest.fixture(scope="module")
def plugin_pods(target) -> dict[str, list]:
    return plugin_pods_by_node(target.cluster.core)


def _is_device_plugin(p) -> bool:
    labels = p.metadata.labels or {}
    containers = {c.name for c in (p.spec.containers if p.spec else None) or []}
    return bool(containers & PLUGIN_CONTAINERS) or any(labels.get(k) == v for k, v in PLUGIN_LABELS)


# A crash-looping plugin is Ready for about a second after each restart, until its kubelet sees it exit again: a pod
# whose container came back from an exit with an error less than this long ago is judged once it has run this long,
# or exited again (the kubelet's first back-off is 10 s).
STEADY_S = 10.0


def _ready(p) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))


def _just_restarted(p) -> bool:
    """Ready, with a container back from an exit with an error less than STEADY_S ago."""
    if not _ready(p):
        return False
    now = datetime.now(timezone.utc)
    for c in p.status.container_statuses or []:
        last, running = c.last_state.terminated if c.last_state else None, c.state.running if c.state else None
        if last and last.exit_code and running and running.started_at and \
                (now - running.started_at).total_seconds() < STEADY_S:
            return True
    return False


def _steady(core, p):
    """The pod once it is not just back from an error (as it is, or as last seen if it went away)."""
    if not _just_restarted(p):
        return p
    name = p.metadata.name
    return watch_until(core.list_namespaced_pod, lambda c: [c.get(name, p)] if not _just_restarted(c.get(name, p))
                       else None, STEADY_S + 30, f"device-plugin pod {name} to run {STEADY_S:.0f}s or exit again",
                       tick=1.0, namespace=p.metadata.namespace, field_selector=f"metadata.name={name}")[0]


def _pod_state(p) -> str:
    """'<namespace>/<name>: <phase>', and why each container that is not ready is not (its last exit code, restarts,
    waiting reason): a crash-looping plugin's pod stays Running between its restarts."""
    state = f"{p.metadata.namespace}/{p.metadata.name}: {p.status.phase}"
    for c in p.status.container_statuses or []:
        if c.ready:
            continue
        exited = (c.state.terminated if c.state else None) or (c.last_state.terminated if c.last_state else None)
        waiting = c.state.waiting if c.state else None
        why = [f"last exit {exited.exit_code}" if exited else "", f"{c.restart_count} restart(s)" if c.restart_count
               else "", waiting.reason if waiting else ""]
        state += f"; {c.name} not ready: {', '.join(w for w in why if w) or 'starting'}"
    return state


@pytest.mark.realcluster
def test_device_plugin_pod_ready_on_node(gpu_node, target, check, plugin_pods):
    if gpu_node.simulated:
        check.skip("device-plugin-ready", "simulated node: no device-plugin pod runs on kwok nodes")
    pods = plugin_pods.get(gpu_node.name) or \
        target.cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={gpu_node.name}").items
    plugin = [_steady(target.cluster.core, p) for p in pods if _is_device_plugin(p)]
    ready = [p.metadata.name for p in plugin if _ready(p) and not _just_restarted(p)]
    check.true("device-plugin-ready", bool(ready), expected="a Ready nvidia-device-plugin pod",
               actual=[_pod_state(p) for p in plugin] or "none",
               what="device-plugin pod on the node")

"""NVIDIA's DRA driver on kubelet nodes (fleet pools with ``backend: kubelet`` and ``offer: dra``).

NVIDIA's ``gpu-kubelet-plugin`` runs there as its chart runs it: a DaemonSet (``kubeletplugin.yaml``) with
the chart's service account and ClusterRole (``rbac-kubeletplugin.yaml``), registering with the node's
kubelet through ``/var/lib/kubelet/plugins_registry``, publishing the node's ResourceSlice over NVIDIA's
mock NVML and preparing claims by writing CDI specs into the node's ``/var/run/cdi``.

The runtime that reads those specs: the kubelet hands the CDI device names to the runtime in the CRI
``CDIDevices`` field, which containerd 1.7 (every kubelet node's, :mod:`.runtime`) injects once CDI is on
(``enable_cdi``, DRA nodes only; Debian's containerd 1.6 ignored the field). The CDI specs run NVIDIA's
``nvidia-cdi-hook`` (``controlplane/cdihook``, the NVIDIA Container Toolkit release the pinned driver requires),
which the driver's image carries at ``/usr/bin/nvidia-cdi-hook`` and the plugin copies onto the node, as NVIDIA's
image does.

The node's driver root is ``/var/lib/gpuproof/driver`` (``kubelet.DEV_ROOT``), laid out as NVIDIA's own
mock-NVML CI lays one out (``hack/ci/mock-nvml/setup-mock-gpu.sh`` of the driver): the mock library at
``usr/lib64/libnvidia-ml.so.<driver version>`` with its ``.so.1`` link, ``usr/bin/nvidia-smi`` and
``dev/nvidia<N>``. The chart mounts it at ``/driver-root`` in the plugin's container; since that folder
has a ``dev``, the driver takes it as its dev root too, and its CDI root transform turns
``/driver-root`` back into the host path: a claim's spec names ``/var/lib/gpuproof/driver/dev/nvidia<N>``
(host) as ``/dev/nvidia<N>`` (container), so the container gets exactly its GPUs' device nodes and the
mock shows it only those GPUs (``engine.go detectVisibleDevices``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable

import yaml

from .. import binaries as _binaries
from .host import DEV_ROOT, DRA_NODE_LABEL, _create, with_node_files

Progress = Callable[[str], None]

TOOLKIT_VERSION = "v1.19.0"               # the NVIDIA Container Toolkit the pinned DRA driver requires (its go.mod)
CDI_HOOK = ("cdihook", "github.com/NVIDIA/nvidia-container-toolkit")
TOOLKIT_LDFLAGS = f"-s -w -X {CDI_HOOK[1]}/internal/info.version={TOOLKIT_VERSION}"   # the toolkit's programs
CDI_ROOT = "/var/run/cdi"                 # the chart's CDI_ROOT; containerd reads no other (host's /etc/cdi: shared)

# the chart (deployments/helm/dra-driver-nvidia-gpu), installed as NVIDIA's install guide installs it:
# release and namespace dra-driver-nvidia-gpu, computeDomains disabled, the other values at their defaults
NAME = "dra-driver-nvidia-gpu"
NAMESPACE = NAME
DAEMONSET = f"{NAME}-kubelet-plugin"
SERVICE_ACCOUNT = f"{NAME}-service-account-kubeletplugin"
CLUSTER_ROLE = f"{NAME}-clusterrole-kubeletplugin"
ROLE = f"{NAME}-role-kubeletplugin"
COMPONENT = {f"{NAME}-component": "kubelet-plugin"}          # the chart's selector labels
REGISTRAR_DIR = "/var/lib/kubelet/plugins_registry"
PLUGINS_DIR = "/var/lib/kubelet/plugins"
HEALTHCHECK_PORT = 51516
LOG_VERBOSITY = "4"
CONTAINER_DRIVER_ROOT = "/driver-root"


def _quiet(msg: str) -> None:
    pass


# ---------------------------------------------------------------------------- what is built


def cdi_hook(progress: Progress = _quiet) -> Path:
    """NVIDIA's ``nvidia-cdi-hook``, built from ``controlplane/cdihook`` on first use."""
    module, path = CDI_HOOK
    return _binaries.go_build(module, {"nvidia-cdi-hook": f"{path}/cmd/nvidia-cdi-hook"},   # cgo: go-nvml
                              ldflags=TOOLKIT_LDFLAGS, progress=progress) / "nvidia-cdi-hook"


def prepare(sw, progress: Progress = _quiet) -> tuple[Path, str]:
    """Build what DRA nodes need before they start (nvidia-cdi-hook); returns the driver's image."""
    from .. import images

    sw.require_dra()
    return images.dra_driver_image(sw, cdi_hook(progress))


def containerd_settings() -> dict[str, object]:
    """What :func:`gpuproof.sim.kubelet.containerd_config` adds for a DRA node: CDI on over the chart's CDI root."""
    return {"cdi_spec_dirs": [CDI_ROOT]}


# ---------------------------------------------------------------------------- the node's driver root


def driver_root(root: Path, mock_config: Path) -> None:
    """Lay out a DRA node's driver root (its ``DEV_ROOT``, whose ``dev/nvidia<N>`` the node already has) as
    NVIDIA's mock-NVML CI does: the mock library as ``usr/lib64/libnvidia-ml.so.<driver version>`` (the version
    the node's mock config reports: NVIDIA's CDI code looks the driver's libraries up by it) with its links,
    and ``usr/bin/nvidia-smi``. The mock reads the node's config through ``MOCK_NVML_CONFIG``, as for GFD and
    the device plugin, so the node's faults reach the driver too (not a copy in the driver root's ``config/``).

    The library is a hard link of the built one where the file system allows (a symlink would point out of
    the plugin's container). ``nvidia-smi`` is an empty placeholder: the driver only checks that it exists
    (``root.go getNvidiaSMIPath``); NVIDIA's real one comes from NVIDIA's package repository, out of reach here.
    """
    from .. import nvidia

    lib = (nvidia.locate(build_missing=False).lib / "libnvidia-ml.so.1").resolve()
    version = yaml.safe_load(mock_config.read_text())["system"]["driver_version"]
    lib64, bin_dir = root / "usr" / "lib64", root / "usr" / "bin"
    for d in (lib64, bin_dir):
        d.mkdir(parents=True, exist_ok=True)
    target = lib64 / f"libnvidia-ml.so.{version}"
    if not target.exists():
        try:
            os.link(lib, target)
        except OSError:
            shutil.copy2(lib, target)
    for link, to in (("libnvidia-ml.so.1", target.name), ("libnvidia-ml.so", "libnvidia-ml.so.1")):
        with contextlib.suppress(FileExistsError):
            (lib64 / link).symlink_to(to)
    (bin_dir / "nvidia-smi").touch(mode=0o755)


# ---------------------------------------------------------------------------- the chart's objects


def rbac() -> list[dict]:
    """The namespace and ``rbac-kubeletplugin.yaml`` as the chart renders it."""
    ns = {"namespace": NAMESPACE}
    subject = [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, **ns}]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": CLUSTER_ROLE},
         "rules": [{"apiGroups": ["resource.nvidia.com"], "resources": ["computedomains"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
                    "verbs": ["get", "list", "watch", "create", "update", "delete"]},
                   {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "update"]},
                   {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SERVICE_ACCOUNT, **ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": f"{NAME}-clusterrole-binding-kubeletplugin"}, "subjects": subject,
         "roleRef": {"kind": "ClusterRole", "name": CLUSTER_ROLE, "apiGroup": "rbac.authorization.k8s.io"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": ROLE, **ns},
         "rules": [{"apiGroups": ["resource.nvidia.com"], "resources": ["computedomaincliques"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": f"{NAME}-role-binding-kubeletplugin", **ns}, "subjects": subject,
         "roleRef": {"kind": "Role", "name": ROLE, "apiGroup": "rbac.authorization.k8s.io"}},
    ]


def daemonset(image: str) -> dict:
    """``kubeletplugin.yaml`` as the chart renders it with GPUs only, ``nvidiaDriverRoot`` = the node's
    ``DEV_ROOT``. Differences, each because of this image: the container runs ``gpu-kubelet-plugin``
    directly (the chart's ``bash -c`` wrapper only masks ``/proc/driver/nvidia/params`` when asked, and the
    image has no bash), and there is no init container (``kubelet-plugin-prestart.sh`` waits until the
    driver root's ``nvidia-smi`` runs; the mock has none). The chart's affinity on NFD's PCI labels becomes
    gpuproof's DRA node label: no nfd-worker runs here. Added: the node's mock NVML config, as for GFD."""
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    labels = {"app.kubernetes.io/name": NAME, "app.kubernetes.io/instance": NAME}
    probe = {"grpc": {"port": HEALTHCHECK_PORT, "service": "liveness"}, "timeoutSeconds": 10}
    env = {"HTTP_ENDPOINT": ":8080", "METRICS_PATH": "/metrics", "LOG_VERBOSITY": LOG_VERBOSITY,
           "NVIDIA_DRIVER_ROOT": DEV_ROOT, "NVIDIA_VISIBLE_DEVICES": "void", "CDI_ROOT": CDI_ROOT,
           "NVIDIA_MIG_CONFIG_DEVICES": "all", "NODE_NAME": None, "NAMESPACE": None, "IMAGE_NAME": image,
           "KUBELET_REGISTRAR_DIRECTORY_PATH": REGISTRAR_DIR, "KUBELET_PLUGINS_DIRECTORY_PATH": PLUGINS_DIR,
           "HEALTHCHECK_PORT": str(HEALTHCHECK_PORT)}
    refs = {"NODE_NAME": "spec.nodeName", "NAMESPACE": "metadata.namespace"}
    container = {
        "name": "gpus", "securityContext": {"privileged": True}, "image": image, "imagePullPolicy": "Never",
        "command": ["gpu-kubelet-plugin", "-v", "$(LOG_VERBOSITY)"], "resources": {},
        "startupProbe": {**probe, "failureThreshold": 600, "periodSeconds": 1},
        "livenessProbe": {**probe, "failureThreshold": 3, "periodSeconds": 30},
        "env": [{"name": k, **(field(refs[k]) if v is None else {"value": v})} for k, v in env.items()],
        "volumeMounts": [{"name": "plugins-registry", "mountPath": REGISTRAR_DIR},
                         {"name": "plugins", "mountPath": PLUGINS_DIR, "mountPropagation": "Bidirectional"},
                         {"name": "cdi", "mountPath": CDI_ROOT},
                         {"name": "driver-root", "mountPath": CONTAINER_DRIVER_ROOT,
                          "mountPropagation": "HostToContainer"}]}
    container, volumes = with_node_files(container, [
        {"name": "plugins-registry", "hostPath": {"path": REGISTRAR_DIR}},
        {"name": "plugins", "hostPath": {"path": PLUGINS_DIR}}, {"name": "cdi", "hostPath": {"path": CDI_ROOT}},
        {"name": "driver-root", "hostPath": {"path": DEV_ROOT, "type": "DirectoryOrCreate"}}])
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": DAEMONSET, "namespace": NAMESPACE,
                                                                   "labels": labels},
        "spec": {"selector": {"matchLabels": COMPONENT},
                 "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
                 "template": {
                     "metadata": {"labels": {**labels, **COMPONENT,
                                             "nvidia-dra-driver-gpu-component": "kubelet-plugin"}},
                     "spec": {"priorityClassName": "system-node-critical", "serviceAccountName": SERVICE_ACCOUNT,
                              "securityContext": {}, "containers": [container], "volumes": volumes,
                              "nodeSelector": {DRA_NODE_LABEL: "true"},
                              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                               "effect": "NoSchedule"}]}}},
    }


def deploy(client, sw, nodes: list[str], image: str, timeout: float, progress: Progress = _quiet) -> None:
    """Run NVIDIA's kubelet plugin on the DRA nodes; return once each has published its ResourceSlice, and
    mark who published it on the node (``gpuproof.dev/slices-by``, as on kwok DRA nodes)."""
    from kubernetes.client.exceptions import ApiException

    from ...cluster.api import watch_until
    from ...vocab import DRA_GROUP, DRA_VERSION
    from ...vocab import SLICES_BY
    from ..dradriver import DRIVER

    _create(client, rbac())
    with contextlib.suppress(ApiException):
        client.apps.delete_namespaced_daemon_set(DAEMONSET, NAMESPACE)
    client.apps.create_namespaced_daemon_set(NAMESPACE, daemonset(image))
    progress(f"DRA: NVIDIA's gpu-kubelet-plugin runs as DaemonSet {NAMESPACE}/{DAEMONSET} on {', '.join(nodes)}")

    def published(cache: dict) -> bool:
        return set(nodes) <= {s["spec"].get("nodeName") for s in cache.values()}

    def describe(cache: dict) -> str:
        pods = client.core.list_namespaced_pod(NAMESPACE, label_selector=",".join(f"{k}={v}" for k, v in
                                                                                  COMPONENT.items())).items
        return f"slices of {sorted({s['spec'].get('nodeName') for s in cache.values()})}; plugin pods: " + (
            "; ".join(f"{p.metadata.name} on {p.spec.node_name}: {_pod_state(p)}" for p in pods) or "none")

    watch_until(client.custom.list_cluster_custom_object, published, timeout,
                f"NVIDIA's DRA kubelet plugin to publish the ResourceSlices of {', '.join(nodes)}", describe=describe,
                group=DRA_GROUP, version=DRA_VERSION, plural="resourceslices", field_selector=f"spec.driver={DRIVER}")
    for name in nodes:
        client.core.patch_node(name, {"metadata": {"annotations": {
            SLICES_BY: f"{sw.dra_driver} (DaemonSet {NAMESPACE}/{DAEMONSET})"}}})


def _pod_state(pod) -> str:
    """A pod's phase and its containers' states, with the reason and message of any not running."""
    out = [pod.status.phase or "Pending"]
    for c in pod.status.container_statuses or []:
        state = c.state.waiting or c.state.terminated
        out.append(f"{c.name} {'running' if c.state.running else (state and state.reason) or '?'}"
                   + (f" ({state.message})" if state and state.message else "") + f", {c.restart_count} restarts")
    return ", ".join(out)

"""NVIDIA's software on the kubelet GPU nodes: each node's files (its mock NVML config with its faults, the pool's
device-plugin config, its machine type), NVIDIA's device plugin and GFD as DaemonSets as NVIDIA's chart runs them,
NFD's ``nfd-master`` on the host (built from ``controlplane/nfd``) turning GFD's NodeFeature objects into the nodes'
labels, and the wait until every GPU node advertises and is labelled."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import yaml

from ...errors import ControlPlaneError
from .. import binaries as _binaries
from . import cgroups, faults
from .host import (DEV_ROOT, DRA_NODE_LABEL, GFD_ACCOUNT, HOST_DRIVER_IN_POD, NFD_NAMESPACE, NODE_FILES,
                   NVIDIA_NODE_LABEL, PLUGIN_NAMESPACE, _create, _sh, _spawn, with_node_files)
from .layout import Node, State, _save, state_dir

Progress = Callable[[str], None]
NFD_VERSION = "v0.19.0"
NFD = ("nfd", "sigs.k8s.io/node-feature-discovery", "cmd/nfd-master")
NFD_LDFLAGS = f"-s -w -X sigs.k8s.io/node-feature-discovery/pkg/version.version={NFD_VERSION}"
NFD_CRDS = "deployment/base/nfd-crds/nfd-api-crds.yaml"      # NodeFeature, NodeFeatureRule, NodeFeatureGroup
MOCK_OVERRIDES = "overrides.yaml"      # the mock reads it beside its config (engine/config.go)


def _quiet(msg: str) -> None:
    pass


# ---------------------------------------------------------------------------- the node's files


def node_files(sw, fleet, node: Node, pool) -> dict[str, str]:
    """What NVIDIA's software on a GPU node reads: the node's mock NVML config, the pool's plugin config and
    the machine's product name (GFD's ``gpu.machine``; a real node's ``/sys/class/dmi/id/product_name``).

    The node's faults go into its NVML: ``nvmlFailures`` into the mock config, ``nvmlCtl`` commands through
    NVIDIA's ``nvml-mock-ctl`` into ``overrides.yaml`` beside it, where the mock reads them (and re-reads them
    within a second: ``nvml-mock-ctl --file <node>/var-lib/gpuproof/overrides.yaml`` changes a running node)."""
    from ..gpunodes import mock_config, plugin_config

    index = pool.node_names().index(node.name)
    plugin = pool.node_plugin_config(index, plugin_config(pool))         # with its faults' devicePluginConfig
    files = {f"{NODE_FILES}/device-plugin-config.yaml": yaml.safe_dump(plugin, sort_keys=False),
             f"{NODE_FILES}/machine-type": f"{pool.instance_type or pool.name}\n"}
    if pool.host_driver is not None:       # the gpu-host node: its GPUs are the host driver's, NVML is not the mock's
        if pool.host_driver.mock_config:   # a driver root that is NVIDIA's mock (tests) reads its GPUs from here
            files[f"{NODE_FILES}/mock-nvml.yaml"] = Path(pool.host_driver.mock_config).read_text()
        return files
    config = yaml.safe_dump(mock_config(sw, pool.gpu, seed=f"{fleet.name}/{node.name}",
                                        failures=pool.nvml_failures(index)), sort_keys=False)
    files[f"{NODE_FILES}/mock-nvml.yaml"] = config
    commands = pool.nvml_ctl(index)
    if commands:
        files[f"{NODE_FILES}/{MOCK_OVERRIDES}"] = _mock_overrides(sw, config, commands, node.name)
    return files


def _mock_overrides(sw, config: str, commands: list[str], node: str) -> str:
    """The overrides file NVIDIA's ``nvml-mock-ctl`` writes for ``commands`` over the mock config ``config``."""
    import shlex
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg, out = Path(tmp) / "config.yaml", Path(tmp) / MOCK_OVERRIDES
        cfg.write_text(config)
        for cmd in commands:
            proc = subprocess.run([str(sw.exe("nvml-mock-ctl")), "--file", str(out), "--config", str(cfg),
                                   *shlex.split(cmd)], capture_output=True, text=True, timeout=60)
            if proc.returncode != 0:
                raise ControlPlaneError(f"kubelet node {node}: nvml-mock-ctl {cmd}: "
                                        f"{(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
        return out.read_text()


# ---------------------------------------------------------------------------- NVIDIA's DaemonSets


def _nvidia_daemonset(name: str, app: str, container: dict, volumes: list[dict], host_driver=None, **spec) -> dict:
    """A DaemonSet of NVIDIA's image on the GPU nodes, reading the node's files from /etc/gpuproof. Over a host
    driver (the gpu-host fleet: a :class:`gpuproof.sim.gpuhost.HostDriver`), it loads that driver's NVML (its folder
    first on ``LD_LIBRARY_PATH``, before the image's mock) and sees the host's GPUs (privileged: what NVIDIA's
    container toolkit gives NVIDIA's pods on a real node)."""
    labels = {"app.kubernetes.io/name": app}
    container, volumes = with_node_files({"image": container.pop("image"), "imagePullPolicy": "Never", **container},
                                         volumes)
    if host_driver is not None:
        container = {**container, "securityContext": {"privileged": True},
                     "env": [*container["env"], {"name": "LD_LIBRARY_PATH", "value": HOST_DRIVER_IN_POD}],
                     "volumeMounts": [*container["volumeMounts"], {"name": "host-driver",
                                                                   "mountPath": HOST_DRIVER_IN_POD, "readOnly": True}]}
        volumes = [*volumes, {"name": "host-driver", "hostPath": {"path": host_driver.lib_dir, "type": "Directory"}}]
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": PLUGIN_NAMESPACE, "labels": labels},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "nodeSelector": {NVIDIA_NODE_LABEL: "true"}, "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}], **spec, "containers": [container], "volumes": volumes}}},
    }


def device_plugin_daemonset(image: str, host_driver=None) -> dict:
    """NVIDIA's device plugin as its chart runs it, over the node's mock NVML (or ``host_driver``'s) and the pool's
    config file."""
    return _nvidia_daemonset("nvidia-device-plugin-daemonset", "nvidia-device-plugin", {
        "name": "nvidia-device-plugin-ctr", "image": image,
        "command": ["/usr/bin/nvidia-device-plugin", "--config-file=/etc/gpuproof/device-plugin-config.yaml"],
        # device specs for the GPUs it allocates, so a container sees only those (containerd 1.6: no CDI, no NRI)
        "env": [{"name": "PASS_DEVICE_SPECS", "value": "true"}, {"name": "NVIDIA_DEV_ROOT", "value": DEV_ROOT}],
        "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}]},
        [{"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}], host_driver,
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": DRA_NODE_LABEL, "operator": "DoesNotExist"}]}]}}})


def gfd_daemonset(image: str, host_driver=None) -> dict:
    """NVIDIA's GPU Feature Discovery as its chart runs it: it writes the node's labels into a NodeFeature
    object (``--use-node-feature-api``), which NFD's master turns into the node's labels."""
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    return _nvidia_daemonset("nvidia-device-plugin-gpu-feature-discovery", "gpu-feature-discovery", {
        "name": "gpu-feature-discovery-ctr", "image": image,
        "command": ["/usr/bin/gpu-feature-discovery", "--use-node-feature-api",
                    "--config-file=/etc/gpuproof/device-plugin-config.yaml",
                    "--machine-type-file=/etc/gpuproof/machine-type"],
        "env": [{"name": "NODE_NAME", **field("spec.nodeName")}, {"name": "NAMESPACE", **field("metadata.namespace")},
                {"name": "POD_NAME", **field("metadata.name")}]}, [], host_driver, serviceAccountName=GFD_ACCOUNT)


def gfd_rbac() -> list[dict]:
    """GFD's service account and role, as NVIDIA's chart writes them (``role.yml``, ``role-binding.yml``)."""
    role = f"{GFD_ACCOUNT}-role"
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": GFD_ACCOUNT, "namespace": PLUGIN_NAMESPACE}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": role}, "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"],
             "verbs": ["get", "list", "watch", "create", "update"]},
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": role},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
         "subjects": [{"kind": "ServiceAccount", "name": GFD_ACCOUNT, "namespace": PLUGIN_NAMESPACE}]}]


# ---------------------------------------------------------------------------- NFD's master


def nfd_master(progress: Progress = _quiet) -> Path:
    """The folder holding node-feature-discovery's ``nfd-master`` and its API's CRDs (``nfd-api-crds.yaml``),
    both from the module pinned in ``controlplane/nfd`` (built there on first use)."""
    module, path, package = NFD
    folder = _binaries.go_build(module, {"nfd-master": f"{path}/{package}"}, ldflags=NFD_LDFLAGS, progress=progress)
    crds = folder / Path(NFD_CRDS).name
    if not crds.exists():
        go = shutil.which("go") or "go"
        where = _sh(go, "list", "-m", "-f", "{{.Dir}}", path, cwd=_binaries.modules_dir() / module,
                    env={**os.environ, "GOFLAGS": "-mod=mod"}).stdout.strip()
        tmp = crds.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(Path(where) / NFD_CRDS, tmp)
        tmp.replace(crds)
    return folder


def start_nfd_master(sim_dir: Path, state: State, folder: Path, client) -> None:
    """NFD's master on the host, as the cluster's admin (like the control plane): it labels nodes from the
    NodeFeature objects GFD writes. It runs in the cluster's cgroup, so :func:`~.nodes.stop` ends it."""
    import socket

    _create(client, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NFD_NAMESPACE}},
                     *yaml.safe_load_all((folder / Path(NFD_CRDS).name).read_text())])
    with socket.socket() as s:                         # its metrics/health port, on the host
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cgroups.make(state, "nfd-master")
    proc = _spawn(state_dir(sim_dir) / "nfd-master.log", cgroups.join(state, "nfd-master"),
                  str(folder / "nfd-master"), f"-kubeconfig={Path(sim_dir) / 'kubeconfig'}", f"-port={port}",
                  # the node it says it runs on (it stamps its version there): the cluster's first kubelet node
                  env={**os.environ, "KUBERNETES_NAMESPACE": NFD_NAMESPACE, "NODE_NAME": state.nodes[0]})
    state.pids["nfd-master"] = proc.pid
    _save(sim_dir, state)


# ---------------------------------------------------------------------------- until the GPU nodes are ready


def wait_gpu_nodes(client, names: set[str], timeout: float, dra: set[str] = frozenset()) -> set[str]:
    """Until every GPU node has GFD's labels (through NFD's master) and, unless ``dra`` names it (NVIDIA's DRA
    driver offers its GPUs) or its device plugin crash-loops, the device plugin's resources. Returns the nodes whose
    device plugin crash-loops (:func:`.faults.crashed_device_plugins`, asked while a node does not advertise)."""
    from ...cluster.api import watch_until

    crashed: set[str] = set()

    def done(node) -> bool:
        return "nvidia.com/gpu.product" in (node.metadata.labels or {}) and (node.metadata.name in dra | crashed or any(
            k.startswith("nvidia.com/") and v not in ("0", 0) for k, v in (node.status.allocatable or {}).items()))

    def all_done(cache: dict) -> bool:
        crashed.update(faults.crashed_device_plugins(
            client, PLUGIN_NAMESPACE, {n for n in names - dra if n not in cache or not done(cache[n])}))
        return all(n in cache and done(cache[n]) for n in names)

    watch_until(client.core.list_node, all_done, timeout,
                f"NVIDIA's device plugin to advertise GPUs and GFD's labels on {len(names)} kubelet node(s)",
                tick=faults.CRASH_TICK)
    return crashed

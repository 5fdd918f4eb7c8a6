"""A kubelet node's kubelet (built from ``controlplane/kube``): its binary, its config and kubeconfig, and its start
in the node's network namespace and in its containerd's mount namespace."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable

import yaml

from .. import binaries as _binaries
from .. import clusternet
from .host import _spawn, client_kubeconfig
from .layout import Node, State

Progress = Callable[[str], None]
KUBELET = ("kube", "k8s.io/kubernetes/cmd/kubelet")


def _quiet(msg: str) -> None:
    pass


def kubelet_binary(progress: Progress = _quiet) -> Path:
    """The kubelet: ``$GPUPROOF_KUBELET``, ``$GPUPROOF_BIN_DIR``, the build cache (built there on first use)."""
    env = os.environ.get(_binaries.env_var("kubelet"))
    if env:
        return Path(env)
    bin_dir = os.environ.get("GPUPROOF_BIN_DIR")
    if bin_dir and (Path(bin_dir) / "kubelet").is_file():
        return Path(bin_dir) / "kubelet"
    module, package = KUBELET
    return _binaries.go_build(module, {"kubelet": package}, ldflags=_binaries.LDFLAGS[module],
                              progress=progress) / "kubelet"


def kubelet_config(node: Node, state: State, ca: Path) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "cgroupDriver": "cgroupfs", "failCgroupV1": False, "cgroupRoot": f"/{state.cgroup}/{node.name}",
        "failSwapOn": False,
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        "address": node.ip(state.subnet), "port": 10250, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
        # the API server reaches a node's kubelet (logs, exec) without a client certificate of its own
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "AlwaysAllow"},
        "podCIDR": node.pod_cidr, "maxPods": node.max_pods, "resolvConf": "",
        **clusternet.kubelet_dns(state.api_service),
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False, "registerNode": True,
    }


def node_kubeconfig(sim_dir: Path, node: Node, state: State, out: Path) -> Path:
    """A kubeconfig for ``system:node:<name>`` (group ``system:nodes``), signed by the cluster's CA."""
    return client_kubeconfig(sim_dir, state, out, f"system:node:{node.name}", "system:nodes")


def configure(sim_dir: Path, state: State, n: Node, etc: Path) -> Path:
    """Write node ``n``'s ``kubelet.yaml`` and kubeconfig into its ``etc``; returns the kubeconfig."""
    (etc / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(n, state, Path(sim_dir) / "pki" / "ca.crt")))
    return node_kubeconfig(sim_dir, n, state, etc)


def start(root: Path, state: State, n: Node, kubelet: Path, kubeconfig: Path, join: Callable[[], None], netns: str,
          mnt: str) -> subprocess.Popen:
    """Start node ``n``'s kubelet (its config in ``root``'s ``etc``: :func:`configure`), with its labels and taints;
    ``mnt``: nsenter's ``--mount=`` of its containerd's mount namespace."""
    etc = root / "etc"
    args = [str(kubelet), f"--config={etc / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={n.name}", f"--node-ip={n.ip(state.subnet)}", "--v=1"]
    if n.labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())))
    if n.taints:
        args.append("--register-with-taints=" + ",".join(n.taints))
    proc = _spawn(root / "logs" / "kubelet.log", join, "nsenter", netns, mnt, *args)
    state.pids[f"{n.name}/kubelet"] = proc.pid
    return proc

"""Fleet faults that break a kubelet node the way a real node breaks (issue #28).

The fault only changes what the node holds; the kubelet, containerd and NVIDIA's software make the failure:

- ``devicePluginConfig``: the node's own device-plugin config (NVIDIA's chart picks one per node by its
  ``nvidia.com/device-plugin.config`` label), merged over the pool's. NVIDIA's device plugin and GFD read it as they
  read the pool's. Asking the plugin for CDI (``flags.plugin.deviceListStrategy: cdi-cri``) on a node whose driver
  root has no ``libcuda.so`` (the mock's has none) makes the plugin exit 1 on every start ("unable to create cdi
  spec file: ... failed to locate libcuda.so"), so its pod crash-loops, while GFD, which makes no CDI spec, labels
  the node;
- ``missingImages``: images the node's containerd lacks (``workloads``: the image gpuproof's workload pods run in).
  A pod of it stays ``ErrImageNeverPull`` there (``imagePullPolicy: Never``: the nodes reach no registry), which
  :mod:`gpuproof.cluster`'s waits take as a pod that never starts.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

Progress = Callable[[str], None]
DEVICE_PLUGIN_APP = "nvidia-device-plugin"          # the app.kubernetes.io/name of the device plugin's pods
CRASHED = "CrashLoopBackOff"


def node_images(wanted: list[tuple], images: dict[str, tuple[Path, str]],
                per_node: dict[str, list[tuple[Path, str]]]) -> dict[str, list[tuple[Path, str]]]:
    """Node name -> the images it imports: ``per_node``'s, and each of ``images`` (fleet name -> image) but those
    its faults say its containerd lacks. ``wanted``: (node, pool) of every kubelet node."""
    out = {}
    for node, pool in wanted:
        lacks = pool.missing_images(pool.node_names().index(node.name))
        out[node.name] = [*per_node.get(node.name, []), *(img for name, img in images.items() if name not in lacks)]
    return out


def wait_device_plugins(client, names: set[str], namespace: str, timeout: float,
                        progress: Progress = lambda m: None) -> set[str]:
    """Until NVIDIA's device-plugin pod on each node of ``names`` is Ready, or crash-loops (its container exited with
    an error and the kubelet backs off restarting it). Returns the nodes whose plugin crash-loops, each told through
    ``progress`` with the plugin's last error line."""
    from ..cluster import watch_until

    if not names:
        return set()

    def settled(cache: dict) -> dict[str, str] | None:
        state = {p.spec.node_name: _state(p) for p in cache.values() if p.spec.node_name in names}
        return state if names <= {n for n, s in state.items() if s} else None

    state = watch_until(client.core.list_namespaced_pod, settled, timeout,
                        f"NVIDIA's device plugin to start on {len(names)} kubelet node(s)", namespace=namespace,
                        label_selector=f"app.kubernetes.io/name={DEVICE_PLUGIN_APP}",
                        describe=lambda c: ", ".join(f"{p.spec.node_name}: {p.status.phase}" for p in c.values()))
    failed = {node for node, s in state.items() if s == CRASHED}
    for pod in client.core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={DEVICE_PLUGIN_APP}"
                                               ).items:
        if pod.spec.node_name in failed:
            progress(f"kubelet node {pod.spec.node_name}: NVIDIA's device plugin crash-loops: "
                     f"{_last_error(client, pod)}")
    return failed


def _state(pod) -> str:
    """'ready', CRASHED, or '' (still starting)."""
    if any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or []):
        return "ready"
    waiting = [c.state.waiting.reason for c in pod.status.container_statuses or [] if c.state and c.state.waiting]
    return CRASHED if CRASHED in waiting else ""


def _last_error(client, pod) -> str:
    """The last error the plugin's previous container (the one that exited) logged, or its exit code."""
    from kubernetes.client.exceptions import ApiException

    from .nvidia import klog_error

    with contextlib.suppress(ApiException):
        log = client.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, previous=True,
                                                  _preload_content=False).data.decode("utf-8", "replace")
        if log.strip():
            return klog_error(log)
    last = [c.last_state.terminated for c in pod.status.container_statuses or []
            if c.last_state and c.last_state.terminated]
    return f"exited {last[0].exit_code}" if last else "exited"

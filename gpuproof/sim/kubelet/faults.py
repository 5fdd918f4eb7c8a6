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
- ``labelsOverGfd``: labels set on the node over GFD's once NFD's master has applied them, as a hand's ``kubectl
  label --overwrite`` or a node-labelling job would on a real cluster; NFD's master leaves them until its hourly
  resync (measured: a changed ``nvidia.com/cuda.driver-version.full`` stayed over 5 minutes), so the node claims
  what its GPUs do not have (a driver version NVML in its pods does not report).
- ``cpuPercent``: the share of one CPU core the node's pods may use together, written as the CFS quota of the
  kubelet's ``kubepods`` cgroup once the cluster is up (NVIDIA's device plugin and GFD running, CoreDNS answering;
  the kernel then throttles the node's pods): a slow node, made by the kernel, for the census to find among its
  peers.
- ``netRateMbit``: the node's network shaped by the kernel (``tc``: an HTB class on its ``eth0`` inside its network
  namespace for what it sends, a token bucket on its veth on the host for what it receives), once the cluster is
  up: a slow node's NIC, for the fabric suite's pairs to find (every pair of it slow).
- ``slowLinks``: the link between two nodes of a pool shaped the same way on both nodes' ``eth0``, for traffic to
  each other's address and pod range only: a slow link between two healthy nodes (their other pairs fast).
"""


from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

Progress = Callable[[str], None]
DEVICE_PLUGIN_APP = "nvidia-device-plugin"          # the app.kubernetes.io/name of the device plugin's pods
CRASH_TICK = 2.0        # seconds between looks at the device-plugin pods of nodes that do not advertise yet


def node_images(wanted: list[tuple], images: dict[str, tuple[Path, str]],
                per_node: dict[str, list[tuple[Path, str]]]) -> dict[str, list[tuple[Path, str]]]:
    """Node name -> the images it imports: ``per_node``'s, and each of ``images`` (fleet name -> image) but those
    its faults say its containerd lacks. ``wanted``: (node, pool) of every kubelet node."""
    out = {}
    for node, pool in wanted:
        lacks = pool.missing_images(pool.node_names().index(node.name))
        out[node.name] = [*per_node.get(node.name, []), *(img for name, img in images.items() if name not in lacks)]
    return out


def crashed_device_plugins(client, namespace: str, nodes: set[str]) -> set[str]:
    """Those of ``nodes`` whose device-plugin pod has exited with an error (the kubelet restarts it, backing off):
    such a node never advertises. Its pod can still be Ready for a moment after each start (the kubelet has not seen
    the exit yet), so only the exit code tells."""
    if not nodes:
        return set()
    return {p.spec.node_name for p in _plugin_pods(client, namespace) if p.spec.node_name in nodes and _exited(p)}


def tell_crashed(client, namespace: str, nodes: set[str], progress: Progress) -> None:
    """Say, for each of ``nodes``, that its device plugin crash-loops and the last error it logged."""
    for pod in _plugin_pods(client, namespace) if nodes else []:
        if pod.spec.node_name in nodes:
            progress(f"kubelet node {pod.spec.node_name}: NVIDIA's device plugin crash-loops: "
                     f"{_last_error(client, pod)}")


def _plugin_pods(client, namespace: str) -> list:
    return client.core.list_namespaced_pod(namespace,
                                           label_selector=f"app.kubernetes.io/name={DEVICE_PLUGIN_APP}").items


def _exited(pod) -> bool:
    """Whether a container of the pod exited with an error (now, or before its restart)."""
    return any(t and t.exit_code for c in pod.status.container_statuses or []
               for t in (c.state.terminated if c.state else None, c.last_state.terminated if c.last_state else None))


def _last_error(client, pod) -> str:
    """The last error the plugin's container that exited logged (the current one while the kubelet backs off, else
    the previous one), or its exit code."""
    from kubernetes.client.exceptions import ApiException

    from ..nvidia import klog_error

    exited = any(c.state and c.state.terminated for c in pod.status.container_statuses or [])
    with contextlib.suppress(ApiException):
        log = client.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace, previous=not exited,
                                                  _preload_content=False).data.decode("utf-8", "replace")
        if log.strip():
            return klog_error(log)
    last = [c.last_state.terminated for c in pod.status.container_statuses or []
            if c.last_state and c.last_state.terminated]
    return f"exited {last[0].exit_code}" if last else "exited"


CFS_MIN_QUOTA_US = 1_000        # the kernel's least quota


def cfs_period_us(pct: int) -> int:
    """The CFS period for a share of ``pct`` percent: 20 ms where its quota is at least the kernel's least (1 ms),
    else as long as that needs. Short, so the kernel holds the share over each 20 ms and not over 100 ms: one
    census figure of a node held to 5% over 100 ms periods read 4 times the others (bursts inside a period)."""
    return max(20_000, -(-CFS_MIN_QUOTA_US * 100 // pct))


def limit_pod_cpu(cpu_root: Path, wanted: list[tuple], progress: Progress) -> dict[str, int]:
    """Hold the pods of each node with a ``cpuPercent`` fault to that share of one core: ``cpu_root`` is the cluster's
    group in the cpu hierarchy, whose ``<node>/kubepods`` the kubelet made. Returns node -> percent."""
    limited = {}
    for node, pool in wanted:
        pct = pool.cpu_percent(pool.node_names().index(node.name))
        if pct is None:
            continue
        group = cpu_root / node.name / "kubepods"
        if not (group / "cpu.cfs_quota_us").exists():
            progress(f"cpuPercent on {node.name} not applied: the kubelet made no {group}")
            continue
        period = cfs_period_us(pct)
        (group / "cpu.cfs_period_us").write_text(str(period))
        (group / "cpu.cfs_quota_us").write_text(str(period * pct // 100))
        limited[node.name] = pct
    if limited:
        progress("pods held to " + ", ".join(f"{pct}% of a core on {n}" for n, pct in sorted(limited.items()))
                 + " (cpuPercent: the kubepods cgroup's CFS quota)")
    return limited


def label_over_gfd(client, wanted: list[tuple], progress: Progress) -> dict[str, dict[str, str]]:
    """Set each ``labelsOverGfd`` fault's labels on its node (GFD's labels are there: NFD's master has applied
    them). Returns node -> the labels set."""
    done = {}
    for node, pool in wanted:
        labels = pool.labels_over_gfd(pool.node_names().index(node.name))
        if labels:
            client.core.patch_node(node.name, {"metadata": {"labels": labels}})
            done[node.name] = labels
            progress(f"kubelet node {node.name}: labelled over GFD's: "
                     + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return done


def _tc(state, i: int | None, *args: str) -> None:
    from .host import _sh

    inside = ("ip", "netns", "exec", state.netns(i)) if i is not None else ()
    _sh(*inside, "tc", *args)


def shape_network(state, wanted: list[tuple], progress: Progress) -> dict[str, str]:
    """Apply each kubelet node's ``netRateMbit`` and ``slowLinks`` with ``tc`` (see the module's doc). ``wanted``:
    (node, pool) of every kubelet node; a link names the other node by its index in the pool. Returns node -> what
    was shaped. The shaping goes with the node's namespace and veth when the cluster stops."""
    by_name = {node.name: node for node, _ in wanted}
    done: dict[str, str] = {}
    for node, pool in wanted:
        index = pool.node_names().index(node.name)
        rate = pool.net_rate_mbit(index)
        links = {pool.node_names()[to]: mbit for to, mbit in pool.slow_links(index).items()
                 if pool.node_names()[to] in by_name}
        if rate is None and not links:
            continue
        # what the node sends: an HTB root on its eth0; unclassified traffic goes at the device's speed unless the
        # node itself is slow (its default class)
        _tc(state, node.index, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb",
            *(("default", "1") if rate else ()))
        if rate:
            _tc(state, node.index, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb",
                "rate", f"{rate}mbit")
        for k, (name, mbit) in enumerate(sorted(links.items()), start=10):
            other, mbit = by_name[name], min(mbit, rate or mbit)
            _tc(state, node.index, "class", "add", "dev", "eth0", "parent", "1:", "classid", f"1:{k}", "htb",
                "rate", f"{mbit}mbit")
            for dst in (other.pod_cidr, f"{other.ip(state.subnet)}/32"):
                _tc(state, node.index, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32",
                    "match", "ip", "dst", dst, "flowid", f"1:{k}")
        if rate:            # what the node receives: the host's end of its veth sends it
            _tc(state, None, "qdisc", "add", "dev", state.veth(node.index), "root", "tbf", "rate", f"{rate}mbit",
                "burst", "64kb", "latency", "400ms")
        done[node.name] = ", ".join(
            ([f"its network at {rate} Mbit/s"] if rate else [])
            + [f"its link to {o} at {m} Mbit/s" for o, m in sorted(links.items())])
    if done:
        progress("network shaped by tc: " + "; ".join(f"{n}: {what}" for n, what in sorted(done.items()))
                 + " (netRateMbit, slowLinks)")
    return done

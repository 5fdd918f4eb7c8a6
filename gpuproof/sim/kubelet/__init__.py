"""Real kubelet nodes for the embedded cluster (fleet pools with ``backend: kubelet``); :func:`load` puts a fleet's
kubelet pools on the cluster, start to finish.

Each node is a real kubelet (built from ``controlplane/kube``) with its own containerd (1.7, with runc and the CNI
plugins, built from pinned modules: ``runtime``), both in the node's own network namespace and mount namespace:

- network: a host bridge per cluster and one veth per node, the API server reached at the bridge address,
  pods on the CNI bridge plugin inside the node's namespace (``network``);
- files: the node's folder is bound over ``/var/lib`` and ``/run`` in its mount namespace, so the
  kubelet, containerd, CNI and device plugins use their default paths (``/var/lib/kubelet/device-plugins``
  is the node's own) and every mount they make dies with the namespace (``containerd``);
- cgroups: everything of node ``n`` runs under ``/gpuproof-<id>/<n>`` (v1 hierarchies, cgroupfs
  driver), so stopping a node kills exactly the processes in it (``cgroups``).

Images come from :mod:`gpuproof.sim.images` and are imported into each node's containerd. On GPU nodes
NVIDIA's device plugin and GFD run as DaemonSets, and NFD's ``nfd-master`` (``controlplane/nfd``, on the
host) turns GFD's NodeFeature objects into the nodes' labels (``gpu``).
Everything the nodes create on the host is named after the cluster id and recorded in
``<state>/kubelet/state.json``; :func:`stop` removes it (processes, cgroups, iptables rules,
veths, namespaces, the bridge), and for a private cluster a reaper process does the same when the
owner dies, SIGKILL included (``nodes``, ``python -m gpuproof.sim.kubelet reap``).

The modules, one concern each: ``needs`` (what the host must have: :func:`missing`), ``layout`` (the nodes and what
they made: :class:`Node`, :class:`State`), ``host`` (commands, processes and files the others share), ``network``,
``cgroups``, ``runtime`` (containerd, runc, the CNI plugins), ``containerd`` (its config and start), ``agent`` (the
kubelet process), ``nodes`` (start, stop, the reaper), ``gpu`` (NVIDIA's
software and NFD's master), ``lent`` (the workload image the nodes lend), ``dra`` (NVIDIA's DRA driver), ``faults``
(fleet faults that break a node), ``toolkit`` (NVIDIA's container toolkit as a node's runtime). This module
re-exports what the rest of gpuproof and the tests use, so ``kubelet.<name>`` stays their one spelling.

Imports: the sim layer's own modules and the base (``gpuproof.errors``, ``gpuproof.images``, ``gpuproof.vocab``),
``gpuproof.cluster``'s watches; never ``gpuproof.discovery``.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Callable

from .. import clusternet
from . import dra, faults, lent
from .agent import KUBELET, kubelet_binary, kubelet_config, node_kubeconfig  # noqa: F401
from .cgroups import CGROUP, CGROUP_V1  # noqa: F401
from .containerd import containerd_config  # noqa: F401
from .gpu import (NFD, NFD_CRDS, NFD_LDFLAGS, NFD_VERSION, device_plugin_daemonset, gfd_daemonset,  # noqa: F401
                  gfd_rbac, nfd_master, node_files, start_nfd_master, wait_gpu_nodes)
from .host import (DEV_ROOT, DRA_NODE_LABEL, GFD_ACCOUNT, MOCK_CONFIG_IN_POD, NFD_NAMESPACE,  # noqa: F401
                   NODE_FILES, NODE_FILES_IN_POD, NVIDIA_MAJOR, NVIDIA_NODE_LABEL, PLUGIN_NAMESPACE, _create,
                   client_kubeconfig, with_node_files)
from .layout import Node, State, _load, fleet_nodes, state_dir  # noqa: F401
from .lent import WORKLOAD_IMAGE_FILE, lent_image, lent_image_of_kubeconfig, workload_image  # noqa: F401
from .needs import missing
from .network import cni_config  # noqa: F401
from .nodes import start, stop

Progress = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def load(sim_dir: Path, api_port: int, fleet, client, progress: Progress = _quiet, timeout: float = 180.0,
         private: bool = False) -> None:
    """Replace the previous fleet's kubelet nodes with this fleet's, and run NVIDIA's device plugin and GFD
    (with NFD's master) on them.

    Without what kubelet nodes need (root, cgroups, containerd ...), the kubelet pools are left out in one
    line and the kwok pools work as before.
    """
    from kubernetes.client.exceptions import ApiException

    from .. import platform

    previous = _load(Path(sim_dir))
    platform.unload(client, sim_dir)       # before the nodes go: its webhooks would refuse the next fleet's objects
    stop(sim_dir, progress=progress)
    for name in previous.nodes if previous else []:
        with contextlib.suppress(ApiException):
            client.core.delete_node(name)
    wanted = fleet_nodes(fleet)
    if not wanted:
        if previous:
            clusternet.unload(client)          # no Services or cluster DNS without kubelet nodes
        return
    why = missing()         # looked up here, in this module: a test stands in for it with monkeypatch
    if why:
        progress(f"kubelet pools {', '.join(sorted({p.name for _, p in wanted}))} left out: {why}")
        return
    t0 = time.monotonic()
    gpu = [(n, p) for n, p in wanted if p.gpu is not None]
    host_driver = next((p.host_driver for _, p in gpu if p.host_driver is not None), None)    # the gpu-host fleet
    files, image, nfd, crashed = {}, "", None, set()
    if gpu:
        from .. import images, nvidia

        sw = nvidia.locate(progress=progress)
        nfd = nfd_master(progress)
        files = {n.name: node_files(sw, fleet, n, p) for n, p in gpu}
        image = images.nvidia_image(sw)
        workloads = images.workloads_image(sw)
    dra_nodes = [n.name for n, _ in gpu if n.dra]
    if dra_nodes:
        dra_image = dra.prepare(sw, progress)
    hosts = [n.name for n, p in wanted if p.gpu is None]
    operators = platform.prepare(fleet.platform, hosts, progress) if fleet.platform else {}
    service = client.core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
    state = start(sim_dir, api_port, [n for n, _ in wanted], files, progress=progress, timeout=timeout,
                  private=private, extra_images=[image] if image else [], api_service=service,
                  gpus={n.name: p.gpu.count for n, p in gpu},
                  devices={n.name: p.host_driver.devices for n, p in gpu if p.host_driver is not None},
                  node_images=faults.node_images(wanted, {"workloads": workloads} if image else {},
                                                 {**{n: [dra_image] for n in dra_nodes},
                                                  **{node: [image] for node, image in operators.values()}}))
    if gpu:
        lent.save(sim_dir, workloads[1], host_driver)
    clusternet.deploy(client, state, progress)
    client.wait_nodes_ready([n.name for n, _ in wanted], timeout=timeout)
    if gpu:
        start_nfd_master(sim_dir, state, nfd, client)
        _create(client, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLUGIN_NAMESPACE}},
                         *gfd_rbac()])
        for ds in (device_plugin_daemonset(image[1], host_driver), gfd_daemonset(image[1], host_driver)):
            with contextlib.suppress(ApiException):
                client.apps.delete_namespaced_daemon_set(ds["metadata"]["name"], PLUGIN_NAMESPACE)
            client.apps.create_namespaced_daemon_set(PLUGIN_NAMESPACE, ds)
        if dra_nodes:
            dra.deploy(client, sw, dra_nodes, dra_image[1], timeout, progress)
        crashed = wait_gpu_nodes(client, {n.name for n, _ in gpu}, timeout, dra=set(dra_nodes))
        faults.label_over_gfd(client, wanted, progress)
        faults.tell_crashed(client, PLUGIN_NAMESPACE, crashed, progress)
    clusternet.wait(client, state, timeout)
    if operators:
        platform.deploy(client, sim_dir, operators, timeout, progress)
    # once NVIDIA's software runs and CoreDNS answers: the fault is the run's to find, not the cluster's start's
    faults.limit_pod_cpu(CGROUP / "cpu" / state.cgroup, wanted, progress)
    faults.shape_network(state, wanted, progress)
    progress(f"{len(wanted)} kubelet node(s) Ready in {time.monotonic() - t0:.1f}s"
             + (f"; NVIDIA's device plugin and GFD advertise and label GPUs on {len(gpu)}" if gpu else "")
             + (f" (the device plugin crash-loops on {', '.join(sorted(crashed))})" if crashed else ""))

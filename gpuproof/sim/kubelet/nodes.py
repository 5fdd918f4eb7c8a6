"""Starting and stopping a cluster's kubelet nodes on this host: each node's folder, files and GPU device nodes, its
network (:mod:`.network`), cgroups (:mod:`.cgroups`), containerd (:mod:`.containerd`), kubelet (:mod:`.agent`) and
kube-proxy (``clusternet``); :func:`stop` removes all of it, and for a private cluster a reaper process does the same
when the owner dies, SIGKILL included (``python -m gpuproof.sim.kubelet reap <dir>``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Callable

from ...errors import ControlPlaneError
from .. import clusternet
from . import agent, cgroups, containerd, dra, network
from . import runtime as node_runtime
from .host import DEV_ROOT, NODE_FILES, NVIDIA_MAJOR
from .layout import Node, State, _load, _save, state_dir
from .needs import missing

Progress = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def start(sim_dir: Path, api_port: int, nodes: list[Node], gpu_files: dict[str, dict[str, str]] | None = None,
          progress: Progress = _quiet, timeout: float = 180.0, private: bool = False,
          extra_images: list[tuple[Path, str]] | None = None, api_service: str = "",
          gpus: dict[str, int] | None = None, node_images: dict[str, list[tuple[Path, str]]] | None = None,
          devices: dict[str, tuple[tuple[str, int], ...]] | None = None) -> State:
    """Start a kubelet node for each of ``nodes``; returns when their containerds answer (not yet Ready).

    ``gpu_files``: node name -> {path under the node's /var/lib: content} (its mock NVML config ...);
    ``gpus``: node name -> how many ``/dev/nvidia<N>`` device nodes it has (under ``DEV_ROOT``);
    ``node_images``: node name -> images only that node imports (``extra_images``: every node);
    ``devices``: node name -> its ``/dev`` files as (name, device number), instead of ``gpus`` (the gpu-host node:
    the host driver's own).
    """
    why = missing()
    if why:
        raise ControlPlaneError(why)
    sim_dir = Path(sim_dir)
    stop(sim_dir)
    kubelet = agent.kubelet_binary(progress)
    runtime = node_runtime.locate(progress)     # containerd, runc, the CNI plugins: found (or built) once
    from .. import images

    tars = [images.pause_image(), *(extra_images or [])]
    node_images = clusternet.prepare(nodes, node_images, progress)     # CoreDNS's image, on its node
    cluster = hashlib.sha256(str(sim_dir.resolve()).encode()).hexdigest()[:4]
    state = State(cluster=cluster, subnet=network.pick_subnet(cluster), api_port=api_port, api_service=api_service,
                  nodes=[n.name for n in nodes])
    _save(sim_dir, state)
    if private:
        _spawn_reaper(sim_dir)
    try:
        progress(f"kubelet nodes: network for {len(nodes)} node(s) on bridge {state.bridge} ({state.gateway}/24)")
        network.up(state, nodes)
        cgroups.make(state, "")
        cgroups.weigh(state, len(nodes))
        for n in nodes:
            nvidia = (devices or {}).get(n.name) or tuple(
                (f"nvidia{i}", os.makedev(NVIDIA_MAJOR, i)) for i in range((gpus or {}).get(n.name, 0)))
            _start_node(sim_dir, state, n, kubelet, runtime, (gpu_files or {}).get(n.name, {}), nvidia,
                        [*tars, *(node_images or {}).get(n.name, [])], timeout)
            _save(sim_dir, state)
            progress(f"kubelet node {n.name}: containerd and kubelet started ({n.ip(state.subnet)})")
    except BaseException:
        stop(sim_dir)
        raise
    return state


def _start_node(sim_dir: Path, state: State, n: Node, kubelet: Path, runtime: node_runtime.NodeRuntime,
                files: dict[str, str],
                nvidia: tuple[tuple[str, int], ...], tars: list[tuple[Path, str]], timeout: float) -> None:
    from .. import images

    root = state_dir(sim_dir) / n.name
    var_lib, run, etc, var_log = root / "var-lib", root / "run", root / "etc", root / "var-log"
    for d in (var_lib / "kubelet", run, etc / "cni", root / "logs", var_log):
        d.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        (var_lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (var_lib / rel).write_text(content)
    # the GPUs' device nodes, where the device plugin's device specs (PASS_DEVICE_SPECS, NVIDIA_DEV_ROOT) point:
    # the runtime makes them in a container that is allocated them, and NVIDIA's mock NVML shows a process
    # only the GPUs whose /dev/nvidia<N> exist (engine.go, detectVisibleDevices). They live in the node's folder.
    dev = var_lib / Path(DEV_ROOT).relative_to("/var/lib") / "dev"
    for name, number in nvidia:
        dev.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mknod(dev / name, 0o666 | stat.S_IFCHR, number)
    if n.dra:       # NVIDIA's DRA driver reads the driver root around dev/; its CDI specs need CDI on
        dra.driver_root(dev.parent, var_lib / NODE_FILES / "mock-nvml.yaml")
    (etc / "cni" / "10-gpuproof.conflist").write_text(json.dumps(network.cni_config(n)))
    config = containerd.containerd_config(etc / "cni", images.PAUSE, runtime,
                                          **(dra.containerd_settings() if n.dra else {}))
    if n.toolkit is not None:
        from . import toolkit

        config = toolkit.node_runtime(etc, n.toolkit, dev.parent, var_lib / NODE_FILES, config)
    (etc / "containerd.toml").write_text(config)
    kubeconfig = agent.configure(sim_dir, state, n, etc)
    cgroups.make(state, f"{n.name}/daemons")
    join = cgroups.join(state, f"{n.name}/daemons")
    netns = f"--net=/run/netns/{state.netns(n.index)}"
    proc = containerd.start(root, state, n, join, netns, runtime, tars, timeout)
    mnt = f"--mount=/proc/{proc.pid}/ns/mnt"
    agent.start(root, state, n, kubelet, kubeconfig, join, netns, mnt)
    clusternet.start_proxy(sim_dir, state, n, root, join, netns, mnt)


def stop(sim_dir: Path, progress: Progress = _quiet) -> bool:
    """Remove everything the kubelet nodes of this cluster made on the host. False if there were none."""
    state = _load(Path(sim_dir))
    if state is None:
        return False
    progress(f"stopping {len(state.nodes)} kubelet node(s)")
    cgroups.kill_all(state)
    network.down(state)
    cgroups.remove(state)
    shutil.rmtree(state_dir(Path(sim_dir)), ignore_errors=True)
    return True


# ---------------------------------------------------------------------------- the reaper


_REAPER_PIPES: list[int] = []


def _spawn_reaper(sim_dir: Path) -> None:
    """A process that waits for this one to end (the pipe's write end closes, even on SIGKILL), then stops
    the nodes. When :func:`stop` ran first, it finds nothing and exits."""
    r, w = os.pipe()
    subprocess.Popen([sys.executable, "-m", __package__, "reap", str(sim_dir)], stdin=r, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    os.close(r)
    _REAPER_PIPES.append(w)


def _reap(sim_dir: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.read(0, 1)                               # returns when the owner is gone
    stop(Path(sim_dir))

"""Real kubelet nodes for the embedded cluster (fleet pools with ``backend: kubelet``).

Long: a kubelet node's life from start to stop; what its neighbours share is kubelet_host's.

Each node is a real kubelet (built from ``controlplane/kube``) with its own containerd (Debian's
``containerd``, ``runc`` and ``containernetworking-plugins``), both in the node's own network
namespace and mount namespace:

- network: a host bridge per cluster (``gpk<id>``, 10.250.<c>.1/24) and one veth per node (the node's
  ``eth0``, 10.250.<c>.<10+i>: a non-loopback node IP). The node reaches the API server at the
  bridge address, which the host DNATs to the API server's 127.0.0.1 port (``route_localnet`` on the
  bridge only). Pods get 10.251.<i>.0/24 from the CNI bridge plugin inside the node's namespace, and
  nodes route each other's pod ranges over the bridge, so the host routes nothing;
- files: the node's folder is bound over ``/var/lib`` and ``/run`` in its mount namespace, so the
  kubelet, containerd, CNI and device plugins use their default paths (``/var/lib/kubelet/device-plugins``
  is the node's own) and every mount they make dies with the namespace;
- cgroups: everything of node ``n`` runs under ``/gpuproof-<id>/<n>`` (v1 hierarchies, cgroupfs
  driver): the kubelet's ``cgroupRoot`` and the daemons' own group, so stopping a node kills
  exactly the processes in it.

Images come from :mod:`gpuproof.sim.images` and are imported into each node's containerd. On GPU nodes
NVIDIA's device plugin and GFD run as DaemonSets, and NFD's ``nfd-master`` (``controlplane/nfd``, on the
host) turns GFD's NodeFeature objects into the nodes' labels.
Everything the nodes create on the host is named after the cluster id and recorded in
``<state>/kubelet/state.json``; :func:`stop` removes it (processes, cgroups, iptables rules,
veths, namespaces, the bridge), and for a private cluster a reaper process does the same when the
owner dies, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import yaml

from ..errors import ControlPlaneError
from . import binaries as _binaries
from . import clusternet, kubelet_faults
from .kubelet_host import (DEV_ROOT, DRA_NODE_LABEL, GFD_ACCOUNT, MOCK_CONFIG_IN_POD, NFD_NAMESPACE,  # noqa: F401
                           NODE_FILES, NODE_FILES_IN_POD, NVIDIA_MAJOR, NVIDIA_NODE_LABEL, PLUGIN_NAMESPACE,
                           _create, _sh, _spawn, client_kubeconfig, with_node_files)

Progress = Callable[[str], None]
KUBELET = ("kube", "k8s.io/kubernetes/cmd/kubelet")
NFD_VERSION = "v0.19.0"
NFD = ("nfd", "sigs.k8s.io/node-feature-discovery", "cmd/nfd-master")
NFD_LDFLAGS = f"-s -w -X sigs.k8s.io/node-feature-discovery/pkg/version.version={NFD_VERSION}"
NFD_CRDS = "deployment/base/nfd-crds/nfd-api-crds.yaml"      # NodeFeature, NodeFeatureRule, NodeFeatureGroup
CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "iptables", "nsenter", "unshare")
CGROUP = Path("/sys/fs/cgroup")
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd", "unified")


def _quiet(msg: str) -> None:
    pass


# ---------------------------------------------------------------------------- what a kubelet node needs


def missing() -> str:
    """Why kubelet nodes cannot run on this machine ('' when they can): one line."""
    lacks = []
    if os.geteuid() != 0:
        lacks.append("root (network and mount namespaces, cgroups, iptables)")
    if not (CGROUP / "memory" / "cgroup.procs").exists():
        lacks.append("cgroup v1 hierarchies under /sys/fs/cgroup (cgroup v2 is not supported yet)")
    tools = [t for t in TOOLS if not shutil.which(t)]
    if not _cni_dir():
        tools.append("CNI plugins (bridge, host-local, loopback, portmap)")
    if tools:
        lacks.append(", ".join(tools) + " (Debian: apt-get install containerd runc containernetworking-plugins "
                                        "iptables)")
    return "kubelet nodes need " + "; ".join(lacks) if lacks else ""


def _cni_dir() -> str:
    return next((d for d in CNI_DIRS if all(Path(d, p).exists() for p in ("bridge", "host-local", "loopback"))), "")


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


# ---------------------------------------------------------------------------- layout


@dataclasses.dataclass
class Node:
    name: str
    index: int
    labels: dict[str, str]
    taints: list[str]
    max_pods: int
    dra: bool = False          # NVIDIA's DRA driver runs here, over containerd 1.7 with CDI (kubelet_dra)
    toolkit: dict | None = None  # NVIDIA's container toolkit as its runtime, with these settings (kubelet_toolkit)

    def ip(self, c: int) -> str:
        return f"10.250.{c}.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.251.{self.index}.0/24"


@dataclasses.dataclass
class State:
    """What the nodes made on the host: all of it is removed by :func:`stop`."""

    cluster: str                                       # the id in every host name (bridge, netns, cgroup)
    subnet: int                                        # the c of 10.250.<c>.0/24
    api_port: int
    api_service: str = ""                              # the `kubernetes` Service's ClusterIP, DNATed in each node
    nodes: list[str] = dataclasses.field(default_factory=list)
    pids: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"gpk{self.cluster}"

    @property
    def gateway(self) -> str:
        return f"10.250.{self.subnet}.1"

    @property
    def cgroup(self) -> str:
        return f"gpuproof-{self.cluster}"

    @property
    def comment(self) -> str:
        return f"gpuproof-{self.cluster}"

    def netns(self, i: int) -> str:
        return f"gpk{self.cluster}-{i}"

    def veth(self, i: int) -> str:
        return f"gpk{self.cluster}h{i}"

    def dnat_rule(self) -> list[str]:
        return ["PREROUTING", "-i", self.bridge, "-d", self.gateway, "-p", "tcp", "--dport", str(self.api_port),
                "-j", "DNAT", "--to-destination", f"127.0.0.1:{self.api_port}", "-m", "comment",
                "--comment", self.comment]


def state_dir(sim_dir: Path) -> Path:
    return Path(sim_dir) / "kubelet"


def _load(sim_dir: Path) -> State | None:
    try:
        return State(**json.loads((state_dir(sim_dir) / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _save(sim_dir: Path, state: State) -> None:
    path = state_dir(sim_dir) / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(state), indent=2))
    tmp.replace(path)


# ---------------------------------------------------------------------------- config files


def containerd_config(cni_conf_dir: Path, pause: str, cdi_spec_dirs: list[str] | None = None, shim: str = "") -> str:
    """``cdi_spec_dirs``: CDI on (containerd 1.7+), reading specs there; ``shim``: the runc shim's path."""
    cdi = f"\n  enable_cdi = true\n  cdi_spec_dirs = {json.dumps(cdi_spec_dirs)}" if cdi_spec_dirs else ""
    shim = f'\n      runtime_path = "{shim}"' if shim else ""
    return f"""version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  restrict_oom_score_adj = true
  disable_apparmor = true{cdi}
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"{shim}
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{_cni_dir()}"
    conf_dir = "{cni_conf_dir}"
"""


def cni_config(node: Node) -> dict:
    return {"cniVersion": "0.4.0", "name": "gpuproof", "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]}


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


# ---------------------------------------------------------------------------- host plumbing


def _cgroup_dirs(state: State, sub: str = "") -> list[Path]:
    return [CGROUP / h / state.cgroup / sub for h in CGROUP_V1 if (CGROUP / h).is_dir()]


def _make_cgroup(state: State, sub: str) -> None:
    for h in CGROUP_V1:
        if not (CGROUP / h).is_dir():
            continue
        path = CGROUP / h
        for part in [state.cgroup, *Path(sub).parts]:
            parent, path = path, path / part
            path.mkdir(exist_ok=True)
            if h == "cpuset":                      # an empty cpuset takes no tasks: inherit the parent's
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (path / f).read_text().strip():
                        (path / f).write_text((parent / f).read_text())


def _join_cgroup(state: State, sub: str) -> Callable[[], None]:
    """A preexec function that moves the child into the node's group in every hierarchy."""
    procs = [d / "cgroup.procs" for d in _cgroup_dirs(state, sub)]

    def join() -> None:
        for p in procs:
            p.write_text("0")
    return join


def _subgroups(d: Path) -> list[Path]:
    """``d`` and every cgroup under it, deepest first. Groups that vanish while they are listed (a container's,
    removed as its processes die) are passed over: ``os.walk`` ignores a directory it cannot list, where
    ``Path.rglob`` raises."""
    found = [Path(top) for top, _, _ in os.walk(d)]
    return sorted(found, key=lambda p: -len(p.parts))


def _cgroup_pids(state: State) -> set[int]:
    pids: set[int] = set()
    for d in _cgroup_dirs(state):
        for group in _subgroups(d):
            with contextlib.suppress(OSError, ValueError):
                pids.update(int(x) for x in (group / "cgroup.procs").read_text().split())
    return pids


def _network_up(state: State, nodes: list[Node]) -> None:
    br, gw = state.bridge, state.gateway
    _sh("ip", "link", "add", br, "type", "bridge")
    _sh("ip", "addr", "add", f"{gw}/24", "dev", br)
    _sh("ip", "link", "set", br, "up")
    Path(f"/proc/sys/net/ipv4/conf/{br}/route_localnet").write_text("1")
    _sh("iptables", "-t", "nat", "-A", *state.dnat_rule())
    for n in nodes:
        ns, host_end, node_end = state.netns(n.index), state.veth(n.index), f"gpk{state.cluster}n{n.index}"
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
        _sh("ip", "link", "set", host_end, "master", br, "up")
        _sh("ip", "link", "set", node_end, "netns", ns)
        inside = ("ip", "netns", "exec", ns)
        _sh(*inside, "ip", "link", "set", node_end, "name", "eth0")
        _sh(*inside, "ip", "addr", "add", f"{n.ip(state.subnet)}/24", "dev", "eth0")
        _sh(*inside, "ip", "link", "set", "eth0", "up")
        _sh(*inside, "ip", "link", "set", "lo", "up")
        _sh(*inside, "ip", "route", "add", "default", "via", gw)
        _sh(*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for other in nodes:
            if other is not n:
                _sh(*inside, "ip", "route", "add", other.pod_cidr, "via", other.ip(state.subnet))
        # pods reach the API server (and the host) as their node: the host routes no pod range
        _sh(*inside, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", n.pod_cidr, "-d", f"{gw}/32",
            "-j", "MASQUERADE")
        # Services, the `kubernetes` one included, are the node's kube-proxy's (clusternet.start_proxy)


# ---------------------------------------------------------------------------- start / stop


def _pick_subnet(cluster: str) -> int:
    """A 10.250.<c>.0/24 no interface of this host has an address in."""
    start = int(cluster, 16)
    for k in range(200):
        c = 20 + (start + k) % 200
        if not _sh("ip", "-4", "addr", "show", "to", f"10.250.{c}.0/24", check=False).stdout.strip():
            return c
    raise ControlPlaneError("kubelet nodes: no free 10.250.<c>.0/24 subnet for the node bridge")


def start(sim_dir: Path, api_port: int, nodes: list[Node], gpu_files: dict[str, dict[str, str]] | None = None,
          progress: Progress = _quiet, timeout: float = 180.0, private: bool = False,
          extra_images: list[tuple[Path, str]] | None = None, api_service: str = "",
          gpus: dict[str, int] | None = None, node_images: dict[str, list[tuple[Path, str]]] | None = None) -> State:
    """Start a kubelet node for each of ``nodes``; returns when their containerds answer (not yet Ready).

    ``gpu_files``: node name -> {path under the node's /var/lib: content} (its mock NVML config ...);
    ``gpus``: node name -> how many ``/dev/nvidia<N>`` device nodes it has (under ``DEV_ROOT``);
    ``node_images``: node name -> images only that node imports (``extra_images``: every node).
    """
    why = missing()
    if why:
        raise ControlPlaneError(why)
    sim_dir = Path(sim_dir)
    stop(sim_dir)
    kubelet = kubelet_binary(progress)
    from . import images

    tars = [images.pause_image(), *(extra_images or [])]
    node_images = clusternet.prepare(nodes, node_images, progress)     # CoreDNS's image, on its node
    cluster = hashlib.sha256(str(sim_dir.resolve()).encode()).hexdigest()[:4]
    state = State(cluster=cluster, subnet=_pick_subnet(cluster), api_port=api_port, api_service=api_service,
                  nodes=[n.name for n in nodes])
    _save(sim_dir, state)
    if private:
        _spawn_reaper(sim_dir)
    try:
        progress(f"kubelet nodes: network for {len(nodes)} node(s) on bridge {state.bridge} ({state.gateway}/24)")
        _network_up(state, nodes)
        for n in nodes:
            _start_node(sim_dir, state, n, kubelet, (gpu_files or {}).get(n.name, {}), (gpus or {}).get(n.name, 0),
                        [*tars, *(node_images or {}).get(n.name, [])], timeout)
            _save(sim_dir, state)
            progress(f"kubelet node {n.name}: containerd and kubelet started ({n.ip(state.subnet)})")
    except BaseException:
        stop(sim_dir)
        raise
    return state


def _start_node(sim_dir: Path, state: State, n: Node, kubelet: Path, files: dict[str, str], gpus: int,
                tars: list[tuple[Path, str]], timeout: float) -> None:
    from . import images

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
    for i in range(gpus):
        dev.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mknod(dev / f"nvidia{i}", 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
    runtime = None
    if n.dra:       # NVIDIA's DRA driver reads the driver root around dev/; its CDI specs need containerd 1.7
        from . import kubelet_dra

        kubelet_dra.driver_root(dev.parent, var_lib / NODE_FILES / "mock-nvml.yaml")
        runtime = kubelet_dra.containerd()
    (etc / "cni" / "10-gpuproof.conflist").write_text(json.dumps(cni_config(n)))
    config = containerd_config(etc / "cni", images.PAUSE,
                               **(kubelet_dra.containerd_settings(runtime) if runtime else {}))
    if n.toolkit is not None:
        from . import kubelet_toolkit

        config = kubelet_toolkit.node_runtime(etc, n.toolkit, dev.parent, var_lib / NODE_FILES, config)
    (etc / "containerd.toml").write_text(config)
    (etc / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(n, state, Path(sim_dir) / "pki" / "ca.crt")))
    kubeconfig = node_kubeconfig(sim_dir, n, state, etc)
    _make_cgroup(state, f"{n.name}/daemons")
    join = _join_cgroup(state, f"{n.name}/daemons")
    netns = f"--net=/run/netns/{state.netns(n.index)}"
    # shared inside the node's namespace (private to the host), as a real node's mounts are: the mount
    # propagation pods ask for (NVIDIA's DRA driver: Bidirectional, HostToContainer) needs it
    script = ('mount --bind "$1" /var/lib && mount --make-rshared /var/lib && mount --bind "$2" /run && '
              'mount --make-rshared /run && mount --bind "$3" /var/log && shift 3 && exec "$@"')
    # /var/log too: each kubelet removes the /var/log/pods folders of the pods it does not run (other nodes')
    sock = run / "containerd" / "containerd.sock"
    containerd = _spawn(root / "logs" / "containerd.log", join,
                        "nsenter", netns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                        "sh", str(var_lib), str(run), str(var_log),
                        str(runtime / "containerd") if runtime else "containerd",
                        "--config", str(etc / "containerd.toml"))
    state.pids[f"{n.name}/containerd"] = containerd.pid
    # inside the node's mount namespace: the host path of the socket may pass the 108-byte limit of a unix address
    ctr = ("nsenter", f"--mount=/proc/{containerd.pid}/ns/mnt", "ctr", "--address", "/run/containerd/containerd.sock")
    _wait_for(lambda: sock.exists() and _sh(*ctr, "version", check=False).returncode == 0,
              timeout, f"containerd of kubelet node {n.name}", root / "logs" / "containerd.log", containerd)
    for tar, _ in tars:
        _sh(*ctr, "-n", "k8s.io", "images", "import", str(tar))
    # the suites' placeholder pods name the upstream pause image; the nodes reach no registry, so it is ours
    from ..images import PAUSE_IMAGE

    if PAUSE_IMAGE != images.PAUSE:
        _sh(*ctr, "-n", "k8s.io", "images", "tag", "--force", images.PAUSE, PAUSE_IMAGE)
    args = [str(kubelet), f"--config={etc / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
            f"--hostname-override={n.name}", f"--node-ip={n.ip(state.subnet)}", "--v=1"]
    if n.labels:
        args.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())))
    if n.taints:
        args.append("--register-with-taints=" + ",".join(n.taints))
    proc = _spawn(root / "logs" / "kubelet.log", join, "nsenter", netns, f"--mount=/proc/{containerd.pid}/ns/mnt",
                  *args)
    state.pids[f"{n.name}/kubelet"] = proc.pid
    clusternet.start_proxy(sim_dir, state, n, root, join, netns, f"--mount=/proc/{containerd.pid}/ns/mnt")


def _wait_for(ready: Callable[[], bool], timeout: float, what: str, log: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    delay = 0.05
    while not ready():
        if proc.poll() is not None:
            raise ControlPlaneError(f"{what} exited ({proc.returncode}) while starting; last lines of {log}:\n"
                                    + "\n".join(log.read_text(errors="replace").splitlines()[-15:]))
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}; see {log}")
        time.sleep(delay)          # a daemon's socket has no watch: poll with a growing interval
        delay = min(delay * 1.5, 0.5)


def stop(sim_dir: Path, progress: Progress = _quiet) -> bool:
    """Remove everything the kubelet nodes of this cluster made on the host. False if there were none."""
    state = _load(Path(sim_dir))
    if state is None:
        return False
    progress(f"stopping {len(state.nodes)} kubelet node(s)")
    _kill_all(state)
    _sh("iptables", "-t", "nat", "-D", *state.dnat_rule(), check=False)
    for i in range(len(state.nodes)):
        _sh("ip", "netns", "del", state.netns(i), check=False)
        _sh("ip", "link", "del", state.veth(i), check=False)
    _sh("ip", "link", "del", state.bridge, check=False)
    for d in _cgroup_dirs(state):
        for sub in _subgroups(d):
            with contextlib.suppress(OSError):
                sub.rmdir()
    shutil.rmtree(state_dir(Path(sim_dir)), ignore_errors=True)
    return True


def _kill_all(state: State, timeout: float = 30.0) -> None:
    """SIGKILL every process in the nodes' cgroups (daemons, shims, containers) until none is left."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        pids = _cgroup_pids(state) | {p for p in state.pids.values() if Path(f"/proc/{p}").exists()}
        pids.discard(os.getpid())
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"kubelet nodes: processes {sorted(pids)} would not die")
        time.sleep(delay)          # waiting for the kernel to finish killing: poll the cgroups
        delay = min(delay * 2, 0.2)


# ---------------------------------------------------------------------------- a fleet's kubelet pools


def fleet_nodes(fleet) -> list[tuple[Node, object]]:
    """(node, pool) for every node of the fleet's kubelet pools, numbered across them."""
    from .fleet import POOL_LABEL

    out = []
    for pool in (p for p in fleet.pools if p.backend == "kubelet"):
        labels = {POOL_LABEL: pool.instance_type or pool.name, **pool.labels}
        if pool.gpu is not None:
            labels[NVIDIA_NODE_LABEL] = "true"
        if pool.dra:
            labels[DRA_NODE_LABEL] = "true"
        for name in pool.node_names():
            toolkit = pool.container_toolkit(pool.node_names().index(name)) if pool.gpu is not None else None
            out.append((Node(name, len(out), labels, [str(t) for t in pool.taints], pool.pods, dra=pool.dra,
                             toolkit=toolkit), pool))
    return out


def node_files(sw, fleet, node: Node, pool) -> dict[str, str]:
    """What NVIDIA's software on a GPU node reads: the node's mock NVML config, the pool's plugin config and
    the machine's product name (GFD's ``gpu.machine``; a real node's ``/sys/class/dmi/id/product_name``).

    The node's faults go into its NVML: ``nvmlFailures`` into the mock config, ``nvmlCtl`` commands through
    NVIDIA's ``nvml-mock-ctl`` into ``overrides.yaml`` beside it, where the mock reads them (and re-reads them
    within a second: ``nvml-mock-ctl --file <node>/var-lib/gpuproof/overrides.yaml`` changes a running node)."""
    from .gpunodes import mock_config, plugin_config

    index = pool.node_names().index(node.name)
    config = yaml.safe_dump(mock_config(sw, pool.gpu, seed=f"{fleet.name}/{node.name}",
                                        failures=pool.nvml_failures(index)), sort_keys=False)
    plugin = pool.node_plugin_config(index, plugin_config(pool))         # with its faults' devicePluginConfig
    files = {f"{NODE_FILES}/mock-nvml.yaml": config,
             f"{NODE_FILES}/device-plugin-config.yaml": yaml.safe_dump(plugin, sort_keys=False),
             f"{NODE_FILES}/machine-type": f"{pool.instance_type or pool.name}\n"}
    commands = pool.nvml_ctl(index)
    if commands:
        files[f"{NODE_FILES}/{MOCK_OVERRIDES}"] = _mock_overrides(sw, config, commands, node.name)
    return files


MOCK_OVERRIDES = "overrides.yaml"      # the mock reads it beside its config (engine/config.go)


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


def _nvidia_daemonset(name: str, app: str, container: dict, volumes: list[dict], **spec) -> dict:
    """A DaemonSet of NVIDIA's image on the GPU nodes, reading the node's files from /etc/gpuproof."""
    labels = {"app.kubernetes.io/name": app}
    container, volumes = with_node_files({"image": container.pop("image"), "imagePullPolicy": "Never", **container},
                                         volumes)
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": PLUGIN_NAMESPACE, "labels": labels},
        "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "nodeSelector": {NVIDIA_NODE_LABEL: "true"}, "priorityClassName": "system-node-critical",
            "tolerations": [{"operator": "Exists"}], **spec, "containers": [container], "volumes": volumes}}},
    }


def device_plugin_daemonset(image: str) -> dict:
    """NVIDIA's device plugin as its chart runs it, over the node's mock NVML and the pool's config file."""
    return _nvidia_daemonset("nvidia-device-plugin-daemonset", "nvidia-device-plugin", {
        "name": "nvidia-device-plugin-ctr", "image": image,
        "command": ["/usr/bin/nvidia-device-plugin", "--config-file=/etc/gpuproof/device-plugin-config.yaml"],
        # device specs for the GPUs it allocates, so a container sees only those (containerd 1.6: no CDI, no NRI)
        "env": [{"name": "PASS_DEVICE_SPECS", "value": "true"}, {"name": "NVIDIA_DEV_ROOT", "value": DEV_ROOT}],
        "volumeMounts": [{"name": "device-plugin", "mountPath": "/var/lib/kubelet/device-plugins"}]},
        [{"name": "device-plugin", "hostPath": {"path": "/var/lib/kubelet/device-plugins"}}],
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": DRA_NODE_LABEL, "operator": "DoesNotExist"}]}]}}})


def gfd_daemonset(image: str) -> dict:
    """NVIDIA's GPU Feature Discovery as its chart runs it: it writes the node's labels into a NodeFeature
    object (``--use-node-feature-api``), which NFD's master turns into the node's labels."""
    field = lambda path: {"valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    return _nvidia_daemonset("nvidia-device-plugin-gpu-feature-discovery", "gpu-feature-discovery", {
        "name": "gpu-feature-discovery-ctr", "image": image,
        "command": ["/usr/bin/gpu-feature-discovery", "--use-node-feature-api",
                    "--config-file=/etc/gpuproof/device-plugin-config.yaml",
                    "--machine-type-file=/etc/gpuproof/machine-type"],
        "env": [{"name": "NODE_NAME", **field("spec.nodeName")}, {"name": "NAMESPACE", **field("metadata.namespace")},
                {"name": "POD_NAME", **field("metadata.name")}]}, [], serviceAccountName=GFD_ACCOUNT)


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


def _start_nfd_master(sim_dir: Path, state: State, folder: Path, client) -> None:
    """NFD's master on the host, as the cluster's admin (like the control plane): it labels nodes from the
    NodeFeature objects GFD writes. It runs in the cluster's cgroup, so :func:`stop` ends it."""
    import socket

    _create(client, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NFD_NAMESPACE}},
                     *yaml.safe_load_all((folder / Path(NFD_CRDS).name).read_text())])
    with socket.socket() as s:                         # its metrics/health port, on the host
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    _make_cgroup(state, "nfd-master")
    proc = _spawn(state_dir(sim_dir) / "nfd-master.log", _join_cgroup(state, "nfd-master"),
                  str(folder / "nfd-master"), f"-kubeconfig={Path(sim_dir) / 'kubeconfig'}", f"-port={port}",
                  # the node it says it runs on (it stamps its version there): the cluster's first kubelet node
                  env={**os.environ, "KUBERNETES_NAMESPACE": NFD_NAMESPACE, "NODE_NAME": state.nodes[0]})
    state.pids["nfd-master"] = proc.pid
    _save(sim_dir, state)


def load(sim_dir: Path, api_port: int, fleet, client, progress: Progress = _quiet, timeout: float = 180.0,
         private: bool = False) -> None:
    """Replace the previous fleet's kubelet nodes with this fleet's, and run NVIDIA's device plugin and GFD
    (with NFD's master) on them.

    Without what kubelet nodes need (root, cgroups, containerd ...), the kubelet pools are left out in one
    line and the kwok pools work as before.
    """
    from kubernetes.client.exceptions import ApiException

    previous = _load(Path(sim_dir))
    stop(sim_dir, progress=progress)
    for name in previous.nodes if previous else []:
        with contextlib.suppress(ApiException):
            client.core.delete_node(name)
    wanted = fleet_nodes(fleet)
    if not wanted:
        if previous:
            clusternet.unload(client)          # no Services or cluster DNS without kubelet nodes
        return
    why = missing()
    if why:
        progress(f"kubelet pools {', '.join(sorted({p.name for _, p in wanted}))} left out: {why}")
        return
    t0 = time.monotonic()
    gpu = [(n, p) for n, p in wanted if p.gpu is not None]
    files, image, nfd, crashed = {}, "", None, set()
    if gpu:
        from . import images, nvidia

        sw = nvidia.locate(progress=progress)
        nfd = nfd_master(progress)
        files = {n.name: node_files(sw, fleet, n, p) for n, p in gpu}
        image = images.nvidia_image(sw)
        workloads = images.workloads_image(sw)
    dra = [n.name for n, _ in gpu if n.dra]
    if dra:
        from . import kubelet_dra

        dra_image = kubelet_dra.prepare(sw, progress)
    service = client.core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
    state = start(sim_dir, api_port, [n for n, _ in wanted], files, progress=progress, timeout=timeout,
                  private=private, extra_images=[image] if image else [], api_service=service,
                  gpus={n.name: p.gpu.count for n, p in gpu},
                  node_images=kubelet_faults.node_images(wanted, {"workloads": workloads} if image else {},
                                                         {n: [dra_image] for n in dra}))
    if gpu:
        (state_dir(Path(sim_dir)) / WORKLOAD_IMAGE_FILE).write_text(json.dumps(workload_image(workloads[1]).to_json()))
    clusternet.deploy(client, state, progress)
    client.wait_nodes_ready([n.name for n, _ in wanted], timeout=timeout)
    kubelet_faults.limit_pod_cpu(CGROUP / "cpu" / state.cgroup, wanted, progress)
    if gpu:
        _start_nfd_master(sim_dir, state, nfd, client)
        _create(client, [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": PLUGIN_NAMESPACE}},
                         *gfd_rbac()])
        for ds in (device_plugin_daemonset(image[1]), gfd_daemonset(image[1])):
            with contextlib.suppress(ApiException):
                client.apps.delete_namespaced_daemon_set(ds["metadata"]["name"], PLUGIN_NAMESPACE)
            client.apps.create_namespaced_daemon_set(PLUGIN_NAMESPACE, ds)
        if dra:
            kubelet_dra.deploy(client, sw, dra, dra_image[1], timeout, progress)
        crashed = _wait_gpu_nodes(client, {n.name for n, _ in gpu}, timeout, dra=set(dra))
        kubelet_faults.label_over_gfd(client, wanted, progress)
        kubelet_faults.tell_crashed(client, PLUGIN_NAMESPACE, crashed, progress)
    clusternet.wait(client, state, timeout)
    progress(f"{len(wanted)} kubelet node(s) Ready in {time.monotonic() - t0:.1f}s"
             + (f"; NVIDIA's device plugin and GFD advertise and label GPUs on {len(gpu)}" if gpu else "")
             + (f" (the device plugin crash-loops on {', '.join(sorted(crashed))})" if crashed else ""))


WORKLOAD_IMAGE_FILE = "workload-image.json"


def workload_image(name: str):
    """How gpuproof's workload pods run on kubelet nodes: the workloads image (NVIDIA's mock NVML), the host's
    ``/usr``, Python and virtualenv read-only at their own paths (the interpreter this process runs, so the pods
    have torch, nvidia-ml-py and locust exactly as this host does), and the node's mock NVML config, where the
    NVIDIA container toolkit would give a real node's driver (the host's ``/usr`` at ``/host/usr``: the image's
    own ``/usr`` takes what NVIDIA's CDI injection mounts there). The workloads take their CPU path (``device``):
    NVML answers for the node's GPUs, CUDA has none."""
    from ..images import Image

    import sysconfig

    from .images import HOST_USR

    python = [sys.base_prefix, sys.prefix]
    if os.path.realpath(sys.base_prefix).startswith("/usr"):    # a distribution's Python: its files under /usr
        python = [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
                  os.path.realpath(sys.executable), sys.prefix]
    paths = list(dict.fromkeys(os.path.realpath(p) for p in python))
    host = [("/usr", HOST_USR)] + [(p, p) for p in paths if not any(p.startswith(q + "/") for q in paths)]
    return Image(name, host_paths=tuple(host), node_paths=((f"/var/lib/{NODE_FILES}", NODE_FILES_IN_POD),),
                 env=(("PATH", f"{os.path.realpath(sys.prefix)}/bin:/usr/bin:/bin"),
                      ("MOCK_NVML_CONFIG", MOCK_CONFIG_IN_POD), ("PYTHONNOUSERSITE", "1")),
                 pull_policy="Never", device="cpu")


def lent_image(sim_dir: Path):
    """The workload image this cluster's kubelet nodes lend (None: no kubelet GPU nodes)."""
    from ..images import Image

    f = state_dir(Path(sim_dir)) / WORKLOAD_IMAGE_FILE
    return Image.from_json(json.loads(f.read_text())) if f.exists() else None


def lent_image_of_kubeconfig(kubeconfig: str | None):
    """The workload image of the embedded cluster whose kubeconfig this is (``gpuproof sim up`` writes it into the
    cluster's folder, beside its kubelet nodes' state), so a run that reaches it through ``--kubeconfig`` runs its
    pods as ``--fleet`` does; None for any other cluster's kubeconfig."""
    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or "~/.kube/config"
    try:
        folder = Path(path).expanduser().resolve().parent
        return lent_image(folder)
    except (OSError, ValueError, KeyError):
        return None


def _wait_gpu_nodes(client, names: set[str], timeout: float, dra: set[str] = frozenset()) -> set[str]:
    """Until every GPU node has GFD's labels (through NFD's master) and, unless ``dra`` names it (NVIDIA's DRA
    driver offers its GPUs) or its device plugin crash-loops, the device plugin's resources. Returns the nodes whose
    device plugin crash-loops (:func:`kubelet_faults.crashed_device_plugins`, asked while a node does not advertise)."""
    from ..cluster.api import watch_until

    crashed: set[str] = set()

    def done(node) -> bool:
        return "nvidia.com/gpu.product" in (node.metadata.labels or {}) and (node.metadata.name in dra | crashed or any(
            k.startswith("nvidia.com/") and v not in ("0", 0) for k, v in (node.status.allocatable or {}).items()))

    def all_done(cache: dict) -> bool:
        crashed.update(kubelet_faults.crashed_device_plugins(
            client, PLUGIN_NAMESPACE, {n for n in names - dra if n not in cache or not done(cache[n])}))
        return all(n in cache and done(cache[n]) for n in names)

    watch_until(client.core.list_node, all_done, timeout,
                f"NVIDIA's device plugin to advertise GPUs and GFD's labels on {len(names)} kubelet node(s)",
                tick=kubelet_faults.CRASH_TICK)
    return crashed


# ---------------------------------------------------------------------------- the reaper


_REAPER_PIPES: list[int] = []


def _spawn_reaper(sim_dir: Path) -> None:
    """A process that waits for this one to end (the pipe's write end closes, even on SIGKILL), then stops
    the nodes. When :func:`stop` ran first, it finds nothing and exits."""
    r, w = os.pipe()
    subprocess.Popen([sys.executable, "-m", __name__, "reap", str(sim_dir)], stdin=r, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    os.close(r)
    _REAPER_PIPES.append(w)


def _reap(sim_dir: str) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.read(0, 1)                               # returns when the owner is gone
    stop(Path(sim_dir))


if __name__ == "__main__" and sys.argv[1:2] == ["reap"]:
    _reap(sys.argv[2])

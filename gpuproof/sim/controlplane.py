"""Run the embedded cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler
and the kwok controller as local processes on 127.0.0.1, plus the fleet's Node objects.

Long: starts, checks and stops the control plane's processes in one order; split, that order would scatter.

Why our own launcher rather than ``kwokctl --runtime binary``: kwokctl downloads its
binaries and keeps its own state layout; we need the pinned binaries we built, a
loopback-only bind, a clear error for each port in use, and to swap the fleet (and
the stages that depend on it) without a restart of the control plane.

State lives in one folder (default ``~/.cache/gpuproof/sim/<name>``): ``state.json``,
``kubeconfig``, ``pki/``, ``logs/``, ``etcd/``. Processes run in their own sessions, so
``gpuproof sim up`` can return and leave the cluster running; ``gpuproof sim down``
(or :meth:`SimCluster.down`) stops them.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

import yaml

from ..errors import ControlPlaneError
from ..vocab import SIMULATED
from .fleet import KWOK_ANNOTATION, KWOK_MANAGED, ControlPlane, Fleet, kwok_managed
from . import binaries as _binaries
from . import replay
from .pki import FRONT_PROXY_CLIENT, make_pki
from .stages import kwok_config

DEFAULT_PORT = 16443
# offsets from the base port
PORTS = {"kube-apiserver": 0, "etcd": 1, "etcd-peer": 2, "kube-controller-manager": 3, "kube-scheduler": 4,
         "kwok": 5}
START_ORDER = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
CONTEXT = "gpuproof-sim"
NODE_LEASE_S = 40         # a kubelet's default node lease: renewed every 10 s

Progress = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


def default_state_dir(name: str = "default") -> Path:
    return _binaries.cache_root() / "sim" / name


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


# lock files of the base ports chosen by find_free_base, one per base, shared by every process of the machine
PORT_LOCKS = Path("/tmp/gpuproof-ports")
_held_bases: dict[int, int] = {}       # base port -> the open lock file this process holds it by, until it exits


def _reserve(base: int) -> bool:
    """Hold ``base``'s lock file (an flock, let go when this process exits). Seconds pass between choosing a base and
    etcd binding its ports: two sessions choosing then found the same ports free and the later etcd could not bind
    (a CI run: "bind: address already in use"). False when another process, or this one, holds it already."""
    try:
        PORT_LOCKS.mkdir(exist_ok=True)
        with contextlib.suppress(OSError):
            PORT_LOCKS.chmod(0o1777)                # any user's sessions share the folder
        fd = os.open(PORT_LOCKS / f"{base}.lock", os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return True                                 # no lock folder: the ports alone decide, as before
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _held_bases[base] = fd
    return True


def _release(base: int) -> None:
    fd = _held_bases.pop(base, None)
    if fd is not None:
        os.close(fd)


def find_free_base(start: int = 20000, stop: int = 30000, step: int = 10) -> int:
    """A base port whose six ports are all free and that no other session has chosen (for private clusters in
    tests, ``--sim-port auto``): its lock file (:func:`_reserve`) is held until this process exits."""
    pid_offset = (os.getpid() % 500) * step       # parallel test sessions start in different places
    for i in range(0, stop - start, step):
        base = start + (pid_offset + i) % (stop - start)
        if not _reserve(base):
            continue
        if all(port_free(base + off) for off in PORTS.values()):
            return base
        _release(base)
    raise ControlPlaneError(f"no six free ports found on 127.0.0.1 between {start} and {stop}")


def _held_ports(base: int) -> list[str]:
    """The cluster's ports on ``base`` that cannot be bound now, as 'port (component)'."""
    return [f"{base + off} ({name})" for name, off in PORTS.items() if not port_free(base + off)]


def _state(stat: str) -> str:
    """The state letter of a /proc/<pid>/stat (or task stat) line: R, S, D, Z, X, ..."""
    return stat.rsplit(")", 1)[1].split()[0]


def _alive(pid: int, exe: str) -> bool:
    """True when pid runs and is the binary we started (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return _state(stat) != "Z" and os.path.basename(cmdline) == os.path.basename(exe)


@dataclasses.dataclass
class State:
    base_port: int
    pids: dict[str, int]
    exes: dict[str, str]
    fleet: str = ""
    fleet_name: str = ""
    started: float = 0.0
    kube_version: str = ""
    control_plane: str = "|"        # ControlPlane.key() of the settings the processes run with

    @property
    def api_url(self) -> str:
        return f"https://127.0.0.1:{self.base_port}"


class SimCluster:
    """One embedded cluster, identified by its state folder."""

    def __init__(self, state_dir: str | os.PathLike | None = None, base_port: int | None = None,
                 private: bool = False, node_lease_s: int = NODE_LEASE_S):
        """private: the cluster belongs to this process (a test session) and dies with it, even on SIGKILL.
        node_lease_s: the Lease kwok's nodes hold (renewed every quarter of it, as a kubelet renews its own); longer
        than the default, the node lifecycle controller's grace period is as long (benchmarks/scale_kwok.py)."""
        self.dir = Path(state_dir) if state_dir else default_state_dir()
        self.base_port = base_port
        self.private = private
        self.node_lease_s = node_lease_s
        self._control_plane = ControlPlane()
        self._procs: dict[str, subprocess.Popen] = {}     # children this object spawned

    # ------------------------------------------------------------------ paths

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def state_file(self) -> Path:
        return self.dir / "state.json"

    def log(self, component: str) -> Path:
        return self.dir / "logs" / f"{component}.log"

    def load_state(self) -> State | None:
        try:
            return State(**json.loads(self.state_file.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def _save_state(self, state: State) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(state), indent=2))
        tmp.replace(self.state_file)

    # ------------------------------------------------------------------ status

    def status(self) -> dict:
        """What runs, per component; ``running`` is True only when every component is up."""
        state = self.load_state()
        if state is None:
            return {"running": False, "state_dir": str(self.dir), "components": {}}
        comps = {c: ("running" if _alive(state.pids.get(c, -1), state.exes.get(c, c)) else "dead")
                 for c in START_ORDER}
        healthy = all(v == "running" for v in comps.values()) and self._api_ready(state, timeout=3)
        return {"running": healthy, "state_dir": str(self.dir), "components": comps,
                "kubeconfig": str(self.kubeconfig), "api": state.api_url, "fleet": state.fleet,
                "kubernetes_version": state.kube_version,
                "uptime_s": round(time.time() - state.started, 1) if state.started else None}

    # ------------------------------------------------------------------ up / down

    def up(self, fleet: Fleet | None = None, progress: Progress = _quiet, timeout: float = 180.0,
           binaries: _binaries.Binaries | None = None) -> Path:
        """Start the cluster (or keep the one running) and load the fleet. Returns the kubeconfig path."""
        current = self.status()
        if current["running"]:
            state = self.load_state()
            progress(f"embedded cluster already running ({state.api_url}); kubeconfig {self.kubeconfig}")
            if fleet is not None and fleet.control_plane.key() != state.control_plane:
                progress("the running cluster has other control-plane settings than this fleet: restarting it")
                self.down(progress=_quiet)
                return self.up(fleet, progress=progress, timeout=timeout, binaries=binaries)
            if fleet is not None and state.fleet != (fleet.source or fleet.name):
                self.load_fleet(fleet, progress=progress, timeout=timeout)
            return self.kubeconfig
        base = self.base_port or DEFAULT_PORT
        if current["components"]:
            progress("cleaning up a dead or partial embedded cluster left from an earlier run")
            old = self.load_state()
            self.down(progress=_quiet)
            if old is not None and old.base_port == base:
                _wait_ports_released(base, progress)

        bins = binaries or _binaries.locate(progress=progress)
        busy = _held_ports(base)
        if busy:
            raise ControlPlaneError(
                f"port {', '.join(busy)} on 127.0.0.1 is in use by another process, so the embedded cluster "
                f"cannot start on base port {base} (it uses ports {base}-{base + 5}). Stop that process, or pick "
                f"another base port: --port of `gpuproof sim up`, --sim-port under pytest (`auto`: a free one).")

        deadline = time.monotonic() + timeout
        t0 = time.monotonic()
        shutil.rmtree(self.dir, ignore_errors=True)
        (self.dir / "logs").mkdir(parents=True)
        pki = make_pki(self.dir / "pki")
        self._write_kubeconfig(base, pki)
        cp = fleet.control_plane if fleet is not None else ControlPlane()
        state = State(base_port=base, pids={}, exes={}, started=time.time(),
                      kube_version=_binaries.version_of(bins["kube-apiserver"]), control_plane=cp.key())
        (self.dir / "kwok.yaml").write_text(kwok_config(fleet))
        self._write_scheduler_config(cp)
        self._control_plane = cp
        try:
            for comp in START_ORDER:
                progress(f"starting {comp}")
                proc = self._spawn(comp, self._args(comp, bins, base, pki))
                state.pids[comp] = proc.pid
                state.exes[comp] = str(bins[comp])
                self._save_state(state)
                self._wait_healthy(comp, state, deadline)
            progress(f"control plane ready in {time.monotonic() - t0:.1f}s ({state.api_url})")
            if fleet is not None:
                self.load_fleet(fleet, progress=progress, timeout=max(deadline - time.monotonic(), 30))
        except BaseException:
            self.down(progress=_quiet)
            raise
        return self.kubeconfig

    def workload_image(self):
        """The image (a :class:`gpuproof.bench.workloads.Image`) gpuproof's workload pods run in on this cluster's
        kubelet GPU nodes; None when it has none (its kwok nodes run no pods)."""
        from . import kubelet

        return kubelet.lent_image(self.dir)

    def down(self, progress: Progress = _quiet, keep_logs: bool = False) -> bool:
        """Stop every component and remove the state folder. Returns False if nothing was there."""
        state = self.load_state()
        if state is None and not self.dir.exists():
            return False
        from . import kubelet

        kubelet.stop(self.dir, progress=progress)
        if state is not None:
            for comp in reversed(START_ORDER):
                pid = state.pids.get(comp)
                if pid and _alive(pid, state.exes.get(comp, comp)):
                    progress(f"stopping {comp} (pid {pid})")
                    _terminate(pid, state.exes.get(comp, comp))
        if keep_logs:
            for sub in ("etcd", "pki"):
                shutil.rmtree(self.dir / sub, ignore_errors=True)
            self.state_file.unlink(missing_ok=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)
        return True

    def restart(self, comp: str = "kube-apiserver", timeout: float = 120.0,
                control_plane: ControlPlane | None = None) -> int:
        """Start one component again with the arguments it ran with, stopping it first if it still runs (killed or
        paused by a test: gpuproof's own fault tests, issue #41 item 7); with ``control_plane``, with those settings
        (an inflight limit lowered, or put back). Returns its new pid once it reports healthy."""
        state = self.load_state()
        if state is None:
            raise ControlPlaneError("the embedded cluster is not running")
        if control_plane is not None:
            self._control_plane, state.control_plane = control_plane, control_plane.key()
            if comp == "kube-scheduler":         # its plugins are in its config file: written anew
                self._write_scheduler_config(control_plane)
        pid, exe = state.pids.get(comp), state.exes[comp]
        if pid and _alive(pid, exe):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)          # a paused process hears SIGTERM only once it runs again
            _terminate(pid, exe)
        old = self._procs.get(comp)
        if old is not None and old.pid == pid:
            with contextlib.suppress(subprocess.TimeoutExpired):
                old.wait(timeout=10)                  # our child: reap it
        bins = _binaries.Binaries({k: Path(v) for k, v in state.exes.items()}, {})
        proc = self._spawn(comp, self._args(comp, bins, state.base_port, None))
        state.pids[comp] = proc.pid
        self._save_state(state)
        self._wait_healthy(comp, state, time.monotonic() + timeout)
        return proc.pid

    # ------------------------------------------------------------------ fleet

    def load_fleet(self, fleet: Fleet, progress: Progress = _quiet, timeout: float = 120.0) -> None:
        """Replace the simulated nodes with the fleet's, and restart kwok with the fleet's stages."""
        from ..cluster.api import connect  # local import: kubernetes client is slow to import

        state = self.load_state()
        if state is None:
            raise ControlPlaneError("the embedded cluster is not running")
        if fleet.control_plane.key() != state.control_plane:
            raise ControlPlaneError(
                f"fleet {fleet.name!r} needs other control-plane settings than the running cluster has; "
                "stop it (gpuproof sim down) and start it with this fleet")
        t0 = time.monotonic()
        nodes = fleet.node_objects(progress=progress)     # NVIDIA's GFD and device plugin, before anything changes
        client = connect(kubeconfig=str(self.kubeconfig))
        core = client.core
        old = [n.metadata.name for n in core.list_node().items
               if (n.metadata.annotations or {}).get(KWOK_ANNOTATION) in (*SIMULATED, *KWOK_MANAGED)]
        if old:
            progress(f"removing {len(old)} simulated nodes of the previous fleet")
            _parallel(lambda name: _ignore_404(core.delete_node, name), old)
        # replay nodes: the API server reads their pods' logs from kwok's server, which serves the recordings
        shutil.rmtree(self.dir / "replay", ignore_errors=True)
        logs = replay.node_logs(fleet, self.dir / "replay")
        nodes = [replay.node_endpoint(n, state.base_port + PORTS["kwok"]) if replay.is_replay(n) else n
                 for n in nodes]
        # kwok reads its stages (and logs) once, at start: restart it with this fleet's
        (self.dir / "kwok.yaml").write_text(kwok_config(fleet, logs))
        pid = state.pids.get("kwok")
        if pid and _alive(pid, state.exes["kwok"]):
            _terminate(pid, state.exes["kwok"])
        bins = _binaries.Binaries({k: Path(v) for k, v in state.exes.items()}, {})
        proc = self._spawn("kwok", self._args("kwok", bins, state.base_port, None))
        state.pids["kwok"] = proc.pid
        state.fleet, state.fleet_name = fleet.source or fleet.name, fleet.name
        self._save_state(state)
        self._wait_healthy("kwok", state, time.monotonic() + 60)

        progress(f"creating {len(nodes)} simulated nodes for fleet {fleet.name!r}")
        _parallel(core.create_node, nodes)
        client.wait_nodes_ready([n["metadata"]["name"] for n in nodes if kwok_managed(n)], timeout=timeout)
        from . import operator

        operator.apply(client, nodes, timeout=timeout, progress=progress)
        replay.apply_stand_ins(client, nodes, timeout=timeout, progress=progress)
        publish_dra(client, fleet, str(self.kubeconfig), progress=progress)
        from . import kubelet    # the fleet's kubelet pools: real nodes that register themselves

        kubelet.load(self.dir, state.base_port, fleet, client, progress=progress, timeout=timeout, private=self.private)
        progress(f"fleet {fleet.name!r}: {len(nodes)} nodes Ready in {time.monotonic() - t0:.1f}s")

    # ------------------------------------------------------------------ internals

    def _write_kubeconfig(self, base: int, pki: dict[str, Path]) -> None:
        cfg = {
            "apiVersion": "v1", "kind": "Config", "current-context": CONTEXT,
            "clusters": [{"name": CONTEXT, "cluster": {"server": f"https://127.0.0.1:{base}",
                                                       "certificate-authority": str(pki["ca.crt"])}}],
            "users": [{"name": "gpuproof-admin", "user": {"client-certificate": str(pki["admin.crt"]),
                                                          "client-key": str(pki["admin.key"])}}],
            "contexts": [{"name": CONTEXT, "context": {"cluster": CONTEXT, "user": "gpuproof-admin"}}],
        }
        self.kubeconfig.write_text(yaml.safe_dump(cfg, sort_keys=False))
        self.kubeconfig.chmod(0o600)

    def _args(self, comp: str, bins, base: int, pki: dict[str, Path] | None) -> list[str]:
        p = {name: base + off for name, off in PORTS.items()}
        pk = self.dir / "pki"
        kc = str(self.kubeconfig)
        exe = str(bins[comp])
        if comp == "etcd":
            return [exe, "--name=gpuproof", f"--data-dir={self.dir / 'etcd'}",
                    f"--listen-client-urls=http://127.0.0.1:{p['etcd']}",
                    f"--advertise-client-urls=http://127.0.0.1:{p['etcd']}",
                    f"--listen-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                    f"--initial-advertise-peer-urls=http://127.0.0.1:{p['etcd-peer']}",
                    f"--initial-cluster=gpuproof=http://127.0.0.1:{p['etcd-peer']}",
                    "--unsafe-no-fsync=true", "--quota-backend-bytes=4294967296", "--log-level=warn"]
        if comp == "kube-apiserver":
            return [exe, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                    f"--secure-port={p['kube-apiserver']}",
                    f"--etcd-servers=http://127.0.0.1:{p['etcd']}",
                    f"--tls-cert-file={pk / 'apiserver.crt'}", f"--tls-private-key-file={pk / 'apiserver.key'}",
                    f"--client-ca-file={pk / 'ca.crt'}",
                    f"--service-account-key-file={pk / 'sa.pub'}",
                    f"--service-account-signing-key-file={pk / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                    "--service-cluster-ip-range=10.96.0.0/16",
                    "--authorization-mode=Node,RBAC",
                    "--enable-admission-plugins=" + ",".join(
                        p for p in ("NodeRestriction", "ResourceQuota", "LimitRanger", "Priority")
                        if p not in self._control_plane.disable_admission_plugins),
                    *([f"--disable-admission-plugins={','.join(self._control_plane.disable_admission_plugins)}"]
                      if self._control_plane.disable_admission_plugins else []),
                    "--kubelet-preferred-address-types=InternalIP,Hostname",   # kubelet nodes' names do not resolve
                    # webhooks and aggregated APIs at their Services' endpoints: the host routes no Service range
                    # (gpuproof.sim.platform)
                    "--enable-aggregator-routing=true",
                    f"--requestheader-client-ca-file={pk / 'front-proxy-ca.crt'}",
                    f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
                    "--requestheader-username-headers=X-Remote-User", "--requestheader-group-headers=X-Remote-Group",
                    "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                    f"--proxy-client-cert-file={pk / 'front-proxy-client.crt'}",
                    f"--proxy-client-key-file={pk / 'front-proxy-client.key'}",
                    *(["--enable-priority-and-fairness=false",       # the limit itself answers 429 (fleet.ControlPlane)
                       f"--max-requests-inflight={self._control_plane.max_requests_inflight}",
                       f"--max-mutating-requests-inflight={self._control_plane.max_requests_inflight}"]
                      if self._control_plane.max_requests_inflight else []),
                    *self._control_plane.gates_flag(), *self._control_plane.runtime_config(),
                    "--allow-privileged=true", "--profiling=false", "--v=1"]
        if comp in ("kube-controller-manager", "kube-scheduler"):
            args = [exe, f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}",
                    f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1",
                    f"--secure-port={p[comp]}", "--leader-elect=false", "--profiling=false", "--v=1"]
            if comp == "kube-scheduler":
                return [exe, f"--config={self.dir / 'scheduler.yaml'}", f"--authentication-kubeconfig={kc}",
                        f"--authorization-kubeconfig={kc}", "--bind-address=127.0.0.1", f"--secure-port={p[comp]}",
                        *self._control_plane.gates_flag(), "--profiling=false", "--v=1"]
            if comp == "kube-controller-manager":
                args += [f"--service-account-private-key-file={pk / 'sa.key'}", f"--root-ca-file={pk / 'ca.crt'}",
                         f"--cluster-signing-cert-file={pk / 'ca.crt'}",
                         f"--cluster-signing-key-file={pk / 'ca.key'}",
                         "--use-service-account-credentials=false", "--concurrent-gc-syncs=20",
                         "--kube-api-qps=200", "--kube-api-burst=400", *self._control_plane.gates_flag()]
                if self.node_lease_s > NODE_LEASE_S:
                    args.append(f"--node-monitor-grace-period={self.node_lease_s}s")
            return args
        if comp == "kwok":
            # a serving certificate: the API server reads replay pods' logs from kwok's server over HTTPS (it
            # verifies no kubelet certificate); kwok then serves HTTPS and HTTP (its /healthz) on one address
            return [exe, f"--kubeconfig={kc}", f"--config={self.dir / 'kwok.yaml'}",
                    "--manage-all-nodes=false",
                    f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION} in ({','.join(KWOK_MANAGED)})",
                    f"--tls-cert-file={pk / 'apiserver.crt'}", f"--tls-private-key-file={pk / 'apiserver.key'}",
                    f"--server-address=127.0.0.1:{p['kwok']}", f"--node-lease-duration-seconds={self.node_lease_s}",
                    "--cidr=10.244.0.0/16", "--node-ip=10.240.0.1"]
        raise ValueError(comp)

    def _write_scheduler_config(self, cp: ControlPlane) -> None:
        profile: dict = {"schedulerName": "default-scheduler"}
        if cp.disable_scheduler_plugins:
            profile["plugins"] = {"multiPoint": {"disabled": [{"name": n} for n in cp.disable_scheduler_plugins]}}
        cfg = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
               "clientConnection": {"kubeconfig": str(self.kubeconfig), "qps": 200, "burst": 400},
               "leaderElection": {"leaderElect": False}, "profiles": [profile]}
        (self.dir / "scheduler.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))

    def _spawn(self, comp: str, args: list[str]) -> subprocess.Popen:
        log = open(self.log(comp), "ab")
        try:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, cwd=self.dir,
                                    preexec_fn=_die_with_parent if self.private else None)
        finally:
            log.close()
        self._procs[comp] = proc
        return proc

    def _running(self, comp: str, state: State) -> bool:
        # our own child: ask it (between fork and exec /proc still shows python's command line)
        proc = self._procs.get(comp)
        if proc is not None and proc.pid == state.pids.get(comp):
            return proc.poll() is None
        return _alive(state.pids[comp], state.exes[comp])

    def _wait_healthy(self, comp: str, state: State, deadline: float) -> None:
        base = state.base_port
        urls = {
            "etcd": f"http://127.0.0.1:{base + PORTS['etcd']}/health",
            "kube-apiserver": f"{state.api_url}/readyz",
            "kube-controller-manager": f"https://127.0.0.1:{base + PORTS['kube-controller-manager']}/healthz",
            "kube-scheduler": f"https://127.0.0.1:{base + PORTS['kube-scheduler']}/healthz",
            "kwok": f"http://127.0.0.1:{base + PORTS['kwok']}/healthz",
        }
        url = urls[comp]
        ctx = self._ssl_context(client=comp == "kube-apiserver")
        delay = 0.05
        last = ""
        while True:
            if not self._running(comp, state):
                raise ControlPlaneError(f"{comp} exited while starting. Last lines of {self.log(comp)}:\n"
                                        + _tail_file(self.log(comp)))
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx if url.startswith("https") else None) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                last = str(getattr(exc, "reason", exc))
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out waiting for {comp} to report healthy at {url} (last answer: "
                                        f"{last}). Last lines of {self.log(comp)}:\n" + _tail_file(self.log(comp)))
            # a component's health endpoint has no watch; poll it with a short, growing interval
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def _api_ready(self, state: State, timeout: float) -> bool:
        try:
            with urllib.request.urlopen(f"{state.api_url}/readyz", timeout=timeout,
                                        context=self._ssl_context(client=True)) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _ssl_context(self, client: bool) -> ssl.SSLContext:
        pk = self.dir / "pki"
        if client and (pk / "ca.crt").exists():
            ctx = ssl.create_default_context(cafile=str(pk / "ca.crt"))
            ctx.load_cert_chain(str(pk / "admin.crt"), str(pk / "admin.key"))
            return ctx
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE      # component self-signed health endpoints on loopback
        return ctx


def publish_dra(client, fleet: Fleet, kubeconfig: str, progress: Progress = _quiet) -> None:
    """Replace the DeviceClasses and ResourceSlices of the previous fleet's DRA pools with this fleet's.

    NVIDIA's DRA driver publishes them: its chart's DeviceClasses, and the slices its kubelet plugin
    publishes over each node's mock NVML (:mod:`gpuproof.sim.dradriver`). MIG devices, which the mock
    does not enumerate, and fleet faults in published slices are gpuproof's model, marked as such on
    the node (``gpuproof.dev/slices-by``). The real scheduler allocates claims, kwok runs the pods.
    """
    from kubernetes.client.exceptions import ApiException

    from ..vocab import DRA_GROUP, DRA_VERSION, SIM_DRA_LABEL
    from ..vocab import SLICES_BY
    from . import dradriver, gpunodes, nvidia

    custom = client.custom
    for plural in ("resourceslices", "deviceclasses"):
        with contextlib.suppress(ApiException):
            custom.delete_collection_cluster_custom_object(DRA_GROUP, DRA_VERSION, plural,
                                                           label_selector=f"{SIM_DRA_LABEL}=true")
    dradriver.delete_all(client)
    pools = [p for p in fleet.pools if p.dra]
    if not pools:
        return
    sw = nvidia.locate(progress=progress)
    sw.require_dra()
    wanted = fleet.device_classes
    classes = [c for c in dradriver.device_classes(sw) if wanted is None or c["metadata"]["name"] in wanted]
    for c in classes:
        custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "deviceclasses", c)
    pools = [p for p in pools if p.backend == "kwok"]     # on kubelet nodes the driver runs as pods (kubelet.dra)
    driven = [(name, gpunodes.mock_config(sw, p.gpu, seed=name, failures=p.nvml_failures(i)))
              for p in pools if not p.mig_enabled for i, name in enumerate(p.node_names())]
    outcome = dradriver.publish(sw, client, kubeconfig, driven, progress=progress)
    uids = {n.metadata.name: n.metadata.uid for n in client.core.list_node().items}
    modelled = [s for p in pools if p.mig_enabled for s in p.resource_slices(uids)]
    if modelled:
        progress(f"DRA: {len(modelled)} ResourceSlices of MIG devices are gpuproof's model (the mock enumerates none)")
        _parallel(lambda o: custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", o), modelled)
    by = {}
    for p in pools:
        for i, name in enumerate(p.node_names()):
            if p.mig_enabled:
                by[name] = f"{gpunodes.MODEL} (MIG devices: the mock enumerates none)"
                continue
            why = outcome.get(name, "")
            by[name] = sw.dra_driver if not why else f"{sw.dra_driver} (published nothing: {why})"
            if not why and dradriver.apply_faults(client, name, p.faults_for(i)):
                by[name] += f" + {gpunodes.MODEL} (fleet fault in the slice)"
    _parallel(lambda item: client.core.patch_node(item[0], {"metadata": {"annotations": {SLICES_BY: item[1]}}}),
              list(by.items()))


def _die_with_parent() -> None:
    """In the child before exec: be killed when the parent dies (Linux prctl PR_SET_PDEATHSIG).

    SIGKILL, not SIGTERM: the apiserver's graceful shutdown stalls once etcd is gone, and a private
    cluster's state is thrown away anyway.
    """
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # 1 = PR_SET_PDEATHSIG


def _threads_left(pid: int) -> bool:
    """True while any thread of pid has not exited. A Go program's leader thread can read `Z` while its
    other threads still run and hold its listening sockets; only when they are gone are its ports free."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            state = _state(Path(f"/proc/{pid}/task/{tid}/stat").read_text())
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X"):
            return True
    return False


def _terminate(pid: int, exe: str, grace: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    delay = 0.02
    while _alive(pid, exe) or (_threads_left(pid) and time.monotonic() < deadline + 5):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(delay)          # waiting for a process we do not parent to exit: poll /proc
        delay = min(delay * 2, 0.2)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _wait_ports_released(base: int, progress: Progress, within: float = 10.0) -> None:
    """After stopping a leftover cluster on these ports: wait (at most `within` s) until the kernel has
    released them; what is still held after that belongs to someone else and `up` names it."""
    deadline = time.monotonic() + within
    said = False
    delay = 0.02
    while time.monotonic() < deadline:
        held = _held_ports(base)
        if not held:
            return
        if not said:
            progress(f"waiting up to {within:.0f} s for the stopped cluster's ports to be released: {', '.join(held)}")
            said = True
        time.sleep(delay)          # no event tells when a socket closes in another process: poll the bind
        delay = min(delay * 2, 0.2)


def _tail_file(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _ignore_404(fn, *args):
    from kubernetes.client.exceptions import ApiException

    try:
        return fn(*args)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _parallel(fn, items, workers: int = 16):
    with cf.ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(fn, items):
            pass

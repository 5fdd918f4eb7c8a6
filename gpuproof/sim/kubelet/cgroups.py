"""The nodes' cgroups: everything of node ``n`` runs under ``/gpuproof-<id>/<n>`` in every v1 hierarchy (cgroupfs
driver), the kubelet's ``cgroupRoot`` and the daemons' own group alike, so stopping the nodes kills exactly the
processes in them (:func:`kill_all`) and leaves no group behind (:func:`remove`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Callable

from ...errors import ControlPlaneError
from .layout import State

CGROUP = Path("/sys/fs/cgroup")
CGROUP_V1 = ("cpu", "cpuacct", "cpuset", "memory", "devices", "freezer", "blkio", "pids", "systemd", "unified")


def dirs(state: State, sub: str = "") -> list[Path]:
    """The cluster's group (or ``sub`` in it) in every hierarchy this host has."""
    return [CGROUP / h / state.cgroup / sub for h in CGROUP_V1 if (CGROUP / h).is_dir()]


def make(state: State, sub: str) -> None:
    """Make the group ``sub`` of the cluster's group in every hierarchy."""
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


SHARES_MAX = 262144                     # cgroup v1's largest cpu.shares


def weigh(state: State, nodes: int) -> int:
    """Give the cluster's group, in the cpu hierarchy, the CPU weight of one busy process of the host per node (1024
    shares per node). Left at the default, all the nodes together weighed as one process, and the host's other work
    (a CI's test workers, Go builds) squeezed every node's pods towards a node held back on purpose
    (tests/test_slow_node.py). More than a process per node would starve the host's own processes in turn (a load
    generator's sends then ran late: tests/test_workloads_inference.py). Returns the shares written (0 where there is
    no cpu hierarchy)."""
    path = CGROUP / "cpu" / state.cgroup / "cpu.shares"
    if not path.exists():
        return 0
    shares = min(SHARES_MAX, 1024 * max(1, nodes))
    path.write_text(str(shares))
    return shares


def join(state: State, sub: str) -> Callable[[], None]:
    """A preexec function that moves the child into the node's group in every hierarchy."""
    procs = [d / "cgroup.procs" for d in dirs(state, sub)]

    def enter() -> None:
        for p in procs:
            p.write_text("0")
    return enter


def subgroups(d: Path) -> list[Path]:
    """``d`` and every cgroup under it, deepest first. Groups that vanish while they are listed (a container's,
    removed as its processes die) are passed over: ``os.walk`` ignores a directory it cannot list, where
    ``Path.rglob`` raises."""
    found = [Path(top) for top, _, _ in os.walk(d)]
    return sorted(found, key=lambda p: -len(p.parts))


def pids(state: State) -> set[int]:
    """Every process in the cluster's groups."""
    out: set[int] = set()
    for d in dirs(state):
        for group in subgroups(d):
            with contextlib.suppress(OSError, ValueError):
                out.update(int(x) for x in (group / "cgroup.procs").read_text().split())
    return out


def kill_all(state: State, timeout: float = 30.0) -> None:
    """SIGKILL every process in the nodes' cgroups (daemons, shims, containers) until none is left."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        left = pids(state) | {p for p in state.pids.values() if Path(f"/proc/{p}").exists()}
        left.discard(os.getpid())
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"kubelet nodes: processes {sorted(left)} would not die")
        time.sleep(delay)          # waiting for the kernel to finish killing: poll the cgroups
        delay = min(delay * 2, 0.2)


def remove(state: State) -> None:
    """Remove the cluster's groups, deepest first (their processes are gone: :func:`kill_all`)."""
    for d in dirs(state):
        for sub in subgroups(d):
            with contextlib.suppress(OSError):
                sub.rmdir()

"""What a kubelet node needs of this host: root, cgroup v1 hierarchies, containerd and the tools around it, the CNI
plugins. :func:`missing` says what is lacking in one line ('' when nothing is)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from .cgroups import CGROUP

CNI_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
TOOLS = ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "ip", "iptables", "nsenter", "unshare")


def missing() -> str:
    """Why kubelet nodes cannot run on this machine ('' when they can): one line."""
    lacks = []
    if os.geteuid() != 0:
        lacks.append("root (network and mount namespaces, cgroups, iptables)")
    if not (CGROUP / "memory" / "cgroup.procs").exists():
        lacks.append("cgroup v1 hierarchies under /sys/fs/cgroup (cgroup v2 is not supported yet)")
    tools = [t for t in TOOLS if not shutil.which(t)]
    if not cni_dir():
        tools.append("CNI plugins (bridge, host-local, loopback, portmap)")
    if tools:
        lacks.append(", ".join(tools) + " (Debian: apt-get install containerd runc containernetworking-plugins "
                                        "iptables)")
    return "kubelet nodes need " + "; ".join(lacks) if lacks else ""


def cni_dir() -> str:
    """The folder of the host's CNI plugins ('' when none holds them)."""
    return next((d for d in CNI_DIRS if all(Path(d, p).exists() for p in ("bridge", "host-local", "loopback"))), "")

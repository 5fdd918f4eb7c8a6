"""What a kubelet node needs of this host: root, cgroup v1 hierarchies and the tools around its runtime (containerd,
runc and the CNI plugins are gpuproof's own: :mod:`.runtime`). :func:`missing` says what is lacking in one line
('' when nothing is)."""

from __future__ import annotations

import os
import shutil

from .cgroups import CGROUP

TOOLS = ("ip", "iptables", "nsenter", "unshare")


def missing() -> str:
    """Why kubelet nodes cannot run on this machine ('' when they can): one line."""
    lacks = []
    if os.geteuid() != 0:
        lacks.append("root (network and mount namespaces, cgroups, iptables)")
    if not (CGROUP / "memory" / "cgroup.procs").exists():
        lacks.append("cgroup v1 hierarchies under /sys/fs/cgroup (cgroup v2 is not supported yet)")
    tools = [t for t in TOOLS if not shutil.which(t)]
    if tools:
        lacks.append(", ".join(tools) + " (Debian: apt-get install iproute2 iptables util-linux)")
    return "kubelet nodes need " + "; ".join(lacks) if lacks else ""


"""A kubelet node's container runtime, built from pinned Go modules like the rest of the embedded cluster, so a
machine needs none of it installed (issue #42: a GPU host with no containerd, a bundle that carries everything):
containerd 1.7 and ``ctr`` as one executable (``controlplane/containerd``'s ``gpuproof-containerd``, hard-linked
under both names) with the runc shim beside it (CDI on DRA nodes, :mod:`.dra`), runc and the CNI plugins the nodes'
network uses (``controlplane/noderuntime``).

runc is built static (cgo for its ``nsenter``; glibc and libseccomp linked in: containerd 1.7 gives every pod
sandbox the runtime's default seccomp profile, so runc must apply one), as runc's own release builds are, so the
same file runs on any x86-64 Linux a bundle reaches; building it needs libseccomp's static library and pkg-config
(Debian: libseccomp-dev pkg-config, which ``setup.sh`` installs). The shim and NVIDIA's container toolkit find
``runc`` on PATH: containerd runs with the runtime's folders first on its PATH, and its children inherit it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from .. import binaries as _binaries

Progress = Callable[[str], None]

CONTAINERD_VERSION = "v1.7.36"            # newest 1.7 the module proxy serves (v1.7.37 and later: 403)
CONTAINERD = ("containerd", "github.com/containerd/containerd")
CONTAINERD_MULTICALL = ("gpuproof-containerd", "./cmd/gpuproof-containerd")     # executable, package
CONTAINERD_SERVES = ("containerd", "ctr")                  # its names (hard links in its folder)
CONTAINERD_SHIM = ("containerd-shim-runc-v2", f"{CONTAINERD[1]}/cmd/containerd-shim-runc-v2")
CONTAINERD_BINARIES = (CONTAINERD_MULTICALL[0], CONTAINERD_SHIM[0])      # the files built
# static (no cgo): the same file on any host; no btrfs (its cgo headers)
CONTAINERD_ENV = {"CGO_ENABLED": "0", "GOFLAGS": "-buildvcs=false -tags=urfave_cli_no_docs,no_btrfs"}
CONTAINERD_LDFLAGS = f"-s -w -X {CONTAINERD[1]}/version.Version={CONTAINERD_VERSION}"

RUNTIME_MODULE = "noderuntime"
RUNC = ("runc", "github.com/opencontainers/runc")
RUNC_ENV = {"CGO_ENABLED": "1", "GOFLAGS": "-buildvcs=false -tags=urfave_cli_no_docs,seccomp,netgo,osusergo"}
RUNC_LDFLAGS = "-s -w -extldflags -static"
CNI_PLUGINS = {"bridge": "main/bridge", "host-local": "ipam/host-local", "loopback": "main/loopback",
               "portmap": "meta/portmap"}
CNI_MODULE = "github.com/containernetworking/plugins/plugins"
CNI_ENV = {"CGO_ENABLED": "0"}
CNI_LDFLAGS = "-s -w"


def _quiet(msg: str) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class NodeRuntime:
    """The folders of a node's runtime: containerd's (containerd, its shim, ctr), runc's, the CNI plugins'."""

    containerd_dir: Path
    runc_dir: Path
    cni_dir: Path

    @property
    def containerd(self) -> Path:
        return self.containerd_dir / "containerd"

    @property
    def shim(self) -> Path:
        return self.containerd_dir / "containerd-shim-runc-v2"

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"

    @property
    def runc(self) -> Path:
        return self.runc_dir / "runc"

    def env(self) -> dict[str, str]:
        """containerd's environment: the runtime's folders first on PATH (the shim's runc, the toolkit's)."""
        return {**os.environ, "PATH": os.pathsep.join([str(self.containerd_dir), str(self.runc_dir),
                                                        os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")])}


# part -> (module, ldflags, env): what each part's cache folder is built and keyed with
_PARTS = {"containerd": (CONTAINERD[0], CONTAINERD_LDFLAGS, CONTAINERD_ENV),
          "runc": (RUNTIME_MODULE, RUNC_LDFLAGS, RUNC_ENV),
          "cni": (RUNTIME_MODULE, CNI_LDFLAGS, CNI_ENV)}


def _build(part: str, packages: dict[str, str], progress: Progress) -> Path:
    module, ldflags, env = _PARTS[part]
    return _binaries.go_build(module, packages, ldflags=ldflags, env=env, progress=progress)


def containerd_dir(progress: Progress = _quiet) -> Path:
    folder = _build("containerd", dict([CONTAINERD_MULTICALL, CONTAINERD_SHIM]), progress)
    for name in CONTAINERD_SERVES:
        link = folder / name
        if not link.exists():
            tmp = folder / f".{name}.link"
            tmp.unlink(missing_ok=True)
            os.link(folder / CONTAINERD_MULTICALL[0], tmp)
            tmp.replace(link)                   # atomic: a concurrent caller sees the link or none
    return folder


def runc_dir(progress: Progress = _quiet) -> Path:
    return _build("runc", {RUNC[0]: RUNC[1]}, progress)


def cni_dir(progress: Progress = _quiet) -> Path:
    return _build("cni", {n: f"{CNI_MODULE}/{p}" for n, p in CNI_PLUGINS.items()}, progress)


def locate(progress: Progress = _quiet) -> NodeRuntime:
    """The node runtime, built on first use (Go needed then; installed from a bundle, never)."""
    return NodeRuntime(containerd_dir(progress), runc_dir(progress), cni_dir(progress))


def folders() -> dict[str, Path]:
    """Where each part lives in the cache (what :func:`locate` finds, without building)."""
    return {part: _binaries.build_folder(module, ldflags, env) for part, (module, ldflags, env) in _PARTS.items()}

"""A kubelet node's containerd (1.7, with runc and the CNI plugins: :mod:`.runtime`; CDI on DRA nodes: :mod:`.dra`):
its config, and its start in the node's own network and mount namespace with the node's images imported.

The node's folder is bound over ``/var/lib``, ``/run`` and ``/var/log`` in that mount namespace, so containerd, the
kubelet (which joins the namespace), CNI and the device plugins use their default paths and every mount they make
dies with the namespace."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Callable

from ...errors import ControlPlaneError
from .host import _sh, _spawn
from .layout import Node, State
from .runtime import NodeRuntime


def containerd_config(cni_conf_dir: Path, pause: str, runtime: NodeRuntime,
                      cdi_spec_dirs: list[str] | None = None) -> str:
    """``runtime``: the shim's and the CNI plugins' folders; ``cdi_spec_dirs``: CDI on, reading specs there."""
    cdi = f"\n  enable_cdi = true\n  cdi_spec_dirs = {json.dumps(cdi_spec_dirs)}" if cdi_spec_dirs else ""
    shim = f'\n      runtime_path = "{runtime.shim}"'
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
    bin_dir = "{runtime.cni_dir}"
    conf_dir = "{cni_conf_dir}"
"""


def start(root: Path, state: State, n: Node, join: Callable[[], None], netns: str, runtime: NodeRuntime,
          tars: list[tuple[Path, str]], timeout: float) -> subprocess.Popen:
    """Start node ``n``'s containerd (of ``runtime``) from its folder ``root`` (``etc/containerd.toml``
    written); returns once it answers, ``tars`` imported."""
    from .. import images
    from ...images import PAUSE_IMAGE

    var_lib, run, etc, var_log = root / "var-lib", root / "run", root / "etc", root / "var-log"
    # shared inside the node's namespace (private to the host), as a real node's mounts are: the mount
    # propagation pods ask for (NVIDIA's DRA driver: Bidirectional, HostToContainer) needs it
    script = ('mount --bind "$1" /var/lib && mount --make-rshared /var/lib && mount --bind "$2" /run && '
              'mount --make-rshared /run && mount --bind "$3" /var/log && shift 3 && exec "$@"')
    # /var/log too: each kubelet removes the /var/log/pods folders of the pods it does not run (other nodes')
    sock = run / "containerd" / "containerd.sock"
    containerd = _spawn(root / "logs" / "containerd.log", join,
                        "nsenter", netns, "unshare", "--mount", "--propagation", "private", "sh", "-c", script,
                        "sh", str(var_lib), str(run), str(var_log),
                        str(runtime.containerd), "--config", str(etc / "containerd.toml"), env=runtime.env())
    state.pids[f"{n.name}/containerd"] = containerd.pid
    # inside the node's mount namespace: the host path of the socket may pass the 108-byte limit of a unix address
    ctr = ("nsenter", f"--mount=/proc/{containerd.pid}/ns/mnt", str(runtime.ctr),
           "--address", "/run/containerd/containerd.sock")
    _wait_for(lambda: sock.exists() and _sh(*ctr, "version", check=False).returncode == 0,
              timeout, f"containerd of kubelet node {n.name}", root / "logs" / "containerd.log", containerd)
    for tar, _ in tars:
        _sh(*ctr, "-n", "k8s.io", "images", "import", str(tar))
    # the suites' placeholder pods name the upstream pause image; the nodes reach no registry, so it is ours
    if PAUSE_IMAGE != images.PAUSE:
        _sh(*ctr, "-n", "k8s.io", "images", "tag", "--force", images.PAUSE, PAUSE_IMAGE)
    return containerd


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

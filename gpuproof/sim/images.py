"""Container images for the embedded cluster's kubelet nodes, built here without Docker.

Each image is an OCI image layout in a tar file (``oci-layout``, ``index.json``, ``blobs/sha256/...``):
one uncompressed layer written with :mod:`tarfile`, a config and a manifest, named in the index with
containerd's ``io.containerd.image.name`` annotation, so ``ctr -n k8s.io images import`` gives it its
full, registry-qualified name (the kubelet never pulls it: the name must already be in containerd).

- ``pause``: a static C program (``PAUSE_C``) that reaps children and waits for a signal;
- ``nvidia-node``: NVIDIA's device plugin and GPU Feature Discovery with NVIDIA's mock
  ``libnvidia-ml.so.1`` where ``dlopen`` finds it, plus the glibc files they link against;
- ``coredns``: CoreDNS's static binary (the cluster DNS of kubelet nodes, :mod:`gpuproof.sim.clusternet`);
- ``nvidia-dra-driver``: NVIDIA's DRA kubelet plugin and ``nvidia-cdi-hook`` (DRA nodes only,
  :mod:`gpuproof.sim.kubelet.dra`);
- ``workloads``: what gpuproof's workload pods run in on kubelet nodes: NVIDIA's mock ``libnvidia-ml.so.1``
  (where the NVIDIA container toolkit would put the driver's) and the mount points for the host's ``/usr``,
  Python and virtualenv, which the pods get read-only by hostPath (:func:`workload_runtime`).

Tarballs are cached in ``$GPUPROOF_CACHE/images/`` under a digest of their contents.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from ..errors import ControlPlaneError
from . import binaries as _binaries

REGISTRY = "gpuproof.local"
PAUSE = f"{REGISTRY}/pause:3.10"
LIB_DIR = "/usr/lib/x86_64-linux-gnu"

PAUSE_C = r"""
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
    struct sigaction s = {0}, r = {0};
    s.sa_handler = stop;
    r.sa_handler = reap;
    r.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGINT, &s, NULL);
    sigaction(SIGTERM, &s, NULL);
    sigaction(SIGCHLD, &r, NULL);
    for (;;) pause();
}
"""


def images_dir() -> Path:
    return _binaries.cache_root() / "images"


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _layer(files: dict[str, tuple[bytes, int]], links: dict[str, str]) -> bytes:
    """A reproducible tar layer: path -> (content, mode), plus symlinks path -> target."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent.relative_to("/")) for p in [*files, *links]} - {"."})
        for d in sorted({str(Path(*Path(x).parts[:i + 1])) for x in dirs for i in range(len(Path(x).parts))}):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for path, (data, mode) in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted(links.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buf.getvalue()


def write_oci(out: Path, name: str, layer: bytes, config: dict) -> Path:
    """Write an OCI image layout tar of one layer, named ``name`` for containerd's import."""
    cfg = json.dumps({"architecture": "amd64", "os": "linux", "config": config,
                      "rootfs": {"type": "layers", "diff_ids": [_sha(layer)]}}, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": _sha(cfg), "size": len(cfg)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": _sha(layer),
                    "size": len(layer)}]}, sort_keys=True).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": _sha(manifest), "size": len(manifest),
        "platform": {"architecture": "amd64", "os": "linux"},
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}).encode()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    with tarfile.open(tmp, "w") as tar:
        entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
        entries.update({f"blobs/sha256/{_sha(b)[7:]}": b for b in (layer, cfg, manifest)})
        for path, data in entries.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)
    return out


def _libs(paths: list[Path]) -> dict[str, Path]:
    """The shared libraries (and the dynamic loader) the given ELF files link against: image path -> host file."""
    out: dict[str, Path] = {}
    for p in paths:
        proc = subprocess.run(["ldd", str(p)], capture_output=True, text=True)
        for m in re.finditer(r"(?:=>\s*)?(/\S+)\s+\(0x", proc.stdout):
            out[m.group(1)] = Path(m.group(1)).resolve()
    return out


def _cached(kind: str, *parts: bytes) -> tuple[Path, str]:
    key = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return images_dir() / f"{kind}-{key}.tar", key


def pause_image() -> tuple[Path, str]:
    """The pause image's tarball and name (``PAUSE``), built with ``gcc -static`` once."""
    tar, _ = _cached("pause", PAUSE_C.encode(), PAUSE.encode())
    if tar.exists():
        return tar, PAUSE
    cc = shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise ControlPlaneError("building the kubelet nodes' pause image needs a C compiler (gcc)")
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "pause.c", Path(tmp) / "pause"
        src.write_text(PAUSE_C)
        proc = subprocess.run([cc, "-static", "-Os", "-s", "-o", str(exe), str(src)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ControlPlaneError(f"building the pause image failed (static libc missing? Debian: libc6-dev): "
                                    f"{proc.stderr.strip().splitlines()[-1:]}")
        layer = _layer({"/pause": (exe.read_bytes(), 0o755)}, {})
    return write_oci(tar, PAUSE, layer, {"Entrypoint": ["/pause"]}), PAUSE


def _programs_image(kind: str, tag: str, exes: dict[str, Path], loads: list[Path], files: dict[str, Path],
                    links: dict[str, str]) -> tuple[Path, str]:
    """An image ``<REGISTRY>/<kind>:<tag>`` of programs and files (image path -> host file), with the shared
    libraries the programs and ``loads`` (libraries they load at run time) link against."""
    tar, _ = _cached(kind, *(str(p.stat().st_size).encode() + p.name.encode() for p in [*exes.values(), *loads]),
                     tag.encode())
    name = f"{REGISTRY}/{kind}:{tag}"
    if tar.exists():
        return tar, name
    layer = {path: (src.read_bytes(), 0o755) for path, src in [*exes.items(), *files.items()]}
    layer.update({path: (src.read_bytes(), 0o755) for path, src in _libs([*exes.values(), *loads]).items()})
    return write_oci(tar, name, _layer(layer, links), {"Env": ["PATH=/usr/bin:/bin"]}), name


def nvidia_image(sw) -> tuple[Path, str]:
    """NVIDIA's device plugin and GFD with the mock NVML (a :class:`gpuproof.sim.nvidia.NodeSoftware`)."""
    exes = {f"/usr/bin/{n}": sw.exe(n) for n in ("nvidia-device-plugin", "gpu-feature-discovery")}
    mock = (sw.lib / "libnvidia-ml.so.1").resolve()
    links = {f"{LIB_DIR}/libnvidia-ml.so.1": mock.name, f"{LIB_DIR}/libnvidia-ml.so": "libnvidia-ml.so.1"}
    return _programs_image("nvidia-node", sw.root.name, exes, [mock], {f"{LIB_DIR}/{mock.name}": mock}, links)


def dra_driver_image(sw, cdi_hook: Path) -> tuple[Path, str]:
    """NVIDIA's DRA kubelet plugin and ``nvidia-cdi-hook`` where NVIDIA's image has them (``/usr/bin``), with the
    glibc files they and the mock NVML link against (the plugin loads the mock from the node's driver root)."""
    exes = {"/usr/bin/gpu-kubelet-plugin": sw.exe("gpu-kubelet-plugin"), "/usr/bin/nvidia-cdi-hook": cdi_hook}
    return _programs_image("nvidia-dra-driver", f"{sw.root.name}-{cdi_hook.parent.name}", exes,
                           [(sw.lib / "libnvidia-ml.so.1").resolve()], {}, {})


WORKLOADS_LIB = "/opt/nvidia/lib64"           # the mock NVML in the workloads image (on LD_LIBRARY_PATH)
HOST_USR = "/host/usr"      # where the workload pods mount the host's /usr (read-only)
# the root's programs and libraries are the host's; the image's own /usr stays writable, because NVIDIA's
# runtime injection (the DRA driver's CDI spec: /usr/bin/nvidia-smi, driver libraries) mounts files into it
WORKLOADS_ROOTFS_LINKS = {"/bin": "host/usr/bin", "/sbin": "host/usr/sbin", "/lib": "host/usr/lib",
                          "/lib64": "host/usr/lib64", "/usr/bin/env": f"{HOST_USR}/bin/env",
                          "/usr/bin/sh": f"{HOST_USR}/bin/sh"}
PASSWD = b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
GROUP = b"root:x:0:\nnogroup:x:65534:\n"
NONROOT = b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"


def workloads_image(sw) -> tuple[Path, str]:
    """The image gpuproof's workload pods run in on kubelet nodes: NVIDIA's mock NVML library and an empty
    root whose ``/bin``, ``/lib`` and ``/lib64`` are the host's ``/usr`` (glibc, ``sh``, ``getent``), which the pod
    mounts at ``/host/usr``, with the host's Python and virtualenv at their own paths.

    Why not an image with Python and torch in it: about 2 GB, imported into every node's containerd on every
    start; the host's files are the same bytes and are read-only in the pod.
    The mock lives in ``/opt``, not ``/usr``: the host's ``/usr`` is mounted over the image's.
    """
    mock = (sw.lib / "libnvidia-ml.so.1").resolve()
    lib = WORKLOADS_LIB
    tar, key = _cached("workloads", mock.read_bytes(), mock.name.encode(), PASSWD, GROUP, lib.encode(),
                       json.dumps(WORKLOADS_ROOTFS_LINKS, sort_keys=True).encode(), sw.root.name.encode())
    name = f"{REGISTRY}/workloads:{key}"
    if tar.exists():
        return tar, name
    files = {f"{lib}/{mock.name}": (mock.read_bytes(), 0o755), "/etc/passwd": (PASSWD, 0o644),
             "/etc/group": (GROUP, 0o644), "/tmp/.keep": (b"", 0o644), "/usr/lib64/.keep": (b"", 0o644),
             "/usr/lib/x86_64-linux-gnu/.keep": (b"", 0o644), f"{HOST_USR}/.keep": (b"", 0o644)}
    links = {**WORKLOADS_ROOTFS_LINKS, f"{lib}/libnvidia-ml.so.1": mock.name,
             f"{lib}/libnvidia-ml.so": "libnvidia-ml.so.1"}
    config = {"Env": [f"LD_LIBRARY_PATH={lib}", "HOME=/tmp", "PATH=/usr/local/bin:/usr/bin:/bin"]}
    return write_oci(tar, name, _layer(files, links), config), name


def coredns_image(exe: Path, version: str) -> tuple[Path, str]:
    """CoreDNS as its upstream image holds it: the static binary at ``/coredns``, its entrypoint. It runs as
    root (upstream's image runs as nonroot with a file capability to bind port 53, which this writer has no
    way to set); the addon's securityContext still drops every capability but NET_BIND_SERVICE."""
    tar, _ = _cached("coredns", str(exe.stat().st_size).encode(), exe.parent.name.encode(), version.encode())
    name = f"{REGISTRY}/coredns:{version}"
    if tar.exists():
        return tar, name
    layer = _layer({"/coredns": (exe.read_bytes(), 0o755)}, {})
    return write_oci(tar, name, layer, {"Entrypoint": ["/coredns"]}), name


def operator_image(exe: Path, name: str, version: str) -> tuple[Path, str]:
    """An operator's controller manager as its upstream image holds it (Kueue's, JobSet's and Kubeflow Trainer's
    Dockerfiles: the static binary at ``/manager``, the entrypoint, user 65532 of distroless' ``nonroot``), for
    :mod:`gpuproof.sim.platform`. Their Deployments ask ``runAsNonRoot``, which a root image fails."""
    tar, _ = _cached(f"operator-{name}", str(exe.stat().st_size).encode(), exe.parent.name.encode(), version.encode())
    ref = f"{REGISTRY}/{name}:{version}"
    if tar.exists():
        return tar, ref
    layer = _layer({"/manager": (exe.read_bytes(), 0o755), "/etc/passwd": (PASSWD + NONROOT, 0o644)}, {})
    return write_oci(tar, ref, layer, {"Entrypoint": ["/manager"], "User": "65532:65532"}), ref

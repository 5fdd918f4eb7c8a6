"""Container images for the embedded cluster's kubelet nodes, built here without Docker.

Each image is an OCI image layout in a tar file (``oci-layout``, ``index.json``, ``blobs/sha256/...``):
one uncompressed layer written with :mod:`tarfile`, a config and a manifest, named in the index with
containerd's ``io.containerd.image.name`` annotation, so ``ctr -n k8s.io images import`` gives it its
full, registry-qualified name (the kubelet never pulls it: the name must already be in containerd).

- ``pause``: a static C program (``PAUSE_C``) that reaps children and waits for a signal;
- ``nvidia-node``: NVIDIA's device plugin and GPU Feature Discovery with NVIDIA's mock
  ``libnvidia-ml.so.1`` where ``dlopen`` finds it, plus the glibc files they link against.

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
        for d in sorted({str(Path(*Path(d).parts[:i + 1])) for d in dirs for i in range(len(Path(d).parts))}):
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


def nvidia_image(sw) -> tuple[Path, str]:
    """NVIDIA's device plugin and GFD with the mock NVML (a :class:`gpuproof.sim.nvidia.NodeSoftware`)."""
    exes = {f"/usr/bin/{n}": sw.exe(n) for n in ("nvidia-device-plugin", "gpu-feature-discovery")}
    mock = (sw.lib / "libnvidia-ml.so.1").resolve()
    tar, key = _cached("nvidia-node", *(str(p.stat().st_size).encode() + p.name.encode()
                                        for p in [*exes.values(), mock]), sw.root.name.encode())
    name = f"{REGISTRY}/nvidia-node:{sw.root.name}"
    if tar.exists():
        return tar, name
    files = {path: (src.read_bytes(), 0o755) for path, src in exes.items()}
    files[f"{LIB_DIR}/{mock.name}"] = (mock.read_bytes(), 0o755)
    files.update({path: (src.read_bytes(), 0o755) for path, src in _libs([*exes.values(), mock]).items()})
    links = {f"{LIB_DIR}/libnvidia-ml.so.1": mock.name, f"{LIB_DIR}/libnvidia-ml.so": "libnvidia-ml.so.1"}
    return write_oci(tar, name, _layer(files, links), {"Env": ["PATH=/usr/bin:/bin"]}), name

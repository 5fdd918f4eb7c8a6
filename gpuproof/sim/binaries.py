"""Find or build the control-plane binaries of the embedded cluster.

Each binary is looked up, in order, in:

1. an environment variable naming it (``GPUPROOF_KUBE_APISERVER=/path/kube-apiserver``, ...),
2. ``$GPUPROOF_BIN_DIR``, then ``$KUBEBUILDER_ASSETS`` (the envtest convention),
3. gpuproof's build cache (``$GPUPROOF_CACHE``, default ``~/.cache/gpuproof``),
4. ``PATH``.

Whatever is still missing is built from the Go modules in ``controlplane/``, which pin
Kubernetes, etcd and kwok, into the build cache. The cache key covers go.mod, go.sum,
the Go version and the build flags, so a bump of any of them rebuilds once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ..errors import ControlPlaneError

KUBE_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.5"
KWOK_VERSION = "v0.7.0"

MODULES_DIR = Path(__file__).resolve().parents[2] / "controlplane"

# binary -> (module folder, package pattern it is built from)
BINARIES = {
    "etcd": ("kube", "./cmd/etcd"),
    "kube-apiserver": ("kube", "k8s.io/kubernetes/cmd/kube-apiserver"),
    "kube-controller-manager": ("kube", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    "kube-scheduler": ("kube", "k8s.io/kubernetes/cmd/kube-scheduler"),
    "kwok": ("kwok", "sigs.k8s.io/kwok/cmd/kwok"),
}


def _version_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    parts = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        parts += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.gitCommit={'0' * 40}",
            f"-X {pkg}.buildDate=2026-01-01T00:00:00Z",
        ]
    return " ".join(parts)


LDFLAGS = {"kube": _version_ldflags(KUBE_VERSION), "kwok": "-s -w"}


def cache_root() -> Path:
    return Path(os.environ.get("GPUPROOF_CACHE") or Path.home() / ".cache" / "gpuproof")


def env_var(name: str) -> str:
    return "GPUPROOF_" + name.upper().replace("-", "_")


@dataclasses.dataclass
class Binaries:
    paths: dict[str, Path]
    sources: dict[str, str]     # binary -> where it came from (env, dir, cache, PATH)

    def __getitem__(self, name: str) -> Path:
        return self.paths[name]

    def describe(self) -> str:
        return "\n".join(f"  {n:<24} {self.paths[n]}  ({self.sources[n]})" for n in BINARIES)


def _is_exe(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def build_key() -> str:
    """A digest of everything that decides what the build produces."""
    h = hashlib.sha256()
    for folder in sorted({m for m, _ in BINARIES.values()}):
        for f in ("go.mod", "go.sum"):
            p = MODULES_DIR / folder / f
            h.update(p.read_bytes() if p.exists() else b"")
        h.update(LDFLAGS[folder].encode())
    h.update((MODULES_DIR / "kube" / "cmd" / "etcd" / "main.go").read_bytes()
             if (MODULES_DIR / "kube" / "cmd" / "etcd" / "main.go").exists() else b"")
    h.update(_go_version().encode())
    return h.hexdigest()[:16]


def _go_version() -> str:
    go = shutil.which("go")
    if not go:
        return "no-go"
    try:
        return subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown-go"


def build_dir() -> Path:
    return cache_root() / "controlplane" / f"{KUBE_VERSION}-{build_key()}" / "bin"


def locate(build_missing: bool = True, progress=None) -> Binaries:
    """Find every binary; build the missing ones when allowed. Raises ControlPlaneError."""
    progress = progress or (lambda msg: None)
    found: dict[str, Path] = {}
    sources: dict[str, str] = {}
    dirs = [(os.environ.get("GPUPROOF_BIN_DIR"), "$GPUPROOF_BIN_DIR"),
            (os.environ.get("KUBEBUILDER_ASSETS"), "$KUBEBUILDER_ASSETS")]
    cache = build_dir()
    for name in BINARIES:
        var = os.environ.get(env_var(name))
        if var:
            if not _is_exe(Path(var)):
                raise ControlPlaneError(f"${env_var(name)} is set to {var}, which is not an executable file")
            found[name], sources[name] = Path(var), f"${env_var(name)}"
            continue
        for d, label in dirs:
            if d and _is_exe(Path(d) / name):
                found[name], sources[name] = Path(d) / name, label
                break
        else:
            if _is_exe(cache / name):
                found[name], sources[name] = cache / name, "build cache"
            elif shutil.which(name):
                found[name], sources[name] = Path(shutil.which(name)), "PATH"  # type: ignore[arg-type]
    missing = [n for n in BINARIES if n not in found]
    if missing:
        if not build_missing:
            raise ControlPlaneError(
                "control-plane binaries missing: " + ", ".join(missing) + ". Run `gpuproof sim build`.")
        build(missing, progress=progress)
        for name in missing:
            found[name], sources[name] = cache / name, "build cache (just built)"
    return Binaries(found, sources)


def build(names: list[str] | None = None, progress=None, force: bool = False) -> Path:
    """Build the named binaries (default all) into the cache. Safe against concurrent calls."""
    progress = progress or (lambda msg: None)
    names = names or list(BINARIES)
    go = shutil.which("go")
    if not go:
        raise ControlPlaneError(
            "the embedded cluster needs kube-apiserver, kube-controller-manager, kube-scheduler, etcd and kwok, "
            f"missing: {', '.join(names)}.\n"
            "Either install Go 1.25 or newer (https://go.dev/dl, or your distribution's golang package) so gpuproof "
            "can build them from the pinned modules in controlplane/, or point gpuproof at existing binaries with "
            "GPUPROOF_BIN_DIR=/dir (or KUBEBUILDER_ASSETS, or one variable per binary such as "
            "GPUPROOF_KUBE_APISERVER=/path).")
    if not MODULES_DIR.is_dir():
        raise ControlPlaneError(f"cannot build: the Go modules folder {MODULES_DIR} is missing from this install")
    out = build_dir()
    out.mkdir(parents=True, exist_ok=True)
    lock_path = out.parent / ".build.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)           # a second builder waits here, then finds the binaries
        todo = [n for n in names if force or not _is_exe(out / n)]
        by_module: dict[str, list[str]] = {}
        for n in todo:
            by_module.setdefault(BINARIES[n][0], []).append(n)
        for module, bins in by_module.items():
            pkgs = [BINARIES[n][1] for n in bins]
            progress(f"building {', '.join(bins)} from controlplane/{module} (first time only; several minutes)")
            t0 = time.monotonic()
            tmp = out.parent / f".tmp-{module}-{os.getpid()}"
            tmp.mkdir(exist_ok=True)
            cmd = [go, "build", "-trimpath", "-buildvcs=false", "-ldflags", LDFLAGS[module], "-o", str(tmp) + "/", *pkgs]
            env = dict(os.environ)
            proc = subprocess.run(cmd, cwd=MODULES_DIR / module, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                raise ControlPlaneError(
                    f"building {', '.join(bins)} failed (go build exited {proc.returncode}):\n"
                    + _tail(proc.stderr + proc.stdout, 40))
            for n in bins:
                (tmp / n).replace(out / n)
            shutil.rmtree(tmp, ignore_errors=True)
            progress(f"built {', '.join(bins)} in {time.monotonic() - t0:.0f}s")
    return out


def _tail(text: str, lines: int) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def version_of(path: Path) -> str:
    try:
        out = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unknown ({exc})"
    text = (out.stdout + out.stderr).strip()
    m = re.search(r"v?\d+\.\d+\.\d+\S*", text)
    return m.group(0) if m else text.splitlines()[0] if text else "unknown"


if __name__ == "__main__":  # python -m gpuproof.sim.binaries: build and list
    b = locate(progress=lambda m: print(m, file=sys.stderr))
    print(b.describe())

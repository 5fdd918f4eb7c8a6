"""Find or build the control-plane binaries of the embedded cluster.

Each binary is looked up, in order, in:

1. an environment variable naming it (``GPUPROOF_KUBE_APISERVER=/path/kube-apiserver``, ...),
2. ``$GPUPROOF_BIN_DIR``, then ``$KUBEBUILDER_ASSETS`` (the envtest convention),
3. gpuproof's build cache (``$GPUPROOF_CACHE``, default ``~/.cache/gpuproof``), which a bundle made by
   ``gpuproof sim bundle`` fills too (``gpuproof sim install FILE``, or ``$GPUPROOF_BUNDLE``, which the
   ``gpuproof run`` and ``gpuproof sim`` commands install first; :mod:`gpuproof.sim.bundle`),
4. ``PATH``.

Whatever is still missing is built with Go from the modules in ``controlplane/``, which pin
Kubernetes, etcd and kwok. The wheel and the sdist ship those modules' files
(``MODULE_FILES``) as ``gpuproof/_controlplane``, which in a checkout is a link to
``controlplane/``: a checkout and an installed gpuproof build the same way.

The cache holds one folder per module and build, ``controlplane/<module>-<key>``. The key is a
digest of the module's files (names and contents, not where they lie) and its build settings, so a
checkout and an install of the same version share one build, and a bump of a pin rebuilds once. The
Go toolchain is not part of the key: what a build produces is decided by the pinned sources, and an
install without Go still finds what a checkout on the same machine built.
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
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterable

from ..errors import ControlPlaneError

KUBE_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.5"
KWOK_VERSION = "v0.7.0"

# What a build of a module under controlplane/ reads, and so what the wheel ships of it
# (pyproject.toml's package-data lists the same patterns; tests/test_packaging.py compares them).
MODULE_FILES = ("go.mod", "go.sum", "*.go", "*.sh")

# binary -> (module folder, package pattern it is built from)
BINARIES = {
    "etcd": ("kube", "./cmd/etcd"),
    "kube-apiserver": ("kube", "k8s.io/kubernetes/cmd/kube-apiserver"),
    "kube-controller-manager": ("kube", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    "kube-scheduler": ("kube", "k8s.io/kubernetes/cmd/kube-scheduler"),
    "kwok": ("kwok", "sigs.k8s.io/kwok/cmd/kwok"),
}

Progress = Callable[[str], None]


def _quiet(msg: str) -> None:
    pass


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


# ---------------------------------------------------------------------------- the Go modules and the cache


def modules_dir() -> Path:
    """``controlplane/``: the repository's in a checkout (through the ``gpuproof/_controlplane`` link),
    the copy inside the package when installed."""
    from .. import package_folder

    return package_folder("_controlplane").resolve()


def module_files(module: str) -> list[Path]:
    """The files of ``controlplane/<module>`` that a build reads (``MODULE_FILES``, in sub-folders too)."""
    folder = modules_dir() / module
    if not (folder / "go.mod").is_file():
        raise ControlPlaneError(f"cannot build: the Go module folder {folder} (its go.mod) is missing from this "
                                f"install; reinstall gpuproof")
    return sorted({p for pattern in MODULE_FILES for p in folder.rglob(pattern) if p.is_file()})


def content_key(paths: Iterable[Path], *settings: str, root: Path | None = None) -> str:
    """A digest of files (their names relative to ``root``, default ``controlplane/``, and contents)
    and of settings that change what is built (flags, environment), for a cache folder's name.
    It depends on nothing else, so the same files in a checkout and in an install give one key."""
    root = root or modules_dir()
    h = hashlib.sha256()
    for rel, path in sorted((p.relative_to(root).as_posix(), p) for p in paths):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    for s in settings:
        h.update(f"{len(s)}\0{s}".encode())
    return h.hexdigest()[:16]


def module_cache(module: str, *settings: str) -> Path:
    """The cache folder of what ``controlplane/<module>`` builds with these settings."""
    return cache_root() / "controlplane" / f"{module}-{content_key(module_files(module), *settings)}"


# ---------------------------------------------------------------------------- locate


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


def locate(build_missing: bool = True, progress: Progress | None = None) -> Binaries:
    """Find every binary; build the missing ones when allowed. Raises ControlPlaneError."""
    found: dict[str, Path] = {}
    sources: dict[str, str] = {}
    dirs = [(os.environ.get("GPUPROOF_BIN_DIR"), "$GPUPROOF_BIN_DIR"),
            (os.environ.get("KUBEBUILDER_ASSETS"), "$KUBEBUILDER_ASSETS")]
    caches: dict[str, Path] = {}
    for name, (module, _) in BINARIES.items():
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
            if module not in caches:
                caches[module] = module_cache(module, LDFLAGS[module])
            if _is_exe(caches[module] / name):
                found[name], sources[name] = caches[module] / name, "build cache"
            elif shutil.which(name):
                found[name], sources[name] = Path(shutil.which(name)), "PATH"  # type: ignore[arg-type]
    missing = [n for n in BINARIES if n not in found]
    if missing:
        if not build_missing:
            raise ControlPlaneError(
                "control-plane binaries missing: " + ", ".join(missing) + ". Run `gpuproof sim build`.")
        for name, path in build(missing, progress=progress).items():
            found[name], sources[name] = path, "build cache (just built)"
    return Binaries(found, sources)


# ---------------------------------------------------------------------------- build


def _go(missing: list[str]) -> str:
    go = shutil.which("go")
    if not go:
        raise ControlPlaneError(
            f"the embedded cluster needs etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok "
            f"(missing: {', '.join(missing)}); get them one of three ways: install Go 1.25 or newer "
            f"(https://go.dev/dl) and gpuproof builds them once from its pinned modules, or set "
            f"GPUPROOF_BIN_DIR to a folder holding them, or KUBEBUILDER_ASSETS to envtest's (one variable per "
            f"binary, such as GPUPROOF_KUBE_APISERVER=/path, works too); or install a bundle made by `gpuproof sim "
            f"bundle` where Go is (`gpuproof sim install FILE`, or GPUPROOF_BUNDLE=FILE)")
    return go


def build(names: list[str] | None = None, progress: Progress | None = None,
          force: bool = False) -> dict[str, Path]:
    """Build the named binaries (default all) into the cache; returns name -> path."""
    names = names or list(BINARIES)
    go = _go(names)
    by_module: dict[str, dict[str, str]] = {}
    for n in names:
        module, package = BINARIES[n]
        by_module.setdefault(module, {})[n] = package
    out: dict[str, Path] = {}
    for module, packages in by_module.items():
        folder = go_build(module, packages, ldflags=LDFLAGS[module], go=go, progress=progress, force=force)
        out.update({n: folder / n for n in packages})
    return out


def build_folder(module: str, ldflags: str = "", env: dict[str, str] | None = None,
                 settings: tuple[str, ...] = ()) -> Path:
    """The cache folder :func:`go_build` puts ``controlplane/<module>``'s binaries in for these settings (without
    building: the bundle's and the lookups' one spelling of it)."""
    return module_cache(module, ldflags, *(f"{k}={v}" for k, v in sorted((env or {}).items())), *settings)


def go_build(module: str, packages: dict[str, str], ldflags: str = "", env: dict[str, str] | None = None,
             go: str | None = None, progress: Progress | None = None, force: bool = False,
             workdir: Callable[[str, Path], Path] | None = None, settings: tuple[str, ...] = ()) -> Path:
    """``go build`` binaries (name -> package) of ``controlplane/<module>`` into its cache folder
    (:func:`module_cache` of the ldflags, env and ``settings``), unless they are there; returns the folder.
    ``workdir(go, tmp)``: the folder to build in instead of the module's own (a copy it makes under ``tmp``).
    Safe against concurrent calls: a second builder waits for the first, then finds the binaries."""
    progress = progress or _quiet
    env = env or {}
    out = build_folder(module, ldflags, env, settings)
    if not force and all(_is_exe(out / n) for n in packages):
        return out                          # built before, or installed from a bundle: no Go needed
    go = go or _go(list(packages))
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        todo = [n for n in packages if force or not _is_exe(out / n)]
        if not todo:
            return out
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out))
        try:
            cmd = [go, "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags, "-o", f"{tmp}/",
                   *(packages[n] for n in todo)]
            cwd = workdir(go, tmp) if workdir else modules_dir() / module
            _run_build(cmd, cwd, {**os.environ, **env}, f"{', '.join(todo)} from controlplane/{module}", progress)
            for n in todo:
                (tmp / n).replace(out / n)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _run_build(cmd: list[str], cwd: Path, env: dict, what: str, progress: Progress) -> None:
    """Run a build, saying when it starts, while it lasts (at doubling intervals) and when it ends."""
    progress(f"building {what} with Go (first time only: several minutes, 10-15 on 2 cores)")
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        wait = 30.0
        try:
            while True:
                try:
                    code = proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    progress(f"still building {what}: {time.monotonic() - t0:.0f}s so far")
                    wait *= 2
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        if code != 0:
            log.seek(0)
            raise ControlPlaneError(f"building {what} failed (go build exited {code}):\n{_tail(log.read(), 40)}")
    progress(f"built {what} in {time.monotonic() - t0:.0f}s")


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

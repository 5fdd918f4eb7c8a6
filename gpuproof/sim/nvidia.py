"""NVIDIA's node software for the embedded cluster: built once, cached, and run over NVIDIA's mock NVML.

What is built (into ``$GPUPROOF_CACHE/nvidia/<key>/``, default ``~/.cache/gpuproof``):

- NVIDIA's mock ``libnvidia-ml.so`` and its GPU profiles, from ``NVIDIA/k8s-test-infra`` (``pkg/gpu/mocknvml``);
- NVIDIA's device plugin and GPU Feature Discovery, from the Go module pinned in ``controlplane/nvidia``;
- ``dprelay`` (``controlplane/nvidia/cmd/dprelay``): the kubelet's side of the device-plugin API, which
  relays what the plugin registers and lists and decides nothing;
- NVIDIA's DRA kubelet plugin (``gpu-kubelet-plugin``) and its chart's DeviceClass templates, from
  ``kubernetes-sigs/dra-driver-nvidia-gpu``.

The two source trees no registry serves come from their upstream repositories at the pinned commits,
or, when ``$GPUPROOF_NVIDIA_SOURCES`` names a folder, from the snapshot tarballs in it
(``<repo>-<commit[:12]>.tar.gz``, as in the project's ``shared/third_party``). The cache key covers
the pinned commits and ``controlplane/nvidia``'s files.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import shutil
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Callable

from ..errors import ControlPlaneError
from . import binaries as _binaries

Progress = Callable[[str], None]

DEVICE_PLUGIN_VERSION = "v0.19.3"            # also GFD's: one module, one release
SOURCES_ENV = "GPUPROOF_NVIDIA_SOURCES"
MOCK_MAX_GPUS = 8                            # GPUs one instance of NVIDIA's mock NVML shows


@dataclasses.dataclass(frozen=True)
class Source:
    name: str
    url: str
    commit: str

    @property
    def tarball(self) -> str:
        return f"{self.name}-{self.commit[:12]}.tar.gz"


TEST_INFRA = Source("k8s-test-infra", "https://github.com/NVIDIA/k8s-test-infra",
                    "3b2b865d91b1844baa9feeca2820d2fab65414c7")
DRA_DRIVER = Source("dra-driver-nvidia-gpu", "https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu",
                    "22407113785e78c7763b4637689a201eb39c6199")
DRA_DRIVER_VERSION = "v0.5.0-dev+" + DRA_DRIVER.commit[:12]
MOCK_NVML_DIR = "pkg/gpu/mocknvml"
DRA_CHART_TEMPLATES = "deployments/helm/dra-driver-nvidia-gpu/templates"
DEVICE_CLASS_TEMPLATES = ("deviceclass-gpu.yaml", "deviceclass-mig.yaml")
BINARIES = ("nvidia-device-plugin", "gpu-feature-discovery", "dprelay", "gpu-kubelet-plugin", "nvml-mock-ctl")
DRA_BINARY = "gpu-kubelet-plugin"
WITHOUT_DRA = ".without-dra"       # in bin/: installed from a bundle made without the DRA driver (gpuproof.sim.bundle)


@dataclasses.dataclass
class NodeSoftware:
    """Where the built pieces are."""

    root: Path

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    @property
    def lib(self) -> Path:                     # libnvidia-ml.so.1 (the mock) and its links
        return self.root / "lib"

    @property
    def profiles(self) -> Path:                # NVIDIA's mock GPU profiles (mock-nvml-config-*.yaml)
        return self.root / "profiles"

    @property
    def chart(self) -> Path:                   # the DRA driver chart's DeviceClass templates
        return self.root / "chart"

    def exe(self, name: str) -> Path:
        return self.bin / name

    @property
    def gfd(self) -> str:
        return f"gpu-feature-discovery {DEVICE_PLUGIN_VERSION}"

    @property
    def device_plugin(self) -> str:
        return f"k8s-device-plugin {DEVICE_PLUGIN_VERSION}"

    @property
    def dra_driver(self) -> str:
        return f"dra-driver-nvidia-gpu {DRA_DRIVER_VERSION}"

    def mock_env(self, config: Path, library_path: bool = True) -> dict[str, str]:
        """This process's environment for a program of NVIDIA's running over the mock config ``config``
        (``library_path``: find the mock through LD_LIBRARY_PATH; the DRA driver reads it from a driver root)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("MOCK_NVML")}
        env["MOCK_NVML_CONFIG"] = str(config)
        if library_path:
            env["LD_LIBRARY_PATH"] = str(self.lib)
        return env

    def require_dra(self) -> None:
        """Raise ControlPlaneError (one line) when NVIDIA's DRA driver is not here: a bundle made without it."""
        if not os.access(self.exe(DRA_BINARY), os.X_OK):
            raise ControlPlaneError(f"NVIDIA's DRA driver is not in {self.root}: it was installed from a bundle made "
                                    "with --without-dra; pools offered through DRA need a bundle made without that "
                                    "flag (or Go, to build it)")

    def complete(self) -> bool:
        without = (self.bin / WITHOUT_DRA).exists()
        return all(os.access(self.exe(b), os.X_OK) for b in BINARIES if not (without and b == DRA_BINARY)) and \
            (self.lib / "libnvidia-ml.so.1").exists() and any(self.profiles.glob("*.yaml")) and \
            all((self.chart / t).exists() for t in DEVICE_CLASS_TEMPLATES)


def klog_error(log: str) -> str:
    """The last error (or fatal) line a Go program of NVIDIA's logged through klog, without its prefix;
    the last line when it logged none."""
    lines = log.splitlines()
    errors = [ln for ln in lines if ln[:1] in "EF"] or lines
    return errors[-1].split("] ", 1)[-1] if errors else "no output"


def module_dir() -> Path:
    return _binaries.modules_dir() / "nvidia"


def build_key() -> str:
    """Content of ``controlplane/nvidia``, the pinned commits: a checkout and an
    install of the same gpuproof share one build."""
    return _binaries.content_key(_binaries.module_files("nvidia"), *(f"{s.url}@{s.commit}" for s in
                                                                      (TEST_INFRA, DRA_DRIVER)),
                                 DEVICE_PLUGIN_VERSION)


def cache_dir() -> Path:
    return _binaries.cache_root() / "nvidia" / f"{DEVICE_PLUGIN_VERSION}-{build_key()}"


def locate(build_missing: bool = True, progress: Progress | None = None) -> NodeSoftware:
    """NVIDIA's node software, built first if it is not in the cache. Raises ControlPlaneError."""
    override = os.environ.get("GPUPROOF_NVIDIA_DIR")
    if override:
        sw = NodeSoftware(Path(override))
        if not sw.complete():
            raise ControlPlaneError(f"$GPUPROOF_NVIDIA_DIR={override} does not hold a complete build of NVIDIA's "
                                    f"node software (bin/{', bin/'.join(BINARIES)}, lib/libnvidia-ml.so.1, "
                                    "profiles/, chart/); unset it to build one")
        return sw
    sw = NodeSoftware(cache_dir())
    if sw.complete():
        return sw
    if not build_missing:
        raise ControlPlaneError("NVIDIA's node software (mock NVML, device plugin, GFD, DRA driver) is not built: "
                                "run `gpuproof sim build`")
    return build(progress=progress)


def _require_tools() -> str:
    go = shutil.which("go")
    missing = [t for t, ok in (("Go 1.25 or newer", go), ("a C compiler (gcc)", shutil.which("gcc") or
                                                           shutil.which("cc")), ("make", shutil.which("make")))
               if not ok]
    if missing:
        raise ControlPlaneError(
            "the embedded cluster's GPU nodes are labelled and advertised by NVIDIA's own GFD, device plugin and DRA "
            f"driver over NVIDIA's mock NVML, which gpuproof builds from source; this machine lacks "
            f"{' and '.join(missing)}. Install them (Debian: apt-get install golang gcc make), or point "
            "$GPUPROOF_NVIDIA_DIR at a finished build, or install a bundle made by `gpuproof sim bundle` where they "
            "are (`gpuproof sim install FILE`). Pools without GPUs need none of it.")
    return go  # type: ignore[return-value]


def _run(cmd: list[str], cwd: Path, what: str, env: dict | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr + proc.stdout).strip().splitlines()[-30:])
        raise ControlPlaneError(f"building {what} failed ({' '.join(cmd[:3])} ... exited {proc.returncode}):\n{tail}")


def _fetch(src: Source, into: Path, progress: Progress) -> Path:
    """The source tree of ``src`` at its pinned commit, under ``into``."""
    dest = into / src.name
    if dest.is_dir():
        return dest
    local = os.environ.get(SOURCES_ENV)
    if local:
        tarball = Path(local) / src.tarball
        if not tarball.is_file():
            raise ControlPlaneError(f"${SOURCES_ENV}={local} has no {src.tarball} (the snapshot of {src.url} at "
                                    f"{src.commit})")
        progress(f"unpacking {tarball.name}")
        tmp = into / f".{src.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(tarball) as tar:
            tar.extractall(tmp, filter="data")
        top = [p for p in tmp.iterdir()]
        (top[0] if len(top) == 1 and top[0].is_dir() else tmp).rename(dest)
        shutil.rmtree(tmp, ignore_errors=True)
        return dest
    git = shutil.which("git")
    if not git:
        raise ControlPlaneError(f"fetching {src.url} needs git, or ${SOURCES_ENV} naming a folder with {src.tarball}")
    progress(f"fetching {src.url} at {src.commit[:12]}")
    tmp = into / f".{src.name}.git"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        _run([git, "init", "-q", str(tmp)], into, src.name)
        _run([git, "-C", str(tmp), "fetch", "-q", "--depth", "1", src.url, src.commit], into, src.name)
        _run([git, "-C", str(tmp), "checkout", "-q", "FETCH_HEAD"], into, src.name)
    except ControlPlaneError as exc:
        raise ControlPlaneError(f"cannot fetch {src.url} at {src.commit} ({str(exc).splitlines()[-1]}); "
                                f"set ${SOURCES_ENV} to a folder holding {src.tarball}") from None
    tmp.rename(dest)
    return dest


def build(progress: Progress | None = None, force: bool = False) -> NodeSoftware:
    """Build everything into the cache (safe against concurrent builders)."""
    progress = progress or (lambda msg: None)
    go = _require_tools()
    if not (module_dir() / "go.mod").is_file():
        raise ControlPlaneError(f"cannot build NVIDIA's node software: {module_dir()}/go.mod is missing")
    sw = NodeSoftware(cache_dir())
    sw.root.mkdir(parents=True, exist_ok=True)
    with open(sw.root.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if sw.complete() and not force:
            return sw
        t0 = time.monotonic()
        src = sw.root / "src"
        src.mkdir(exist_ok=True)
        for d in (sw.bin, sw.lib, sw.profiles, sw.chart):
            d.mkdir(exist_ok=True)
        env = {"CGO_ENABLED": "1", "GOFLAGS": "-mod=vendor"}

        infra = _fetch(TEST_INFRA, src, progress)
        mock = infra / MOCK_NVML_DIR
        if force or not (sw.lib / "libnvidia-ml.so.1").exists():
            progress("building NVIDIA's mock NVML (about 35 s)")
            _run(["make", "NO_PADDING=1", "GOFLAGS=-mod=vendor"], mock, "NVIDIA's mock NVML", env)
            for f in mock.glob("libnvidia-ml.so*"):
                target = sw.lib / f.name
                target.unlink(missing_ok=True)
                if f.is_symlink():
                    target.symlink_to(os.readlink(f))
                else:
                    shutil.copy2(f, target)
        for f in (mock / "configs").glob("mock-nvml-config-*.yaml"):
            shutil.copy2(f, sw.profiles / f.name)
        ctl = sw.exe("nvml-mock-ctl")
        if force or not ctl.exists():
            _run([go, "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", str(ctl),
                  "./cmd/nvml-mock-ctl"], infra, "nvml-mock-ctl", env)

        stamp = f"-s -w -X github.com/NVIDIA/k8s-device-plugin/internal/info.version={DEVICE_PLUGIN_VERSION}"
        todo = [b for b in ("nvidia-device-plugin", "gpu-feature-discovery") if force or not sw.exe(b).exists()]
        if todo:
            progress(f"building NVIDIA's {' and '.join(todo)} {DEVICE_PLUGIN_VERSION} (about 3 min the first time)")
            _run([go, "build", "-trimpath", "-buildvcs=false", "-ldflags", stamp, "-o", str(sw.bin) + "/",
                  *[f"github.com/NVIDIA/k8s-device-plugin/cmd/{b}" for b in todo]],
                 module_dir(), " and ".join(todo), {"CGO_ENABLED": "1", "GOFLAGS": "-mod=mod"})
        if force or not sw.exe("dprelay").exists():
            _run([go, "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o", str(sw.bin) + "/",
                  "./cmd/dprelay"], module_dir(), "dprelay", {"CGO_ENABLED": "1", "GOFLAGS": "-mod=mod"})

        dra = _fetch(DRA_DRIVER, src, progress)
        if force or not sw.exe("gpu-kubelet-plugin").exists():
            progress("building NVIDIA's DRA kubelet plugin (about 2 min the first time)")
            _run([go, "build", "-trimpath", "-buildvcs=false", "-ldflags", "-s -w", "-o",
                  str(sw.exe("gpu-kubelet-plugin")), "./cmd/gpu-kubelet-plugin"], dra, "NVIDIA's DRA driver", env)
        for t in DEVICE_CLASS_TEMPLATES:
            shutil.copy2(dra / DRA_CHART_TEMPLATES / t, sw.chart / t)
        shutil.rmtree(src, ignore_errors=True)
        progress(f"NVIDIA's node software built in {time.monotonic() - t0:.0f}s ({sw.root})")
    return sw

"""Everything the embedded cluster needs that is not Python, in one file (issue #42).

``gpuproof sim bundle -o FILE`` writes it; ``gpuproof sim install FILE`` (or ``GPUPROOF_BUNDLE=FILE``, installed
by ``gpuproof run`` and ``gpuproof sim`` first) unpacks it into gpuproof's build cache, into the very folders a
build from source fills (:func:`gpuproof.sim.binaries.module_cache`, :func:`gpuproof.sim.nvidia.cache_dir`,
:func:`gpuproof.sim.images.images_dir`), so every lookup finds its piece there and neither Go nor a network is
needed: ``gpuproof sim up`` and ``gpuproof run`` then start as on the machine that built it.

What it holds (:func:`gather`): one multi-call executable (``controlplane/bundle``: etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kubelet, kube-proxy, NFD's nfd-master and CoreDNS share their packages
once; installed as hard links under each name, in each program's own cache folder), NFD's CRDs and Kubernetes'
CoreDNS addon manifest, kwok, the kubelet nodes' runtime (containerd 1.7 with its runc shim and ``ctr``, a static
runc, the CNI plugins bridge, host-local, loopback and portmap), NVIDIA's nvidia-cdi-hook (DRA nodes), device
plugin, GFD, DRA kubelet plugin, the mock NVML and its profiles, ``dprelay`` and ``nvml-mock-ctl``, and the pause
image (which needs a static C compiler). The other images are made from these programs on first use, as after a
build. Never the platform's operators (Kueue, JobSet, Kubeflow Trainer: ``platform`` in the manifest's
``without``), which fleets that name them build with Go. The host still provides what kubelet nodes run beside
them (:func:`gpuproof.sim.kubelet.missing` says what is missing in one line): root, cgroup v1, iptables, ip,
nsenter and unshare.

The file is a tar compressed as one xz stream (x86 branch filter, LZMA2 preset 9e, a dictionary as large as the
tar up to 512 MiB, so the programs' common bytes are stored once), readable with ``tar xJf``. A manifest
(``gpuproof-bundle.json``) names each file's place in the cache and its digest; a bundle made by another
gpuproof (other pinned sources, so other cache folders) is refused in one line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import lzma
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Callable

from .. import __version__
from ..errors import ControlPlaneError
from . import binaries as _binaries

Progress = Callable[[str], None]
MANIFEST = "gpuproof-bundle.json"
FORMAT = 1
LIMIT_MIB = 56                  # the bundle and the repository fit in 64 MiB (issue #42)
ENV = "GPUPROOF_BUNDLE"
MULTICALL = ("bundle", "gpuproof-kube", "./cmd/gpuproof-kube")     # module, executable, package
KUBE_NAMES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy")
MULTICALL_SERVES = (*KUBE_NAMES, "nfd-master", "coredns", "kwok")    # the programs controlplane/bundle's executable is
MULTICALL_ENV = {"CGO_ENABLED": "0",      # static: it is CoreDNS's image's program too
                 "GOFLAGS": "-mod=mod"}   # its go.mod replaces kwok by a local copy (kwok_source)
# kwok v0.7.0 reads an annotation key by a name apimachinery v0.35 no longer declares (v0.8.0 needs Kubernetes
# v0.36): the multi-call executable is built against a copy of kwok's module with that name replaced by its value
# (apimachinery v0.33's types.go), the one change; the same v0.7.0 built on its own (controlplane/kwok) needs none
KWOK_MODULE = ("sigs.k8s.io/kwok", "v0.7.0")
KWOK_EDIT = ("pkg/utils/informer/informer.go", "metav1.InitialEventsListBlueprintAnnotationKey",
             '"kubernetes.io/initial-events-list-blueprint"')


def multicall_ldflags() -> str:
    from .kubelet import NFD_LDFLAGS

    return _binaries.LDFLAGS["kube"] + " " + NFD_LDFLAGS.replace("-s -w ", "")


def _quiet(msg: str) -> None:
    pass


@dataclasses.dataclass
class Piece:
    """Files of one cache folder: ``files`` (name in the folder -> where they come from on this machine)."""

    what: str
    folder: Path                        # in the cache, as this gpuproof computes it
    files: dict[str, Path]
    links: dict[str, str] = dataclasses.field(default_factory=dict)    # symbolic links in the folder: name -> target
    hardlinks: dict[str, Path] = dataclasses.field(default_factory=dict)  # name -> a file of the bundle (in the cache)

    def rel(self) -> str:
        return self.folder.relative_to(_binaries.cache_root()).as_posix()


def folders() -> dict[str, Path]:
    """Where each piece lives in the cache of this gpuproof (what the lookups compute)."""
    from . import clusternet, kubelet, nvidia
    from .kubelet import dra as kubelet_dra
    from .kubelet import runtime as node_runtime

    return {
        "kube": _binaries.build_folder("kube", _binaries.LDFLAGS["kube"]),
        "kwok": _binaries.build_folder("kwok", _binaries.LDFLAGS["kwok"]),
        "nfd": _binaries.build_folder(kubelet.NFD[0], kubelet.NFD_LDFLAGS),
        "coredns": _binaries.build_folder(clusternet.COREDNS[0], "-s -w", clusternet.COREDNS_ENV),
        **{f"runtime-{k}": v for k, v in node_runtime.folders().items()},
        "cdihook": _binaries.build_folder(kubelet_dra.CDI_HOOK[0], kubelet_dra.TOOLKIT_LDFLAGS),
        "nvidia": nvidia.cache_dir(),
        "images": _binaries.cache_root() / "images",
    }


# ---------------------------------------------------------------------------- make


def _multicall_settings() -> tuple[str, ...]:
    return (f"kwok-edit={KWOK_EDIT}",)


def multicall_folder() -> Path:
    """Where :func:`multicall` puts the executable (without building it)."""
    return _binaries.build_folder(MULTICALL[0], multicall_ldflags(), MULTICALL_ENV, _multicall_settings())


def kwok_source(go: str, tmp: Path) -> Path:
    """``controlplane/bundle`` copied under ``tmp`` with kwok's module beside it, ``KWOK_EDIT`` made in it, and the
    copy's go.mod replacing kwok by it; returns the copy (where the multi-call executable is built)."""
    import subprocess

    module = tmp / "bundle"
    shutil.copytree(_binaries.modules_dir() / MULTICALL[0], module)
    name, version = KWOK_MODULE
    got = subprocess.run([go, "mod", "download", "-json", f"{name}@{version}"], cwd=module, capture_output=True,
                         text=True)
    if got.returncode != 0:
        raise ControlPlaneError(f"cannot fetch {name}@{version} for the multi-call executable: "
                                f"{(got.stdout + got.stderr).strip()[-400:]}")
    kwok = tmp / "kwok"
    shutil.copytree(json.loads(got.stdout)["Dir"], kwok)
    for d, _, files in os.walk(kwok):               # the module cache's copies are read-only
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(os.path.join(d, f), 0o644)
    rel, old, new = KWOK_EDIT
    text = (kwok / rel).read_text()
    if old not in text:
        raise ControlPlaneError(f"{name}@{version} {rel} no longer names {old}: the multi-call build's edit is stale")
    (kwok / rel).write_text(text.replace(old, new))
    subprocess.run([go, "mod", "edit", f"-replace={name}={kwok}"], cwd=module, check=True)
    return module


def multicall(progress: Progress = _quiet) -> Path:
    """The multi-call executable of the Kubernetes programs, nfd-master, CoreDNS and kwok (``controlplane/bundle``,
    built on first use)."""
    module, name, package = MULTICALL
    return _binaries.go_build(module, {name: package}, ldflags=multicall_ldflags(),
                              env=MULTICALL_ENV, progress=progress,
                              workdir=kwok_source, settings=_multicall_settings()) / name


def gather(progress: Progress = _quiet, dra: bool = True) -> list[Piece]:
    """Every piece, built first where this machine has not built it yet (that needs Go); ``dra=False``: without
    NVIDIA's DRA driver and nvidia-cdi-hook (what only pools offered through DRA use)."""
    from . import clusternet, images, kubelet, nvidia
    from .kubelet import dra as kubelet_dra
    from .kubelet import runtime as node_runtime

    where = folders()
    kube = multicall(progress)
    proxy = clusternet.kube_proxy_binary(progress)           # built beside the others: the addon manifest's folder
    clusternet.addon_manifest()
    nfd = kubelet.nfd_master(progress)
    coredns = clusternet.coredns_binary(progress)
    runtime = node_runtime.locate(progress)
    hook = kubelet_dra.cdi_hook(progress) if dra else None
    sw = nvidia.locate(progress=progress)
    kwok = _binaries.locate(progress=progress)["kwok"]
    pause, _ = images.pause_image()
    del proxy
    nv = {f"bin/{b}": sw.exe(b) for b in nvidia.BINARIES if dra or b != nvidia.DRA_BINARY}
    if not dra:
        marker = _binaries.cache_root() / "bundle" / "without-dra"     # empty: installed as bin/.without-dra
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        nv[f"bin/{nvidia.WITHOUT_DRA}"] = marker
    nv.update({f"lib/{p.name}": p for p in sw.lib.iterdir() if not p.is_symlink()})
    nv.update({f"profiles/{p.name}": p for p in sorted(sw.profiles.glob("*.yaml"))})
    nv.update({f"chart/{t}": sw.chart / t for t in nvidia.DEVICE_CLASS_TEMPLATES})
    multi = where["kube"] / MULTICALL[1]

    def served(folder: str, name: str, built: Path) -> tuple[dict[str, Path], dict[str, Path]]:
        """(files, hard links) of a program the multi-call executable serves, or that comes on its own."""
        return ({}, {name: multi}) if name in MULTICALL_SERVES else ({name: built}, {})

    kwok_files, kwok_links = served("kwok", "kwok", kwok)
    nfd_files, nfd_links = served("nfd", "nfd-master", nfd / "nfd-master")
    dns_files, dns_links = served("coredns", "coredns", coredns)
    return [
        Piece(f"one multi-call executable: {', '.join(MULTICALL_SERVES)}", where["kube"],
              {MULTICALL[1]: kube, "coredns.yaml.base": where["kube"] / "coredns.yaml.base"},
              hardlinks={n: multi for n in KUBE_NAMES}),
        Piece("kwok", where["kwok"], kwok_files, hardlinks=kwok_links),
        Piece("NFD's nfd-master", where["nfd"], {**nfd_files, "nfd-api-crds.yaml": nfd / Path(kubelet.NFD_CRDS).name},
              hardlinks=nfd_links),
        Piece("CoreDNS", where["coredns"], dns_files, hardlinks=dns_links),
        Piece("the kubelet nodes' containerd 1.7 and ctr (one executable), its runc shim", where["runtime-containerd"],
              {b: runtime.containerd_dir / b for b in node_runtime.CONTAINERD_BINARIES},
              hardlinks={n: runtime.containerd_dir / node_runtime.CONTAINERD_MULTICALL[0]
                         for n in node_runtime.CONTAINERD_SERVES}),
        Piece("runc", where["runtime-runc"], {"runc": runtime.runc}),
        Piece("the CNI plugins", where["runtime-cni"], {b: runtime.cni_dir / b for b in node_runtime.CNI_PLUGINS}),
        *([Piece("nvidia-cdi-hook (DRA nodes)", where["cdihook"], {"nvidia-cdi-hook": hook})] if dra else []),
        Piece("NVIDIA's node software", where["nvidia"], nv,
              {f"lib/{p.name}": os.readlink(p) for p in sw.lib.iterdir() if p.is_symlink()}),
        Piece("the pause image", where["images"], {pause.name: pause}),
    ]


DICT_MAX = 512 << 20     # xz's dictionary at most: about 4 GB of memory to compress, 512 MiB to unpack


def _filters(dict_size: int, fast: bool = False) -> list[dict]:
    """xz -9e with a dictionary as large as the whole tar (up to ``DICT_MAX``), so that any program's bytes can
    repeat any earlier program's (the Go programs share libraries: 2 MiB less than a dictionary the size of the
    largest one, RESULTS.md); ``fast``: xz -1 (about twice the size, a small fraction of the time: a bundle that
    stays on a fast network or disk, or the project's own tests)."""
    if fast:
        return [{"id": lzma.FILTER_X86}, {"id": lzma.FILTER_LZMA2, "preset": 1}]
    return [{"id": lzma.FILTER_X86},
            {"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME,
             "dict_size": max(1 << 24, min(dict_size, DICT_MAX))}]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def make(out: Path, progress: Progress = _quiet, dra: bool = True, fast: bool = False,
         compress: bool = True) -> dict:
    """Write the bundle to ``out`` (``dra=False``: without the DRA pieces; ``fast``: xz -1 instead of -9e;
    ``compress=False``: a plain tar, written in seconds, for a bundle that stays on the machine or a fast disk, and
    the project's own tests of what a bundle holds and installs); returns its manifest (with ``size`` and
    ``seconds``). Installing reads any of them."""
    t0 = time.monotonic()
    pieces = gather(progress, dra=dra)
    root = _binaries.cache_root()
    entries, manifest_pieces = [], []
    for p in pieces:
        files = {}
        for name, src in p.files.items():
            if not src.is_file():
                raise ControlPlaneError(f"cannot bundle {p.what}: {src} is missing")
            files[name] = {"sha256": _sha256(src), "size": src.stat().st_size}
            entries.append((f"{p.rel()}/{name}", src))
        manifest_pieces.append({"what": p.what, "folder": p.rel(), "files": files, "links": p.links,
                                "hardlinks": {n: t.relative_to(root).as_posix() for n, t in p.hardlinks.items()}})
    # never the platform's operators (gpuproof.sim.platform): about 180 MB of programs, over the bundle's limit, and
    # built with Go only for the fleets that name them
    manifest = {"format": FORMAT, "gpuproof": __version__, "without": [*([] if dra else ["dra"]), "platform"],
                "made": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pieces": manifest_pieces}
    raw = sum(src.stat().st_size for _, src in entries)
    how = ("(a plain tar, uncompressed)" if not compress else "(xz -1, x86 filter)" if fast
           else "(xz -9e, x86 filter; several minutes on 2 cores)")
    progress(f"{'compressing' if compress else 'writing'} {len(entries)} files ({raw / 2**20:.0f} MiB) into {out} "
             f"{how}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    try:
        stream = (lzma.open(tmp, "wb", format=lzma.FORMAT_XZ, filters=_filters(raw, fast)) if compress
                  else open(tmp, "wb"))
        with stream as xz, tarfile.open(fileobj=xz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            data = json.dumps(manifest, indent=1).encode()
            _add(tar, MANIFEST, io.BytesIO(data), len(data), 0o644)
            for arc, src in entries:
                with open(src, "rb") as f:
                    _add(tar, arc, f, src.stat().st_size, 0o755 if os.access(src, os.X_OK) else 0o644)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    manifest.update(size=out.stat().st_size, raw=raw, seconds=round(time.monotonic() - t0, 1))
    return manifest


def _add(tar: tarfile.TarFile, name: str, f, size: int, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime, info.uname, info.gname = size, mode, 0, "root", "root"
    tar.addfile(info, f)


# ---------------------------------------------------------------------------- install


def _read_manifest(tar: tarfile.TarFile, path: Path, first: tarfile.TarInfo | None = None) -> dict:
    first = first or tar.next()
    if first is None or first.name != MANIFEST:
        raise ControlPlaneError(f"{path} is not a gpuproof bundle (it does not start with {MANIFEST})")
    f = tar.extractfile(first)
    manifest = json.loads(f.read()) if f else {}
    if manifest.get("format") != FORMAT:
        raise ControlPlaneError(f"{path} is a gpuproof bundle of format {manifest.get('format')}, this gpuproof "
                                f"reads format {FORMAT}: make one with `gpuproof sim bundle` of this version")
    return manifest


def _expected(manifest: dict, path: Path) -> None:
    """Refuse a bundle whose cache folders are not this gpuproof's (other pinned sources or build settings)."""
    mine = {p.relative_to(_binaries.cache_root()).as_posix() for p in folders().values()}
    other = [p["folder"] for p in manifest["pieces"] if p["folder"] not in mine]
    if other:
        raise ControlPlaneError(
            f"{path} was made by another gpuproof ({manifest.get('gpuproof')}, made {manifest.get('made')}): its "
            f"{', '.join(other)} are not what this gpuproof's pinned sources build ({', '.join(sorted(mine))}); make "
            f"one with `gpuproof sim bundle` of this version")


def installed(path: Path) -> bool:
    """Whether the bundle at ``path`` is installed in the cache (a stamp of its name, size and time)."""
    return _stamp(path).exists()


def _stamp(path: Path) -> Path:
    st = Path(path).stat()
    key = hashlib.sha256(f"{Path(path).resolve()}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return _binaries.cache_root() / "bundle" / f"installed-{key}.json"


def install(path: Path, progress: Progress = _quiet) -> dict:
    """Unpack the bundle into the cache; returns its manifest with ``seconds`` (the time it took). Files already
    in place with the same digest are kept; the others are replaced. Raises ControlPlaneError in one line."""
    path = Path(path)
    if not path.is_file():
        raise ControlPlaneError(f"no gpuproof bundle at {path} (make one with `gpuproof sim bundle -o FILE`)")
    t0 = time.monotonic()
    root = _binaries.cache_root()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".bundle-", dir=root))
    try:
        try:
            manifest: dict = {}
            with tarfile.open(path, mode="r|*") as tar:          # a stream (xz or plain): read once, from its start
                for member in tar:
                    if not manifest:
                        manifest = _read_manifest(tar, path, member)
                        _expected(manifest, path)
                    else:
                        tar.extract(member, staging, filter="data")
            if not manifest:
                raise ControlPlaneError(f"{path} is not a gpuproof bundle (it is empty)")
        except (tarfile.TarError, lzma.LZMAError, EOFError, ValueError, OSError) as exc:
            if isinstance(exc, ControlPlaneError):
                raise
            raise ControlPlaneError(f"{path}: cannot unpack this gpuproof bundle ({exc}); is it complete?") from None
        for piece in manifest["pieces"]:                      # all of it is whole before any of it is moved
            for name, meta in piece["files"].items():
                got = staging / piece["folder"] / name
                if not got.is_file() or _sha256(got) != meta["sha256"]:
                    raise ControlPlaneError(f"{path}: {piece['folder']}/{name} is missing or damaged in the bundle")
        for piece in manifest["pieces"]:
            src, dest = staging / piece["folder"], root / piece["folder"]
            for name in piece["files"]:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                (src / name).replace(dest / name)
        files = {f"{p['folder']}/{n}" for p in manifest["pieces"] for n in p["files"]}
        for piece in manifest["pieces"]:
            dest = root / piece["folder"]
            dest.mkdir(parents=True, exist_ok=True)
            links = [(n, t, True) for n, t in piece.get("hardlinks", {}).items()]
            for name, target, hard in links + [(n, t, False) for n, t in piece.get("links", {}).items()]:
                link = dest / name
                tmp = link.with_name(f".{link.name}.{os.getpid()}")
                tmp.unlink(missing_ok=True)
                if hard:                                       # the multi-call executable under a program's name
                    if target not in files:
                        raise ControlPlaneError(f"{path}: {piece['folder']}/{name} is a link to {target}, which the "
                                                f"bundle does not hold")
                    os.link(root / target, tmp)
                else:                                          # a library's version link
                    tmp.symlink_to(target)
                tmp.replace(link)
        stamp = _stamp(path)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(json.dumps({"bundle": str(path.resolve()), "made": manifest.get("made")}))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    manifest["seconds"] = round(time.monotonic() - t0, 1)
    progress(f"installed {path} ({path.stat().st_size / 2**20:.1f} MiB) into {root} in {manifest['seconds']}s")
    return manifest


def from_env(progress: Progress = _quiet) -> None:
    """Install ``$GPUPROOF_BUNDLE`` once (a no-op when unset or already installed): ``gpuproof run`` and
    ``gpuproof sim`` call it before anything else."""
    path = os.environ.get(ENV)
    if not path:
        return
    if not Path(path).is_file():
        raise ControlPlaneError(f"${ENV}={path}: no such file (a bundle made by `gpuproof sim bundle -o FILE`)")
    if not installed(Path(path)):
        install(Path(path), progress)


def check(path: Path) -> list[str]:
    """The cache files the installed bundle at ``path`` should have put there but that are missing (names)."""
    with tarfile.open(path, mode="r|*") as tar:
        manifest = _read_manifest(tar, path)
    root = _binaries.cache_root()
    return [f"{p['folder']}/{n}" for p in manifest["pieces"]
            for n in [*p["files"], *p.get("links", {}), *p.get("hardlinks", {})]
            if not (root / p["folder"] / n).exists()]

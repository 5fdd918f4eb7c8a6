"""The bundle (issue #42): what `gpuproof sim bundle` writes, `gpuproof sim install` (or $GPUPROOF_BUNDLE) puts
into a clean cache, where every lookup then finds its piece without Go; bad bundles are refused in one line.

These run over stand-in files in the cache folders the lookups compute (the bundle's code reads no program);
tests/test_bundle_lab.py installs the real bundle and starts kubelet nodes from it with Go hidden.
"""

from __future__ import annotations

import io
import json
import lzma
import os
import tarfile
from pathlib import Path

import pytest

from gpuproof.cli.main import main
from gpuproof.errors import ControlPlaneError
from gpuproof.sim import binaries, bundle, clusternet, images, kubelet, nvidia
from gpuproof.sim.kubelet import runtime as node_runtime

pytestmark = pytest.mark.unit


def _write(path: Path, data: bytes = b"#!/bin/sh\necho stand-in\n", mode: int = 0o755) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)


def fill_cache() -> None:
    """Stand-ins for everything a build from source leaves in the cache ($GPUPROOF_CACHE)."""
    where = bundle.folders()
    multi = bundle.multicall_folder() / bundle.MULTICALL[1]
    _write(multi, b"\x7fELF multi-call " * 64)
    for name in bundle.KUBE_NAMES:
        _write(where["kube"] / name, f"separate {name}".encode())
    _write(where["kube"] / "coredns.yaml.base", b"kind: ConfigMap\n", 0o644)
    _write(where["kwok"] / "kwok")
    _write(where["nfd"] / "nfd-master")
    _write(where["nfd"] / Path(kubelet.NFD_CRDS).name, b"kind: CustomResourceDefinition\n", 0o644)
    _write(where["coredns"] / "coredns")
    for name in (*node_runtime.CONTAINERD_BINARIES, *node_runtime.CONTAINERD_SERVES):
        _write(where["runtime-containerd"] / name)
    _write(where["runtime-runc"] / "runc")
    for name in node_runtime.CNI_PLUGINS:
        _write(where["runtime-cni"] / name)
    _write(where["cdihook"] / "nvidia-cdi-hook")
    sw = nvidia.NodeSoftware(where["nvidia"])
    for name in nvidia.BINARIES:
        _write(sw.exe(name), f"nvidia {name}".encode())
    _write(sw.lib / "libnvidia-ml.so.550.163.01", b"\x7fELF mock", 0o755)
    (sw.lib / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.550.163.01")
    (sw.lib / "libnvidia-ml.so").symlink_to("libnvidia-ml.so.1")
    _write(sw.profiles / "mock-nvml-config-a100.yaml", b"system: {}\n", 0o644)
    for t in nvidia.DEVICE_CLASS_TEMPLATES:
        _write(sw.chart / t, b"kind: DeviceClass\n", 0o644)
    pause, _ = images._cached("pause", images.PAUSE_C.encode(), images.PAUSE.encode())
    _write(pause, b"oci-layout", 0o644)


@pytest.fixture
def no_go(monkeypatch, tmp_path):
    """A machine without Go (nothing on PATH), its cache empty; returns (the maker's cache, the bundle path)."""
    for name in binaries.BINARIES:
        monkeypatch.delenv(binaries.env_var(name), raising=False)
    for var in ("GPUPROOF_BIN_DIR", "KUBEBUILDER_ASSETS", "GPUPROOF_NVIDIA_DIR", "GPUPROOF_KUBELET",
                "GPUPROOF_KUBE_PROXY", "GPUPROOF_COREDNS", bundle.ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setenv("GPUPROOF_CACHE", str(tmp_path / "maker"))
    fill_cache()
    out = tmp_path / "gpuproof-bundle.tar.xz"
    bundle.make(out)
    monkeypatch.setenv("GPUPROOF_CACHE", str(tmp_path / "clean"))
    return tmp_path / "maker", out


def test_an_installed_bundle_is_found_by_every_lookup_without_go(no_go):
    _, out = no_go
    with pytest.raises(ControlPlaneError, match="gpuproof sim install FILE"):   # before: Go is asked for, and a bundle
        binaries.locate()
    manifest = bundle.install(out)
    assert manifest["seconds"] >= 0
    found = binaries.locate(build_missing=False)
    assert all(found.sources[n] == "build cache" for n in binaries.BINARIES), found.describe()
    kube = bundle.folders()["kube"]
    # the Kubernetes programs are one multi-call executable, a hard link under each name
    assert len({(kube / n).stat().st_ino for n in bundle.KUBE_NAMES}) == 1
    assert (kube / "kube-apiserver").read_bytes().startswith(b"\x7fELF multi-call")
    for program in ("nfd-master", "coredns"):          # served by it too, from their own cache folders
        folder = bundle.folders()["nfd" if program == "nfd-master" else "coredns"]
        assert (folder / program).stat().st_ino == (kube / "kubelet").stat().st_ino
    assert kubelet.kubelet_binary() == kube / "kubelet"
    assert clusternet.kube_proxy_binary() == kube / "kube-proxy"
    assert clusternet.addon_manifest() == "kind: ConfigMap\n"
    assert (kubelet.nfd_master() / "nfd-api-crds.yaml").exists()
    from gpuproof.sim.kubelet import dra as kubelet_dra

    runtime = node_runtime.locate()                     # built from no source: installed
    assert runtime.shim.exists() and runtime.ctr.exists() and runtime.runc.exists()
    assert (runtime.cni_dir / "portmap").exists()
    assert kubelet_dra.cdi_hook().exists()
    sw = nvidia.locate(build_missing=False)
    assert sw.complete() and (sw.lib / "libnvidia-ml.so.1").resolve().name == "libnvidia-ml.so.550.163.01"
    assert images.pause_image()[0].read_bytes() == b"oci-layout"          # no C compiler asked for
    assert bundle.check(out) == []


def test_the_bundle_variable_is_installed_by_the_commands_first(no_go, monkeypatch, capsys):
    _, out = no_go
    monkeypatch.setenv(bundle.ENV, str(out))
    assert main(["sim", "fleets"]) == 0
    assert bundle.installed(out) and "installed" in capsys.readouterr().err
    assert binaries.locate(build_missing=False)["kwok"].exists()
    assert main(["sim", "fleets"]) == 0 and "installed" not in capsys.readouterr().err      # once
    monkeypatch.setenv(bundle.ENV, str(out.with_name("nowhere.tar.xz")))
    assert main(["sim", "fleets"]) == 2
    assert "$GPUPROOF_BUNDLE=" in capsys.readouterr().err


def test_the_cli_installs_and_writes(no_go, capsys, tmp_path, monkeypatch):
    maker, out = no_go
    assert main(["sim", "install", str(out)]) == 0
    assert "installed" in capsys.readouterr().err
    monkeypatch.setenv("GPUPROOF_CACHE", str(maker))
    assert main(["sim", "bundle", "-o", str(tmp_path / "again.tar.xz")]) == 0
    printed = capsys.readouterr()
    assert "one multi-call executable: etcd, kube-apiserver" in printed.out
    assert "MiB" in printed.err


def _rewrite(src: Path, dst: Path, edit) -> None:
    """A copy of the bundle ``src`` with its manifest and members passed through ``edit(name, data)``."""
    with tarfile.open(src, "r|xz") as tin, lzma.open(dst, "wb") as xz, tarfile.open(fileobj=xz, mode="w|") as tout:
        for m in tin:
            data = tin.extractfile(m).read() if m.isfile() else b""
            data = edit(m.name, data)
            if data is None:
                continue
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))


def _refused(path: Path, capsys) -> str:
    assert main(["sim", "install", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_bad_bundles_are_refused_in_one_line(no_go, tmp_path, capsys):
    _, out = no_go
    assert "no gpuproof bundle at" in _refused(tmp_path / "missing.tar.xz", capsys)
    (tmp_path / "junk.tar.xz").write_bytes(b"not xz at all")
    assert "cannot unpack this gpuproof bundle" in _refused(tmp_path / "junk.tar.xz", capsys)

    def other_version(name, data):
        if name != bundle.MANIFEST:
            return data
        m = json.loads(data)
        m["pieces"][0]["folder"] = "controlplane/kube-0000000000000000"
        return json.dumps(m).encode()

    _rewrite(out, tmp_path / "other.tar.xz", other_version)
    err = _refused(tmp_path / "other.tar.xz", capsys)
    assert "was made by another gpuproof" in err and "controlplane/kube-0000000000000000" in err, err
    _rewrite(out, tmp_path / "damaged.tar.xz", lambda n, d: d[:-1] + b"!" if n.endswith("/runc") else d)
    assert "runc is missing or damaged in the bundle" in _refused(tmp_path / "damaged.tar.xz", capsys)
    _rewrite(out, tmp_path / "short.tar.xz", lambda n, d: None if n.endswith("/nfd-api-crds.yaml") else d)
    assert "nfd-api-crds.yaml is missing or damaged" in _refused(tmp_path / "short.tar.xz", capsys)
    assert not any((Path(os.environ["GPUPROOF_CACHE"]) / "controlplane").glob("noderuntime-*/runc"))  # none half-done


def test_a_bundle_without_dra_serves_every_pool_but_those_offered_through_dra(no_go, tmp_path, monkeypatch):
    maker, _ = no_go
    monkeypatch.setenv("GPUPROOF_CACHE", str(maker))
    small = tmp_path / "nodra.tar"                                 # uncompressed (--uncompressed): read as well
    manifest = bundle.make(small, dra=False, compress=False)
    assert manifest["without"] == ["dra", "platform"]
    assert manifest["size"] >= manifest["raw"], manifest          # a plain tar
    names = {f"{p['folder']}/{n}" for p in manifest["pieces"] for n in p["files"]}
    assert not [n for n in names if "cdi-hook" in n or n.endswith("/gpu-kubelet-plugin")], names
    # every kubelet node's runtime stays: the gpu-host node runs on it (a GPU machine has none installed)
    linked = {n for p in manifest["pieces"] for n in p.get("hardlinks", {})}
    assert {n.rsplit("/", 1)[1] for n in names} | linked >= {"containerd", "ctr", "runc", "bridge", "portmap"}, names
    monkeypatch.setenv("GPUPROOF_CACHE", str(tmp_path / "clean-nodra"))
    bundle.install(small)
    sw = nvidia.locate(build_missing=False)                     # complete without the DRA driver
    with pytest.raises(ControlPlaneError, match="made with --without-dra; pools offered through DRA need"):
        sw.require_dra()

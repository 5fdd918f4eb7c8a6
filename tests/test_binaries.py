"""Finding the control-plane binaries: the user's first, the build cache next, and a clear word when neither.

The build cache is keyed on the content of the Go modules gpuproof ships, so a checkout and an
install of the same version find one build (tests/test_packaging.py runs an installed wheel on it).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from gpuproof.errors import ControlPlaneError
from gpuproof.sim import binaries

REPO = Path(__file__).resolve().parents[1]

# `go build ... -o DIR/ PKG...` writes one executable per package, named after its last element
GO_STAND_IN = """\
import os, sys
with open(os.environ["GO_LOG"], "a") as log:
    log.write(" ".join(sys.argv[1:]) + "\\n")
args = sys.argv[sys.argv.index("-o") + 1:]
for pkg in args[1:]:
    exe = os.path.join(args[0], pkg.rsplit("/", 1)[-1])
    with open(exe, "w") as f:
        f.write("#!/bin/sh\\n")
    os.chmod(exe, 0o755)
"""


def _fake_bin(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_text("#!/bin/sh\necho fake\n")
    p.chmod(0o755)
    return p


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in binaries.BINARIES:
        monkeypatch.delenv(binaries.env_var(name), raising=False)
    monkeypatch.delenv("GPUPROOF_BIN_DIR", raising=False)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("GPUPROOF_CACHE", str(tmp_path / "cache"))      # an empty build cache
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))               # no go, no binaries on PATH
    return tmp_path


def test_users_binaries_are_used_without_building(clean_env, monkeypatch):
    assets = clean_env / "assets"
    for name in ("etcd", "kube-apiserver"):                  # envtest's KUBEBUILDER_ASSETS layout
        _fake_bin(assets, name)
    own = clean_env / "own"
    for name in ("kube-controller-manager", "kube-scheduler"):
        _fake_bin(own, name)
    kwok = _fake_bin(clean_env / "elsewhere", "kwok")
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    monkeypatch.setenv("GPUPROOF_BIN_DIR", str(own))
    monkeypatch.setenv("GPUPROOF_KWOK", str(kwok))
    found = binaries.locate(build_missing=False)
    assert found.sources == {"etcd": "$KUBEBUILDER_ASSETS", "kube-apiserver": "$KUBEBUILDER_ASSETS",
                             "kube-controller-manager": "$GPUPROOF_BIN_DIR", "kube-scheduler": "$GPUPROOF_BIN_DIR",
                             "kwok": "$GPUPROOF_KWOK"}


def test_path_is_the_last_resort(clean_env, monkeypatch):
    onpath = clean_env / "onpath"
    for name in binaries.BINARIES:
        _fake_bin(onpath, name)
    monkeypatch.setenv("PATH", str(onpath))
    assert set(binaries.locate(build_missing=False).sources.values()) == {"PATH"}


def test_bad_variable_is_named(clean_env, monkeypatch):
    monkeypatch.setenv("GPUPROOF_KUBE_APISERVER", "/no/such/kube-apiserver")
    with pytest.raises(ControlPlaneError, match=r"\$GPUPROOF_KUBE_APISERVER is set to /no/such/kube-apiserver"):
        binaries.locate(build_missing=False)


def test_neither_go_nor_binaries_names_the_three_ways_in_one_line(clean_env):
    with pytest.raises(ControlPlaneError) as err:
        binaries.locate()
    msg = str(err.value)
    assert "\n" not in msg, msg
    assert "missing: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok" in msg
    assert "install Go 1.25 or newer" in msg and "GPUPROOF_BIN_DIR" in msg and "KUBEBUILDER_ASSETS" in msg
    assert not any((clean_env / "cache").rglob("kwok"))


def test_the_modules_are_found_through_the_package():
    """In a checkout gpuproof/_controlplane links to controlplane/ (an install holds a copy)."""
    assert binaries.modules_dir() == REPO / "controlplane"
    files = {p.relative_to(REPO / "controlplane").as_posix() for p in binaries.module_files("kube")}
    assert {"kube/go.mod", "kube/go.sum", "kube/cmd/etcd/main.go"} <= files


def test_module_files_are_the_build_inputs_only(tmp_path, monkeypatch):
    root = tmp_path / "controlplane"
    for rel in ("m/go.mod", "m/go.sum", "m/cmd/x/main.go", "m/build.sh", "m/README.md", "m/bin/x"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    monkeypatch.setattr(binaries, "modules_dir", lambda: root)
    assert [p.relative_to(root).as_posix() for p in binaries.module_files("m")] == [
        "m/build.sh", "m/cmd/x/main.go", "m/go.mod", "m/go.sum"]
    with pytest.raises(ControlPlaneError, match="nosuch"):
        binaries.module_files("nosuch")


def test_the_cache_key_is_the_content_not_the_place(tmp_path):
    """A checkout and an install hold the same files in different folders: one key. Any byte or
    build setting changed: another key, so a bump of a pin rebuilds once."""
    a, b = tmp_path / "checkout" / "controlplane", tmp_path / "site-packages" / "gpuproof" / "_controlplane"
    for root in (a, b):
        shutil.copytree(REPO / "controlplane" / "kwok", root / "kwok")

    def key(root, *settings):
        return binaries.content_key(sorted((root / "kwok").rglob("go.*")), *settings, root=root)

    assert key(a, "-s -w") == key(b, "-s -w")
    assert key(a, "-s -w") != key(a, "-s -w -X changed=1")
    with open(b / "kwok" / "go.sum", "a") as f:
        f.write("example.com/x v1.0.0 h1:AAAA=\n")
    assert key(a, "-s -w") != key(b, "-s -w")
    before = key(a, "-s -w")
    (a / "kwok" / "go.sum").rename(a / "kwok" / "go.sum2")   # the same bytes under another name
    assert key(a, "-s -w") != before


def test_binaries_another_checkout_or_install_built_are_found_without_go(clean_env):
    for module in ("kube", "kwok"):
        folder = binaries.module_cache(module, binaries.LDFLAGS[module])
        assert folder.parent == clean_env / "cache" / "controlplane" and folder.name.startswith(f"{module}-")
        for name, (m, _) in binaries.BINARIES.items():
            if m == module:
                _fake_bin(folder, name)
    found = binaries.locate(build_missing=False)
    assert set(found.sources.values()) == {"build cache"}


@pytest.mark.build  # tier: a Go build (a stand-in go)
def test_a_build_goes_to_its_modules_cache_folder(clean_env, monkeypatch):
    """The plumbing around `go build` (one folder per module, built once), with a stand-in for go."""
    bindir = clean_env / "gobin"
    go = _fake_bin(bindir, "go")
    go.write_text(f"#!{sys.executable}\n" + GO_STAND_IN)
    monkeypatch.setenv("PATH", str(bindir))
    monkeypatch.setenv("GO_LOG", str(clean_env / "go.log"))
    said = []
    found = binaries.locate(progress=said.append)
    assert set(found.sources.values()) == {"build cache (just built)"}
    assert found["kwok"] == binaries.module_cache("kwok", binaries.LDFLAGS["kwok"]) / "kwok"
    assert found["etcd"].parent == binaries.module_cache("kube", binaries.LDFLAGS["kube"])
    assert any(m.startswith("building etcd, kube-apiserver") for m in said), said
    assert any(m.startswith("built kwok from controlplane/kwok") for m in said), said
    assert len((clean_env / "go.log").read_text().splitlines()) == 2          # one go build per module
    assert set(binaries.locate(progress=said.append).sources.values()) == {"build cache"}
    assert len((clean_env / "go.log").read_text().splitlines()) == 2          # built once

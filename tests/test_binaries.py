"""Finding the control-plane binaries: the user's first, the build cache next, and a clear word when neither."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuproof.errors import ControlPlaneError
from gpuproof.sim import binaries


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


def test_neither_go_nor_binaries_says_what_to_install(clean_env):
    with pytest.raises(ControlPlaneError) as err:
        binaries.locate()
    msg = str(err.value)
    assert "missing: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok" in msg
    assert "install Go 1.25 or newer" in msg and "GPUPROOF_BIN_DIR" in msg and "KUBEBUILDER_ASSETS" in msg
    assert not (clean_env / "cache" / "controlplane").exists() or not any((clean_env / "cache").rglob("kwok"))


def test_cache_key_follows_the_pins(monkeypatch):
    """Bumping a pin (go.mod) or the version stamp changes where binaries are cached, so it rebuilds."""
    key = binaries.build_key()
    monkeypatch.setitem(binaries.LDFLAGS, "kwok", "-s -w -X changed=1")
    assert binaries.build_key() != key

"""Base ports for private embedded clusters: chosen once per machine at a time (the lock files of find_free_base)."""

from __future__ import annotations

import fcntl
import os

import pytest

from gpuproof.sim import controlplane
from gpuproof.sim.controlplane import find_free_base

pytestmark = pytest.mark.unit


@pytest.fixture
def locks(tmp_path, monkeypatch):
    monkeypatch.setattr(controlplane, "PORT_LOCKS", tmp_path / "ports")
    monkeypatch.setattr(controlplane, "_held_bases", {})
    yield tmp_path / "ports"
    for fd in controlplane._held_bases.values():
        os.close(fd)


def test_one_process_never_gets_the_same_base_twice(locks):
    first, second = find_free_base(), find_free_base()
    assert first != second
    assert {f"{first}.lock", f"{second}.lock"} <= {p.name for p in locks.iterdir()}


def test_a_base_another_session_holds_is_passed_over(locks):
    base = find_free_base()
    controlplane._release(base)
    other = os.open(locks / f"{base}.lock", os.O_RDWR)      # another session's hold: its own open file
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert find_free_base() != base
    finally:
        os.close(other)
    assert find_free_base() == base           # let go: the base is free again


def test_without_a_lock_folder_the_ports_alone_decide(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setattr(controlplane, "PORT_LOCKS", blocker / "ports")     # cannot be made: a file is in the way
    monkeypatch.setattr(controlplane, "_held_bases", {})
    assert 20000 <= find_free_base() < 30000

"""Waits on the API server that outlast its restart (issue #41 item 3): a list cut by a refused or reset
connection is asked again, with back-off, until the wait's own deadline, which then says the API server did not
answer."""

from __future__ import annotations

import time

import pytest
import urllib3

from gpuproof.cluster.api import watch_until
from gpuproof.errors import WaitTimeout


def _refused():
    return urllib3.exceptions.MaxRetryError(None, "/api/v1/pods", "Connection refused")


def test_a_list_refused_while_the_api_server_restarts_is_asked_again():
    calls = []

    def list_fn(**kwargs):
        calls.append(kwargs)
        if len(calls) <= 2:
            raise _refused()
        return {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "p"}, "phase": "Running"}]}

    got = watch_until(list_fn, lambda c: c.get("p"), 30, "pod p")
    assert got["phase"] == "Running" and len(calls) == 3


def test_an_api_server_that_stays_away_ends_the_wait_at_its_deadline_saying_so():
    def list_fn(**kwargs):
        raise _refused()

    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"timed out after 1s waiting for pod p: the API server did not answer "
                                          r"\(MaxRetryError: .*Connection refused"):
        watch_until(list_fn, lambda c: c.get("p"), 1, "pod p")
    assert time.monotonic() - t0 < 3


@pytest.mark.server  # tier: pytest as a process, with gpuproof's plugin
def test_a_check_cut_by_the_api_server_is_not_judged(tmp_path):
    """A check whose wait ended because the API server stopped answering is a skip naming the wait, never a
    failure (issue #41 item 3); any other error still fails."""
    import subprocess
    import sys

    (tmp_path / "test_cut.py").write_text(
        "from gpuproof.errors import ApiUnreachable\n\n\n"
        "def test_cut():\n"
        "    raise ApiUnreachable('timed out after 60s waiting for pod p: the API server did not answer (x)')\n\n\n"
        "def test_broken():\n"
        "    raise RuntimeError('a real error')\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_cut.py", "-q", "-rs", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--junitxml={tmp_path / 'junit.xml'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "not judged: timed out after 60s waiting for pod p: the API server did not answer" in proc.stdout
    junit = (tmp_path / "junit.xml").read_text()
    assert '<skipped type="pytest.skip" message="not judged: timed out' in junit, junit

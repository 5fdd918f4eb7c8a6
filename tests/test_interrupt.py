"""Ctrl-C is obeyed at once, whatever the run waits on (issue #52 item 5).

How fast an interrupted run ends against a cluster, with one pod or hundreds of pods and watches in flight, is a
benchmark (benchmarks/interrupt_load.py, written up in benchmarks/TESTS.md); tests/test_cleanup.py checks that an
interrupted run leaves nothing and says how it ended. Here: what made the end slow or lost the interrupt, each alone.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from types import SimpleNamespace

import pytest

pytest_plugins = ["pytester"]

DEEP = '''
def deep(n):
    if n == 0:
        raise KeyboardInterrupt
    return deep(n - 1)


def test_interrupted():
    deep(40)
'''

# how many frames pytest's terminal reporter is given to render (it runs after gpuproof's hook, which is tryfirst)
COUNT = '''
import pytest


class Count:
    @pytest.hookimpl(trylast=True)
    def pytest_keyboard_interrupt(self, excinfo):
        print(f"FRAMES TO RENDER {len(excinfo.traceback)}")


def pytest_configure(config):
    config.pluginmanager.register(Count())
'''


@pytest.mark.parametrize("full", [False, True], ids=["short", "full-trace"])
def test_an_interrupt_is_rendered_from_its_last_frame_unless_full_trace_is_asked(pytester, full):
    """pytest renders the whole traceback of an interrupt (every frame's source file parsed) to print its last line:
    70 frames deep in a wait on the cluster, 10 to 30 s on a loaded machine before any cleanup began. gpuproof cuts
    it to the last frame pytest shows; --full-trace still gets every frame."""
    pytester.makepyfile(test_deep=DEEP)
    pytester.makeconftest(COUNT)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-s", *(["--full-trace"] if full else []),
                                          no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    out = result.stdout.str()
    frames = int(out.split("FRAMES TO RENDER ")[1].split()[0])
    assert "test_deep.py:3: KeyboardInterrupt" in out
    if full:
        assert frames > 40 and "deep(40)" in out
    else:
        assert frames == 1


DRAIN = '''
import os
import signal
import threading
import types

import pytest

from gpuproof.plugin import fanout as fo

NODES = [types.SimpleNamespace(name=f"n{i}") for i in range(2)]


@pytest.fixture(scope="session")
def fan(request):
    return fo.get(request.config, run=None, say=lambda m: None)


def work(node, lane):
    with lane.pods(1):
        if node.name == "n1" and lane.stop.wait(30):        # until the run ends
            raise RuntimeError("stopped")
    return node.name


@pytest.mark.parametrize("node", NODES, ids=["n0", "n1"])
def test_a(node, fan, request):
    if node.name == "n1":
        # Ctrl-C in a second, while the next check waits for this one's work on n1 to end (fanout.drain)
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        pytest.skip("n1's work runs on")
    assert fan.result(request.node, node, work, name="a", member=lambda p: p.get("node")) == "n0"


def test_b(fan):
    print("TEST B RAN")
'''


@pytest.mark.server  # tier: pytest as a process (a real SIGINT, which must not reach this session)
def test_ctrl_c_while_a_check_waits_for_the_fan_out_of_the_one_before_ends_the_run(pytester):
    """The fan-out drains an earlier check's work before another check starts; Ctrl-C while it waited was swallowed
    there (contextlib.suppress(BaseException)), and the run went on once the work ended."""
    pytester.makepyfile(test_drain=DRAIN)
    t0 = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--parallel=2", "--progress-after=0", "-s",
                                           timeout=120)
    assert result.ret == pytest.ExitCode.INTERRUPTED, result.stdout.str()
    assert "TEST B RAN" not in result.stdout.str()
    assert time.monotonic() - t0 < 30          # not after n1's work gave up waiting (30 s)


def _target(tmp_path, cleanup):
    """A Target with a run whose cleanup is ``cleanup``, and a run folder: what its close() uses, nothing more."""
    from gpuproof.plugin.target import Target
    from gpuproof.results import RunDir

    t = Target.__new__(Target)
    said: list[str] = []
    t.config = SimpleNamespace(getoption=lambda *a, **k: None)
    t.progress = said.append
    t.run_id, t.scale, t._closed, t.api_gone, t.cut_short = "r1", 1.0, False, False, ""
    t.cluster = SimpleNamespace(api=SimpleNamespace(), nodewatch=None)
    t._run = SimpleNamespace(_cleaned=False, cleanup=cleanup)
    t._run_dir = RunDir.create(tmp_path, "r1", target="t", argv=[], cluster="c", fleet="")
    t.lease, t.sim = None, None
    t.choice = SimpleNamespace(close=lambda progress: None)
    t.write_inventory = lambda: said.append("inventory written")
    return t, said


def test_an_end_interrupted_while_it_waits_for_the_deletion_still_writes_the_run_record(tmp_path):
    """A second Ctrl-C while the run waits for its namespace to go stops the waiting, never the writing of run.json:
    it says how the run ended and what the second interrupt cut."""
    from gpuproof.results import CheckRecord

    def cleanup(**kwargs):
        raise KeyboardInterrupt

    t, said = _target(tmp_path, cleanup)
    t._run_dir.add_check(CheckRecord(feature="f", check="c", target="n", verdict="pass"))
    t.close("interrupted", interrupted=True)
    meta = json.loads((tmp_path / "r1" / "run.json").read_text())
    assert meta["outcome"] == "interrupted"
    assert meta["extra"]["end_interrupted"] == "interrupted during its cleanup"
    # ended at once: the records as JSONL, no parquet copy (pandas' import alone took seconds under load)
    assert "JSONL only" in meta["extra"]["tables"] and not (tmp_path / "r1" / "checks.parquet").exists()
    assert (tmp_path / "r1" / "checks.jsonl").read_text().count("\n") == 1
    assert any("not waited for" in line and "gpuproof clean" in line for line in said), said
    assert "inventory written" not in said


def test_the_run_record_of_a_run_without_records_needs_no_pandas(tmp_path, monkeypatch):
    """run.json comes first and pandas (with pyarrow: 10 to 40 s to import on a loaded machine) only for a table to
    write: an interrupted run with no records ends without it."""
    from gpuproof.results import RunDir

    monkeypatch.setitem(sys.modules, "pandas", None)        # `import pandas` fails
    rd = RunDir.create(tmp_path, "r2", target="t", argv=[], cluster="c", fleet="")
    rd.finalize("interrupted")
    assert json.loads((tmp_path / "r2" / "run.json").read_text())["outcome"] == "interrupted"


def test_a_pod_wait_hears_the_run_end_before_its_watch_has_listed_anything():
    """A fan-out worker waiting on a pod whose shared watch has not listed yet (an API server slow to answer) heard the
    end of the run only after 30 s; now as soon as the watch is closed (FanOut.stop_now)."""
    from gpuproof.cluster.api import InFlight
    from gpuproof.cluster.podwatch import PodWatch
    from gpuproof.errors import ClusterError

    watch = PodWatch.__new__(PodWatch)           # its state only: no thread, no cluster
    watch.run = SimpleNamespace(namespace="gpuproof-r", cluster=SimpleNamespace(
        api=SimpleNamespace(gpuproof_inflight=InFlight()), nodewatch=None))
    watch.cache, watch.tick, watch._cond = {}, 5.0, threading.Condition()
    watch._ready, watch._stop = threading.Event(), threading.Event()         # never listed
    watch.error, watch.error_since = None, 0.0
    stop = threading.Event()

    def end():
        stop.set()
        watch.close()

    threading.Timer(0.2, end).start()
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="stopped waiting for pod gpuproof-r/p to finish: the run is ending"):
        watch.wait("p", lambda p: False, 600, "to finish", stop)
    assert time.monotonic() - t0 < 3

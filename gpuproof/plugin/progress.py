"""Progress during a run: long steps as they happen, and an estimate of the time left.

A pytest plugin (loaded with gpuproof's plugin; ``-p no:gpuproof.progress`` turns it off,
``--gpuproof-progress-after 0`` silences it). It only speaks in sessions that use gpuproof's
fixtures, and only about steps that last longer than ``--gpuproof-progress-after`` seconds
(default 10); a step is reported again at doubling intervals (10 s, 20 s, 40 s ... then every
5 minutes), so a long step costs a handful of lines, never one per second:

- a check still running (a benchmark on this host, a long wait);
- a pod of the run waiting: for a node (with the scheduler's reason), or on its node
  (``ContainerCreating``, ``ImagePullBackOff``, ...); a workload pod still running; how a
  reported wait ended;
- image pulls, from the kubelet's events: still pulling, pulled (duration and size),
  failing (``ErrImagePull``/``BackOff``, once each);
- a request the API server has not answered (a frozen or overloaded control plane): its method and
  path and how long, then how long it took once answered (``gpuproof.cluster.api.InFlight``).

The estimate: checks done / total and the time left, from the time each check took in this
run, refined by the durations of the same checks in earlier runs against the same target
(``junit.xml`` in ``<report-dir>/<earlier run>/``): a check timed before counts its earlier
time, scaled by how fast this run is going compared with that one. Printed at the start,
then at most every 3 x ``--gpuproof-progress-after`` seconds as checks finish.

Lines are written through pytest's terminal reporter, past output capture. The cluster is
followed by watches on the run namespace (pods and events) in background threads; their lines
are written while a test runs, or by pytest's own thread between tests.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import pytest

from .progress_board import Board, EventView, PodView, Schedule, fmt_duration
from .options import DEFAULT_PROGRESS_AFTER as DEFAULT_AFTER
from .progress_eta import Estimate, history, junit_key

PLUGIN_NAME = "gpuproof-progress"

# where gpuproof's fixtures live, by name: importing the module here (progress is registered first) would import it
# before pytest marks it for assertion rewriting
FIXTURES_MODULE = __name__.rsplit(".", 1)[0] + ".fixtures"
# fixtures that make a test one of gpuproof's checks (a session with none of them is left alone)
GPUPROOF_FIXTURES = {"target", "run", "discovery", "check", "run_dir", "scratch", "gpu_node", "gpu_pool",
                     "gpu_product", "gpu_products", "needs_real_gpus"}


# ------------------------------------------------------------------------------ formatting


# ------------------------------------------------------------------------------ reporting schedule


# ------------------------------------------------------------------------------ pods and pulls


# ------------------------------------------------------------------------------ the estimate


# ------------------------------------------------------------------------------ the plugin


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.get_plugin(PLUGIN_NAME) is None:
        config.pluginmanager.register(Progress(config), PLUGIN_NAME)


def _uses_gpuproof(item) -> bool:
    """Whether the test uses one of gpuproof's fixtures (not merely a fixture of the same name)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
    for name in GPUPROOF_FIXTURES & set(getattr(item, "fixturenames", ())):
        chosen = defs.get(name) or ()
        if chosen and getattr(getattr(chosen[-1], "func", None), "__module__", "") == FIXTURES_MODULE:
            return True
    return False


def run_target(config: pytest.Config, t) -> tuple[str, str]:
    """(target, fleet) as the run's run.json records them: earlier runs count only against the same ones."""
    choice = getattr(t, "choice", None)
    if choice is not None and hasattr(choice, "label"):
        return choice.label(), (choice.fleet or "mixed") if not t.real else ""
    kubeconfig, context = config.getoption("--kubeconfig"), config.getoption("--context")
    if not t.real:
        return "embedded", config.getoption("--fleet") or "mixed"
    return f"kubeconfig:{kubeconfig or '~/.kube/config'}#{context or ''}", ""


class Progress:
    """The plugin object: holds the run's estimate, the board, the threads that follow the cluster."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.after = float(config.getoption("progress_after", DEFAULT_AFTER) or 0.0)
        self.active = False
        self.lines: list[str] = []                # every line given, for tests and callers to wait on
        self._cond = threading.Condition(threading.RLock())
        self._in_phase = False
        self._pending: list[str] = []
        self._stop = threading.Event()
        self._unfollow = threading.Event()        # the watches on the run's pods and events stop (set with _stop)
        self._threads: list[threading.Thread] = []
        self._following = False
        self.board = Board(self.after or DEFAULT_AFTER)
        self.schedule = Schedule(self.after or DEFAULT_AFTER)
        self.estimate: Estimate | None = None
        self.sources: list[str] = []
        self.started = time.monotonic()
        self._last_eta = time.monotonic()
        self._current: str | None = None
        self._current_since = 0.0
        self._api_reported: dict[int, tuple[str, str, float]] = {}   # API requests reported as unanswered

    # -- writing

    def say(self, msg: str) -> None:
        """One '[gpuproof] ...' line, from any thread."""
        with self._cond:
            self.lines.append(msg)
            self._cond.notify_all()
            if self._in_phase:
                self._write(msg, past_capture=True)
            elif threading.current_thread() is threading.main_thread():
                self._flush()
                self._write(msg, past_capture=False)
            else:
                self._pending.append(msg)     # pytest's thread is reporting: it writes this at its next step

    def _flush(self, past_capture: bool = False) -> None:
        pending, self._pending = self._pending, []
        for msg in pending:
            self._write(msg, past_capture)

    def _write(self, msg: str, past_capture: bool) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        capman = self.config.pluginmanager.get_plugin("capturemanager") if past_capture else None
        with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
            tw = self.config.get_terminal_writer()
            if tw.width_of_current_line:      # pytest's dots: end their line (and let pytest start a new one)
                tw.line()
            tr.currentfspath = None
            tw.line(f"[gpuproof] {msg}")

    def wait_for(self, predicate: Callable[[str], bool] | str, timeout: float, count: int = 1) -> str | None:
        """The ``count``-th line matching (a substring or a predicate), waiting up to ``timeout`` s for it."""
        test = (lambda line: predicate in line) if isinstance(predicate, str) else predicate
        with self._cond:
            self._cond.wait_for(lambda: sum(1 for line in self.lines if test(line)) >= count, timeout)
            found = [line for line in self.lines if test(line)]
            return found[count - 1] if len(found) >= count else None

    # -- pytest hooks

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        config = self.config
        if self.after <= 0 or config.getoption("collectonly") or config.getoption("verbose") < -1:
            return
        if not any(_uses_gpuproof(i) for i in session.items):
            return
        self.active = True
        from .target import get_target

        t = get_target(config)
        target, fleet = run_target(config, t)
        earlier, self.sources = history(config.getoption("--report-dir"), t.run_id, target, fleet)
        self.estimate = Estimate([junit_key(i.nodeid) for i in session.items], earlier)
        n = self.estimate.total
        line = f"{n} check{'s' if n != 1 else ''} to run"
        left = self.estimate.remaining() if earlier else None
        if left is not None:
            line += f"; about {fmt_duration(left)} by earlier runs ({self._by()})"
        self.say(line)
        self.started = self._last_eta = time.monotonic()
        self._start(self._tick_loop, "ticker")

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        if not self.active:
            return
        with self._cond:
            self._flush()
            self._current, self._current_since = nodeid, time.monotonic()

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_setup(self, item):
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_call(self, item):
        return (yield from self._phase())

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_teardown(self, item, nextitem):
        return (yield from self._phase())

    def _phase(self):
        # innermost wrapper: output capture is on for exactly this span, so the threads may write past it
        # now, and pytest cannot switch capture back off while one of them is writing
        if not self.active:
            return (yield)
        with self._cond:
            self._in_phase = True
            self._flush(past_capture=True)
        self._follow_run()
        try:
            return (yield)
        finally:
            with self._cond:
                self._in_phase = False

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        if not self.active or self.estimate is None:
            return
        now = time.monotonic()
        with self._cond:
            self._flush()
            if self._current == nodeid:
                self.estimate.finished(junit_key(nodeid), now - self._current_since)
                self._current = None
            else:
                self.estimate.finished(junit_key(nodeid), 0.0)
        if now - self._last_eta >= 3 * self.after and self.estimate.done < self.estimate.total:
            self._last_eta = now
            self.say(self._eta_line())

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus) -> None:
        if not self.active:
            return
        self._stop.set()
        self._unfollow.set()
        with self._cond:
            self._flush()
        with contextlib.suppress(Exception):      # a request answered since the last tick: said, not lost
            self._api_waits(time.monotonic())
        if self.estimate is not None and self.estimate.done:
            self.say(f"{self.estimate.done} checks in {fmt_duration(time.monotonic() - self.started)}")
        self.active = False

    def stop_following(self) -> None:
        """The run is ending (interrupted): its pods' and events' watches stop now. Deleting hundreds of pods sends
        as many events, each decoded in Python beside the run's own end (issue #52); the lines on time stay."""
        self._unfollow.set()

    # -- the estimate in words

    def _by(self) -> str:
        e = self.estimate
        runs = self.sources[0] + (f" and {len(self.sources) - 1} before it" if len(self.sources) > 1 else "")
        return f"{e.timed_before()} of {e.total} timed in run {runs}"

    def _eta_line(self) -> str:
        e = self.estimate
        running_for = time.monotonic() - self._current_since if self._current else 0.0
        left = e.remaining(junit_key(self._current) if self._current else None, running_for)
        line = f"{e.done}/{e.total} checks done in {fmt_duration(time.monotonic() - self.started)}"
        if left is not None:
            line += f"; about {fmt_duration(left)} left"
            if self.sources:
                line += f" (pace {e.pace():.2g}x of run {self.sources[0]})" if any(
                    k in e.earlier for k in e.took) else f" (by run {self.sources[0]})"
        return line

    # -- following the cluster

    def _start(self, fn: Callable[[], None], name: str) -> None:
        def body():
            try:
                fn()
            except Exception:           # progress must never be the reason a run fails
                pass

        t = threading.Thread(target=body, name=f"gpuproof-progress-{name}", daemon=True)
        self._threads.append(t)
        t.start()

    def _tick_loop(self) -> None:
        tick = min(5.0, max(0.1, self.after / 4))
        while not self._stop.wait(tick):
            now = time.monotonic()
            self._follow_run()
            with self._cond:
                current, since = self._current, self._current_since
            if current is not None and self.schedule.due(("test", current), now - since):
                line = f"still running {current} ({fmt_duration(now - since)})"
                if self.estimate is not None:
                    left = self.estimate.remaining(junit_key(current), now - since)
                    line += f"; {self.estimate.done}/{self.estimate.total} checks done" + (
                        f", about {fmt_duration(left)} left" if left is not None else "")
                self.say(line)
            for line in self.board.tick(now):
                self.say(line)
            self._api_waits(now)

    def _api_waits(self, now: float) -> None:
        """A request the API server has not answered for --progress-after seconds: what it is and how long (at
        doubling intervals), and how long it took once answered."""
        from .target import started_target

        t = started_target(self.config)
        inflight = getattr(getattr(getattr(t, "cluster", None), "api", None), "gpuproof_inflight", None)
        if inflight is None:
            return
        waiting = inflight.waiting()
        for key, (method, path, since) in waiting.items():
            if self.schedule.due(("api", key), now - since):
                self.say(f"waiting for the API server: {method} {path} has had no answer for "
                         f"{fmt_duration(now - since)}")
        for key in [k for k in self._api_reported if k not in waiting]:
            method, path, since = self._api_reported.pop(key)
            self.schedule.forget(("api", key))
            self.say(f"the API server answered {method} {path} after {fmt_duration(now - since)}")
        self._api_reported.update({k: v for k, v in waiting.items() if self.schedule.reported(("api", k))})

    def _follow_run(self) -> None:
        """Once the run namespace exists, watch its pods and events (once)."""
        if self._following or self._unfollow.is_set():
            return
        from .target import get_target

        t = get_target(self.config)
        run = t._run
        if run is None or t.cluster is None:
            return
        with self._cond:
            if self._following:
                return
            self._following = True
        core = t.cluster.core

        def on_pod(kind: str, pod) -> None:
            now = time.monotonic()
            lines = self.board.pod_gone(pod.metadata.name, now) if kind == "DELETED" else \
                self.board.pod(PodView.of(pod), now)
            for line in lines:
                self.say(line)

        def on_event(kind: str, ev) -> None:
            if kind != "DELETED" and ev.involved_object is not None:
                for line in self.board.event(EventView.of(ev), time.monotonic()):
                    self.say(line)

        self._start(lambda: follow(core.list_namespaced_pod, on_pod, self._unfollow, namespace=run.namespace), "pods")
        self._start(lambda: follow(core.list_namespaced_event, on_event, self._unfollow, namespace=run.namespace,
                                   field_selector="involvedObject.kind=Pod"), "events")


def follow(list_fn: Callable, handle: Callable[[str, Any], None], stop: threading.Event, **kwargs) -> None:
    """List, then watch, calling handle(type, object) for every object and change, until ``stop`` is set.

    A lost connection or an expired resourceVersion starts over from a fresh list; errors back off.
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    backoff = 0.5
    while not stop.is_set():
        try:
            resp = list_fn(**kwargs, _request_timeout=30)
            for obj in resp.items:
                handle("ADDED", obj)
            rv = resp.metadata.resource_version
            while not stop.is_set():
                w = watch.Watch()
                for ev in w.stream(list_fn, resource_version=rv, timeout_seconds=5, _request_timeout=15, **kwargs):
                    if stop.is_set():
                        break
                    obj = ev["object"]
                    if ev["type"] == "ERROR":
                        code = obj.get("code") if isinstance(obj, dict) else getattr(obj, "code", None)
                        raise ApiException(status=code or 500)
                    if ev["type"] == "BOOKMARK" or isinstance(obj, dict):
                        continue
                    rv = obj.metadata.resource_version
                    handle(ev["type"], obj)
                w.stop()
            backoff = 0.5
        except Exception:
            if stop.wait(backoff):           # the cluster went away (end of run) or hiccupped: try again later
                return
            backoff = min(backoff * 2, 10.0)

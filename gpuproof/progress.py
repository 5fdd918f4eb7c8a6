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
  failing (``ErrImagePull``/``BackOff``, once each).

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
import dataclasses
import json
import math
import re
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import pytest

DEFAULT_AFTER = 10.0
MAX_GAP = 300.0            # a step still going is reported at least this often
LINES_PER_TICK = 4         # more pod lines than this in one tick are summed up
HISTORY_RUNS = 10          # earlier run folders looked at for durations
PLUGIN_NAME = "gpuproof-progress"

# fixtures that make a test one of gpuproof's checks (a session with none of them is left alone)
GPUPROOF_FIXTURES = {"target", "run", "discovery", "check", "run_dir", "scratch", "gpu_node", "gpu_pool",
                     "gpu_product", "gpu_products", "needs_real_gpus"}


# ------------------------------------------------------------------------------ formatting


def fmt_duration(seconds: float) -> str:
    """'0.4s', '7s', '1m05s', '2h03m'."""
    if 0 < seconds < 9.95:
        return f"{seconds:.1f}s"
    s = int(round(max(0.0, seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


_GO_DURATION = re.compile(r"(\d+(?:\.\d+)?)(h|ms|m|s|us|µs|ns)")
_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def go_duration(text: str) -> float | None:
    """Seconds of a Go duration as the kubelet prints it ('1m2.5s', '812ms'); None if it is none."""
    parts = _GO_DURATION.findall(text or "")
    if not parts or "".join(f"{v}{u}" for v, u in parts) != text:
        return None
    return sum(float(v) * _GO_UNITS[u] for v, u in parts)


def _short(text: str, limit: int = 140) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------------------ reporting schedule


class Schedule:
    """When a step still going is worth a line: after ``after`` s, then at doubling gaps (at most MAX_GAP)."""

    def __init__(self, after: float):
        self.after = after
        self._next: dict[Any, float] = {}

    def due(self, key: Any, elapsed: float) -> bool:
        nxt = self._next.get(key, self.after)
        if elapsed < nxt:
            return False
        gap = min(max(nxt, self.after), MAX_GAP)
        while nxt <= elapsed:
            nxt += gap
            gap = min(gap * 2, MAX_GAP)
        self._next[key] = nxt
        return True

    def reported(self, key: Any) -> bool:
        return key in self._next

    def forget(self, key: Any) -> None:
        self._next.pop(key, None)


# ------------------------------------------------------------------------------ pods and pulls


@dataclasses.dataclass
class PodView:
    """What progress needs of a pod."""

    name: str
    phase: str = "Pending"
    node: str = ""
    unschedulable: str = ""      # the scheduler's reason while it finds no node
    waiting: str = ""            # a container's waiting reason once on a node
    waiting_message: str = ""
    workload: bool = False       # a workload pod (benchmark, probe): its running time is a step

    @classmethod
    def of(cls, pod) -> "PodView":
        """From a kubernetes client V1Pod."""
        from .workloads import WORKLOAD_LABEL

        status, spec = pod.status, pod.spec
        view = cls(pod.metadata.name, phase=(status.phase if status else None) or "Pending",
                   node=(spec.node_name if spec else None) or "",
                   workload=WORKLOAD_LABEL in (pod.metadata.labels or {}))
        for cond in (status.conditions or []) if status else []:
            if cond.type == "PodScheduled" and cond.status == "False":
                view.unschedulable = cond.message or cond.reason or "not scheduled yet"
        for cs in [*(status.init_container_statuses or []), *(status.container_statuses or [])] if status else []:
            waiting = cs.state.waiting if cs.state else None
            if waiting is not None and waiting.reason:
                view.waiting, view.waiting_message = waiting.reason, waiting.message or ""
                break
        return view

    @property
    def state(self) -> str:
        if self.phase in ("Succeeded", "Failed"):
            return self.phase
        if self.phase == "Running":
            return "Running"
        if not self.node:
            return "unscheduled"
        return f"waiting:{self.waiting or 'starting'}"


@dataclasses.dataclass
class EventView:
    """What progress needs of an event about a pod."""

    pod: str
    reason: str
    message: str = ""
    key: str = ""                # uid + count: the same event seen twice (a relist) says nothing new
    node: str = ""

    @classmethod
    def of(cls, ev) -> "EventView":
        count = ev.count or (ev.series.count if getattr(ev, "series", None) else 0) or 1
        host = (ev.source.host if ev.source else None) or getattr(ev, "reporting_instance", None) or ""
        return cls(ev.involved_object.name, ev.reason or "", ev.message or "", f"{ev.metadata.uid}/{count}", host)


_IMAGE = re.compile(r'[Ii]mage "([^"]+)"')
_PULLED_IN = re.compile(r" in (\S+?)(?: \(|\. |$)")
_IMAGE_SIZE = re.compile(r"Image size: (\d+) bytes")
PULL_FAILURES = ("Failed", "BackOff", "ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InspectFailed")


class Board:
    """The run's pods and image pulls, and the lines they are worth. Thread-safe; the clock is passed in."""

    def __init__(self, after: float):
        self.after = after
        self.schedule = Schedule(after)
        self._lock = threading.Lock()
        self.pods: dict[str, PodView] = {}
        self._since: dict[str, float] = {}                     # pod -> when its current state began
        self._pulls: dict[tuple[str, str], float] = {}         # (pod, image) -> when the pull began
        self._seen_events: set[str] = set()
        self._said: set[tuple[str, str, str]] = set()          # one-off lines already given

    # -- pods

    def pod(self, view: PodView, now: float) -> list[str]:
        """A pod was added or changed; returns lines for a reported step that just ended."""
        with self._lock:
            old = self.pods.get(view.name)
            self.pods[view.name] = view
            if old is not None and old.state == view.state:
                return []
            lines = []
            if old is not None:
                lines += self._ended(old, view, now)
            self._since[view.name] = now
            return lines

    def pod_gone(self, name: str, now: float) -> list[str]:
        with self._lock:
            old = self.pods.pop(name, None)
            since = self._since.pop(name, now)
            self._pulls = {k: v for k, v in self._pulls.items() if k[0] != name}
            if old is not None and self.schedule.reported(("pod", name, old.state)):
                self.schedule.forget(("pod", name, old.state))
                return [f"pod {name}{self._on(old)}: deleted after {fmt_duration(now - since)} {self._doing(old)}"]
            return []

    def _ended(self, old: PodView, new: PodView, now: float) -> list[str]:
        key = ("pod", old.name, old.state)
        if not self.schedule.reported(key):
            return []
        self.schedule.forget(key)
        took = fmt_duration(now - self._since.get(old.name, now))
        if new.phase in ("Succeeded", "Failed"):
            return [f"pod {new.name}{self._on(new)}: {new.phase} after {took} {self._doing(old)}"]
        now_doing = f"running on {new.node}" if new.state == "Running" else self._doing(new)
        return [f"pod {new.name}: {self._doing(old)} for {took}; now {now_doing}"]

    @staticmethod
    def _on(view: PodView) -> str:
        return f" on {view.node}" if view.node else ""

    @staticmethod
    def _doing(view: PodView) -> str:
        if view.state == "unscheduled":
            return "waiting for a node"
        if view.state == "Running":
            return "running"
        if view.state.startswith("waiting:"):
            return f"waiting ({view.waiting or 'starting'})"
        return view.phase

    # -- events

    def event(self, ev: EventView, now: float) -> list[str]:
        with self._lock:
            if ev.key and ev.key in self._seen_events:
                return []
            if ev.key:
                self._seen_events.add(ev.key)
            pod = self.pods.get(ev.pod)
            node = (pod.node if pod else "") or ev.node
            where = f"pod {ev.pod}" + (f" on {node}" if node else "")
            m = _IMAGE.search(ev.message)
            image = m.group(1) if m else ""
            if ev.reason == "Pulling" and image:
                self._pulls.setdefault((ev.pod, image), now)
                return []
            if ev.reason == "Pulled" and image:
                began = self._pulls.pop((ev.pod, image), None)
                key = ("pull", ev.pod, image)
                if "already present" in ev.message:
                    self.schedule.forget(key)
                    return []
                took = None
                if (d := _PULLED_IN.search(ev.message)) is not None:
                    took = go_duration(d.group(1))
                if took is None and began is not None:
                    took = now - began
                reported = self.schedule.reported(key)
                self.schedule.forget(key)
                if not reported and (took is None or took < self.after):
                    return []
                size = _IMAGE_SIZE.search(ev.message)
                return [f"{where}: pulled image {image}" + (f" in {fmt_duration(took)}" if took is not None else "")
                        + (f" ({fmt_bytes(int(size.group(1)))})" if size else "")]
            if ev.reason in PULL_FAILURES and ("image" in ev.message.lower() or ev.reason != "Failed"):
                once = (ev.pod, ev.reason, image or _short(ev.message, 60))
                if once in self._said:
                    return []
                self._said.add(once)
                return [f"{where}: {ev.reason}: {_short(ev.message)}"]
            return []

    # -- time passing

    def tick(self, now: float) -> list[str]:
        """Lines for pods and pulls whose step has lasted long enough to be worth one (again)."""
        lines: list[str] = []
        with self._lock:
            pulling_pods = {pod for pod, _ in self._pulls}
            for (pod, image), began in sorted(self._pulls.items()):
                if self.schedule.due(("pull", pod, image), now - began):
                    view = self.pods.get(pod)
                    lines.append(f"pod {pod}{self._on(view) if view else ''}: pulling image {image} "
                                 f"({fmt_duration(now - began)} so far)")
            for name, view in sorted(self.pods.items()):
                state = view.state
                if state in ("Succeeded", "Failed") or (state == "Running" and not view.workload):
                    continue
                if name in pulling_pods and state.startswith("waiting:"):
                    continue           # the pull says it better
                elapsed = now - self._since.get(name, now)
                if not self.schedule.due(("pod", name, state), elapsed):
                    continue
                took = fmt_duration(elapsed)
                if state == "unscheduled":
                    lines.append(f"pod {name} waiting for a node ({took}): {_short(view.unschedulable)}")
                elif state == "Running":
                    lines.append(f"pod {name} running on {view.node} ({took})")
                else:
                    why = f": {_short(view.waiting_message)}" if view.waiting_message else ""
                    lines.append(f"pod {name} on {view.node}: {view.waiting or 'starting'} ({took}){why}")
        if len(lines) > LINES_PER_TICK:
            lines = lines[: LINES_PER_TICK - 1] + [f"... and {len(lines) - LINES_PER_TICK + 1} more pods or pulls "
                                                   "still going"]
        return lines


# ------------------------------------------------------------------------------ the estimate


def junit_key(nodeid: str) -> str:
    """A test's key as junit.xml has it: 'suites.test_x::test_y[param]' (classname::name)."""
    base, bracket, params = nodeid.partition("[")
    parts = base.split("::")
    parts[0] = re.sub(r"\.py$", "", parts[0].replace("/", "."))
    return ".".join(parts[:-1]) + "::" + parts[-1] + bracket + params


def junit_durations(path: str | Path) -> dict[str, float]:
    """Seconds per test (setup + call + teardown) from a junit.xml, keyed like :func:`junit_key`."""
    out: dict[str, float] = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        try:
            out[f"{case.get('classname', '')}::{case.get('name', '')}"] = float(case.get("time") or "nan")
        except ValueError:
            continue
    return {k: v for k, v in out.items() if math.isfinite(v) and v >= 0}


def history(report_dir: str | Path, run_id: str, target: str, fleet: str = "") -> tuple[dict[str, float], list[str]]:
    """Durations of checks in the latest earlier runs against the same target (and fleet).

    Returns {key: seconds} (the most recent run that timed a check wins) and the run ids used.
    """
    root = Path(report_dir)
    try:
        folders = sorted((p for p in root.iterdir() if p.is_dir() and p.name != run_id), reverse=True)
    except OSError:
        return {}, []
    durations: dict[str, float] = {}
    used: list[str] = []
    for folder in folders:
        if len(used) >= HISTORY_RUNS:
            break
        junit = folder / "junit.xml"
        if not junit.is_file():
            continue
        try:
            meta = json.loads((folder / "run.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("target") != target or (meta.get("fleet") or "") != (fleet or ""):
            continue
        found = junit_durations(junit)
        if not found:
            continue
        used.append(folder.name)
        for key, seconds in found.items():
            durations.setdefault(key, seconds)
    return durations, used


class Estimate:
    """Time left in a run: the checks' earlier durations (scaled by this run's pace), else this run's mean."""

    def __init__(self, keys: list[str], earlier: dict[str, float] | None = None):
        self.keys = list(keys)
        self.earlier = dict(earlier or {})
        self.took: dict[str, float] = {}

    @property
    def total(self) -> int:
        return len(self.keys)

    @property
    def done(self) -> int:
        return len(self.took)

    def finished(self, key: str, seconds: float) -> None:
        self.took[key] = max(0.0, seconds)

    def pace(self) -> float:
        """This run's time over the earlier runs' time, for the checks both timed (1 when none)."""
        both = [k for k in self.took if k in self.earlier]
        before = sum(self.earlier[k] for k in both)
        if not both or before <= 0:
            return 1.0
        return min(5.0, max(0.2, sum(self.took[k] for k in both) / before))

    def remaining(self, running: str | None = None, running_for: float = 0.0) -> float | None:
        """Seconds left (None: nothing to go by yet). The check running now counts what it has left."""
        left = [k for k in self.keys if k not in self.took]
        new = [self.took[k] for k in self.took if k not in self.earlier] or list(self.took.values())
        mean = sum(new) / len(new) if new else (sum(self.earlier.values()) / len(self.earlier)
                                                if self.earlier else None)
        pace = self.pace()
        total = 0.0
        for key in left:
            guess = self.earlier[key] * pace if key in self.earlier else mean
            if guess is None:
                return None
            if key == running:
                guess = max(0.0, guess - running_for)
            total += guess
        return total

    def timed_before(self) -> int:
        return sum(1 for k in self.keys if k in self.earlier)


# ------------------------------------------------------------------------------ the plugin


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("gpuproof").addoption(
        "--gpuproof-progress-after", "--progress-after", dest="progress_after", type=float, default=DEFAULT_AFTER,
        metavar="SECONDS",
        help="report a step (a check, a pod waiting, an image pull, a benchmark pod) once it has lasted this long, "
             "then at doubling intervals; the time left is shown at most every 3x this; 0 turns progress off "
             f"(default {DEFAULT_AFTER:g})")


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.get_plugin(PLUGIN_NAME) is None:
        config.pluginmanager.register(Progress(config), PLUGIN_NAME)


def _uses_gpuproof(item) -> bool:
    """Whether the test uses one of gpuproof's fixtures (not merely a fixture of the same name)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
    for name in GPUPROOF_FIXTURES & set(getattr(item, "fixturenames", ())):
        chosen = defs.get(name) or ()
        if chosen and getattr(getattr(chosen[-1], "func", None), "__module__", "") == "gpuproof.pytest_plugin":
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
        from .pytest_plugin import get_target

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
        with self._cond:
            self._flush()
        if self.estimate is not None and self.estimate.done:
            self.say(f"{self.estimate.done} checks in {fmt_duration(time.monotonic() - self.started)}")
        self.active = False

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

    def _follow_run(self) -> None:
        """Once the run namespace exists, watch its pods and events (once)."""
        if self._following or self._stop.is_set():
            return
        from .pytest_plugin import get_target

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

        self._start(lambda: follow(core.list_namespaced_pod, on_pod, self._stop, namespace=run.namespace), "pods")
        self._start(lambda: follow(core.list_namespaced_event, on_event, self._stop, namespace=run.namespace,
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

"""What the cluster shows of a run's pods and events, in the words of a progress line (``gpuproof.plugin.progress``)."""

from __future__ import annotations

import dataclasses
import re
import threading
from typing import Any

MAX_GAP = 300.0            # a step still going is reported at least this often
LINES_PER_TICK = 4         # more pod lines than this in one tick are summed up


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
        from ..bench.workloads import WORKLOAD_LABEL

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

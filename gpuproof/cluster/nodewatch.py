"""Nodes lost while a run goes on (issue #41 item 4): deleted, or turned NotReady, after the run first saw them.

A run judges the nodes its discovery listed at the start. One watch on the cluster's nodes (:class:`NodeWatch`,
started with the run's discovery: :func:`watch_nodes`) notes each of them that is deleted, or whose Ready condition
leaves True, with the time. From then on:

- a wait on a pod bound or pinned to such a node ends at once with :class:`~gpuproof.errors.NodeLost` naming it
  (``Run.wait_pods``, ``PodWatch``), instead of at its deadline;
- the fan-out starts no work on it;
- the plugin records every check on it as not judged (a skip naming the node and why), never pass or fail;
- the run's outcome names it, and ``gpuproof run`` says so in one line and exits 75 (plugin/target.py, cli/run.py).

A lost node stays lost for the rest of the run, even if it comes back: a node re-created, or Ready again, is not
the node the run's checks began on. A node NotReady from the start is not lost (the nodes suite fails it) and one
that joins during the run is not watched. Nothing here changes a node: it only reads them.
"""

from __future__ import annotations

import datetime as _dt
import json
import threading
import time
from typing import Any, Callable, Iterable

from ..errors import NodeLost


def _name(node: Any) -> str:
    return node["metadata"]["name"] if isinstance(node, dict) else node.metadata.name


def _ready(node: Any) -> tuple[bool, str]:
    """(Ready=True, 'reason: message' of the Ready condition) of a node as API JSON or a model object."""
    if isinstance(node, dict):
        conds = (node.get("status") or {}).get("conditions") or []
        cond = next((c for c in conds if c.get("type") == "Ready"), None)
        if cond is None:
            return False, "no Ready condition"
        why = ": ".join(x for x in (cond.get("reason"), cond.get("message")) if x)
        return cond.get("status") == "True", f"Ready={cond.get('status')}" + (f" ({why})" if why else "")
    conds = (node.status.conditions or []) if node.status else []
    cond = next((c for c in conds if c.type == "Ready"), None)
    if cond is None:
        return False, "no Ready condition"
    why = ": ".join(x for x in (cond.reason, cond.message) if x)
    return cond.status == "True", f"Ready={cond.status}" + (f" ({why})" if why else "")


def _clock() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%H:%M:%SZ")


class NodeLoss:
    """Which nodes of those first seen were lost since, and why. Fed by :class:`NodeWatch`; pure, so tested alone."""

    def __init__(self, nodes: Iterable[Any] = ()):
        self._lock = threading.Lock()
        self.ready: dict[str, bool] = {}       # node -> Ready when first seen (only those are watched)
        self.lost: dict[str, str] = {}         # node -> why it is lost
        self.lost_at: dict[str, float] = {}    # node -> time.monotonic() when seen lost
        self.start(nodes)

    def start(self, nodes: Iterable[Any]) -> None:
        with self._lock:
            for n in nodes:
                self.ready.setdefault(_name(n), _ready(n)[0])

    def observe(self, kind: str, node: Any, clock: str | None = None) -> str:
        """One watch event (ADDED, MODIFIED, DELETED) of a node: why it is lost now, or ''."""
        name = _name(node)
        with self._lock:
            if name not in self.ready or name in self.lost:
                return ""
            if kind == "DELETED":
                why = f"node {name} was deleted during the run (at {clock or _clock()})"
            else:
                ready, state = _ready(node)
                if ready or not self.ready[name]:
                    return ""
                why = f"node {name} went NotReady at {clock or _clock()} ({state})"
            self.lost[name], self.lost_at[name] = why, time.monotonic()
            return why

    def relisted(self, nodes: Iterable[Any], clock: str | None = None) -> list[str]:
        """A fresh list of every node (after a watch was cut): the watched nodes not in it were deleted meanwhile."""
        nodes = list(nodes)
        present = {_name(n) for n in nodes}
        out = [self.observe("MODIFIED", n, clock) for n in nodes]
        with self._lock:
            gone = [n for n in self.ready if n not in present and n not in self.lost]
        out += [self.observe("DELETED", {"metadata": {"name": n}}, clock) for n in gone]
        return [why for why in out if why]

    def reason(self, name: str | None) -> str:
        if not name:
            return ""
        with self._lock:
            return self.lost.get(name, "")

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.lost)


class NodeWatch:
    """One list + watch of the cluster's nodes for a run, feeding a :class:`NodeLoss` (API JSON: no model objects,
    which cost 10x on a large cluster). ``say`` hears one line per node lost (from the watch's thread)."""

    def __init__(self, cluster, nodes: Iterable[Any], say: Callable[[str], None] | None = None, tick: float = 60.0):
        self.cluster = cluster
        self.loss = NodeLoss(nodes)
        self.say = say or (lambda msg: None)
        self.tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpuproof-nodewatch", daemon=True)
        self._thread.start()

    def reason(self, name: str | None) -> str:
        return self.loss.reason(name)

    def _tell(self, whys: Iterable[str]) -> None:
        for why in whys:
            try:
                self.say(f"{why}: its checks are not judged from now on")
            except Exception:                 # noqa: BLE001  (a line not written never stops the watch)
                pass

    def _loop(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        core = self.cluster.core

        def list_node(**kwargs):              # no docstring: the watch leaves its objects as API JSON
            return core.list_node(**kwargs)

        backoff = 0.5
        while not self._stop.is_set():
            try:
                resp = core.list_node(_preload_content=False, _request_timeout=60)
                body = json.loads(resp.data)
                self._tell(self.loss.relisted(body.get("items") or []))
                rv = body["metadata"]["resourceVersion"]
                while not self._stop.is_set():
                    w = watch.Watch()
                    for ev in w.stream(list_node, resource_version=rv, timeout_seconds=max(1, int(self.tick)),
                                       _request_timeout=self.tick + 30, allow_watch_bookmarks=True):
                        obj = ev["object"]
                        if ev["type"] == "ERROR":
                            raise ApiException(status=(obj.get("code") if isinstance(obj, dict) else None) or 500)
                        rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                        if ev["type"] != "BOOKMARK":
                            self._tell([why for why in [self.loss.observe(ev["type"], obj)] if why])
                        if self._stop.is_set():
                            break
                    w.stop()
                backoff = 0.5
            except Exception:                 # noqa: BLE001  (a cut watch lists again: the list says who is gone)
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, 10.0)

    def stop(self) -> None:
        self._stop.set()


def watch_nodes(cluster, nodes: Iterable[Any], say: Callable[[str], None] | None = None) -> NodeWatch:
    """Start the run's node watch on ``cluster`` (once; a second call returns the first), over ``nodes`` as the run
    first saw them."""
    found = getattr(cluster, "nodewatch", None)
    if found is None:
        found = cluster.nodewatch = NodeWatch(cluster, nodes, say)
    return found


def lost_reason(cluster, node: str | None) -> str:
    """Why ``node`` is lost ('' when it is not, or when no node watch runs on ``cluster``)."""
    watcher = getattr(cluster, "nodewatch", None)
    return watcher.reason(node) if watcher is not None and node else ""


def pod_node(pod: Any) -> str:
    """The node a pod is bound to, or pinned to (nodeSelector on the hostname, or a required node affinity on one
    name): '' for a pod free to go anywhere."""
    spec = pod.spec
    if spec.node_name:
        return spec.node_name
    name = (spec.node_selector or {}).get("kubernetes.io/hostname")
    if name:
        return name
    na = spec.affinity.node_affinity if spec.affinity else None
    req = na.required_during_scheduling_ignored_during_execution if na else None
    names = set()
    for term in (req.node_selector_terms or []) if req else []:
        for f in term.match_fields or []:
            if f.key == "metadata.name" and f.operator == "In":
                names |= set(f.values or [])
    return next(iter(names)) if len(names) == 1 else ""


def raise_if_node_lost(cluster, cache: dict, nodes: dict[str, str], what: str) -> None:
    """NodeLost when a pod of ``cache`` is bound or pinned to a lost node. ``nodes`` (pod -> node) keeps, across
    calls, the node of each pod seen, so a pod the node took with it (deleted with it) still names it."""
    if getattr(cluster, "nodewatch", None) is None:
        return
    for name, pod in cache.items():
        node = pod_node(pod)
        if node:
            nodes[name] = node
    for name, node in nodes.items():
        why = lost_reason(cluster, node)
        if why:
            raise NodeLost(node, why, f"pod {name} on it: {what}")

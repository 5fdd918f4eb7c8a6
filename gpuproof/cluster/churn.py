"""Verdicts that hold while other people's pods come and go.

A check built on free capacity takes a :class:`ForeignPods` snapshot of the nodes it uses
before it starts. When it is about to fail, it asks ``changed()``: if pods that are not the
run's arrived on or left those nodes meanwhile, the capacity the check was built on moved
under it, and the check is skipped with that reason instead of failing (see
``Checker.true(..., churn=...)``).

A check that fills a node's free capacity with its own pods waits on them with :func:`fill_done`: one of them taken away
meanwhile (another's preemptor, a deletion) ends the wait at once, and the check is not judged, naming whose pods came
(:func:`taken_away`), instead of waiting out its deadline into a failure.

Preemption victims are what the scheduler records on them (a ``Preempted`` event naming the
preemptor's UID, the ``DisruptionTarget`` condition), never pods that merely disappeared.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable, Iterable

from kubernetes import watch

from .api import RUN_LABEL


def _foreign(pod, run_id: str) -> bool:
    return (pod.metadata.labels or {}).get(RUN_LABEL) != run_id


class ForeignPods:
    """Pods not of this run, not finished, on some nodes: at the start, and every one that came or went since.

    A watch follows the nodes from the start, so a pod that arrived and left again while the check
    ran still counts (comparing two snapshots would miss it). The watch ends with this object.
    """

    def __init__(self, cluster, run_id: str, nodes: Iterable[str]):
        self.cluster, self.run_id = cluster, run_id
        self.nodes = sorted(set(nodes))
        self.came: dict[str, str] = {}
        self.went: dict[str, str] = {}
        self.lost = ""                    # why the watch stopped early ('' while it follows)
        self.before, rv = self._list()
        self._watch = watch.Watch()
        weakref.finalize(self, self._watch.stop)
        threading.Thread(target=_follow, args=(weakref.ref(self), self._watch, self._selector(), rv),
                         name="gpuproof-churn", daemon=True).start()

    def _selector(self) -> dict:
        # one node: the API server filters; several: every pod, filtered here
        return {"field_selector": f"spec.nodeName={self.nodes[0]}"} if len(self.nodes) == 1 else {}

    def _list(self) -> tuple[dict[str, str], str]:
        resp = self.cluster.core.list_pod_for_all_namespaces(**self._selector())
        return {p.metadata.uid: _describe(p) for p in resp.items if self._counts(p)}, resp.metadata.resource_version

    def _counts(self, pod) -> bool:
        return pod.spec.node_name in self.nodes and _foreign(pod, self.run_id) \
            and pod.status.phase not in ("Succeeded", "Failed") and pod.metadata.deletion_timestamp is None

    def _event(self, kind: str, pod) -> None:
        if pod.spec.node_name not in self.nodes or not _foreign(pod, self.run_id):
            return
        uid = pod.metadata.uid
        if kind != "DELETED" and self._counts(pod):
            if uid not in self.before:
                self.came[uid] = _describe(pod)
        elif uid in self.before or uid in self.came:
            self.went[uid] = _describe(pod)

    def read(self) -> dict[str, str]:
        return self._list()[0]

    def changed(self) -> str:
        """'' when no pod of others arrived on or left the nodes since the start; else what did."""
        now = self.read()
        came = sorted({*self.came.values(), *(now[u] for u in set(now) - set(self.before))})
        went = sorted({*self.went.values(), *(self.before[u] for u in set(self.before) - set(now))})
        parts = ([f"{len(came)} arrived ({', '.join(came[:3])}{', ...' if len(came) > 3 else ''})"] if came else []) + \
                ([f"{len(went)} left ({', '.join(went[:3])}{', ...' if len(went) > 3 else ''})"] if went else [])
        if not parts and self.lost:
            parts = [f"could not follow them ({self.lost})"]
        if not parts:
            return ""
        return f"pods of others changed on {', '.join(self.nodes)} while the check ran: {'; '.join(parts)}"


def _describe(pod) -> str:
    return f"{pod.metadata.namespace}/{pod.metadata.name} on {pod.spec.node_name}"


def _follow(ref, w, selector: dict, rv: str) -> None:
    """Feed watch events to the ForeignPods behind ``ref`` until it is gone (the watch is stopped then)."""
    owner = ref()
    if owner is None:
        return
    core = owner.cluster.core
    del owner
    try:
        for ev in w.stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=300,
                           **selector):
            owner = ref()
            if owner is None:
                return
            if ev["type"] in ("ADDED", "MODIFIED", "DELETED"):
                owner._event(ev["type"], ev["object"])
            del owner
        owner = ref()
        if owner is not None:          # the server ended the watch: what follows is not seen
            owner.lost = "watch ended after 300 s"
    except Exception as exc:        # a broken watch makes every later verdict a skip, never a pass by luck
        owner = ref()
        if owner is not None:
            owner.lost = f"watch ended: {exc}"


def fill_done(names: list[str], settled: Callable[[Any], bool]) -> Callable[[dict], Any]:
    """done() of a wait on the pods a check fills a node's free capacity with (issue #41 item 5): ``("taken", [...])``
    as soon as one of them, once seen, is gone or going (preempted by other people's pods, or deleted: capacity
    taken from under the check, which no longer waits for it), ``("placed", cache)`` once all are ``settled``."""
    seen: set[str] = set()

    def done(cache: dict) -> Any:
        seen.update(n for n in names if n in cache)
        taken = [n for n in sorted(seen) if n not in cache or cache[n].metadata.deletion_timestamp]
        if taken:
            return "taken", taken
        return all(n in cache and settled(cache[n]) for n in names) and ("placed", cache)

    return done


def taken_away(churn: ForeignPods, where: str, taken: list[str]) -> str:
    """Why a check whose fill pods were taken away is not judged: whose pods came or went meanwhile, when seen."""
    return churn.changed() or (f"{', '.join(taken)} taken away while {where} filled (preempted by other pods, or "
                               "deleted): the capacity the check was filling is not its own")


def preemption_victims(cluster, preemptor_uid: str) -> set[str]:
    """namespace/name of every pod the scheduler preempted for the pod with this UID."""
    events = cluster.core.list_event_for_all_namespaces(field_selector="reason=Preempted").items
    return {f"{e.involved_object.namespace}/{e.involved_object.name}" for e in events
            if preemptor_uid in (e.message or "")}

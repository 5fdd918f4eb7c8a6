"""Verdicts that hold while other people's pods come and go.

A check built on free capacity takes a :class:`ForeignPods` snapshot of the nodes it uses
before it starts. When it is about to fail, it asks ``changed()``: if pods that are not the
run's arrived on or left those nodes meanwhile, the capacity the check was built on moved
under it, and the check is skipped with that reason instead of failing (see
``Checker.true(..., churn=...)``).

Preemption victims are what the scheduler records on them (a ``Preempted`` event naming the
preemptor's UID, the ``DisruptionTarget`` condition), never pods that merely disappeared.
"""

from __future__ import annotations

from typing import Iterable

from .cluster import RUN_LABEL


def _foreign(pod, run_id: str) -> bool:
    return (pod.metadata.labels or {}).get(RUN_LABEL) != run_id


class ForeignPods:
    """Pods not of this run, not finished, on some nodes: now, and what changed since."""

    def __init__(self, cluster, run_id: str, nodes: Iterable[str]):
        self.cluster, self.run_id = cluster, run_id
        self.nodes = sorted(set(nodes))
        self.before = self.read()

    def read(self) -> dict[str, str]:
        out = {}
        for node in self.nodes:
            for p in self.cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items:
                if _foreign(p, self.run_id) and p.status.phase not in ("Succeeded", "Failed") \
                        and p.metadata.deletion_timestamp is None:
                    out[p.metadata.uid] = f"{p.metadata.namespace}/{p.metadata.name} on {node}"
        return out

    def changed(self) -> str:
        """'' when the same foreign pods hold the nodes as at the start; else what changed."""
        now = self.read()
        came = sorted(now[u] for u in set(now) - set(self.before))
        went = sorted(self.before[u] for u in set(self.before) - set(now))
        if not came and not went:
            return ""
        parts = ([f"{len(came)} arrived ({', '.join(came[:3])}{', ...' if len(came) > 3 else ''})"] if came else []) + \
                ([f"{len(went)} left ({', '.join(went[:3])}{', ...' if len(went) > 3 else ''})"] if went else [])
        return f"pods of others changed on {', '.join(self.nodes)} while the check ran: {'; '.join(parts)}"


def preemption_victims(cluster, preemptor_uid: str) -> set[str]:
    """namespace/name of every pod the scheduler preempted for the pod with this UID."""
    events = cluster.core.list_event_for_all_namespaces(field_selector="reason=Preempted").items
    return {f"{e.involved_object.namespace}/{e.involved_object.name}" for e in events
            if preemptor_uid in (e.message or "")}

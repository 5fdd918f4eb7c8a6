"""Named waits: what a suite waits for, said in its name, as the Kubernetes e2e framework says it
(``e2epod.WaitForPodRunningInNamespace``, ``WaitForPodCondition(..., conditionDesc, timeout, condition)``).

A :class:`PodCondition` is a test on one pod with the words of what it waits for; a wait on it names them when it
runs out of time::

    p = wait_for(run, "dra-probe", pod_scheduled, target.timeouts.claim_scheduled)
    w.wait_for(name, pod_running.named("to be Running (the GPU the exporter should see busy)"), timeout)

``wait_for`` takes the run (:meth:`Run.wait_pod <gpuproof.cluster.api.Run.wait_pod>`, a watch of its own) or a
:class:`~gpuproof.cluster.podwatch.PodWatch` (one shared watch, for fan-outs) the same way; either ends early on a
pod that can never start. The waits on other objects are named too: :func:`wait_quota_computed`,
:func:`wait_events_naming`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from .api import watch_until

FINISHED = ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class PodCondition:
    """A condition on one pod and what it says (``what``, e.g. "to be Running": the end of "waiting for pod X ...").

    ``test`` sees the pod, or None where a shared watch has not seen it (or saw it go); only :data:`pod_gone` holds
    for None."""

    what: str
    test: Callable[[Any], bool]

    def __call__(self, pod) -> bool:
        return self.test(pod)

    def named(self, what: str) -> PodCondition:
        """The same condition saying more of why it is waited for."""
        return dataclasses.replace(self, what=what)


def _phase(pod) -> str | None:
    return pod.status.phase if pod is not None and pod.status else None


def is_ready(pod) -> bool:
    """The pod's Ready condition is True."""
    for cond in (pod.status.conditions or []) if pod is not None and pod.status else []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False


pod_scheduled = PodCondition("to be scheduled", lambda p: p is not None and bool(p.spec.node_name))
pod_running = PodCondition("to be Running", lambda p: _phase(p) == "Running")
pod_ready = PodCondition("to be Ready", is_ready)
pod_done = PodCondition("to finish (Succeeded or Failed)", lambda p: _phase(p) in FINISHED)
pod_started = PodCondition("to be Running (or finished)", lambda p: _phase(p) in ("Running", *FINISHED))
pod_gone = PodCondition("to be deleted", lambda p: p is None)


def wait_for(waiter, name: str, condition: PodCondition, timeout: float, stop=None) -> Any:
    """Pod ``name`` once it meets ``condition``; :class:`~gpuproof.errors.WaitTimeout` naming ``condition.what`` at
    ``timeout`` or as soon as the pod can never start. ``waiter``: the run, or a PodWatch (``stop``: its run's end)."""
    if hasattr(waiter, "wait_pod"):
        return waiter.wait_pod(name, condition, timeout, condition.what)
    return waiter.wait_for(name, condition, timeout, stop)


def wait_quota_computed(core, namespace: str, name: str, resource: str, timeout: float) -> Any:
    """ResourceQuota ``namespace/name`` once kube-controller-manager has computed it (its ``status.hard`` names
    ``resource``): only then is the quota enforced."""
    return watch_until(core.list_namespaced_resource_quota,
                       lambda c: name in c and (c[name].status.hard or {}).get(resource) or None,
                       timeout, f"ResourceQuota {namespace}/{name} to be initialised", namespace=namespace)


def wait_events_naming(core, reason: str, text: str, timeout: float, what: str) -> dict:
    """The cluster's events of ``reason`` once one of them has ``text`` in its message (the scheduler records its
    events asynchronously); the name -> event cache."""
    return watch_until(core.list_event_for_all_namespaces,
                       lambda c: any(text in (e.message or "") for e in c.values()) and c or None,
                       timeout, what, field_selector=f"reason={reason}")

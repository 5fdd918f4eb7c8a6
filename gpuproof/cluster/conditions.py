"""Named waits: what a suite waits for, said in its name, as the Kubernetes e2e framework says it
(``e2epod.WaitForPodRunningInNamespace``, ``WaitForPodCondition(..., conditionDesc, timeout, condition)``).

A :class:`PodCondition` is a test on one pod with the words of what it waits for; a wait on it names them when it
runs out of time::

    p = wait_for(run, "dra-probe", pod_scheduled, target.timeouts.claim_scheduled)
    w.wait_for(name, pod_running.named("to be Running (the GPU the exporter should see busy)"), timeout)

``wait_for`` takes the run (:meth:`Run.wait_pod <gpuproof.cluster.api.Run.wait_pod>`, a watch of its own) or a
:class:`~gpuproof.cluster.podwatch.PodWatch` (one shared watch, for fan-outs) the same way; either ends early on a
pod that can never start. The conditions themselves live in :mod:`gpuproof.cluster.podconditions` (so the run's
own waits use them too) and are given out here. The waits on other objects are named too:
:func:`wait_quota_computed`, :func:`wait_events_naming`.
"""

from __future__ import annotations

from typing import Any

from .api import watch_until
from .podconditions import (FINISHED, PodCondition, is_ready, pod_done, pod_gone, pod_ready,  # noqa: F401
                            pod_running, pod_scheduled, pod_started)


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


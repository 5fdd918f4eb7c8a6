"""Named waits: what a suite waits for, said in its name, as the Kubernetes e2e framework says it
(``e2epod.WaitForPodRunningInNamespace``, ``WaitForPodCondition(..., conditionDesc, timeout, condition)``).

A :class:`PodCondition` is a test on one pod with the words of what it waits for; a wait on it names them when it
runs out of time::

    p = wait_for(run, "dra-probe", pod_scheduled, target.timeouts.claim_scheduled)
    w.wait_for(name, pod_running.named("to be Running (the GPU the exporter should see busy)"), timeout)

``wait_for`` takes the run (:meth:`Run.wait_pod <gpuproof.cluster.api.Run.wait_pod>`, a watch of its own) or a
:class:`~gpuproof.cluster.podwatch.PodWatch` (one shared watch, for fan-outs) the same way; either ends early on a
pod that can never start; :func:`wait_all` waits on several of the run's pods at once. The conditions themselves
live in :mod:`gpuproof.cluster.podconditions` (so the run's own waits use them too) and are given out here.
The waits on other objects are named too: :func:`wait_quota_computed`, :func:`wait_events_naming`,
:func:`wait_claims_gone`.
"""

from __future__ import annotations

from typing import Any

from ..vocab import DRA_GROUP, DRA_VERSION
from .api import watch_until
from .podconditions import (FINISHED, PodCondition, is_ready, pod_done, pod_gone, pod_ready,  # noqa: F401
                            pod_running, pod_scheduled, pod_started)


def wait_for(waiter, name: str, condition: PodCondition, timeout: float, stop=None) -> Any:
    """Pod ``name`` once it meets ``condition``; :class:`~gpuproof.errors.WaitTimeout` naming ``condition.what`` at
    ``timeout`` or as soon as the pod can never start. ``waiter``: the run, or a PodWatch (``stop``: its run's end)."""
    if hasattr(waiter, "wait_pod"):
        return waiter.wait_pod(name, condition, timeout, condition.what)
    return waiter.wait_for(name, condition, timeout, stop)


def wait_all(run, names: list[str], condition: PodCondition, timeout: float, who: str | None = None) -> dict:
    """The run's pods ``names`` (name -> pod, None for a pod gone) once every one meets ``condition``, in one watch
    of the run's pods that ends early, as :meth:`Run.wait_pods <gpuproof.cluster.api.Run.wait_pods>` does, on a pod
    that can never start. A timeout says "waiting for <who> <condition.what>"; ``who``: "pod <name>" for one pod,
    "<n> pods" for more, unless given."""
    names = list(dict.fromkeys(names))
    if not names:
        return {}
    who = who or (f"pod {names[0]}" if len(names) == 1 else f"{len(names)} pods")

    def all_met(cache: dict) -> dict | None:
        pods = {n: cache.get(n) for n in names}
        return pods if all(condition(p) for p in pods.values()) else None

    return run.wait_pods(all_met, timeout, f"{who} {condition.what}")


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


def wait_claims_gone(run, timeout: float, names: list[str] | None = None, who: str | None = None) -> None:
    """Until the ResourceClaims ``names`` of the run's namespace (every one when None) are deallocated and deleted:
    the next test then finds their devices free. ``who``: the claims in the timeout's words ("claims a, b" when
    ``names`` are given, else "the ResourceClaims in <namespace>")."""
    left = set(names) if names is not None else None
    if left is not None and not left:
        return
    who = who or (f"claims {', '.join(sorted(left))}" if left is not None
                  else f"the ResourceClaims in {run.namespace}")

    def remaining(cache: dict) -> list[str]:
        return sorted(set(cache) & left if left is not None else set(cache))

    # the client's ResourceV1Api cannot decode watch events (it asks for a V1ResourceClaim model it lacks)
    watch_until(run.cluster.custom.list_namespaced_custom_object, lambda c: not remaining(c), timeout,
                f"{who} to be deallocated and deleted",
                describe=lambda c: f"{len(remaining(c))} left: {', '.join(remaining(c)[:5])}",
                group=DRA_GROUP, version=DRA_VERSION, namespace=run.namespace, plural="resourceclaims")

"""One watch on a run's pods, shared by many waiters: what lets a run wait on hundreds of pods at once.

:meth:`Run.wait_pods <gpuproof.cluster.api.Run.wait_pods>` opens a list and a watch of its own for each wait, which
is right for one pod at a time. A fan-out across a fleet has up to ``--parallel`` pods in flight, each with a waiter:
N watches on the same namespace would cost the API server N connections and N relists. :class:`PodWatch` keeps one
list + watch of the pods that carry a label selector, a name -> pod cache, and wakes every waiter on each change.

A waiter's wait ends, as :meth:`Run.wait_pods` does, as soon as its pod can never start: bound to a node whose
kubelet stays silent (:data:`~gpuproof.cluster.api.KUBELET_SILENCE`), refused by the kubelet for good
(:data:`~gpuproof.cluster.api.NEVER_STARTS`), or an image that failed to pull
:data:`~gpuproof.cluster.api.PULL_TRIES` times; and a pod pinned to a node that was cordoned or went away meanwhile;
a pod bound or pinned to a node lost during the run ends it with :class:`~gpuproof.errors.NodeLost` within ``tick``.
A watch the API server leaves broken ends it with :class:`~gpuproof.errors.ApiUnreachable` at its deadline (its pod
is not judged on what was seen before), or with :class:`~gpuproof.errors.ApiGone` after the API deadline.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable

from ..errors import ApiGone, ApiUnreachable, ClusterError, WaitTimeout, one_line
from .conditions import PodCondition, pod_done, pod_gone
from .nodewatch import pod_node, raise_if_node_lost
from .api import (_describe_pod, _raise_if_kubelet_silent, _raise_if_never_starts, _root_cause, api_deadline_of_client,
                  no_answer, raise_if_pull_fails)


class PodWatch:
    """A shared cache of the run namespace's pods matching ``label_selector``, kept by one background watch."""

    def __init__(self, run, label_selector: str, tick: float = 5.0):
        self.run = run
        self.label_selector = label_selector
        self.tick = tick
        self.cache: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.error_since = 0.0          # time.monotonic() since which the watch has been broken (0: it is not)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"gpuproof-podwatch-{label_selector}", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the watch

    def _loop(self) -> None:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        core, ns = self.run.cluster.core, self.run.namespace
        backoff = 0.2
        while not self._stop.is_set():
            try:
                resp = core.list_namespaced_pod(ns, label_selector=self.label_selector, _request_timeout=30)
                with self._cond:
                    self.cache = {p.metadata.name: p for p in resp.items}
                    self.error, self.error_since = None, 0.0
                    self._ready.set()           # before the waiters wake: they judge only a cache that is ready
                    self._cond.notify_all()
                rv = resp.metadata.resource_version
                while not self._stop.is_set():
                    w = watch.Watch()
                    for ev in w.stream(core.list_namespaced_pod, ns, label_selector=self.label_selector,
                                       resource_version=rv, timeout_seconds=max(1, int(self.tick)),
                                       _request_timeout=self.tick + 30, allow_watch_bookmarks=True):
                        obj = ev["object"]
                        if ev["type"] == "ERROR":
                            code = obj.get("code") if isinstance(obj, dict) else getattr(obj, "code", None)
                            raise ApiException(status=code or 500)
                        if ev["type"] == "BOOKMARK" or isinstance(obj, dict):
                            rv = (obj.get("metadata") or {}).get("resourceVersion", rv) if isinstance(obj, dict) \
                                else rv
                            continue
                        rv = obj.metadata.resource_version
                        with self._cond:
                            if ev["type"] == "DELETED":
                                self.cache.pop(obj.metadata.name, None)
                            else:
                                self.cache[obj.metadata.name] = obj
                            self._cond.notify_all()
                        if self._stop.is_set():
                            break
                    w.stop()
                    with self._cond:            # a quiet window: waiters re-check the conditions time makes true
                        self._cond.notify_all()
                backoff = 0.2
            except Exception as exc:            # noqa: BLE001  (a lost watch is retried; waiters see why meanwhile)
                with self._cond:
                    self.error = exc
                    self.error_since = self.error_since or time.monotonic()
                    self._cond.notify_all()
                if self._stop.wait(backoff):
                    return
                backoff = min(backoff * 2, 5.0)

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    # ---------------------------------------------------------------- waiting

    def wait(self, name: str, condition: Callable[[Any], bool], timeout: float, what: str,
             stop: threading.Event | None = None) -> Any:
        """The pod once ``condition(pod)`` holds (None for a pod that is gone, when the condition accepts None).

        Raises :class:`WaitTimeout` naming ``what`` at the deadline or as soon as the pod can never start, and
        :class:`ClusterError` when ``stop`` is set (the run is ending) or the API server stays unreachable."""
        deadline = time.monotonic() + timeout
        bound_since: dict[str, float] = {}
        pulls: dict[str, tuple[str, int]] = {}
        looked_at = -float("inf")
        nodes: dict[str, str] = {}          # the pod's node, kept once seen: a lost node may take the pod with it
        full = f"pod {self.run.namespace}/{name} {what}"
        cut = ""                            # how the API server broke off the watch during this wait, if it did
        with self._cond:                    # the first list too is waited for here, where ``stop`` is heard
            while True:
                pod = self.cache.get(name)
                if self._ready.is_set() and condition(pod):
                    return pod
                raise_if_node_lost(self.run.cluster, {name: pod} if pod is not None else {}, nodes, full)
                if pod is not None:
                    one = {name: pod}
                    _raise_if_kubelet_silent(one, bound_since, self.run.namespace, full)
                    _raise_if_never_starts(one, self.run.namespace, full)
                    raise_if_pull_fails(one, pulls, self.run.namespace, full)
                    if time.monotonic() >= looked_at + self.tick:
                        looked_at = time.monotonic()
                        self._raise_if_node_refuses(pod, full)
                if stop is not None and stop.is_set():
                    raise ClusterError(f"stopped waiting for {full}: the run is ending")
                left = deadline - time.monotonic()
                self._raise_if_api_gone(full, left <= 0, timeout)
                if self.error is not None and no_answer(self.error) and not cut:
                    cut = f"{type(self.error).__name__}: {_root_cause(self.error)}"
                if left <= 0:
                    state = _describe_pod(pod) if self._ready.is_set() else (
                        f"the pod list never arrived: {_root_cause(self.error)}" if self.error else "no answer yet")
                    if self._ready.is_set() and self.error is not None:   # what it saw may be stale: say why
                        failing = time.monotonic() - self.error_since
                        state += (f"; the namespace's pod watch has failed for the last {failing:.0f}s: "
                                  f"{one_line(_root_cause(self.error), 200)}")
                    if cut:       # what it waited for may have been lost with the API server (a scheduler's update)
                        raise ApiUnreachable(f"timed out after {timeout:.0f}s waiting for {full} (last seen: {state}), "
                                             f"after the API server broke off the wait ({cut}): what it waited for "
                                             "may have been lost while the API server was away")
                    raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {full} (last seen: {state})")
                self._cond.wait(min(left, self.tick))

    def _raise_if_api_gone(self, what: str, at_deadline: bool, timeout: float) -> None:
        """ApiGone once the watch has been broken for the API deadline; at the wait's deadline, ApiUnreachable while it
        is broken: what the wait observed was cut by the API server, so nothing is judged on it (issue #41 item 3)."""
        if not self.error_since or not no_answer(self.error):
            return
        broken = time.monotonic() - self.error_since
        limit = api_deadline_of_client(self.run.cluster.api)
        if broken >= limit:
            raise ApiGone(f"the API server did not answer for {broken:.0f}s (the API deadline, --api-deadline "
                          f"{limit:g}) while waiting for {what} ({_root_cause(self.error)})")
        if at_deadline:
            raise ApiUnreachable(f"timed out after {timeout:.0f}s waiting for {what}: the API server did not answer "
                                 f"for the last {broken:.0f}s ({_root_cause(self.error)})")

    def _raise_if_node_refuses(self, pod, what: str) -> None:
        """WaitTimeout when the scheduler cannot place a pod pinned to one node because that node has been cordoned
        or has gone since the run began (a pod waiting for GPUs other pods hold waits on: they may be freed)."""
        node = pod_node(pod)        # pinned by the hostname label or by name (gpuproof.cluster.placement.pin_to)
        cond = next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None) if pod.status else None
        if not node or pod.spec.node_name or cond is None or cond.status != "False" or cond.reason != "Unschedulable":
            return
        from kubernetes.client.exceptions import ApiException

        try:
            obj = self.run.cluster.core.read_node(node, _request_timeout=10)
            why = "was cordoned after the run began (spec.unschedulable)" if obj.spec.unschedulable else ""
        except ApiException as exc:
            why = "is gone from the cluster" if exc.status == 404 else ""
        except Exception:                    # noqa: BLE001  (a look that failed decides nothing; the wait goes on)
            why = ""
        if why:
            raise WaitTimeout(f"pod {self.run.namespace}/{pod.metadata.name} can never be scheduled: node {node} "
                              f"{why}; the scheduler: {cond.message}; gave up waiting for {what}")

    def wait_for(self, name: str, condition: PodCondition, timeout: float, stop: threading.Event | None = None) -> Any:
        """The named wait (:mod:`gpuproof.cluster.conditions`): :meth:`wait` saying ``condition.what``."""
        return self.wait(name, condition, timeout, condition.what, stop)

    def wait_done(self, name: str, timeout: float, stop: threading.Event | None = None) -> Any:
        return self.wait_for(name, pod_done, timeout, stop)

    def wait_gone(self, name: str, timeout: float, stop: threading.Event | None = None) -> None:
        self.wait_for(name, pod_gone, timeout, stop)

"""Cluster access: connect, a namespace per run, apply, watch-based waits, cleanup.

Long: the one client of the Kubernetes API: connecting, one-line errors, waits and the run's namespace together.

Everything a run creates carries the run's labels::

    app.kubernetes.io/managed-by: gpuproof
    gpuproof.dev/run: <run-id>

and lives in the run's namespace ``gpuproof-<run-id>``, except cluster-scoped objects
the suite needs (PriorityClasses), which carry the same labels. :meth:`Run.cleanup`
deletes exactly those; ``gpuproof clean`` deletes those of earlier runs. Nothing
else in the cluster is ever modified.

Waits use watches with a deadline; a timeout raises :class:`WaitTimeout` naming what
was awaited and the last state seen. A wait on the run's pods also ends, with the same error,
as soon as one of them has been bound to a node for ``KUBELET_SILENCE`` seconds without a word
from that node's kubelet, or its kubelet says it can never start it (:data:`NEVER_STARTS`): such a pod
never starts, and saying so beats waiting out the deadline. One bound or pinned to a node lost during the run
(cluster/nodewatch.py) ends it with :class:`~gpuproof.errors.NodeLost`.
"""

from __future__ import annotations

import contextlib
import threading
import time
import urllib.parse
from typing import Any, Callable, Iterable

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import utils as k8s_utils
from kubernetes import watch
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from ..errors import ApiGone, ApiUnreachable, ClusterError, WaitTimeout, one_line
from .podconditions import pod_done, pod_running
from .rate import TokenBucket

MANAGED_BY = "app.kubernetes.io/managed-by"
RUN_LABEL = "gpuproof.dev/run"
OWNER = "gpuproof"
NAMESPACE_PREFIX = "gpuproof-"
LOG_SETTLE_S = 10.0         # seconds a finished pod's log is read again for the line its caller wants
KUBELET_SILENCE = 60.0      # seconds a pod may sit bound to a node with no status from its kubelet
# a container's waiting reasons that no retry of the kubelet ends: the image is not on the node and the pod may
# not pull it (imagePullPolicy: Never), or its name is no image reference
NEVER_STARTS = ("ErrImageNeverPull", "InvalidImageName")
# failed pulls of one image (the kubelet's ErrImagePull, retried with back-off: 10 s, 20 s, 40 s ...) after which a
# pod is taken to never start: an image no mirror serves does not appear by waiting out the deadline
PULL_TRIES = 3
WATCH_WINDOW = 60.0         # seconds one watch request of a wait lasts at most (then it is made again, from its place)
NODE_LOST_TICK = 3.0        # seconds between looks at the run's lost nodes while a pod wait has no event
THROTTLED_TRIES = 8         # answers of 429 (Too Many Requests) one request is sent again after
# seconds a request may go without an answer (refused, reset, unanswered) before the API server is taken as gone and
# the run stops, cut short (--api-deadline, $GPUPROOF_API_DEADLINE); within it, a request safe to send again is
API_DEADLINE = 120.0
# requests a second the run's client sends at most, and at once (--api-qps, $GPUPROOF_API_QPS): what controllers
# built for large clusters set (client-go's own default, 5 and 10, throttles a fleet's fan-out). Watches are not
# counted (one request each, then events); 429s are sent again as the API server says (above)
API_QPS = 50.0
API_BURST = 100.0
# requests sent again when the API server refused or broke off the connection: reads, deletes (gpuproof deletes only
# its own objects: a second delete finds it gone) and the run lease's renewal (a replace at a resourceVersion)
SAFE_AGAIN = ("GET", "HEAD", "DELETE")
LEASES = "/apis/coordination.k8s.io/"
MIRROR_HINT = ("point gpuproof at an image this cluster can pull: GPUPROOF_IMAGE=<mirror>/<image> for the workload "
               "pods, GPUPROOF_LOADGEN_IMAGE for the load generator, GPUPROOF_PAUSE_IMAGE for the check pods")


def run_labels(run_id: str) -> dict[str, str]:
    return {MANAGED_BY: OWNER, RUN_LABEL: run_id}


def connect(kubeconfig: str | None = None, context: str | None = None, check: bool = True,
            api_deadline: float | None = None, qps: float | None = None) -> "Cluster":
    """Connect by kubeconfig/context. With check, fail fast and clearly when unreachable. ``api_deadline``: seconds
    a request may go unanswered (default :data:`API_DEADLINE`, or ``$GPUPROOF_API_DEADLINE``); ``qps``: requests a
    second sent at most, :data:`API_BURST` at once (default :data:`API_QPS`, or ``$GPUPROOF_API_QPS``)."""
    cfg = k8s.Configuration()
    try:
        k8s_config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=cfg)
    except ConfigException as exc:
        raise ClusterError(f"cannot use kubeconfig {kubeconfig or '~/.kube/config'}"
                           f"{f' context {context!r}' if context else ''}: {exc}") from None
    except FileNotFoundError as exc:
        raise ClusterError(f"kubeconfig not found: {exc.filename}") from None
    # connection failures: 2 tries more; 429 (API priority and fairness, or the API server's inflight limit, turned
    # the request away before handling it, so any method may be sent again): up to 8 more, as Retry-After says or
    # with back-off. A throttled cluster slows a run down; it does not fail it (issue #41)
    cfg.retries = urllib3.Retry(total=10, connect=2, read=0, status=THROTTLED_TRIES, status_forcelist=(429,),
                                allowed_methods=None, respect_retry_after_header=True, backoff_factor=0.2,
                                raise_on_status=False)
    # a fan-out holds up to --parallel requests at once (a log read, a create, a delete per worker), plus the watches;
    # the bucket bounds how many start a second, the pool how many connections are kept for the next
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize or 0, 300)
    api = k8s.ApiClient(cfg)
    inflight = InFlight.attach(api)
    inflight.deadline = api_deadline_from(api_deadline)
    rate = api_qps_from(qps)
    inflight.bucket = TokenBucket(rate, API_BURST) if rate else None
    name = context or _current_context(kubeconfig)
    cluster = Cluster(api, name=name, kubeconfig=kubeconfig)
    if check:
        cluster.check_reachable()
    return cluster


def _current_context(kubeconfig: str | None) -> str:
    with contextlib.suppress(Exception):
        _, active = k8s_config.list_kube_config_contexts(config_file=kubeconfig)
        return active["name"]
    return "default"


def _number_setting(value: float | str | None, env: str, default: float, what: str, unit: str,
                    out_of_range: Callable[[float], bool], range_words: str) -> float:
    """``value``, else ``$env``, else ``default``, as a number; anything else one line naming ``what``."""
    import os

    raw = value if value is not None else os.environ.get(env) or default
    try:
        number = float(raw)
    except ValueError:
        raise ClusterError(f"{what} must be a number of {unit}, got {raw!r}") from None
    if out_of_range(number):
        raise ClusterError(f"{what} must be {range_words}, got {number:g}")
    return number


def api_qps_from(value: float | str | None) -> float:
    """The client's request rate: ``value``, else ``$GPUPROOF_API_QPS``, else :data:`API_QPS`; 0 means unbounded."""
    return _number_setting(value, "GPUPROOF_API_QPS", API_QPS, "the API request rate", "requests a second",
                           lambda n: n < 0, "0 (unbounded) or more requests a second")


def api_deadline_from(value: float | str | None) -> float:
    """The API deadline in seconds: ``value``, else ``$GPUPROOF_API_DEADLINE``, else :data:`API_DEADLINE`."""
    return _number_setting(value, "GPUPROOF_API_DEADLINE", API_DEADLINE, "the API deadline", "seconds",
                           lambda n: n <= 0, "more than 0 seconds")


def _not_sent(exc: BaseException) -> bool:
    """The connection was refused or never made: the request did not reach the API server (safe to send again)."""
    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) else exc
    return isinstance(reason, (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError,
                               ConnectionRefusedError))


def _is_watch(args: tuple, kwargs: dict) -> bool:
    query = kwargs.get("query_params") if "query_params" in kwargs else (args[0] if args else None)
    return any(k == "watch" and v for k, v in (query or []))


class InFlight:
    """The requests of one API client that have not had an answer yet (a watch: until its response starts), so that
    a run can say what it waits for when the API server stops answering (issue #41).

    It also bounds them (issue #41 items 2 and 3): a request sent without a timeout of its caller's waits at most
    ``deadline`` seconds for its answer; one the API server refused or broke off is sent again, with back-off, within
    that deadline when that is safe (:data:`SAFE_AGAIN`, the lease's renewal, or a connection never made), so a
    restarted API server is outlasted; past the deadline :class:`~gpuproof.errors.ApiGone` names the request. One
    broken off that is not safe to send again (a create that may have been done) is
    :class:`~gpuproof.errors.ApiUnreachable` at once: the check that sent it is not judged."""

    def __init__(self):
        self._lock = threading.Lock()
        self._next = 0
        self.open: dict[int, tuple[str, str, float]] = {}     # id -> (method, path, since)
        self.deadline = API_DEADLINE
        self.bucket: TokenBucket | None = None                # --api-qps (None: unbounded)

    @classmethod
    def attach(cls, api: k8s.ApiClient) -> "InFlight":
        found = getattr(api, "gpuproof_inflight", None)
        if found is not None:
            return found
        inflight = cls()
        rest = api.rest_client
        send = rest.request

        def request(method, url, *args, **kwargs):
            if inflight.bucket is not None and not _is_watch(args, kwargs):
                inflight.bucket.take()          # --api-qps: the client's own rate, as client-go's (watches aside)
            key = inflight._begin(method, url)
            try:
                if kwargs.get("_request_timeout") is not None:     # the caller bounds it and handles its errors
                    return send(method, url, *args, **kwargs)
                if _is_watch(args, kwargs):      # a watch may be quiet for long: only its connection is bounded
                    return send(method, url, *args, **{**kwargs, "_request_timeout": (inflight.deadline, None)})
                return inflight._send_within_deadline(send, method, url, *args, **kwargs)
            finally:
                inflight._end(key)

        rest.request = request
        api.gpuproof_inflight = inflight
        return inflight

    def _send_within_deadline(self, send, method: str, url: str, *args, **kwargs):
        path = urllib.parse.urlsplit(url).path or url
        t0 = time.monotonic()
        ends = t0 + self.deadline
        delay = 0.2
        while True:
            kwargs["_request_timeout"] = max(1.0, ends - time.monotonic())
            try:
                return send(method, url, *args, **kwargs)
            except (urllib3.exceptions.HTTPError, ConnectionError, ApiException) as exc:   # refused, reset, silent
                if isinstance(exc, ApiException) and exc.status != 0:    # an answer (status 0: the client's TLS error)
                    raise
                why = f"{type(exc).__name__}: {one_line(_root_cause(exc), 200)}"
                again = method in SAFE_AGAIN or (method == "PUT" and path.startswith(LEASES)) or _not_sent(exc)
                silent = time.monotonic() >= ends - 0.05         # it waited the whole deadline for this answer
                if not again and not silent:
                    raise ApiUnreachable(f"the API server broke off {method} {path} before answering ({why}); not "
                                         "sent again, as it may have been done") from None
                if silent or time.monotonic() + delay >= ends:
                    raise ApiGone(f"the API server did not answer {method} {path} for {time.monotonic() - t0:.0f}s "
                                  f"(the API deadline, --api-deadline {self.deadline:g}; {why})") from None
                # the API server is down or restarting: nothing to watch; back off, within the deadline
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _begin(self, method: str, url: str) -> int:
        path = urllib.parse.urlsplit(url).path or url
        with self._lock:
            self._next += 1
            self.open[self._next] = (method, path, time.monotonic())
            return self._next

    def _end(self, key: int) -> None:
        with self._lock:
            self.open.pop(key, None)

    def waiting(self) -> dict[int, tuple[str, str, float]]:
        with self._lock:
            return dict(self.open)


class Cluster:
    def __init__(self, api: k8s.ApiClient, name: str = "", kubeconfig: str | None = None):
        self.api = api
        self.name = name
        self.kubeconfig = kubeconfig
        self.core = k8s.CoreV1Api(api)
        self.apps = k8s.AppsV1Api(api)
        self.batch = k8s.BatchV1Api(api)
        self.scheduling = k8s.SchedulingV1Api(api)
        self.auth = k8s.AuthorizationV1Api(api)
        self.custom = k8s.CustomObjectsApi(api)
        self.resource = k8s.ResourceV1Api(api)
        self.nodewatch = None          # the run's watch on its nodes, once started (cluster/nodewatch.py)

    @property
    def server(self) -> str:
        return self.api.configuration.host

    # ---------------------------------------------------------------- reachability

    def check_reachable(self, timeout: float = 10.0) -> str:
        try:
            info = k8s.VersionApi(self.api).get_code(_request_timeout=timeout)
        except ApiException as exc:
            if exc.status in (401, 403):
                raise ClusterError(f"cluster {self.name} at {self.server} refused our credentials "
                                   f"(HTTP {exc.status}); check the kubeconfig user") from None
            raise ClusterError(f"cluster {self.name} at {self.server} answered HTTP {exc.status}: {exc.reason}") \
                from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ClusterError(f"cannot reach cluster {self.name} at {self.server}: {_root_cause(exc)}. "
                               "Is it running, and is this the right kubeconfig/context?") from None
        return info.git_version

    def version(self) -> str:
        return k8s.VersionApi(self.api).get_code().git_version

    # ---------------------------------------------------------------- nodes

    def nodes(self) -> list[k8s.V1Node]:
        return self.core.list_node().items

    def node_dicts(self) -> list[dict]:
        """Nodes as plain API JSON: 10x faster than model objects on large clusters."""
        import json

        resp = self.core.list_node(_preload_content=False)
        return json.loads(resp.data)["items"]

    def dra_objects(self, plural: str) -> list[dict] | None:
        """All ``resource.k8s.io/v1`` objects of a cluster-scoped kind (resourceslices, deviceclasses) as API
        JSON; None when the cluster does not serve that API (before Kubernetes 1.34) or we may not list it."""
        try:
            return self.custom.list_cluster_custom_object("resource.k8s.io", "v1", plural)["items"]
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise _api_error(exc, f"list {plural}") from None

    def wait_nodes_ready(self, names: list[str], timeout: float = 120.0) -> None:
        wanted = set(names)

        def ready(cache: dict) -> bool:
            return wanted <= {n for n, obj in cache.items() if _node_ready(obj)}

        def describe(cache: dict) -> str:
            not_ready = sorted(wanted - {n for n, o in cache.items() if _node_ready(o)})
            return f"{len(not_ready)} not Ready yet, e.g. {', '.join(not_ready[:5])}"

        watch_until(self.core.list_node, ready, timeout, f"{len(wanted)} nodes to become Ready",
                    describe=describe)

    # ---------------------------------------------------------------- runs

    def leftover_runs(self) -> dict[str, dict[str, list[str]]]:
        """Objects of any gpuproof run still in the cluster, by run id."""
        selector = f"{MANAGED_BY}={OWNER},{RUN_LABEL}"
        found: dict[str, dict[str, list[str]]] = {}
        for ns in self.core.list_namespace(label_selector=selector).items:
            found.setdefault(ns.metadata.labels[RUN_LABEL], {}).setdefault("namespaces", []).append(ns.metadata.name)
        for pc in self.scheduling.list_priority_class(label_selector=selector).items:
            found.setdefault(pc.metadata.labels[RUN_LABEL], {}).setdefault("priorityclasses", []) \
                .append(pc.metadata.name)
        return found

    def clean(self, run_ids: Iterable[str] | None = None, wait: bool = True, timeout: float = 120.0,
              progress: Callable[[str], None] | None = None) -> list[str]:
        """Delete what earlier runs left behind (all of them, or the given run ids)."""
        leftovers = self.leftover_runs()
        targets = [r for r in leftovers if run_ids is None or r in set(run_ids)]
        for rid in targets:
            Run(self, rid).cleanup(wait=wait, timeout=timeout, progress=progress)
        return targets


class Run:
    """One run's namespace and labelled objects."""

    workload_image = None     # the image the cluster lends workload pods (gpuproof.bench.workloads.Image), if any
    quick_bench = False       # --quick-bench: the benchmarks run at their smallest sizes (ci_params)

    def __init__(self, cluster: Cluster, run_id: str):
        self.cluster = cluster
        self.run_id = run_id
        self.namespace = NAMESPACE_PREFIX + run_id
        self.labels = run_labels(run_id)
        self._cleaned = False
        self._deleting: list[str] = []              # the namespaces asked to be deleted (Run.delete)

    @property
    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())

    def create(self, progress: Callable[[str], None] | None = None, timeout: float = 60.0) -> None:
        self._make_namespace(self.namespace, timeout)
        if progress:
            progress(f"run namespace {self.namespace}")

    def create_namespace(self, suffix: str, timeout: float = 60.0) -> str:
        """One more namespace for this run (for checks that must not affect the rest, e.g. quotas)."""
        name = f"{self.namespace}-{suffix}"[:63].rstrip("-")
        self._make_namespace(name, timeout)
        return name

    def _make_namespace(self, name: str, timeout: float) -> None:
        ns = k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels=dict(self.labels)))
        try:
            self.cluster.core.create_namespace(ns)
        except ApiException as exc:
            raise _api_error(exc, f"create the run namespace {name}") from None
        # pods cannot be created before the service-account controller made the default account
        watch_until(self.cluster.core.list_namespaced_service_account, lambda c: "default" in c, timeout,
                    f"the default ServiceAccount in namespace {name}", namespace=name)

    # ---------------------------------------------------------------- objects

    def stamp(self, manifest: dict, namespace: str | None = None) -> dict:
        """The manifest with the run's labels added to it (and to its pod template), in a run namespace."""
        m = dict(manifest)
        meta = dict(m.get("metadata") or {})
        meta["labels"] = {**(meta.get("labels") or {}), **self.labels}
        if m.get("kind") not in CLUSTER_SCOPED:
            meta["namespace"] = namespace or self.namespace
        m["metadata"] = meta
        tmpl = (m.get("spec") or {}).get("template")
        if isinstance(tmpl, dict):
            spec = dict(m["spec"])
            tmeta = dict(tmpl.get("metadata") or {})
            tmeta["labels"] = {**(tmeta.get("labels") or {}), **self.labels}
            spec["template"] = {**tmpl, "metadata": tmeta}
            m["spec"] = spec
        return m

    def apply(self, manifest: dict, namespace: str | None = None) -> Any:
        """Create one object (stamped with the run's labels). Returns the created object."""
        m = self.stamp(manifest, namespace)
        try:
            created = k8s_utils.create_from_dict(self.cluster.api, m, namespace=m["metadata"].get("namespace"))
        except k8s_utils.FailToCreateError as exc:
            raise _api_error(exc.api_exceptions[0], f"create {m['kind']} {m['metadata'].get('name')}") from None
        return created[0] if isinstance(created, list) and len(created) == 1 else created

    def try_apply(self, manifest: dict, namespace: str | None = None) -> tuple[Any, ApiException | None]:
        """Like apply, but an API refusal (quota, validation) is returned instead of raised."""
        m = self.stamp(manifest, namespace)
        try:
            created = k8s_utils.create_from_dict(self.cluster.api, m, namespace=m["metadata"].get("namespace"))
            return created[0], None
        except k8s_utils.FailToCreateError as exc:
            return None, exc.api_exceptions[0]

    def pods(self) -> list[k8s.V1Pod]:
        return self.cluster.core.list_namespaced_pod(self.namespace).items

    def pod(self, name: str) -> k8s.V1Pod:
        return self.cluster.core.read_namespaced_pod(name, self.namespace)

    def pod_logs(self, name: str, container: str | None = None) -> str:
        # the raw bytes: kubernetes 36's deserialized answer is the repr of bytes ("b'...\\n...'"), one line
        resp = self.cluster.core.read_namespaced_pod_log(name, self.namespace, container=container,
                                                         _preload_content=False)
        return resp.data.decode("utf-8", "replace")

    def finished_log(self, name: str, complete: Callable[[str], bool], container: str | None = None,
                     settle: float | None = None) -> str:
        """The log of a pod that has finished, once ``complete(log)`` holds, or as it is after ``settle`` seconds.
        The runtime copies a container's output into its log on its own schedule: under load the last lines
        (a workload's JSON result) can reach the log after the kubelet has reported the exit. A log has no
        watch, so it is read again, at growing intervals, until it holds what the caller waits for."""
        deadline = time.monotonic() + (LOG_SETTLE_S if settle is None else settle)
        delay = 0.1
        while True:
            logs = self.pod_logs(name, container)
            left = deadline - time.monotonic()
            if complete(logs) or left <= 0:
                return logs
            time.sleep(min(delay, left))
            delay = min(delay * 2, 2.0)

    def describe_exit(self, name: str) -> str:
        """How the pod's containers ended ('exit code 137 (OOMKilled)'), or its phase when none has."""
        try:
            pod = self.pod(name)
        except Exception as exc:  # noqa: BLE001  (a description only: never hide the caller's error)
            return f"pod unreadable: {_root_cause(exc)}"
        ends = []
        for cs in (pod.status.container_statuses or []) if pod.status else []:
            t = cs.state.terminated if cs.state else None
            if t is not None:
                why = " ".join(x for x in (t.reason, t.message) if x)
                ends.append(f"{cs.name}: exit code {t.exit_code}" + (f" ({why})" if why else ""))
        return "; ".join(ends) or _describe_pod(pod)

    def wait_pods(self, done: Callable[[dict], Any], timeout: float, what: str,
                  describe: Callable[[dict], str] | None = None, label_selector: str | None = None) -> Any:
        """Watch the run's pods until done(cache) returns something truthy; returns it. A pod whose node's
        kubelet stays silent (:data:`KUBELET_SILENCE`), or says it can never start it (:data:`NEVER_STARTS`),
        ends the wait early with :class:`WaitTimeout`."""
        from .nodewatch import raise_if_node_lost

        bound_since: dict[str, float] = {}
        pulls: dict[str, tuple[str, int]] = {}
        nodes: dict[str, str] = {}

        def done_or_silent(cache: dict) -> Any:
            result = done(cache)
            if not result:
                raise_if_node_lost(self.cluster, cache, nodes, what)      # a node lost mid-run: NodeLost, at once
                _raise_if_kubelet_silent(cache, bound_since, self.namespace, what)
                _raise_if_never_starts(cache, self.namespace, what)
                raise_if_pull_fails(cache, pulls, self.namespace, what)
            return result

        # a lost node changes none of its pods at once: with a node watch running, look every few seconds
        tick = KUBELET_SILENCE / 4 if getattr(self.cluster, "nodewatch", None) is None else NODE_LOST_TICK
        return watch_until(self.cluster.core.list_namespaced_pod, done_or_silent, timeout, what,
                           describe=describe or _describe_pods, tick=tick, namespace=self.namespace,
                           label_selector=label_selector)

    def wait_pod(self, name: str, condition: Callable[[k8s.V1Pod], bool], timeout: float, what: str) -> k8s.V1Pod:
        return self.wait_pods(lambda c: c[name] if name in c and condition(c[name]) else None, timeout,
                              f"pod {self.namespace}/{name} {what}",
                              describe=lambda c: _describe_pod(c.get(name)))

    def wait_running(self, name: str, timeout: float = 60.0) -> k8s.V1Pod:
        """Pod ``name`` once it is Running (:data:`~gpuproof.cluster.podconditions.pod_running`)."""
        return self.wait_pod(name, pod_running, timeout, pod_running.what)

    def wait_pod_done(self, name: str, timeout: float = 600.0) -> k8s.V1Pod:
        """Pod ``name`` once it has finished (:data:`~gpuproof.cluster.podconditions.pod_done`)."""
        return self.wait_pod(name, pod_done, timeout, pod_done.what)

    def wait_event(self, name: str, reason: str, timeout: float = 60.0) -> k8s.CoreV1Event:
        return watch_until(
            self.cluster.core.list_namespaced_event,
            lambda c: next((e for e in c.values() if e.reason == reason), None), timeout,
            f"a {reason} event for {self.namespace}/{name}",
            describe=lambda c: ", ".join(sorted({e.reason for e in c.values()})) or "no events",
            namespace=self.namespace, field_selector=f"involvedObject.name={name}")

    def delete(self, progress: Callable[[str], None] | None = None) -> list[str]:
        """Ask the API server to delete the run's cluster-scoped objects and namespaces (found by the run label), and
        return the namespaces' names; waits for nothing. Once asked, the namespace controller deletes everything in
        them (pods made later are refused: the namespace is terminating), and takes at least 5 s to do it
        (kube-controller-manager's namespaceDeletionGracePeriod), so a run that is ending asks first (issue #52)."""
        core, sched = self.cluster.core, self.cluster.scheduling
        for pc in sched.list_priority_class(label_selector=self.selector).items:
            with contextlib.suppress(ApiException):
                sched.delete_priority_class(pc.metadata.name)
        names = [ns.metadata.name for ns in core.list_namespace(label_selector=self.selector).items
                 if (ns.metadata.labels or {}).get(RUN_LABEL) == self.run_id]
        for name in names:
            if progress and name not in self._deleting:
                progress(f"deleting run namespace {name}")
            with contextlib.suppress(ApiException):
                core.delete_namespace(name, propagation_policy="Background")
        self._deleting += [n for n in names if n not in self._deleting]
        return names

    def deleting(self, namespace: str | None = None) -> bool:
        """Whether the run's namespace (or ``namespace``) has been asked to be deleted: what is in it goes with it."""
        return (namespace or self.namespace) in self._deleting

    def cleanup(self, wait: bool = True, timeout: float = 120.0,
                progress: Callable[[str], None] | None = None) -> None:
        """Delete the run's namespaces and cluster-scoped objects (found by the run label), and with ``wait`` wait
        until its namespaces are gone. Idempotent (after :meth:`delete` it asks again, for what was made since)."""
        names = self.delete(progress)
        if wait and names:
            core = self.cluster.core
            watch_until(core.list_namespace, lambda c: not (set(names) & set(c)) or None, timeout,
                        f"namespaces {', '.join(names)} to be deleted",
                        describe=lambda c: "; ".join(f"{n}: {_describe_ns(c.get(n))}" for n in names if n in c),
                        label_selector=self.selector)
        self._cleaned = True


CLUSTER_SCOPED = {"Namespace", "PriorityClass", "Node", "ClusterRole", "ClusterRoleBinding",
                  "RuntimeClass", "StorageClass"}


# -------------------------------------------------------------------- watch helper


def watch_until(list_fn: Callable, done: Callable[[dict], Any], timeout: float, what: str,
                describe: Callable[[dict], str] | None = None, tick: float | None = None, **list_kwargs) -> Any:
    """List, then watch, keeping a name -> object cache, until done(cache) is truthy.

    ``list_fn`` returns model objects (CoreV1Api) or API JSON (CustomObjectsApi: the cache then holds dicts).
    Returns done's value. Raises WaitTimeout naming ``what`` and the last state. ``tick``: ask done() again
    at least this often, events or not (for conditions that time itself makes true).
    """
    deadline = time.monotonic() + timeout
    cache: dict[str, Any] = {}
    api_deadline = _api_deadline_of(list_fn)
    cut: list[str] = []         # how the API server broke off this wait (a restart): then its end judges nothing
    deleted: dict[str, float] = {}  # objects deleted while this wait watched, and when (seconds into it)

    def relist() -> str:
        # a list is an idempotent read: an API server restarting (connection refused, reset) is asked again, with
        # back-off, until the wait's own deadline, which then names it, or the API deadline, which ends the run
        delay, since = 0.2, time.monotonic()
        while True:
            try:
                return relist_once()
            except (urllib3.exceptions.MaxRetryError, urllib3.exceptions.ProtocolError, ConnectionError) as exc:
                now = time.monotonic()
                cut.append(f"{type(exc).__name__}: {one_line(_root_cause(exc), 120)}")
                if now + delay > since + api_deadline:
                    raise ApiGone(f"the API server did not answer for {now - since:.0f}s (the API deadline, "
                                  f"--api-deadline {api_deadline:g}) while waiting for {what} "
                                  f"({type(exc).__name__}: {one_line(exc, 200)})") from None
                if now + delay > deadline:
                    raise ApiUnreachable(f"timed out after {timeout:.0f}s waiting for {what}: the API server did not "
                                         f"answer ({type(exc).__name__}: {one_line(exc, 200)})") from None
                time.sleep(delay)          # the API server is down: nothing to watch; back off, within the deadline
                delay = min(delay * 2, 5.0)

    def relist_once() -> str:
        cache.clear()
        resp = list_fn(**list_kwargs, _request_timeout=max(5.0, min(30.0, timeout, api_deadline)))
        if isinstance(resp, dict):
            for item in resp.get("items") or []:
                cache[item["metadata"]["name"]] = item
            return resp["metadata"]["resourceVersion"]
        for item in resp.items:
            cache[item.metadata.name] = item
        return resp.metadata.resource_version

    rv = relist()
    while True:
        result = done(cache)
        if result:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            state = describe(cache) if describe else f"{len(cache)} objects seen"
            gone = [f"{n} at {t:.0f}s" for n, t in deleted.items() if n not in cache]
            if gone:          # "not found" then means deleted by someone, not never made
                state += f"; deleted during this wait: {', '.join(gone[:5])}" + (" ..." if len(gone) > 5 else "")
            if cut:           # what it waited for may have been lost with the API server (a scheduler's update)
                raise ApiUnreachable(f"timed out after {timeout:.0f}s waiting for {what} (last seen: {state}), "
                                     f"after the API server broke off the wait ({cut[0]}): what it waited for may "
                                     "have been lost while the API server was away")
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last seen: {state})")
        w = watch.Watch()
        try:
            # the API server ends each watch after its window; one that says nothing for the window and a margin
            # (a frozen API server) is cut here and listed again, which the API deadline bounds
            window = min(remaining, tick or WATCH_WINDOW, WATCH_WINDOW)
            for ev in w.stream(list_fn, resource_version=rv, timeout_seconds=max(1, int(window + 0.999)),
                               _request_timeout=window + min(30.0, api_deadline), allow_watch_bookmarks=True,
                               **list_kwargs):
                obj = ev["object"]
                if ev["type"] == "ERROR":
                    raise ApiException(status=getattr(obj, "code", 500) if not isinstance(obj, dict)
                                       else obj.get("code", 500))
                if ev["type"] == "BOOKMARK":          # the client leaves bookmarks as plain dicts
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv) if isinstance(obj, dict) \
                        else obj.metadata.resource_version
                    continue
                meta = obj["metadata"] if isinstance(obj, dict) else None
                rv = meta["resourceVersion"] if meta else obj.metadata.resource_version
                name = meta["name"] if meta else obj.metadata.name
                if ev["type"] == "DELETED":
                    cache.pop(name, None)
                    deleted[name] = timeout - (deadline - time.monotonic())
                else:
                    cache[name] = obj
                result = done(cache)
                if result:
                    w.stop()
                    return result
                if time.monotonic() > deadline:
                    break
        except ApiException as exc:
            if exc.status == 410:          # our resourceVersion is too old: start over from a fresh list
                rv = relist()
                continue
            raise
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError,
                urllib3.exceptions.MaxRetryError, ConnectionError) as exc:
            cut.append(f"{type(exc).__name__}: {one_line(_root_cause(exc), 120)}")
            rv = relist()              # the watch was cut (an API server restarting): list again, then watch on
        finally:
            w.stop()


def api_deadline_of_client(api: Any) -> float:
    """The API deadline of an API client (:data:`API_DEADLINE` for one not made by :func:`connect`)."""
    inflight = getattr(api, "gpuproof_inflight", None)
    return inflight.deadline if inflight is not None else API_DEADLINE


def _api_deadline_of(list_fn: Callable) -> float:
    """The API deadline of the client a bound list method (CoreV1Api.list_...) sends through."""
    return api_deadline_of_client(getattr(getattr(list_fn, "__self__", None), "api_client", None))


def no_answer(exc: BaseException | None) -> bool:
    """An error that says the API server did not answer (refused, reset, timed out), not that it said no."""
    while exc is not None:
        if isinstance(exc, (ApiUnreachable, urllib3.exceptions.HTTPError, ConnectionError)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# -------------------------------------------------------------------- helpers


# taints the node lifecycle controller puts on a node until it has seen it Ready (and takes off after)
_NOT_READY_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def _node_ready(node) -> bool:
    """Ready, and the controller has taken its not-ready taint off: pods can land there now."""
    if any(t.key in _NOT_READY_TAINTS for t in (node.spec.taints or [] if node.spec else [])):
        return False
    for cond in (node.status.conditions or []) if node.status else []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False


def _raise_if_kubelet_silent(cache: dict, bound_since: dict[str, float], namespace: str, what: str) -> None:
    """WaitTimeout when a pod has been bound to a node for KUBELET_SILENCE s with no status from its kubelet
    (no container status, no condition but PodScheduled): its kubelet is gone, or it was never there."""
    now = time.monotonic()
    for name, pod in cache.items():
        status = pod.status
        heard = status.phase != "Pending" or status.container_statuses or any(
            c.type != "PodScheduled" for c in status.conditions or [])
        if not pod.spec.node_name or heard:
            bound_since.pop(name, None)
            continue
        since = bound_since.setdefault(name, now)
        if now - since >= KUBELET_SILENCE:
            raise WaitTimeout(f"pod {namespace}/{name} is bound to node {pod.spec.node_name}, whose kubelet has not "
                              f"taken it up in {now - since:.0f}s (no status from the kubelet: is it running?); "
                              f"gave up waiting for {what}")


def _raise_if_never_starts(cache: dict, namespace: str, what: str) -> None:
    """WaitTimeout when the kubelet keeps a pod's container waiting for a reason of :data:`NEVER_STARTS`."""
    for name, pod in cache.items():
        if pod.metadata.deletion_timestamp:          # on its way out: nobody waits for it
            continue
        for c in [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]:
            waiting = c.state.waiting if c.state else None
            if waiting and waiting.reason in NEVER_STARTS:
                raise WaitTimeout(f"pod {namespace}/{name} can never start on node {pod.spec.node_name}: container "
                                  f"{c.name}: {waiting.reason}: {waiting.message}; gave up waiting for {what}")


def raise_if_pull_fails(cache: dict, pulls: dict[str, tuple[str, int]], namespace: str, what: str,
                        tries: int | None = None) -> None:
    """WaitTimeout once a pod's image has failed to pull ``tries`` times (:data:`PULL_TRIES`): each time the
    kubelet's waiting reason turns to ``ErrImagePull`` is one failed pull (``ImagePullBackOff`` is the pause
    between two); ``pulls`` keeps (last reason, failed pulls) per pod across calls."""
    tries = PULL_TRIES if tries is None else tries
    for name, pod in cache.items():
        if pod.metadata.deletion_timestamp:
            continue
        for c in [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]:
            waiting = c.state.waiting if c.state else None
            reason = waiting.reason if waiting else ""
            key = f"{name}/{c.name}"
            last, failed = pulls.get(key, ("", 0))
            if reason in ("ErrImagePull", "ImagePullBackOff") and reason != last and (
                    reason == "ErrImagePull" or failed == 0):
                failed += 1                 # a back-off seen first stands for the pull that failed before it
            pulls[key] = (reason, failed)
            if failed >= tries:
                raise WaitTimeout(
                    f"pod {namespace}/{name} on node {pod.spec.node_name}: image {c.image} failed to pull {failed} "
                    f"times ({reason}: {(waiting.message or '').strip() or 'no message'}); {MIRROR_HINT}; "
                    f"gave up waiting for {what}")


def _describe_pod(pod) -> str:
    if pod is None:
        return "pod not found"
    msg = f"phase {pod.status.phase}, node {pod.spec.node_name or '(none)'}"
    for cond in pod.status.conditions or []:
        if cond.status != "True" and cond.message:
            msg += f"; {cond.type}: {cond.message}"
    if pod.status.reason:
        msg += f"; reason {pod.status.reason}: {pod.status.message}"
    return msg


def _describe_pods(cache: dict) -> str:
    phases: dict[str, int] = {}
    for p in cache.values():
        phases[p.status.phase] = phases.get(p.status.phase, 0) + 1
    return ", ".join(f"{n} {ph}" for ph, n in sorted(phases.items())) or "no pods"


def _describe_ns(ns) -> str:
    if ns is None:
        return "gone"
    conds = [f"{c.type}: {c.message}" for c in (ns.status.conditions or []) if c.status == "True"]
    return f"phase {ns.status.phase}" + (f"; {'; '.join(conds)}" if conds else "")


def _root_cause(exc: BaseException) -> str:
    seen = exc
    while getattr(seen, "reason", None) is not None and isinstance(seen.reason, BaseException):
        seen = seen.reason
    return str(seen)


def api_message(exc: ApiException) -> str:
    """What the API server said in a refusal: its Status's message, else the body as it came, else the status."""
    import json

    with contextlib.suppress(TypeError, ValueError, AttributeError):
        message = json.loads(exc.body).get("message")
        if message:
            return message
    return exc.body or f"{exc.status} {exc.reason}"


def _api_error(exc: ApiException, doing: str) -> ClusterError:
    body = api_message(exc)
    if exc.status == 403:
        return ClusterError(f"not allowed to {doing}: {body}. The kubeconfig's user needs that permission.")
    return ClusterError(f"could not {doing}: HTTP {exc.status}: {body}")

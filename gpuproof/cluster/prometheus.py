"""Prometheus' HTTP API, at a URL the user names or through the API server's service proxy to one found in the
cluster (issue #39: the monitoring suite reads what Prometheus stored without anything for the user to open).

Found, when no URL is named, among the cluster's Services, in this order:

1. kube-prometheus-stack's (``<release>-kube-prometheus-prometheus``, label ``app=kube-prometheus-stack-prometheus``);
2. kube-prometheus' (``prometheus-k8s`` in ``monitoring``);
3. the Prometheus operator's governing Service of any Prometheus (``prometheus-operated``, label
   ``operated-prometheus=true``);
4. the community chart's ``prometheus-server``, or any Service labelled ``app.kubernetes.io/name=prometheus``
   (Alertmanager, Pushgateway, node exporter and the operator itself are not Prometheus).

Its port: the one named ``http-web`` or ``web`` (the operator's), else 9090, else ``http``, else the first. The
requests go to ``/api/v1/namespaces/<ns>/services/<name>:<port>/proxy/api/v1/...``: permissions ``services`` list
and ``services/proxy`` get (deploy/rbac.yaml).

Also the Prometheus operator's PodMonitor (``monitoring.coreos.com/v1``): whether the cluster serves it, the labels
its Prometheus selects monitors by, and one made for a pod (the monitoring suite's ai_service_metrics check).
"""

from __future__ import annotations

import dataclasses
import json
import time
import urllib.parse
import urllib.request

import urllib3
from kubernetes.client.exceptions import ApiException

TIMEOUT_S = 30.0
POLL_S = 1.0                # between two queries of a wait for a scrape (Prometheus.sampled)
PORT_NAMES = ("http-web", "web")
NOT_PROMETHEUS = ("alertmanager", "pushgateway", "node-exporter", "operator", "blackbox", "adapter", "thanos")


class PrometheusError(OSError):
    """Prometheus did not answer, or answered with an error (one line, naming where it was asked)."""


@dataclasses.dataclass(frozen=True)
class Service:
    namespace: str
    name: str
    port: int
    why: str                # what made it Prometheus' Service

    def __str__(self) -> str:
        return f"service {self.namespace}/{self.name}:{self.port}"


def _rank(svc) -> tuple[int, str] | None:
    """How surely a Service is a Prometheus server's (lower is surer) and why; None for one that is not."""
    meta = svc.metadata
    labels, name = meta.labels or {}, meta.name
    if any(word in name for word in NOT_PROMETHEUS) and name != "prometheus-operated":
        return None
    if name.endswith("-kube-prometheus-prometheus") or labels.get("app") == "kube-prometheus-stack-prometheus":
        return 0, "kube-prometheus-stack's Prometheus"
    if name == "prometheus-k8s":
        return 1, "kube-prometheus' Prometheus"
    if name == "prometheus-operated" or labels.get("operated-prometheus") == "true":
        return 2, "the Prometheus operator's governing Service"
    if name == "prometheus-server" or labels.get("app.kubernetes.io/name") == "prometheus":
        return 3, "a Service labelled app.kubernetes.io/name=prometheus"
    return None


def _port(svc) -> int | None:
    ports = svc.spec.ports or []
    for want in (lambda p: p.name in PORT_NAMES, lambda p: p.port == 9090, lambda p: p.name == "http"):
        if found := next((p for p in ports if want(p)), None):
            return found.port
    return ports[0].port if ports else None


def find(cluster) -> Service | None:
    """The cluster's Prometheus Service, the surest first (ties: by namespace and name); None without one. A
    cluster that refuses the list answers None too: the caller says that no Prometheus was found."""
    try:
        services = cluster.core.list_service_for_all_namespaces(_request_timeout=TIMEOUT_S).items
    except ApiException:
        return None
    ranked = []
    for svc in services:
        rank, port = _rank(svc), _port(svc)
        if rank is not None and port is not None:
            ranked.append((rank[0], svc.metadata.namespace, svc.metadata.name, port, rank[1]))
    if not ranked:
        return None
    _, namespace, name, port, why = min(ranked)
    return Service(namespace, name, port, why)


class Prometheus:
    """Prometheus' query API (``/api/v1/<path>``), directly at ``url`` or through the API server to ``service``."""

    def __init__(self, url: str | None = None, cluster=None, service: Service | None = None):
        if (url is None) == (service is None):
            raise ValueError("a Prometheus is reached at a URL or through a Service, one of the two")
        self.url, self.cluster, self.service = url, cluster, service

    def __str__(self) -> str:
        if self.url:
            return self.url
        return f"{self.service} (found in the cluster: {self.service.why}; through the API server)"

    def api(self, path: str, **params) -> dict:
        """The ``data`` of Prometheus' answer to ``GET /api/v1/<path>?<params>``."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        if self.url:
            with urllib.request.urlopen(f"{self.url.rstrip('/')}/api/v1/{path}{query}", timeout=TIMEOUT_S) as r:
                answer = json.load(r)
        else:
            s = self.service
            proxied = f"/api/v1/namespaces/{s.namespace}/services/{s.name}:{s.port}/proxy/api/v1/{path}{query}"
            try:
                resp = self.cluster.api.call_api(proxied, "GET", header_params={"Accept": "application/json"},
                                                 auth_settings=["BearerToken"], _preload_content=False,
                                                 _request_timeout=TIMEOUT_S)
            except ApiException as exc:
                body = " ".join(str(exc.body or "").split())[:200]
                raise PrometheusError(f"{s} through the API server: HTTP {exc.status} {exc.reason}"
                                      + (f": {body}" if body else "")) from None
            except urllib3.exceptions.HTTPError as exc:
                raise PrometheusError(f"{s}: the API server did not answer: {type(exc).__name__}: {exc}") from None
            answer = json.loads(resp[0].data if isinstance(resp, tuple) else resp.data)
        if answer.get("status") != "success":
            raise PrometheusError(f"Prometheus answered {answer.get('errorType')}: {answer.get('error')}")
        return answer["data"]

    def sampled(self, query: str, after: float | None, timeout: float, poll: float = POLL_S) -> bool:
        """Wait until the instant query has a sample scraped after ``after`` (a Unix time; None: any sample), polling
        every ``poll`` seconds for at most ``timeout``; whether it came."""
        deadline = time.monotonic() + timeout
        while True:
            stamps = self.api("query", query=f"timestamp({query})")["result"]
            if stamps and (after is None or any(float(s["value"][1]) > after for s in stamps)):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)            # a poll of Prometheus, until a scrape or the deadline


# ------------------------------------------------------------------ the Prometheus operator's PodMonitor

MONITORING_GROUP = "monitoring.coreos.com"


def podmonitors_served(cluster) -> bool:
    """Does the API server serve the Prometheus operator's PodMonitor (``monitoring.coreos.com/v1``)? Discovery
    needs no permission."""
    from kubernetes import client as k8s

    try:
        found = k8s.CustomObjectsApi(cluster.api).get_api_resources(MONITORING_GROUP, "v1")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return any(r.name == "podmonitors" for r in found.resources or [])


def monitor_labels(cluster) -> tuple[dict, str]:
    """The labels a PodMonitor needs for the cluster's Prometheus to select it (kube-prometheus-stack's selects
    ``release: <its release>`` unless told otherwise), from the first Prometheus object's ``podMonitorSelector``,
    and where they came from. Permission: ``monitoring.coreos.com`` ``prometheuses`` list."""
    from kubernetes import client as k8s

    try:
        found = k8s.CustomObjectsApi(cluster.api).list_cluster_custom_object(MONITORING_GROUP, "v1", "prometheuses")
    except ApiException as exc:
        return {}, f"no labels: the Prometheus objects could not be listed (HTTP {exc.status} {exc.reason})"
    for p in found.get("items") or []:
        meta, selector = p.get("metadata") or {}, (p.get("spec") or {}).get("podMonitorSelector")
        if selector is not None and not selector.get("matchExpressions"):
            labels = dict(selector.get("matchLabels") or {})
            return labels, f"the podMonitorSelector of Prometheus {meta.get('namespace')}/{meta.get('name')}"
    return {}, "no labels: no Prometheus object selects PodMonitors by labels alone"


def create_pod_monitor(cluster, namespace: str, name: str, selector: dict, labels: dict) -> None:
    """A PodMonitor ``namespace/name`` that scrapes the ``/metrics`` of the pods ``selector`` matches, on their port
    named ``http``, every 5 s. Permission: ``monitoring.coreos.com`` ``podmonitors`` create."""
    from kubernetes import client as k8s

    body = {"apiVersion": f"{MONITORING_GROUP}/v1", "kind": "PodMonitor",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"selector": {"matchLabels": selector},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}]}}
    k8s.CustomObjectsApi(cluster.api).create_namespaced_custom_object(MONITORING_GROUP, "v1", namespace,
                                                                      "podmonitors", body)

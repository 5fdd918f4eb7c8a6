"""NVIDIA's DCGM exporter in a cluster: its DaemonSets and their pods, and a pod's ``/metrics`` read through the API
server's pod proxy (``pods/proxy``: no port-forward, nothing to open). Reads only; what the output shows is judged by
``gpuproof/discovery/monitoring.py``.

The exporter is the DaemonSet of the GPU operator (``nvidia-dcgm-exporter``), of the standalone chart
(``dcgm-exporter``, ``<release>-dcgm-exporter``), or any DaemonSet whose pods run the ``dcgm-exporter`` image or serve
port 9400. Permissions: ``apps/daemonsets`` list, ``pods`` list, ``pods/proxy`` get.
"""

from __future__ import annotations

import dataclasses

import urllib3
from kubernetes.client.exceptions import ApiException

from ..errors import GpuproofError

PORT = 9400
NAMES = ("nvidia-dcgm-exporter", "dcgm-exporter")
IMAGE = "dcgm-exporter"
READ_TIMEOUT_S = 30.0
NONE_FOUND = (f"no DCGM exporter in the cluster: no DaemonSet named {' or '.join(NAMES)} (or <release>-dcgm-exporter), "
              f"labelled so, running the {IMAGE} image or serving port {PORT} (the embedded cluster runs no DCGM)")


def is_exporter(ds) -> bool:
    """A DaemonSet of NVIDIA's DCGM exporter: by name, by label, by image, or by its port."""
    meta = ds.metadata
    labels = meta.labels or {}
    if meta.name in NAMES or meta.name.endswith("-dcgm-exporter"):
        return True
    if labels.get("app") in NAMES or labels.get("app.kubernetes.io/name") == IMAGE:
        return True
    return any(IMAGE in (c.image or "") or any(p.container_port == PORT for p in (c.ports or []))
               for c in ds.spec.template.spec.containers or [])


def ready(pod) -> bool:
    return pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True"
                                                 for c in (pod.status.conditions or []))


@dataclasses.dataclass
class Exporter:
    daemonset: object
    pod: object
    port: int

    @property
    def name(self) -> str:
        return f"{self.pod.metadata.namespace}/{self.pod.metadata.name}"

    @property
    def image(self) -> str:
        return ",".join(sorted({c.image for c in self.pod.spec.containers if IMAGE in (c.image or "")}) or
                        sorted({c.image for c in self.pod.spec.containers}))


@dataclasses.dataclass
class Exporters:
    daemonsets: list
    on_node: dict           # node name -> [Exporter], Ready ones first
    reads: dict = dataclasses.field(default_factory=dict)     # node name -> its /metrics, read once for its tests
    findings: dict = dataclasses.field(default_factory=dict)  # node name -> its output judged, once for its tests

    def describe(self) -> str:
        return ", ".join(f"{d.metadata.namespace}/{d.metadata.name} (desired {d.status.desired_number_scheduled}, "
                         f"ready {d.status.number_ready})" for d in self.daemonsets)

    def of(self, node: str) -> list[Exporter]:
        """The node's exporter pods, Ready ones first."""
        return self.on_node.get(node, [])

    def ready_on(self, node: str) -> Exporter | None:
        """The node's first Ready exporter pod, or None."""
        return next((e for e in self.of(node) if ready(e.pod)), None)


def port_of(ds) -> int:
    """The port the exporter's pods serve ``/metrics`` on: 9400, or the one named ``metrics``."""
    for c in ds.spec.template.spec.containers or []:
        for p in c.ports or []:
            if p.container_port == PORT or p.name == "metrics":
                return p.container_port
    return PORT


def find_exporters(cluster) -> Exporters:
    """Every exporter DaemonSet and its pods by node (no DaemonSet: an empty Exporters). Raises GpuproofError when
    the DaemonSets cannot be listed."""
    try:
        daemonsets = [d for d in cluster.apps.list_daemon_set_for_all_namespaces().items if is_exporter(d)]
    except ApiException as exc:
        raise GpuproofError(f"listing DaemonSets to find the DCGM exporter: HTTP {exc.status} {exc.reason} (the "
                            "monitoring suite needs list on apps/daemonsets: deploy/rbac.yaml)") from None
    on_node: dict[str, list] = {}
    for ds in daemonsets:
        selector = ",".join(f"{k}={v}" for k, v in sorted((ds.spec.selector.match_labels or {}).items()))
        for pod in cluster.core.list_namespaced_pod(ds.metadata.namespace, label_selector=selector).items:
            if pod.spec.node_name:
                on_node.setdefault(pod.spec.node_name, []).append(Exporter(ds, pod, port_of(ds)))
    for found in on_node.values():
        found.sort(key=lambda e: not ready(e.pod))
    return Exporters(daemonsets, on_node)


def read_metrics(cluster, exporter: Exporter) -> dict:
    """The exporter pod's /metrics through the API server's pod proxy: {"text"} or {"error"}."""
    pod = exporter.pod.metadata
    try:
        # the raw body: the client's own decoding of a 'str' answer gives the repr of its bytes (kubernetes 36)
        resp = cluster.core.connect_get_namespaced_pod_proxy_with_path(
            f"{pod.name}:{exporter.port}", pod.namespace, "metrics", _request_timeout=READ_TIMEOUT_S,
            _preload_content=False)
        text = resp.data
    except ApiException as exc:
        body = " ".join(str(exc.body or "").split())[:200]
        return {"error": f"HTTP {exc.status} {exc.reason}" + (f": {body}" if body else "")}
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    return {"text": text}

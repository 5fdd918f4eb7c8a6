"""ai_service_metrics' cluster side on the embedded cluster's real API server (issue #39): what the monitoring suite
asks of the Prometheus operator's API, with the operator's CRDs made here (schemaless: the API server stores what it
is given, as it does the operator's own CRDs' fields the suite uses).

- without the CRDs, :func:`podmonitors_served` says no (the check skips, saying so); with them, yes;
- :func:`monitor_labels` reads the labels a PodMonitor needs from a Prometheus object's ``podMonitorSelector``
  (kube-prometheus-stack's ``release: <release>``), and says so when none selects by labels;
- :func:`create_pod_monitor` makes the PodMonitor in the run's namespace: the pod's own labels as its selector, its
  ``http`` port's ``/metrics`` every 5 s, the labels asked for.

- the server's pod (:func:`service_pod`) is one the API server takes: pinned to the node, the tiny model, port
  ``http`` (whose ``/metrics`` the PodMonitor scrapes), readiness on ``/healthz``.

The server running and the requests through the pod proxy need a node that runs pods (not the kwok nodes): not here.
"""

from __future__ import annotations

import contextlib

import pytest
from kubernetes import client as k8s

from gpuproof.bench.base import wait_until
from gpuproof.cluster import prometheus as prom
from gpuproof.plugin import monitoring_checks as mc

GROUP = "monitoring.coreos.com"


def crd(kind: str, plural: str) -> dict:
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{plural}.{GROUP}"},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
                     "versions": [{"name": "v1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


@pytest.fixture
def operator_crds(embedded):
    """The PodMonitor and Prometheus CRDs, Established; deleted after."""
    ext = k8s.ApiextensionsV1Api(embedded.client.api)
    made = []
    try:
        for kind, plural in (("PodMonitor", "podmonitors"), ("Prometheus", "prometheuses")):
            ext.create_custom_resource_definition(crd(kind, plural))
            made.append(f"{plural}.{GROUP}")
        for name in made:
            wait_until(lambda n=name: any(c.type == "Established" and c.status == "True" for c in
                                          ext.read_custom_resource_definition(n).status.conditions or []),
                       60, f"CRD {name} to be Established")
        yield
    finally:
        for name in made:
            with contextlib.suppress(Exception):
                ext.delete_custom_resource_definition(name)


def test_without_the_crds_no_podmonitor_is_served(embedded):
    assert prom.podmonitors_served(embedded.client) is False


def test_with_the_crds_the_monitor_is_labelled_as_prometheus_selects_and_made_in_the_run(embedded, run_in,
                                                                                          operator_crds):
    cluster = embedded.client
    wait_until(lambda: prom.podmonitors_served(cluster), 60, "API discovery to list podmonitors")
    custom = k8s.CustomObjectsApi(cluster.api)
    assert prom.monitor_labels(cluster) == ({}, "no labels: no Prometheus object selects PodMonitors by labels "
                                                "alone")
    custom.create_namespaced_custom_object(GROUP, "v1", run_in.namespace, "prometheuses", {
        "apiVersion": f"{GROUP}/v1", "kind": "Prometheus", "metadata": {"name": "kps-prometheus"},
        "spec": {"podMonitorSelector": {"matchLabels": {"release": "kps"}}, "podMonitorNamespaceSelector": {}}})
    labels, source = prom.monitor_labels(cluster)
    assert labels == {"release": "kps"}
    assert source == f"the podMonitorSelector of Prometheus {run_in.namespace}/kps-prometheus"
    served = mc.Served(run_in.namespace, mc.SERVICE_POD, "a100-0", 8000, {"gpuproof.dev/workload": mc.SERVICE_POD})
    mc.create_pod_monitor(cluster, served, {**labels, **run_in.labels})
    got = custom.get_namespaced_custom_object(GROUP, "v1", run_in.namespace, "podmonitors", mc.SERVICE_POD)
    assert got["metadata"]["labels"] == {"release": "kps", **run_in.labels}
    assert got["spec"] == {"selector": {"matchLabels": {"gpuproof.dev/workload": mc.SERVICE_POD}},
                           "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}]}


def test_the_server_pod_is_one_the_api_server_takes(embedded, run_in):
    pod, own = mc.service_pod(run_in, "a100-0", "NVIDIA-A100-SXM4-80GB")
    made = run_in.apply(pod)
    assert made.metadata.name == mc.SERVICE_POD and own.items() <= made.metadata.labels.items()
    (c,) = made.spec.containers
    assert c.ports[0].name == "http" and c.ports[0].container_port == 8000
    assert c.readiness_probe.http_get.path == "/healthz"
    assert c.command[-4:] == ["--model", "tiny", "--device", "cuda"], c.command
    terms = made.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms
    assert "a100-0" in str(terms)

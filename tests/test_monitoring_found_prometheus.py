"""The monitoring suite finds the cluster's Prometheus itself and reads it through the API server (issue #39): no
``--prometheus``, nothing for the user to open.

Real Prometheus (Debian's 2.42) scrapes the recorded DCGM output (``h100-pod-on-gpu0-issue490.prom``, as
tests/test_monitoring_prometheus.py does) and serves on every address of this machine. The shared embedded cluster's
real API server gets a Service shaped as kube-prometheus-stack names and labels its Prometheus, without a selector,
whose Endpoints (and EndpointSlice) are this machine's own address and Prometheus' port: the API server's service
proxy (``services/<name>:<port>/proxy``) reaches real Prometheus as it would reach the pods behind the chart's
Service. The address is the machine's first global one. The API server proxies only to an endpoint address that is
a pod's (its ``targetRef`` pod must have that IP in ``status.podIPs``): the Endpoints name a Pod object bound to a
node no kubelet or kwok runs, whose status the test writes as a kubelet writes a host-network pod's (this
machine's address, Running). Nothing runs in it; the answers are real Prometheus'.

- :func:`gpuproof.cluster.prometheus.find` picks that Service among others (Alertmanager's is not Prometheus);
- the suite's Prometheus check, given no URL, passes through it;
- a found Service whose Prometheus does not answer fails ``prometheus-gpu-series`` naming the Service and the API
  server's own reason.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from types import SimpleNamespace

import pytest
from kubernetes import client as k8s

from gpuproof.cluster import prometheus as prom
from gpuproof.plugin import monitoring_checks as mc
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir
from test_monitoring import H100_NODE, cluster, daemonset, exporter_pod
from test_monitoring_prometheus import RECORDED, free_port, job, recorded_and_scraped, until
from test_real_gpu_checks import INLINE, suite

NAMESPACE = "gpuproof-prom-found"
SERVICE = "kps-kube-prometheus-prometheus"


def host_address() -> str:
    """This machine's first global IPv4 address that is not a kubelet cluster's bridge (those come and go)."""
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True,
                         check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        if not fields[1].startswith(("gpk", "veth")):
            return fields[3].split("/")[0]
    pytest.fail(f"no global IPv4 address on this machine to reach Prometheus at through the API server:\n{out}",
                pytrace=False)


@pytest.fixture(scope="module")
def open_prometheus(tmp_path_factory):
    """Prometheus on every address, scraping the recorded output every second (job ``honored``); its port."""
    with recorded_and_scraped(tmp_path_factory.mktemp("prometheus"),
                              lambda target: [{"job_name": "honored", "honor_labels": True, **job(target)}],
                              listen="0.0.0.0") as url:
        yield int(url.rsplit(":", 1)[1])


def service(name: str, labels: dict, port: int, port_name: str = "http-web") -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NAMESPACE, "labels": labels},
            "spec": {"ports": [{"name": port_name, "port": 9090 if port_name == "http-web" else port,
                                "targetPort": port}]}}


@pytest.fixture
def services(embedded):
    """A namespace with a kube-prometheus-stack-like Prometheus Service and an Alertmanager one, their endpoints set
    by hand (no selector); a function that points the Prometheus Service's endpoints at a port. Deleted after."""
    core = embedded.client.core
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=NAMESPACE)))
    address = host_address()
    discovery = k8s.DiscoveryV1Api(embedded.client.api)

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "prometheus-kps-0", "namespace": NAMESPACE},
           "spec": {"nodeName": "gpuproof-no-such-node", "hostNetwork": True,
                    "containers": [{"name": "prometheus", "image": "quay.io/prometheus/prometheus:v2.42.0"}]}}
    ref = {"kind": "Pod", "namespace": NAMESPACE, "name": "prometheus-kps-0"}

    def point(port: int) -> None:
        for name in (SERVICE, f"{SERVICE}-slice"):
            with contextlib.suppress(k8s.ApiException):
                core.delete_namespaced_endpoints(SERVICE, NAMESPACE) if name == SERVICE else \
                    discovery.delete_namespaced_endpoint_slice(name, NAMESPACE)
        core.create_namespaced_endpoints(NAMESPACE, {
            "metadata": {"name": SERVICE},
            "subsets": [{"addresses": [{"ip": address, "targetRef": ref}],
                         "ports": [{"name": "http-web", "port": port}]}]})
        discovery.create_namespaced_endpoint_slice(NAMESPACE, {
            "metadata": {"name": f"{SERVICE}-slice", "labels": {"kubernetes.io/service-name": SERVICE,
                                                                "endpointslice.kubernetes.io/managed-by": "gpuproof"}},
            "addressType": "IPv4", "endpoints": [{"addresses": [address], "conditions": {"ready": True},
                                                  "targetRef": ref}],
            "ports": [{"name": "http-web", "port": port, "protocol": "TCP"}]})

    try:
        core.create_namespaced_pod(NAMESPACE, pod)
        core.patch_namespaced_pod_status("prometheus-kps-0", NAMESPACE, {"status": {
            "phase": "Running", "hostIP": address, "podIP": address, "podIPs": [{"ip": address}]}})
        core.create_namespaced_service(NAMESPACE, service(SERVICE, {"app": "kube-prometheus-stack-prometheus",
                                                                     "release": "kps"}, 9090))
        core.create_namespaced_service(NAMESPACE, service("kps-kube-prometheus-alertmanager", {
            "app": "kube-prometheus-stack-alertmanager", "app.kubernetes.io/name": "prometheus"}, 9093, "http"))
        yield SimpleNamespace(point=point, client=embedded.client)
    finally:
        with contextlib.suppress(k8s.ApiException):          # no kubelet will ever confirm its end: at once
            core.delete_namespaced_pod("prometheus-kps-0", NAMESPACE, grace_period_seconds=0)
        core.delete_namespace(NAMESPACE)
        with contextlib.suppress(Exception):
            until(f"namespace {NAMESPACE} to be gone",
                  lambda: NAMESPACE not in {n.metadata.name for n in core.list_namespace().items})


def run_check(tmp_path, real):
    """The suite's Prometheus check with no --prometheus: the exporter's side stood in (tests/test_monitoring.py),
    the Services and the proxy the embedded API server's own."""
    module = suite("monitoring")
    api = cluster([daemonset()], [exporter_pod(H100_NODE.name)], RECORDED)
    api.core.list_service_for_all_namespaces = real.core.list_service_for_all_namespaces
    api.api = real.api
    options = {"prometheus": None, "prometheus_selector": 'job="honored"'}
    request = SimpleNamespace(node=None, config=SimpleNamespace(getoption=lambda name, default=None: options[name]),
                              getfixturevalue={"fanout": INLINE}.get)
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, H100_NODE, {H100_NODE.name: H100_NODE})
    module.test_prometheus_has_each_gpus_series_with_its_pod(
        needs_real_gpus=None, gpu_node=H100_NODE, target=SimpleNamespace(cluster=api),
        exporters=mc.require_exporters(api), prometheus_server=lambda: mc.prometheus_of(request, api),
        request=request, check=checker)
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def test_the_suite_finds_the_clusters_prometheus_and_reads_it_through_the_api_server(open_prometheus, services,
                                                                                     tmp_path):
    services.point(open_prometheus)
    found = prom.find(services.client)
    assert found == prom.Service(NAMESPACE, SERVICE, 9090, "kube-prometheus-stack's Prometheus")
    server = prom.Prometheus(cluster=services.client, service=found)
    until("the API server's service proxy to reach Prometheus",
          lambda: server.api("query", query="up")["result"], timeout=30)
    checker, records = run_check(tmp_path, services.client)
    checker.finish()
    assert [(r["check"], r["verdict"]) for r in records] == [
        ("prometheus-gpu-series", "pass"), ("prometheus-gpu-series", "pass"), ("prometheus-pod-label", "pass"),
        ("prometheus-gpu-series", "pass")]
    assert records[0]["expected"] == (f"an answer from service {NAMESPACE}/{SERVICE}:9090 (found in the cluster: "
                                      "kube-prometheus-stack's Prometheus; through the API server)")


def test_a_found_prometheus_that_does_not_answer_fails_naming_the_service(services, tmp_path):
    services.point(free_port())          # nothing listens there
    checker, records = run_check(tmp_path, services.client)
    with pytest.raises(pytest.fail.Exception) as raised:
        checker.finish()
    rec, = [r for r in records if r["verdict"] == "fail"]
    assert rec["check"] == "prometheus-gpu-series" and rec["target"] == H100_NODE.name
    assert rec["expected"].startswith(f"an answer from service {NAMESPACE}/{SERVICE}:9090 (found in the cluster")
    assert rec["actual"].startswith(f"PrometheusError: service {NAMESPACE}/{SERVICE}:9090 through the API server: "
                                    "HTTP 503"), rec
    assert rec["message"] in str(raised.value)

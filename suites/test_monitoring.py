"""GPU monitoring: every GPU node's DCGM exporter is Ready and publishes each of its GPUs (issue #39).

- The exporter is the DaemonSet of the GPU operator (``nvidia-dcgm-exporter``), of the standalone chart
  (``dcgm-exporter``, ``<release>-dcgm-exporter``), or any DaemonSet whose pods run the ``dcgm-exporter`` image or
  serve port 9400. A cluster without one skips the whole suite, saying so (never a pass); so does the embedded
  cluster, which runs no DCGM: its kwok nodes are left out as every real-GPU check leaves them (an exporter pod
  there is a pause container: the stack suite's ``operator-pod-ready`` judges those), and its kubelet nodes have no
  exporter.
- Per GPU node: a Ready exporter pod on the node (``dcgm-exporter-ready``; a node without one fails by name); its
  ``/metrics`` read through the API server's pod proxy (``pods/proxy``: no port-forward, nothing to open;
  ``dcgm-metrics-read``), judged by ``gpuproof/discovery/monitoring.py``: it parses strictly, every GPU (by UUID
  where DRA's ResourceSlices name them, else by count) has a utilization and a framebuffer series (MIG GPUs: a
  profiling series per instance), and the host label equals the node name. Every failure names the node, the GPU
  (index and UUID), the expected and the actual.
- The exporter's image, name set, host label spelling and the releases they fit are recorded per node
  (``dcgm-exporter-version``).
- Through Prometheus, when one is named (``--prometheus URL``, ``--prometheus-selector 'job="..."'``): each GPU the
  exporter publishes has its utilization series there (``prometheus-gpu-series``), and a GPU the exporter attributes
  to a pod carries that pod in ``pod`` there too (``prometheus-pod-label``; a ServiceMonitor without
  ``honorLabels: true`` leaves it in ``exported_pod`` and fails with that reason). Without ``--prometheus`` it skips.
- The numbers move with the work (``dcgm-pod-attribution``, ``dcgm-utilization-moves``): per GPU node, gpuproof's
  matmul pod holds one GPU busy for a few of the exporter's collections; the exporter is read before it starts and
  while it runs until exactly one GPU's series carry the pod (``pod``/``namespace``) with its utilization above the
  idle reading. Proven on recorded outputs (dcgm-exporter #490's pod at 0 % is the stale-reading fault); on a real
  GPU not yet (no GPU machine has run it).
- ``ai_service_metrics`` (``ai-service-metrics``), with ``--prometheus`` and the Prometheus operator's PodMonitor CRD
  (else it skips, saying which is missing): gpuproof's inference server (its ``/metrics`` speaks the Prometheus text
  format to a scraper) as a pod on a GPU node, a PodMonitor for it in the run's namespace (labelled as the
  Prometheus objects' ``podMonitorSelector`` asks), N completions through the pod proxy; Prometheus'
  ``gpuproof_inference_requests_total`` of the pod must read its first scrape's value + N. Permissions besides:
  ``pods/proxy`` create, ``monitoring.coreos.com`` ``podmonitors`` create and ``prometheuses`` list. Proven against
  real Prometheus scraping the server on the CPU, the cluster side stood in for
  (tests/test_monitoring_service_prometheus.py); not yet on a cluster.

JUnit cases named after the upstream tests (gpuproof conformance reads them as ``<Test>/<subtest>``):
``TestAcceleratorPerformanceMetrics::test_MetricsEndpointReachable[<node>]`` (``dcgm-exporter-ready``,
``dcgm-metrics-read``, ``dcgm-metrics-parse``, ``dcgm-exporter-version``),
``...::test_PerAcceleratorUtilizationMetric`` (``dcgm-gpu-utilization``), ``...::test_PerAcceleratorMemoryMetric``
(``dcgm-gpu-memory``), and
``TestAIServiceMetrics::test_inference_server_metrics_reach_prometheus`` (``ai-service-metrics``; upstream's test has
no subtests). The host label, the series in Prometheus and the numbers moving with the work are gpuproof's own (no
upstream test asserts them): their tests keep gpuproof's names.

Every node's exporter is read at once (the fan-out; reads hold no pod slot), once for all the node's tests.
Permissions: ``apps/daemonsets`` list, ``pods`` list, ``pods/proxy`` get. Proven on recorded outputs
(tests/test_monitoring.py, against real Prometheus in tests/test_monitoring_prometheus.py) and, for the cluster path,
on a kubelet node whose DaemonSet serves a recorded output with ``python -m http.server``
(tests/test_monitoring_kubelet.py).
"""

import functools
import time

import pytest

from gpuproof.cluster import dcgm
from gpuproof.cluster import prometheus as prom
from gpuproof.discovery import monitoring
from gpuproof.plugin import monitoring_checks as mc

FEATURE = "monitoring"


@pytest.fixture(scope="module")
def exporters(target):
    return mc.require_exporters(target.cluster)


@pytest.fixture(scope="module")
def prometheus_server(target, request):
    """The Prometheus of the run, looked for once (not once per GPU node: the Service list is the whole cluster's),
    and only when a test that reached it asks (``prometheus_server()``): a module fixture is set up before the
    test's own skips (needs_real_gpus), and a run on simulated GPUs lists no Services."""
    return functools.cache(lambda: mc.prometheus_of(request, target.cluster))


@pytest.mark.conformance("accelerator_metrics", guard=True)
class TestAcceleratorPerformanceMetrics:
    """Named after the upstream test (accelerator_metrics), so its JUnit cases read
    TestAcceleratorPerformanceMetrics/<subtest>, one per GPU node: upstream reads one endpoint, gpuproof every GPU
    node's exporter. Upstream's OptionalMetrics (temperature, power, interconnect) is only logged there: not here."""

    @pytest.mark.conformance("accelerator_metrics",
                             checks=("dcgm-exporter-ready", "dcgm-metrics-read", "dcgm-metrics-parse"))
    def test_MetricsEndpointReachable(self, needs_real_gpus, gpu_node, target, exporters, request, check):
        """One Ready exporter pod on the GPU node; its /metrics read through the API server's pod proxy parses."""
        node = gpu_node
        mine = exporters.of(node.name)
        found = mine[0] if mine else None
        shown = [f"{e.name}: {e.pod.status.phase}{', Ready' if dcgm.ready(e.pod) else ', not Ready'}" for e in mine]
        if not check.true("dcgm-exporter-ready", found is not None and dcgm.ready(found.pod),
                          f"a Ready pod of {exporters.describe()} on the node", ", ".join(shown) or "none",
                          what="the DCGM exporter on the node"):
            return
        result = mc.exporter_read(request, node, target, exporters)
        if not check.true("dcgm-metrics-read", "text" in result,
                          f"{found.name}'s /metrics through the API server's pod proxy (port {found.port})",
                          result.get("error", ""), what="the exporter's /metrics"):
            return
        text = result["text"]
        info = monitoring.exporter_info(text)
        check.record("dcgm-exporter-version", "pass", "",
                     f"image {found.image}; names {info.get('names')}; host label {info.get('host_label')}; "
                     f"{info.get('releases')}; driver {info.get('driver') or '?'}")
        mc.record(check, mc.findings_of(node, text, found.pod, exporters), ("dcgm-metrics-parse",))

    @pytest.mark.conformance("accelerator_metrics", checks=("dcgm-gpu-utilization",))
    def test_PerAcceleratorUtilizationMetric(self, needs_real_gpus, gpu_node, target, exporters, request, check):
        """Every GPU of the node has a utilization series (MIG GPUs: a profiling series per instance)."""
        mc.record(check, mc.judged(request, gpu_node, target, exporters), ("dcgm-gpu-utilization",))

    @pytest.mark.conformance("accelerator_metrics", checks=("dcgm-gpu-memory",))
    def test_PerAcceleratorMemoryMetric(self, needs_real_gpus, gpu_node, target, exporters, request, check):
        """Every GPU of the node has a framebuffer series."""
        mc.record(check, mc.judged(request, gpu_node, target, exporters), ("dcgm-gpu-memory",))


# gpuproof's own: upstream has no test of the host label. Outside TestAcceleratorPerformanceMetrics, so that its
# failure fails this test, not accelerator_metrics (gpuproof conformance reads only the upstream names there).
def test_exporter_names_the_node_on_its_series(needs_real_gpus, gpu_node, target, exporters, request, check):
    """The exporter's host label is the node's name on every series (not the exporter pod's)."""
    mc.record(check, mc.judged(request, gpu_node, target, exporters), ("dcgm-host-label",))


def test_prometheus_has_each_gpus_series_with_its_pod(needs_real_gpus, gpu_node, target, exporters, prometheus_server,
                                                     request, check):
    """The exporter's series as Prometheus stores them: every GPU, and the pod the exporter attributes it to."""
    server = prometheus_server()
    if server is None:
        pytest.skip(f"{mc.NO_PROMETHEUS}: nothing to check the exporter's series reach")
    node = gpu_node
    if exporters.ready_on(node.name) is None:
        check.skip("prometheus-gpu-series", f"{node.name} has no Ready DCGM exporter pod (dcgm-exporter-ready)")
    result = mc.stored_series(request, node, target, exporters, server)
    if "text" not in result:
        check.skip("prometheus-gpu-series", f"the exporter's /metrics could not be read: {result.get('error')}")
    if not check.true("prometheus-gpu-series", "stored" in result, f"an answer from {server}",
                      result.get("prometheus_error", ""), what="Prometheus' query API"):
        return
    mc.record(check, monitoring.judge_prometheus(node.name, result["text"], result["stored"]))


# ------------------------------------------------------------------ the numbers move with the work


@pytest.mark.places_pods
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "bench-dcgm-work-{node}", requests="1 {resource}",
                     note="gpuproof's matmul holding one GPU busy while the exporter is read")
def test_exporter_follows_the_work(needs_real_gpus, gpu_node, target, run, discovery, exporters, request, check):
    """While gpuproof's matmul pod holds one GPU of the node, exactly that GPU's series carry the pod's name and
    its utilization rises above the idle reading; the node's other GPUs carry none of it."""
    from gpuproof.plugin.fanout import NodeSkip

    node = gpu_node
    exporter = exporters.ready_on(node.name)
    if exporter is None:
        check.skip("dcgm-pod-attribution", f"{node.name} has no Ready DCGM exporter pod (dcgm-exporter-ready)")
    try:
        result = mc.fan_out(request).result(
            request.node, node, lambda n, lane: mc.follow_work(run, target, discovery, n, lane, exporter),
            name="monitoring-work")
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    if not check.true("dcgm-metrics-read", "error" not in result,
                      f"{exporter.name}'s /metrics through the API server's pod proxy {result.get('when', '')}",
                      result.get("error", ""), what="the exporter's /metrics"):
        return
    mc.record(check, monitoring.judge_work(node.name, result["before"], result["during"], run.namespace,
                                           result["pod"]))


# ------------------------------------------------------------------ ai_service_metrics: an AI server's own metrics


@pytest.mark.conformance("ai_service_metrics", checks=("ai-service-metrics",))
class TestAIServiceMetrics:
    """Named after the upstream test (ai_service_metrics), which has no subtests: its JUnit case reads
    TestAIServiceMetrics/inference_server_metrics_reach_prometheus."""

    @pytest.mark.creates("ConfigMap", "gpuproof-workloads")
    @pytest.mark.creates("Pod", mc.SERVICE_POD, on="first", requests="1 {resource}",
                         note="gpuproof's inference server")
    @pytest.mark.creates("PodMonitor", mc.SERVICE_POD, note="when the cluster serves monitoring.coreos.com/v1")
    def test_inference_server_metrics_reach_prometheus(self, needs_real_gpus, target, run, gpu_products,
                                                       prometheus_server, request, check):
        """ai_service_metrics: gpuproof's inference server on a GPU node, a PodMonitor in the run's namespace, N
        requests; Prometheus' ``gpuproof_inference_requests_total`` of the pod reads N (its first scrape's value +
        N)."""
        server = prometheus_server()
        if server is None:
            pytest.skip(f"{mc.NO_PROMETHEUS}: nothing to check gpuproof's inference server's metrics reach")
        if not prom.podmonitors_served(target.cluster):
            pytest.skip(f"the cluster serves no PodMonitor ({prom.MONITORING_GROUP}/v1: the Prometheus operator's "
                        "CRDs): nothing the run can create makes Prometheus discover a pod")
        if not gpu_products:
            pytest.skip("no GPU node runs GPU code here")
        product = sorted(gpu_products)[0]
        node = gpu_products[product][0]
        labels, source = prom.monitor_labels(target.cluster)
        with mc.serving(run, node, product) as served:
            mc.create_pod_monitor(target.cluster, served, {**labels, **run.labels})
            result, targets = mc.service_counter(server, served, None, mc.SERVICE_DISCOVERY_S)
            before = int(max((float(r["value"][1]) for r in result), default=0))
            if result:
                errors = mc.send_completions(target.cluster, served, mc.SERVICE_REQUESTS)
                answered = time.time()
                if not check.true("ai-service-metrics", not errors,
                                  f"{mc.SERVICE_REQUESTS} completions from {served.pod} through the API server's pod "
                                  "proxy", "; ".join(errors), what="gpuproof's inference server", target=node):
                    return
                result, targets = mc.service_counter(server, served, answered, mc.SERVICE_SCRAPE_S)
        for f in monitoring.judge_service_metrics(node, served.pod, before + mc.SERVICE_REQUESTS, result, targets,
                                                  before):
            check.true(f.check, f.verdict == "pass", f.expected, f.actual,
                       what=f"{f.check} (PodMonitor labels: {source})" + (f" ({f.reason})" if f.reason else ""),
                       target=node)

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

import contextlib
import dataclasses
import functools
import time

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from gpuproof.cluster import prometheus as prom
from gpuproof.discovery import monitoring

FEATURE = "monitoring"
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


def ready(pod) -> bool:
    return pod.status.phase == "Running" and any(c.type == "Ready" and c.status == "True"
                                                 for c in (pod.status.conditions or []))


def _port(ds) -> int:
    for c in ds.spec.template.spec.containers or []:
        for p in c.ports or []:
            if p.container_port == PORT or p.name == "metrics":
                return p.container_port
    return PORT


def find_exporters(cluster) -> Exporters:
    try:
        daemonsets = [d for d in cluster.apps.list_daemon_set_for_all_namespaces().items if is_exporter(d)]
    except ApiException as exc:
        pytest.fail(f"listing DaemonSets to find the DCGM exporter: HTTP {exc.status} {exc.reason} (the monitoring "
                    "suite needs list on apps/daemonsets: deploy/rbac.yaml)", pytrace=False)
    on_node: dict[str, list] = {}
    for ds in daemonsets:
        selector = ",".join(f"{k}={v}" for k, v in sorted((ds.spec.selector.match_labels or {}).items()))
        for pod in cluster.core.list_namespaced_pod(ds.metadata.namespace, label_selector=selector).items:
            if pod.spec.node_name:
                on_node.setdefault(pod.spec.node_name, []).append(Exporter(ds, pod, _port(ds)))
    for found in on_node.values():
        found.sort(key=lambda e: not ready(e.pod))
    return Exporters(daemonsets, on_node)


def require_exporters(cluster) -> Exporters:
    """The exporters, or a skip of the whole suite saying none was found."""
    found = find_exporters(cluster)
    if not found.daemonsets:
        pytest.skip(NONE_FOUND)
    return found


@pytest.fixture(scope="module")
def exporters(target):
    return require_exporters(target.cluster)


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


def facts_of(node) -> monitoring.NodeFacts:
    """What gpuproof knows of the node's GPUs: their UUIDs where DRA's ResourceSlices name them (in NVML index
    order), else their count (GFD's gpu.count counts MIG devices under the single strategy: not GPUs then)."""
    whole = sorted((d for d in node.dra_devices if d.type == "gpu" and d.uuid),
                   key=lambda d: int(d.attributes.get("index", 0) or 0))
    gpus = node.physical_count
    if gpus is None and node.mig_strategy != "single":
        gpus = node.count_label
    mig = node.mig_strategy != "none"
    instances = sum(node.mig_resources.values()) if node.mig_resources else (
        node.count_label if node.mig_strategy == "single" else None)
    return monitoring.NodeFacts(node.name, gpus, tuple(d.uuid for d in whole), mig, instances if mig else None)


def fan_out(request):
    """The session's fan-out, asked for when the check runs: these checks create nothing (no pod, no object), and
    gpuproof's plan counts a check whose fixtures include the run (the fan-out's do) as one that creates objects."""
    return request.getfixturevalue("fanout")


def exporter_read(request, node, target, exporters: Exporters) -> dict:
    """The node's exporter's /metrics ({"text"} or {"error"}), read once for all the node's tests: the first test
    that asks reads every node of its check at once (the fan-out), the node's later tests take what it read."""
    if node.name not in exporters.reads:
        def work(n, lane):
            there = exporters.on_node.get(n.name, [])
            return read_metrics(target.cluster, there[0]) if there else {"error": "no exporter pod on the node"}

        exporters.reads[node.name] = fan_out(request).result(request.node, node, work, name="monitoring")
    return exporters.reads[node.name]


def findings_of(node, text: str, pod, exporters: Exporters) -> list:
    """Every finding on the node's exporter output (gpuproof/discovery/monitoring.py), judged once for all the
    node's tests."""
    if node.name not in exporters.findings:
        exporters.findings[node.name] = monitoring.judge(facts_of(node), text, exporter_pod=pod.metadata.name)
    return exporters.findings[node.name]


def judged(request, node, target, exporters: Exporters) -> list:
    """Every finding on the node's exporter output (gpuproof/discovery/monitoring.py), for a test that judges part
    of it; a skip, with no record, where there is nothing to judge: MetricsEndpointReachable records why."""
    mine = exporters.on_node.get(node.name, [])
    if not mine or not ready(mine[0].pod):
        pytest.skip(f"{node.name} has no Ready DCGM exporter pod (dcgm-exporter-ready): no output to judge")
    result = exporter_read(request, node, target, exporters)
    if "text" not in result:
        pytest.skip(f"{node.name}: the exporter's /metrics could not be read (dcgm-metrics-read): {result['error']}")
    findings = findings_of(node, result["text"], mine[0].pod, exporters)
    if any(f.check == "dcgm-metrics-parse" and f.verdict == "fail" for f in findings):
        pytest.skip(f"{node.name}: the exporter's /metrics is not the Prometheus text format (dcgm-metrics-parse)")
    return findings


def record(check, findings, names: tuple[str, ...]) -> None:
    """Record the findings of these checks, each naming its GPU and why."""
    for f in findings:
        if f.check in names:
            what = (f"{f.gpu}: " if f.gpu else "") + f.check + (f" ({f.reason})" if f.reason else "")
            check.true(f.check, f.verdict == "pass", f.expected, f.actual, what=what)


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
        mine = exporters.on_node.get(node.name, [])
        found = mine[0] if mine else None
        shown = [f"{e.name}: {e.pod.status.phase}{', Ready' if ready(e.pod) else ', not Ready'}" for e in mine]
        if not check.true("dcgm-exporter-ready", found is not None and ready(found.pod),
                          f"a Ready pod of {exporters.describe()} on the node", ", ".join(shown) or "none",
                          what="the DCGM exporter on the node"):
            return
        result = exporter_read(request, node, target, exporters)
        if not check.true("dcgm-metrics-read", "text" in result,
                          f"{found.name}'s /metrics through the API server's pod proxy (port {found.port})",
                          result.get("error", ""), what="the exporter's /metrics"):
            return
        text = result["text"]
        info = monitoring.exporter_info(text)
        check.record("dcgm-exporter-version", "pass", "",
                     f"image {found.image}; names {info.get('names')}; host label {info.get('host_label')}; "
                     f"{info.get('releases')}; driver {info.get('driver') or '?'}")
        record(check, findings_of(node, text, found.pod, exporters), ("dcgm-metrics-parse",))

    @pytest.mark.conformance("accelerator_metrics", checks=("dcgm-gpu-utilization",))
    def test_PerAcceleratorUtilizationMetric(self, needs_real_gpus, gpu_node, target, exporters, request, check):
        """Every GPU of the node has a utilization series (MIG GPUs: a profiling series per instance)."""
        record(check, judged(request, gpu_node, target, exporters), ("dcgm-gpu-utilization",))

    @pytest.mark.conformance("accelerator_metrics", checks=("dcgm-gpu-memory",))
    def test_PerAcceleratorMemoryMetric(self, needs_real_gpus, gpu_node, target, exporters, request, check):
        """Every GPU of the node has a framebuffer series."""
        record(check, judged(request, gpu_node, target, exporters), ("dcgm-gpu-memory",))


# gpuproof's own: upstream has no test of the host label. Outside TestAcceleratorPerformanceMetrics, so that its
# failure fails this test, not accelerator_metrics (gpuproof conformance reads only the upstream names there).
def test_exporter_names_the_node_on_its_series(needs_real_gpus, gpu_node, target, exporters, request, check):
    """The exporter's host label is the node's name on every series (not the exporter pod's)."""
    record(check, judged(request, gpu_node, target, exporters), ("dcgm-host-label",))


UTILIZATION_NAMES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                     "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO")


def prometheus_of(request, cluster) -> prom.Prometheus | None:
    """The Prometheus the run reads: ``--prometheus URL``, else the one found among the cluster's Services (read
    through the API server's service proxy), else None."""
    url = request.config.getoption("prometheus", None)
    if url:
        return prom.Prometheus(url=url)
    found = prom.find(cluster)
    return prom.Prometheus(cluster=cluster, service=found) if found else None


@pytest.fixture(scope="module")
def prometheus_server(target, request):
    """The Prometheus of the run, looked for once (not once per GPU node: the Service list is the whole cluster's),
    and only when a test that reached it asks (``prometheus_server()``): a module fixture is set up before the
    test's own skips (needs_real_gpus), and a run on simulated GPUs lists no Services."""
    return functools.cache(lambda: prometheus_of(request, target.cluster))


NO_PROMETHEUS = ("no Prometheus named (--prometheus URL) and none found in the cluster (kube-prometheus-stack's, "
                 "kube-prometheus' prometheus-k8s, the operator's prometheus-operated, prometheus-server)")


def prometheus_series(server: prom.Prometheus, uuids: list, selector: str = "") -> list:
    """The utilization series Prometheus holds for these GPUs (by UUID: unique across the cluster, whichever host
    label spelling the exporter used), as dcgm_series samples."""
    matchers = [f'__name__=~"{"|".join(UTILIZATION_NAMES)}"', f'UUID=~"{"|".join(sorted(uuids))}"']
    if selector.strip():
        matchers.append(selector.strip())
    return monitoring.samples_from_query(server.api("query", query="{" + ",".join(matchers) + "}")["result"])


def test_prometheus_has_each_gpus_series_with_its_pod(needs_real_gpus, gpu_node, target, exporters, prometheus_server,
                                                     request, check):
    """The exporter's series as Prometheus stores them: every GPU, and the pod the exporter attributes it to."""
    server = prometheus_server()
    if server is None:
        pytest.skip(f"{NO_PROMETHEUS}: nothing to check the exporter's series reach")
    node = gpu_node
    mine = [e for e in exporters.on_node.get(node.name, []) if ready(e.pod)]
    if not mine:
        check.skip("prometheus-gpu-series", f"{node.name} has no Ready DCGM exporter pod (dcgm-exporter-ready)")
    selector = request.config.getoption("prometheus_selector", "") or ""

    def work(n, lane):
        there = [e for e in exporters.on_node.get(n.name, []) if ready(e.pod)]
        read = read_metrics(target.cluster, there[0])
        if "text" not in read:
            return read
        try:
            uuids = sorted(set(monitoring.attributed(read["text"])) | set(monitoring.published(read["text"])))
            return {**read, "stored": prometheus_series(server, uuids, selector) if uuids else []}
        except (OSError, ValueError) as exc:
            return {**read, "prometheus_error": f"{type(exc).__name__}: {exc}"}

    result = fan_out(request).result(request.node, node, work, name="monitoring-prometheus")
    if "text" not in result:
        check.skip("prometheus-gpu-series", f"the exporter's /metrics could not be read: {result.get('error')}")
    if not check.true("prometheus-gpu-series", "stored" in result, f"an answer from {server}",
                      result.get("prometheus_error", ""), what="Prometheus' query API"):
        return
    for f in monitoring.judge_prometheus(node.name, result["text"], result["stored"]):
        what = (f"{f.gpu}: " if f.gpu else "") + f.check + (f" ({f.reason})" if f.reason else "")
        check.true(f.check, f.verdict == "pass", f.expected, f.actual, what=what)


# ------------------------------------------------------------------ the numbers move with the work

WORK_HOLD_S = 150.0         # the matmul pod warms up this long: five of the exporter's default 30 s collections
WORK_POLL_S = 5.0           # a read of the exporter's /metrics while the pod runs (the exporter has no watch)
WORK_RUNNING_S = 600.0      # the pod placed and started (an image pull on a fresh node)


def work_pod(run, node, resource: str, lane) -> dict:
    """gpuproof's matmul workload holding one GPU of the node busy for about ``WORK_HOLD_S`` seconds."""
    from gpuproof.bench import workloads as wl
    from gpuproof.bench.base import pod_name
    from gpuproof.plugin import bench_checks
    from gpuproof.plugin.checks import tolerations_for

    device = bench_checks.device(run)
    # on the CPU (the embedded cluster's kubelet nodes: a GPU only NVML's mock sees) the pod's work is brief: no
    # exporter there sees it, and the check's path (pod, reads before and during, verdict) is what runs
    size = ["--sizes", "256"] if device == "cpu" else ["--sizes", "8192", "--warmup-s", f"{WORK_HOLD_S:g}"]
    args = ["--device", device, "--dtypes", "bf16", *size, "--iters", "20", "--check-size", "0"]
    return wl.workload_pod(pod_name("dcgm-work", node.name), "matmul.py", args,
                           labels={**run.labels, **lane.labels}, namespace=run.namespace, image=bench_checks.image(run),
                           resource=resource, node=node.name, tolerations=tolerations_for(node),
                           deadline_s=int(WORK_HOLD_S * 4))


@contextlib.contextmanager
def holding_gpu(run, node, resource: str, lane):
    """The work pod, Running on the node; deleted (and gone) after. Yields its name."""
    from gpuproof.bench.base import applied, ensure_configmap
    from gpuproof.cluster.conditions import pod_started, wait_for

    ensure_configmap(run)
    pod = work_pod(run, node, resource, lane)
    name = pod["metadata"]["name"]
    with applied(run, [pod], lane=lane):
        wait_for(lane.job.watch(), name, pod_started.named("to be Running (the GPU the exporter should see busy)"),
                 WORK_RUNNING_S, lane.stop)
        yield name


def follow_work(run, target, discovery, node, lane, exporter: Exporter) -> dict:
    """The node's exporter read before a pod holds one of its GPUs, then while it runs, until the exporter
    attributes a GPU to the pod with its utilization above the idle reading, or the pod's hold ends."""
    from gpuproof.plugin import bench_checks
    from gpuproof.plugin.checks import free_on
    from gpuproof.plugin.fanout import NodeSkip

    resource, _ = bench_checks.node_gpus(discovery, node.name)
    if free_on(target.cluster, node, resource) < 1:
        raise NodeSkip("dcgm-pod-attribution", f"{node.name} has no free {resource}: every GPU is held by other pods")
    before = read_metrics(target.cluster, exporter)
    if "text" not in before:
        return {"error": before["error"], "when": "before the work pod started"}
    with lane.pods(1), holding_gpu(run, node, resource, lane) as pod:
        deadline = time.monotonic() + WORK_HOLD_S
        while True:
            during = read_metrics(target.cluster, exporter)
            if "text" in during:
                with contextlib.suppress(ValueError):
                    found = monitoring.judge_work(node.name, before["text"], during["text"], run.namespace, pod)
                    if all(f.verdict == "pass" for f in found) and len(found) == 2:
                        break
            seen = lane.job.watch().cache.get(pod)
            phase = seen.status.phase if seen is not None and seen.status else None
            if phase == "Failed":
                return {"error": f"the work pod {run.namespace}/{pod} failed before the exporter saw it busy "
                                 f"({seen.status.reason or 'see its log'})", "when": "while it ran"}
            if phase == "Succeeded" or time.monotonic() >= deadline or lane.stop.wait(WORK_POLL_S):
                break           # the work is over (judged on the last read), or its hold
    if "text" not in during:
        return {"error": during["error"], "when": f"while {run.namespace}/{pod} ran"}
    return {"before": before["text"], "during": during["text"], "pod": pod}


@pytest.mark.places_pods
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "bench-dcgm-work-{node}", requests="1 {resource}",
                     note="gpuproof's matmul holding one GPU busy while the exporter is read")
def test_exporter_follows_the_work(needs_real_gpus, gpu_node, target, run, discovery, exporters, request, check):
    """While gpuproof's matmul pod holds one GPU of the node, exactly that GPU's series carry the pod's name and
    its utilization rises above the idle reading; the node's other GPUs carry none of it."""
    from gpuproof.plugin.fanout import NodeSkip

    node = gpu_node
    mine = [e for e in exporters.on_node.get(node.name, []) if ready(e.pod)]
    if not mine:
        check.skip("dcgm-pod-attribution", f"{node.name} has no Ready DCGM exporter pod (dcgm-exporter-ready)")
    exporter = mine[0]
    try:
        result = fan_out(request).result(
            request.node, node, lambda n, lane: follow_work(run, target, discovery, n, lane, exporter),
            name="monitoring-work")
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    if not check.true("dcgm-metrics-read", "error" not in result,
                      f"{exporter.name}'s /metrics through the API server's pod proxy {result.get('when', '')}",
                      result.get("error", ""), what="the exporter's /metrics"):
        return
    for f in monitoring.judge_work(node.name, result["before"], result["during"], run.namespace, result["pod"]):
        what = (f"{f.gpu}: " if f.gpu else "") + f.check + (f" ({f.reason})" if f.reason else "")
        check.true(f.check, f.verdict == "pass", f.expected, f.actual, what=what)


# ------------------------------------------------------------------ ai_service_metrics: an AI server's own metrics

SERVICE_POD = "ai-service-metrics"
SERVICE_REQUESTS = 5
SERVICE_READY_S = 900.0           # the image's pull and the model's load
SERVICE_DISCOVERY_S = 180.0       # the monitor found and the pod scraped once (the operator reloads Prometheus)
SERVICE_SCRAPE_S = 120.0          # a scrape after the last answer (the PodMonitor asks for one every 5 s)
SERVICE_POLL_S = 1.0
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
    and where they came from."""
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


@dataclasses.dataclass
class Served:
    """The inference server pod the check judges."""
    namespace: str
    name: str
    node: str
    port: int
    selector: dict          # its own labels, for the PodMonitor

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


def service_pod(run, node: str, product: str) -> tuple[dict, dict]:
    """The inference server's pod (the benchmark's Deployment's pod template, the tiny model: the work is not the
    point), pinned to the node, and its own labels (the PodMonitor's selector)."""
    from gpuproof.bench import workloads as wl
    from gpuproof.cluster.placement import pod_manifest
    from gpuproof.plugin import bench_checks

    deployment, _service = wl.inference_manifests(
        SERVICE_POD, labels=run.labels, namespace=run.namespace, image=bench_checks.image(run), product=product,
        node=node, server_args=["--model", "tiny", "--device", bench_checks.device(run)])
    pod = pod_manifest({**deployment["metadata"], "labels": deployment["spec"]["template"]["metadata"]["labels"]},
                       deployment["spec"]["template"]["spec"])
    return pod, deployment["spec"]["selector"]["matchLabels"]


@contextlib.contextmanager
def serving(run, node: str, product: str):
    """gpuproof's inference server as a pod on the node, Ready; deleted after."""
    from gpuproof.bench import workloads as wl
    from gpuproof.bench.base import applied, ensure_configmap
    from gpuproof.cluster.conditions import pod_ready, wait_for

    ensure_configmap(run)
    pod, own = service_pod(run, node, product)
    with applied(run, [pod]):
        wait_for(run, SERVICE_POD, pod_ready.named("to be Ready (gpuproof's inference server)"), SERVICE_READY_S)
        yield Served(run.namespace, SERVICE_POD, node, wl.INFERENCE_PORT, own)


def create_pod_monitor(cluster, served: Served, labels: dict) -> None:
    """A PodMonitor in the run's namespace that scrapes the server's ``/metrics`` every 5 s (the run namespace's
    deletion deletes it)."""
    from kubernetes import client as k8s

    body = {"apiVersion": f"{MONITORING_GROUP}/v1", "kind": "PodMonitor",
            "metadata": {"name": served.name, "namespace": served.namespace, "labels": labels},
            "spec": {"selector": {"matchLabels": served.selector},
                     "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}]}}
    k8s.CustomObjectsApi(cluster.api).create_namespaced_custom_object(MONITORING_GROUP, "v1", served.namespace,
                                                                      "podmonitors", body)


def send_completions(cluster, served: Served, n: int) -> list[str]:
    """``n`` completion requests to the server through the API server's pod proxy, one after another; the errors."""
    errors = []
    path = f"/api/v1/namespaces/{served.namespace}/pods/{served.name}:{served.port}/proxy/v1/completions"
    for i in range(n):
        try:
            cluster.api.call_api(path, "POST", header_params={"Content-Type": "application/json",
                                                              "Accept": "application/json"},
                                 body={"prompt": f"request {i + 1} of {n}", "max_tokens": 4},
                                 auth_settings=["BearerToken"], _preload_content=False,
                                 _request_timeout=READ_TIMEOUT_S)
        except ApiException as exc:
            errors.append(f"request {i + 1}: HTTP {exc.status} {exc.reason}")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            errors.append(f"request {i + 1}: {type(exc).__name__}: {exc}")
    return errors


def service_counter(server: prom.Prometheus, served: Served, after: float | None, timeout: float) -> tuple[list, list]:
    """Prometheus' request counter of the pod (an instant query's result) and its targets for the pod, once it has
    a sample scraped after ``after`` (a Unix time; None: any sample), or as they are after ``timeout`` seconds."""
    query = monitoring.service_query(served.name, served.namespace)
    deadline = time.monotonic() + timeout
    while True:
        stamps = server.api("query", query=f"timestamp({query})")["result"]
        if stamps and (after is None or any(float(s["value"][1]) > after for s in stamps)) \
                or time.monotonic() >= deadline:
            break
        time.sleep(SERVICE_POLL_S)          # a poll of Prometheus, until a scrape or the deadline
    result = server.api("query", query=query)["result"]
    targets = monitoring.pod_targets(server.api("targets", state="active")["activeTargets"], served.pod)
    return result, targets


@pytest.mark.conformance("ai_service_metrics", checks=("ai-service-metrics",))
class TestAIServiceMetrics:
    """Named after the upstream test (ai_service_metrics), which has no subtests: its JUnit case reads
    TestAIServiceMetrics/inference_server_metrics_reach_prometheus."""

    @pytest.mark.creates("ConfigMap", "gpuproof-workloads")
    @pytest.mark.creates("Pod", SERVICE_POD, on="first", requests="1 {resource}", note="gpuproof's inference server")
    @pytest.mark.creates("PodMonitor", SERVICE_POD, note="when the cluster serves monitoring.coreos.com/v1")
    def test_inference_server_metrics_reach_prometheus(self, needs_real_gpus, target, run, gpu_products,
                                                       prometheus_server, request, check):
        """ai_service_metrics: gpuproof's inference server on a GPU node, a PodMonitor in the run's namespace, N
        requests; Prometheus' ``gpuproof_inference_requests_total`` of the pod reads N (its first scrape's value +
        N)."""
        server = prometheus_server()
        if server is None:
            pytest.skip(f"{NO_PROMETHEUS}: nothing to check gpuproof's inference server's metrics reach")
        if not podmonitors_served(target.cluster):
            pytest.skip(f"the cluster serves no PodMonitor ({MONITORING_GROUP}/v1: the Prometheus operator's CRDs): "
                        "nothing the run can create makes Prometheus discover a pod")
        if not gpu_products:
            pytest.skip("no GPU node runs GPU code here")
        product = sorted(gpu_products)[0]
        node = gpu_products[product][0]
        labels, source = monitor_labels(target.cluster)
        with serving(run, node, product) as served:
            create_pod_monitor(target.cluster, served, {**labels, **run.labels})
            result, targets = service_counter(server, served, None, SERVICE_DISCOVERY_S)
            before = int(max((float(r["value"][1]) for r in result), default=0))
            if result:
                errors = send_completions(target.cluster, served, SERVICE_REQUESTS)
                answered = time.time()
                if not check.true("ai-service-metrics", not errors,
                                  f"{SERVICE_REQUESTS} completions from {served.pod} through the API server's pod "
                                  "proxy", "; ".join(errors), what="gpuproof's inference server", target=node):
                    return
                result, targets = service_counter(server, served, answered, SERVICE_SCRAPE_S)
        for f in monitoring.judge_service_metrics(node, served.pod, before + SERVICE_REQUESTS, result, targets, before):
            check.true(f.check, f.verdict == "pass", f.expected, f.actual,
                       what=f"{f.check} (PodMonitor labels: {source})" + (f" ({f.reason})" if f.reason else ""),
                       target=node)

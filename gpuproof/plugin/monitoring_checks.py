"""The monitoring suite's work in the cluster (suites/test_monitoring.py reads as its checks; this is how they get
what they judge).

- The DCGM exporters (``gpuproof/cluster/dcgm.py``), or a skip of the whole suite where there is none; every GPU
  node's ``/metrics`` read once for all the node's tests, through the fan-out (every node's at once: reads hold no pod
  slot), and judged once (``gpuproof/discovery/monitoring.py``).
- The Prometheus the run reads (``--prometheus URL``, else one found among the cluster's Services), and per node the
  series it stores for the GPUs the exporter publishes.
- The numbers moving with the work: gpuproof's matmul pod holding one GPU of the node busy for a few of the exporter's
  collections, the exporter read before it starts and while it runs.
- ai_service_metrics: gpuproof's inference server as a pod on a GPU node, completions sent to it through the API
  server's pod proxy, and Prometheus' request counter of the pod, once scraped.

Plugin layer: the pods are the benchmarks' (``gpuproof.bench``), placed as the plugin's checks place them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from ..cluster import dcgm
from ..cluster import prometheus as prom
from ..discovery import monitoring
from ..errors import GpuproofError


# ------------------------------------------------------------------ the exporters and their outputs


def require_exporters(cluster) -> dcgm.Exporters:
    """The exporters, or a skip of the whole suite saying none was found (a failure where they cannot be listed)."""
    try:
        found = dcgm.find_exporters(cluster)
    except GpuproofError as exc:
        pytest.fail(str(exc), pytrace=False)
    if not found.daemonsets:
        pytest.skip(dcgm.NONE_FOUND)
    return found


def fan_out(request):
    """The session's fan-out, asked for when the check runs: these checks create nothing (no pod, no object), and
    gpuproof's plan counts a check whose fixtures include the run (the fan-out's do) as one that creates objects."""
    return request.getfixturevalue("fanout")


def exporter_read(request, node, target, exporters: dcgm.Exporters) -> dict:
    """The node's exporter's /metrics ({"text"} or {"error"}), read once for all the node's tests: the first test
    that asks reads every node of its check at once (the fan-out), the node's later tests take what it read."""
    if node.name not in exporters.reads:
        def work(n, lane):
            there = exporters.of(n.name)
            return dcgm.read_metrics(target.cluster, there[0]) if there else {"error": "no exporter pod on the node"}

        exporters.reads[node.name] = fan_out(request).result(request.node, node, work, name="monitoring")
    return exporters.reads[node.name]


def findings_of(node, text: str, pod, exporters: dcgm.Exporters) -> list:
    """Every finding on the node's exporter output (gpuproof/discovery/monitoring.py), judged once for all the
    node's tests."""
    if node.name not in exporters.findings:
        exporters.findings[node.name] = monitoring.judge(monitoring.facts_of(node), text,
                                                         exporter_pod=pod.metadata.name)
    return exporters.findings[node.name]


def judged(request, node, target, exporters: dcgm.Exporters) -> list:
    """Every finding on the node's exporter output, for a test that judges part of it; a skip, with no record,
    where there is nothing to judge: MetricsEndpointReachable records why."""
    mine = exporters.of(node.name)
    if not mine or not dcgm.ready(mine[0].pod):
        pytest.skip(f"{node.name} has no Ready DCGM exporter pod (dcgm-exporter-ready): no output to judge")
    result = exporter_read(request, node, target, exporters)
    if "text" not in result:
        pytest.skip(f"{node.name}: the exporter's /metrics could not be read (dcgm-metrics-read): {result['error']}")
    findings = findings_of(node, result["text"], mine[0].pod, exporters)
    if any(f.check == "dcgm-metrics-parse" and f.verdict == "fail" for f in findings):
        pytest.skip(f"{node.name}: the exporter's /metrics is not the Prometheus text format (dcgm-metrics-parse)")
    return findings


def record(check, findings, names: tuple[str, ...] | None = None) -> None:
    """Record the findings (of these checks, where named), each naming its GPU and why."""
    for f in findings:
        if names is None or f.check in names:
            what = (f"{f.gpu}: " if f.gpu else "") + f.check + (f" ({f.reason})" if f.reason else "")
            check.true(f.check, f.verdict == "pass", f.expected, f.actual, what=what)


# ------------------------------------------------------------------ Prometheus

# the utilization series' names, classic and DCGM 4.7 (4.9.0's exporter), as Prometheus stores them
UTILIZATION_NAMES = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
                     "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO")
NO_PROMETHEUS = ("no Prometheus named (--prometheus URL) and none found in the cluster (kube-prometheus-stack's, "
                 "kube-prometheus' prometheus-k8s, the operator's prometheus-operated, prometheus-server)")


def prometheus_of(request, cluster) -> prom.Prometheus | None:
    """The Prometheus the run reads: ``--prometheus URL``, else the one found among the cluster's Services (read
    through the API server's service proxy), else None."""
    url = request.config.getoption("prometheus", None)
    if url:
        return prom.Prometheus(url=url)
    found = prom.find(cluster)
    return prom.Prometheus(cluster=cluster, service=found) if found else None


def gpu_series_query(uuids, selector: str = "") -> str:
    """The PromQL that reads the utilization series Prometheus holds for these GPUs (by UUID: unique across the
    cluster, whichever host label spelling the exporter used), narrowed by ``selector`` (``job="..."``)."""
    matchers = [f'__name__=~"{"|".join(UTILIZATION_NAMES)}"', f'UUID=~"{"|".join(sorted(uuids))}"']
    if selector.strip():
        matchers.append(selector.strip())
    return "{" + ",".join(matchers) + "}"


def stored_series(request, node, target, exporters: dcgm.Exporters, server: prom.Prometheus) -> dict:
    """The node's exporter read now, and the utilization series Prometheus stores for every GPU it publishes or
    attributes to a pod (``--prometheus-selector`` narrows the query): {"text", "stored"}, {"text",
    "prometheus_error"} or {"error"}; every node of the check at once (the fan-out)."""
    selector = request.config.getoption("prometheus_selector", "") or ""

    def work(n, lane):
        exporter = exporters.ready_on(n.name)
        if exporter is None:
            return {"error": "no Ready exporter pod on the node"}
        read = dcgm.read_metrics(target.cluster, exporter)
        if "text" not in read:
            return read
        try:
            uuids = sorted(set(monitoring.attributed(read["text"])) | set(monitoring.published(read["text"])))
            result = server.api("query", query=gpu_series_query(uuids, selector))["result"] if uuids \
                else []
            return {**read, "stored": monitoring.samples_from_query(result)}
        except (OSError, ValueError) as exc:
            return {**read, "prometheus_error": f"{type(exc).__name__}: {exc}"}

    return fan_out(request).result(request.node, node, work, name="monitoring-prometheus")


# ------------------------------------------------------------------ the numbers move with the work

WORK_HOLD_S = 150.0         # the matmul pod warms up this long: five of the exporter's default 30 s collections
WORK_POLL_S = 5.0           # a read of the exporter's /metrics while the pod runs (the exporter has no watch)
WORK_RUNNING_S = 600.0      # the pod placed and started (an image pull on a fresh node)


def work_pod(run, node, resource: str, lane) -> dict:
    """gpuproof's matmul workload holding one GPU of the node busy for about ``WORK_HOLD_S`` seconds."""
    from ..bench import workloads as wl
    from ..bench.base import pod_name
    from . import bench_checks
    from .checks import tolerations_for

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
    from ..bench.base import applied, ensure_configmap
    from ..cluster.conditions import pod_started, wait_for

    ensure_configmap(run)
    pod = work_pod(run, node, resource, lane)
    name = pod["metadata"]["name"]
    with applied(run, [pod], lane=lane):
        wait_for(lane.job.watch(), name, pod_started.named("to be Running (the GPU the exporter should see busy)"),
                 WORK_RUNNING_S, lane.stop)
        yield name


def follow_work(run, target, discovery, node, lane, exporter: dcgm.Exporter) -> dict:
    """The node's exporter read before a pod holds one of its GPUs, then while it runs, until the exporter
    attributes a GPU to the pod with its utilization above the idle reading, or the pod's hold ends:
    {"before", "during", "pod"} or {"error", "when"}. A NodeSkip where the node has no free GPU."""
    from . import bench_checks
    from .checks import free_on
    from .fanout import NodeSkip

    resource, _ = bench_checks.node_gpus(discovery, node.name)
    if free_on(target.cluster, node, resource) < 1:
        raise NodeSkip("dcgm-pod-attribution", f"{node.name} has no free {resource}: every GPU is held by other pods")
    before = dcgm.read_metrics(target.cluster, exporter)
    if "text" not in before:
        return {"error": before["error"], "when": "before the work pod started"}
    with lane.pods(1), holding_gpu(run, node, resource, lane) as pod:
        deadline = time.monotonic() + WORK_HOLD_S
        while True:
            during = dcgm.read_metrics(target.cluster, exporter)
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


# ------------------------------------------------------------------ ai_service_metrics: an AI server's own metrics

SERVICE_POD = "ai-service-metrics"
SERVICE_REQUESTS = 5
SERVICE_READY_S = 900.0           # the image's pull and the model's load
SERVICE_DISCOVERY_S = 180.0       # the monitor found and the pod scraped once (the operator reloads Prometheus)
SERVICE_SCRAPE_S = 120.0          # a scrape after the last answer (the PodMonitor asks for one every 5 s)


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
    from ..bench import workloads as wl
    from ..cluster.placement import pod_manifest
    from . import bench_checks

    deployment, _service = wl.inference_manifests(
        SERVICE_POD, labels=run.labels, namespace=run.namespace, image=bench_checks.image(run), product=product,
        node=node, server_args=["--model", "tiny", "--device", bench_checks.device(run)])
    pod = pod_manifest({**deployment["metadata"], "labels": deployment["spec"]["template"]["metadata"]["labels"]},
                       deployment["spec"]["template"]["spec"])
    return pod, deployment["spec"]["selector"]["matchLabels"]


@contextlib.contextmanager
def serving(run, node: str, product: str):
    """gpuproof's inference server as a pod on the node, Ready; deleted after."""
    from ..bench import workloads as wl
    from ..bench.base import applied, ensure_configmap
    from ..cluster.conditions import pod_ready, wait_for

    ensure_configmap(run)
    pod, own = service_pod(run, node, product)
    with applied(run, [pod]):
        wait_for(run, SERVICE_POD, pod_ready.named("to be Ready (gpuproof's inference server)"), SERVICE_READY_S)
        yield Served(run.namespace, SERVICE_POD, node, wl.INFERENCE_PORT, own)


def create_pod_monitor(cluster, served: Served, labels: dict) -> None:
    """A PodMonitor in the run's namespace that scrapes the server's ``/metrics`` every 5 s (the run namespace's
    deletion deletes it)."""
    prom.create_pod_monitor(cluster, served.namespace, served.name, served.selector, labels)


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
                                 _request_timeout=dcgm.READ_TIMEOUT_S)
        except ApiException as exc:
            errors.append(f"request {i + 1}: HTTP {exc.status} {exc.reason}")
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            errors.append(f"request {i + 1}: {type(exc).__name__}: {exc}")
    return errors


def service_counter(server: prom.Prometheus, served: Served, after: float | None, timeout: float) -> tuple[list, list]:
    """Prometheus' request counter of the pod (an instant query's result) and its targets for the pod, once it has
    a sample scraped after ``after`` (a Unix time; None: any sample), or as they are after ``timeout`` seconds."""
    query = monitoring.service_query(served.name, served.namespace)
    server.sampled(query, after, timeout)
    result = server.api("query", query=query)["result"]
    targets = monitoring.pod_targets(server.api("targets", state="active")["activeTargets"], served.pod)
    return result, targets

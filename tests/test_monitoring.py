"""GPU monitoring (issue #39): the judge of a node's DCGM exporter output (gpuproof/discovery/monitoring.py) and the
monitoring suite (suites/test_monitoring.py), on recorded exporter outputs only (tests/data/dcgm/SOURCES.md).

No exporter runs here (it needs NVIDIA's DCGM): its side is what public sources printed, verbatim, and outputs derived
from those by an edit each file states. The suite runs as pytest would run it, with a real Checker, against the
kubernetes client's own model objects for the exporter's DaemonSet and pods; the API server's pod proxy answers with
the recorded file. Each fault fails its check naming node, GPU (index and UUID), expected and actual; the healthy
outputs pass. Real Prometheus scraping these files: tests/test_monitoring_prometheus.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from test_real_gpu_checks import INLINE, node, suite

from gpuproof.cluster import dcgm
from gpuproof.discovery import monitoring
from gpuproof.discovery.monitoring import NodeFacts, judge
from gpuproof.plugin import monitoring_checks as mc
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir

DATA = Path(__file__).parent / "data" / "dcgm"
L4_HOST, L4_UUID = "i-030791dc5a37cd257", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
H100_HOST = "computeinstance-e00c1p6dpy98xytphp"
H100_UUIDS = ("GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b", "GPU-15338f3e-5fd9-962d-921a-979b820520f0")
MIG_UUID = "GPU-d6dd33b9-0000-0000-0000-000000000000"
EXPORTER_POD = "nvidia-dcgm-exporter-x7k2p"
L4 = NodeFacts(L4_HOST, 1, (L4_UUID,))
H100 = NodeFacts(H100_HOST, 2, H100_UUIDS)


def text(name: str) -> str:
    return (DATA / name).read_text()


def verdicts(findings) -> dict[tuple[str, str], str]:
    return {(f.check, f.gpu): f.verdict for f in findings}


def failed(findings) -> list:
    return [f for f in findings if f.verdict == "fail"]


# -------------------------------------------------------------------------------- the judge, per recorded output

@pytest.mark.parametrize("name, facts", [
    ("kops-l4-gpu-operator-idle.prom", L4),
    ("kops-l4-gpu-operator-idle.prom", NodeFacts(L4_HOST, 1)),                    # by count: GPU 0
    ("upcloud-l40s-helm.prom", NodeFacts("gpu1-wl8sg", 1, ("GPU-5b4e07f6-3a86-4340-039d-25f2a83cdc43",))),
    ("derived-4.8.3-hostname.prom", L4),
    ("derived-4.9.0-dcgm47-names-busy.prom", L4),
    ("derived-a100-mig-from-reference.prom", NodeFacts("della-l01g1", 1, (MIG_UUID,), mig=True, mig_instances=1)),
])
def test_a_healthy_output_passes_every_check(name, facts):
    findings = judge(facts, text(name))
    assert failed(findings) == []
    assert {f.check for f in findings} == set(monitoring.CHECKS)
    per_gpu = [f for f in findings if f.gpu]
    assert per_gpu and all(f.gpu.startswith("GPU 0 (GPU-") for f in per_gpu), per_gpu


def test_units_are_normalized_by_name_in_what_is_recorded():
    """4.9.0's ratio and bytes read as % and MiB, the same figures the classic names give."""
    new = {f.check: f.actual for f in judge(L4, text("derived-4.9.0-dcgm47-names-busy.prom")) if f.gpu}
    old = {f.check: f.actual for f in judge(L4, text("kops-l4-gpu-operator-idle.prom")) if f.gpu}
    assert new == {"dcgm-gpu-utilization": "DCGM_FI_DEV_GPU_UTIL_RATIO = 93 %",
                   "dcgm-gpu-memory": "DCGM_FI_DEV_FB_USED_BYTES = 20000 MiB"}
    assert old == {"dcgm-gpu-utilization": "DCGM_FI_DEV_GPU_UTIL = 0 %",
                   "dcgm-gpu-memory": "DCGM_FI_DEV_FB_USED = 0 MiB"}


def test_the_h100_excerpt_has_both_gpus_utilization_and_no_memory_series():
    """Issue 490's author quoted the utilization series alone: both GPUs pass utilization and the host label, and
    the memory check says what the excerpt lacks (an excerpt, not an exporter that lost its FB fields)."""
    v = verdicts(judge(H100, text("h100-pod-on-gpu0-issue490.prom")))
    assert v[("dcgm-gpu-utilization", f"GPU 0 ({H100_UUIDS[0]})")] == "pass"
    assert v[("dcgm-gpu-utilization", f"GPU 1 ({H100_UUIDS[1]})")] == "pass"
    assert v[("dcgm-host-label", "")] == "pass"
    assert v[("dcgm-gpu-memory", f"GPU 1 ({H100_UUIDS[1]})")] == "fail"


def test_exporter_info_says_which_releases_wrote_it():
    assert monitoring.exporter_info(text("kops-l4-gpu-operator-idle.prom")) == {
        "names": "classic", "host_label": "Hostname", "driver": "580.105.08",
        "releases": "before 4.9.0 (classic names); before 4.6.0-4.8.3 (label Hostname)"}
    info = monitoring.exporter_info(text("derived-4.9.0-dcgm47-names-busy.prom"))
    assert (info["names"], info["host_label"], info["driver"]) == ("dcgm-4.7", "hostname", "580.105.08")
    assert monitoring.exporter_info(text("derived-fault-kops-cut-short.prom")) == {}


# -------------------------------------------------------------------------------- the judge, per derived fault

def test_a_missing_gpu_fails_by_index_and_uuid():
    out = judge(H100, text("derived-fault-h100-gpu1-missing.prom"))
    util = [f for f in failed(out) if f.check == "dcgm-gpu-utilization"]
    assert [f.message for f in util] == [f"{H100_HOST}: GPU 1 ({H100_UUIDS[1]}): dcgm-gpu-utilization: expected a "
                                         "utilization series, actual no series for this GPU"]
    # known by count only: the GPU is named by the index the exporter would give it
    by_count = judge(NodeFacts(H100_HOST, 2), text("derived-fault-h100-gpu1-missing.prom"))
    assert [f.gpu for f in failed(by_count) if f.check == "dcgm-gpu-utilization"] == ["GPU 1 (UUID not published)"]


def test_empty_labels_fail_the_gpu_and_the_host_label():
    out = judge(L4, text("derived-fault-kops-labels-empty.prom"))
    by = {(f.check, f.gpu): f for f in failed(out)}
    gpu = f"GPU 0 ({L4_UUID})"
    assert by[("dcgm-gpu-utilization", gpu)].actual == ("no series for this GPU; 23 series name no GPU (labels gpu "
                                                        "and UUID empty)")
    assert ("dcgm-gpu-memory", gpu) in by
    host = by[("dcgm-host-label", "")]
    assert (host.actual, host.reason.split(":")[0]) == ("(missing or empty)", "no host label")


def test_the_exporter_pods_name_as_host_fails_saying_why():
    f, = failed(judge(L4, text("derived-fault-kops-host-pod-name.prom"), exporter_pod=EXPORTER_POD))
    assert f.message == (f"{L4_HOST}: dcgm-host-label: expected hostname (or Hostname) = '{L4_HOST}' on every series, "
                         f"actual '{EXPORTER_POD}' (the exporter pod's own name: its NODE_NAME is not set from "
                         "spec.nodeName)")


def test_a_mig_gpu_needs_a_profiling_series_per_instance():
    facts = NodeFacts("della-l01g1", 1, (MIG_UUID,), mig=True, mig_instances=1)
    out = failed(judge(facts, text("derived-fault-a100-mig-no-profiling.prom")))
    assert [(f.check, f.gpu, f.actual) for f in out] == [
        ("dcgm-gpu-utilization", f"GPU 0 ({MIG_UUID})", "instances 7: lacking on 7"),
        ("dcgm-gpu-utilization", "", "0")]
    assert out[1].expected.startswith("1 MIG instances with DCGM_FI_PROF_GR_ENGINE_ACTIVE")
    # 2 MIG devices advertised, 1 published
    more = failed(judge(NodeFacts("della-l01g1", 1, mig=True, mig_instances=2),
                        text("derived-a100-mig-from-reference.prom")))
    assert [(f.check, f.actual) for f in more] == [("dcgm-gpu-utilization", "1")]


def test_an_output_cut_short_fails_parsing_naming_the_line():
    f, = judge(L4, text("derived-fault-kops-cut-short.prom"))
    assert (f.check, f.verdict) == ("dcgm-metrics-parse", "fail") and f.actual.startswith("line 41: not a sample")


def test_blank_sentinels_are_absent_values():
    """A utilization at DCGM's blank is no value (the exporter's README prints one): the profiling series is read,
    and without it the GPU has none."""
    blank = text("kops-l4-gpu-operator-idle.prom").replace(
        'DCGM_FI_DRIVER_VERSION="580.105.08"} 0\n# HELP DCGM_FI_DEV_MEM_COPY_UTIL',
        'DCGM_FI_DRIVER_VERSION="580.105.08"} 9223372036854775794\n# HELP DCGM_FI_DEV_MEM_COPY_UTIL')
    assert blank != text("kops-l4-gpu-operator-idle.prom")
    out = judge(NodeFacts(L4_HOST, 1), blank)
    util, = [f for f in out if f.check == "dcgm-gpu-utilization"]
    assert (util.verdict, util.actual) == ("pass", "DCGM_FI_PROF_GR_ENGINE_ACTIVE = 0")      # the blank is not read
    none = blank.replace("DCGM_FI_PROF_GR_ENGINE_ACTIVE{", "DCGM_FI_PROF_GR_ENGINE_ACTIVE_NOT_COLLECTED{")
    util, = [f for f in judge(NodeFacts(L4_HOST, 1), none) if f.check == "dcgm-gpu-utilization"]
    assert util.verdict == "fail" and "'DCGM_FI_DEV_GPU_UTIL'" not in util.actual


def test_prometheus_without_honor_labels_fails_with_exported_pod():
    """The exporter attributes GPU 0 to default/dcgmproftester2; stored without honorLabels, Prometheus' pod is the
    exporter's own and the workload is in exported_pod."""
    dcgm = monitoring.series()
    exporter = text("h100-pod-on-gpu0-issue490.prom")
    out = monitoring.judge_prometheus(H100_HOST, exporter, dcgm.parse(text("derived-fault-h100-exported-pod.prom")))
    f, = failed(out)
    assert f.message == (f"{H100_HOST}: GPU 0 ({H100_UUIDS[0]}): prometheus-pod-label: expected pod=default/"
                         "dcgmproftester2 (the pod the exporter attributes the GPU to), actual pod=gpu-operator/"
                         f"{EXPORTER_POD}, exported_container=dcgmproftester2, exported_namespace=default, "
                         "exported_pod=dcgmproftester2 (the scrape does not honor the exporter's labels: a "
                         "ServiceMonitor without honorLabels: true (kube-prometheus-stack's default for "
                         "dcgm-exporter))")
    assert [g.verdict for g in out if g.check == "prometheus-gpu-series"] == ["pass", "pass"]
    # the exporter's own series, as honorLabels keeps them: pass
    assert failed(monitoring.judge_prometheus(H100_HOST, exporter, dcgm.parse(exporter))) == []
    # a GPU that never reached Prometheus
    gone = monitoring.judge_prometheus(H100_HOST, exporter, dcgm.parse(text("derived-fault-h100-gpu1-missing.prom")))
    assert [(f.check, f.gpu) for f in failed(gone)] == [("prometheus-gpu-series", f"GPU 1 ({H100_UUIDS[1]})")]


# -------------------------------------------------------------------------------- the suite, run as pytest runs it

def daemonset(name: str = "nvidia-dcgm-exporter", namespace: str = "gpu-operator", labels: dict | None = None,
              image: str = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04", port: int = 9400):
    labels = {"app": name} if labels is None else labels
    return k8s.V1DaemonSet(
        metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels),
        spec=k8s.V1DaemonSetSpec(
            selector=k8s.V1LabelSelector(match_labels={"app": name}),
            template=k8s.V1PodTemplateSpec(spec=k8s.V1PodSpec(containers=[k8s.V1Container(
                name="exporter", image=image, ports=[k8s.V1ContainerPort(container_port=port, name="metrics")])]))),
        status=k8s.V1DaemonSetStatus(current_number_scheduled=1, desired_number_scheduled=1, number_misscheduled=0,
                                     number_ready=1))


def exporter_pod(node_name: str, ready: bool = True, name: str = EXPORTER_POD):
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, namespace="gpu-operator", labels={"app": "nvidia-dcgm-exporter"}),
        spec=k8s.V1PodSpec(node_name=node_name, containers=[k8s.V1Container(
            name="nvidia-dcgm-exporter", image="nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04")]),
        status=k8s.V1PodStatus(phase="Running",
                               conditions=[k8s.V1PodCondition(type="Ready", status=str(ready))]))


def cluster(daemonsets: list, pods: list, served: str | None = None, refused: ApiException | None = None):
    """The API the suite uses: DaemonSets, pods, and the pod proxy answering with a recorded file's text."""
    asked = []

    def proxy(name, namespace, path, **kw):
        asked.append((name, namespace, path))
        if refused is not None:
            raise refused
        assert kw.get("_preload_content") is False        # the raw body, as the API server sent it
        return SimpleNamespace(data=text(served).encode())

    return SimpleNamespace(
        apps=SimpleNamespace(list_daemon_set_for_all_namespaces=lambda: k8s.V1DaemonSetList(items=daemonsets)),
        core=SimpleNamespace(list_namespaced_pod=lambda ns, label_selector="": k8s.V1PodList(items=pods),
                             connect_get_namespaced_pod_proxy_with_path=proxy), asked=asked)


L4_NODE, = node(L4_HOST, {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.count": "1"},
                {"nvidia.com/gpu": "1"}).nodes
H100_NODE, = node(H100_HOST, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "2"},
                  {"nvidia.com/gpu": "2"}).nodes


def run_suite(tmp_path, gpu_node, api):
    module = suite("monitoring")
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, gpu_node, {gpu_node.name: gpu_node})
    request = SimpleNamespace(node=None, getfixturevalue={"fanout": INLINE}.get)
    # the node's tests in the suite's order, as pytest runs them, sharing the module's exporters (one read of the
    # node's /metrics); one Checker for all: a fault row lists the failures of each
    tests = module.TestAcceleratorPerformanceMetrics()
    kwargs = {"needs_real_gpus": None, "gpu_node": gpu_node, "target": SimpleNamespace(cluster=api),
              "exporters": mc.require_exporters(api), "request": request, "check": checker}
    for test in (tests.test_MetricsEndpointReachable, tests.test_PerAcceleratorUtilizationMetric,
                 tests.test_PerAcceleratorMemoryMetric, module.test_exporter_names_the_node_on_its_series):
        try:
            test(**kwargs)
        except pytest.skip.Exception:
            pass
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def _healthy(n):
    return [daemonset()], [exporter_pod(n.name)]


# id: (node, the exporter's DaemonSets and pods, the file the pod proxy serves or the error it answers,
#      [(check, node, expected, the actual's start)] that must fail)
FAULTS = {
    "exporter-not-ready": (L4_NODE, ([daemonset()], [exporter_pod(L4_HOST, ready=False)]),
                           "kops-l4-gpu-operator-idle.prom",
                           [("dcgm-exporter-ready", L4_HOST, "a Ready pod of gpu-operator/nvidia-dcgm-exporter "
                             "(desired 1, ready 1) on the node", f"gpu-operator/{EXPORTER_POD}: Running, not Ready")]),
    "no-exporter-pod-on-the-node": (L4_NODE, ([daemonset()], [exporter_pod("another-node")]),
                                    "kops-l4-gpu-operator-idle.prom",
                                    [("dcgm-exporter-ready", L4_HOST, "a Ready pod of gpu-operator/"
                                      "nvidia-dcgm-exporter (desired 1, ready 1) on the node", "none")]),
    "proxy-refused": (L4_NODE, _healthy(L4_NODE), ApiException(status=403, reason="Forbidden"),
                      [("dcgm-metrics-read", L4_HOST, f"gpu-operator/{EXPORTER_POD}'s /metrics through the API "
                        "server's pod proxy (port 9400)", "HTTP 403 Forbidden")]),
    "output-cut-short": (L4_NODE, _healthy(L4_NODE), "derived-fault-kops-cut-short.prom",
                         [("dcgm-metrics-parse", L4_HOST, "the Prometheus text format", "line 41: not a sample")]),
    "gpu-missing": (H100_NODE, _healthy(H100_NODE), "derived-fault-h100-gpu1-missing.prom",
                    [("dcgm-gpu-utilization", H100_HOST, "a utilization series", "no series for this GPU")]),
    "labels-empty": (L4_NODE, _healthy(L4_NODE), "derived-fault-kops-labels-empty.prom",
                     [("dcgm-gpu-utilization", L4_HOST, "a utilization series", "no series for this GPU; 23 series"),
                      ("dcgm-gpu-memory", L4_HOST, "a framebuffer series", "no series for this GPU; 23 series"),
                      ("dcgm-host-label", L4_HOST, f"hostname (or Hostname) = '{L4_HOST}' on every series",
                       "(missing or empty)")]),
    "host-is-the-pod-name": (L4_NODE, _healthy(L4_NODE), "derived-fault-kops-host-pod-name.prom",
                             [("dcgm-host-label", L4_HOST, f"hostname (or Hostname) = '{L4_HOST}' on every series",
                               f"'{EXPORTER_POD}'")]),
}


def failed_as_listed(checker, records: list[dict], expectations) -> list[dict]:
    """The run fails, and each (check, node, expected, the actual's start) of a fault table's row is a failed record
    whose message is among the lines the failure printed and starts with the node. The records found."""
    with pytest.raises(pytest.fail.Exception) as raised:
        checker.finish()
    lines = str(raised.value).splitlines()
    found = []
    for check, target, expected, actual in expectations:
        rec = next((r for r in records if r["check"] == check and r["verdict"] == "fail"
                    and r["actual"].startswith(actual)), None)
        assert rec is not None, records
        assert (rec["target"], rec["expected"]) == (target, expected), rec
        assert rec["message"] in lines and rec["message"].startswith(f"{target}: "), lines
        found.append(rec)
    return found


@pytest.mark.parametrize("case", list(FAULTS))
def test_monitoring_check_fails_on_its_fault(tmp_path, case):
    gpu_node, (daemonsets, pods), served, expectations = FAULTS[case]
    api = cluster(daemonsets, pods, served if isinstance(served, str) else None,
                  served if isinstance(served, ApiException) else None)
    checker, records = run_suite(tmp_path, gpu_node, api)
    for rec in failed_as_listed(checker, records, expectations):
        if rec["check"] in ("dcgm-gpu-utilization", "dcgm-gpu-memory"):
            assert "GPU " in rec["message"] and "(" in rec["message"], rec       # index and UUID (or that it has none)


def test_the_suite_passes_a_healthy_exporter_and_records_its_version(tmp_path):
    api = cluster(*_healthy(L4_NODE), "derived-4.9.0-dcgm47-names-busy.prom")
    checker, records = run_suite(tmp_path, L4_NODE, api)
    checker.finish()
    assert api.asked == [(f"{EXPORTER_POD}:9400", "gpu-operator", "metrics")]
    assert {r["check"] for r in records if r["verdict"] == "pass"} == {
        "dcgm-exporter-ready", "dcgm-metrics-read", "dcgm-exporter-version", *monitoring.CHECKS}
    version, = [r for r in records if r["check"] == "dcgm-exporter-version"]
    assert version["actual"] == ("image nvcr.io/nvidia/k8s/dcgm-exporter:3.3.9-3.6.1-ubuntu22.04; names dcgm-4.7; "
                                 "host label hostname; 4.9.0 or later (DCGM 4.7 names); 4.6.0-4.8.3 or later (label "
                                 "hostname); driver 580.105.08")


def test_exporters_are_found_by_name_label_image_or_port_and_none_skips_the_suite():
    other = daemonset("node-exporter", "monitoring", labels={}, image="quay.io/prometheus/node-exporter:v1.8",
                      port=9100)
    found = [daemonset(), daemonset("dcgm-exporter", "monitoring", labels={}),
             daemonset("prod-dcgm-exporter", "monitoring", labels={}),
             daemonset("gpu-metrics", "monitoring", labels={}, image="registry.local/metrics:1", port=9400),
             daemonset("gpu-metrics-2", "monitoring", labels={"app.kubernetes.io/name": "dcgm-exporter"},
                       image="registry.local/metrics:1", port=8080)]
    assert [dcgm.is_exporter(d) for d in [*found, other]] == [True] * 5 + [False]
    with pytest.raises(pytest.skip.Exception, match="no DCGM exporter in the cluster: no DaemonSet named "
                                                    "nvidia-dcgm-exporter or dcgm-exporter"):
        mc.require_exporters(cluster([other], []))


def test_the_facts_of_a_node_count_gpus_not_mig_devices():
    assert monitoring.facts_of(L4_NODE) == NodeFacts(L4_HOST, 1, (), False, None)
    mig, = node("h100-mig-0", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8",
                               "nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.count": "24"},
                {"nvidia.com/mig-1g.10gb": "24"}).nodes
    assert monitoring.facts_of(mig) == NodeFacts("h100-mig-0", 8, (), True, 24)
    single, = node("a100-single-0", {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                                     "nvidia.com/gpu.count": "14", "nvidia.com/mig.strategy": "single"},
                   {"nvidia.com/gpu": "14"}).nodes
    assert monitoring.facts_of(single) == NodeFacts("a100-single-0", None, (), True, 14)


def test_the_coverage_count_knows_every_monitoring_check():
    import test_check_coverage

    checks = test_check_coverage.recordable_checks()
    assert {c for c, f in checks.items() if f == "test_monitoring.py"} == {
        "dcgm-exporter-ready", "dcgm-metrics-read", *monitoring.CHECKS, *monitoring.PROMETHEUS_CHECKS,
        *monitoring.SERVICE_CHECKS,     # ai-service-metrics fails in tests/test_monitoring_service_prometheus.py
        *monitoring.WORK_CHECKS}
    # each fails in a row of FAULTS (tests/test_check_coverage.py counts them, with every other table; the
    # Prometheus checks in tests/test_monitoring_prometheus.py's, against real Prometheus)
    assert {c for row in FAULTS.values() for c, *_ in row[-1]} == {
        "dcgm-exporter-ready", "dcgm-metrics-read", *monitoring.CHECKS}


# ----------------------------------------------------------------- the numbers move with the work (dcgm-*-work checks)

WORK_POD = "bench-dcgm-work-computeinstance-e00c1p6dpy98xytphp"       # what the suite names its pod on the H100 node
IDLE_H100 = "derived-h100-idle-before-work.prom"


def run_work_check(tmp_path, monkeypatch, gpu_node, namespace: str, pod: str, before: str, during: str):
    """The suite's work check as pytest runs it: the pod proxy answers ``before``, then ``during`` for every read
    after the work pod started. The pod itself is stood in for (its creation and wait are the benchmarks' own,
    tested with them); the fan-out runs the work inline with a lane whose stop is never set."""
    import threading
    from contextlib import contextmanager, nullcontext

    from gpuproof.plugin import bench_checks, checks

    module = suite("monitoring")
    served = iter([before])
    api = cluster([daemonset()], [exporter_pod(gpu_node.name)])
    api.core.connect_get_namespaced_pod_proxy_with_path = \
        lambda *a, **kw: SimpleNamespace(data=text(next(served, during)).encode())

    @contextmanager
    def holding(run, node, resource, lane):
        yield pod

    monkeypatch.setattr(mc, "holding_gpu", holding)
    monkeypatch.setattr(mc, "WORK_POLL_S", 0.01)
    monkeypatch.setattr(mc, "WORK_HOLD_S", 0.2)
    monkeypatch.setattr(checks, "free_on", lambda *a: 1)
    monkeypatch.setattr(bench_checks, "node_gpus", lambda discovery, name, all_gpus=False: ("nvidia.com/gpu", 1))
    lane = SimpleNamespace(pods=lambda k=1: nullcontext(), stop=threading.Event(),
                           job=SimpleNamespace(watch=lambda: SimpleNamespace(cache={})))
    fan = SimpleNamespace(result=lambda item, node, work, **kw: work(node, lane))
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, gpu_node, {gpu_node.name: gpu_node})
    request = SimpleNamespace(node=None, getfixturevalue={"fanout": fan}.get)
    module.test_exporter_follows_the_work(needs_real_gpus=None, gpu_node=gpu_node, target=SimpleNamespace(cluster=api),
                                          run=SimpleNamespace(namespace=namespace), discovery=None,
                                          exporters=mc.require_exporters(api), request=request, check=checker)
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def test_the_work_check_passes_when_the_pods_gpu_is_busy_and_labelled(tmp_path, monkeypatch):
    checker, records = run_work_check(tmp_path, monkeypatch, H100_NODE, "gpuproof-work", WORK_POD, IDLE_H100,
                                      "derived-h100-busy-gpuproof-pod.prom")
    checker.finish()
    assert [(r["check"], r["verdict"], r["actual"]) for r in records] == [
        ("dcgm-metrics-read", "pass", ""),
        ("dcgm-pod-attribution", "pass", f"GPU 0 ({H100_UUIDS[0]}) pod=gpuproof-work/{WORK_POD}"),
        ("dcgm-utilization-moves", "pass", "97 %")]


# id: (node, the run's namespace, the work pod's name, the output before, the output while it runs,
#      [(check, node, expected, the actual's start)] that must fail)
WORK_FAULTS = {
    # verbatim: dcgm-exporter #490's output, GPU 0 attributed to the pod and reading 0 %
    "utilization-stays-idle": (H100_NODE, "default", "dcgmproftester2", IDLE_H100, "h100-pod-on-gpu0-issue490.prom",
                               [("dcgm-utilization-moves", H100_HOST, "utilization above its idle reading 0 % while "
                                 "the pod runs", "0 %")]),
    # the same output judged for gpuproof's pod: the GPU is another pod's, ours is on none
    "the-gpu-is-another-pods": (H100_NODE, "gpuproof-work", WORK_POD, IDLE_H100, "h100-pod-on-gpu0-issue490.prom",
                                [("dcgm-pod-attribution", H100_HOST, f"exactly one GPU's series labelled "
                                  f"pod=gpuproof-work/{WORK_POD} (the pod holds one GPU)",
                                  f"0 GPUs: GPU 0 ({H100_UUIDS[0]}) pod=default/dcgmproftester2, GPU 1 "
                                  f"({H100_UUIDS[1]}) no pod")]),
    # a busy GPU with no pod labels at all (4.9.0's names; the exporter without the pod-resources socket)
    "no-pod-labels": (L4_NODE, "gpuproof-work", "bench-dcgm-work-i-030791dc5a37cd257", "kops-l4-gpu-operator-idle.prom",
                      "derived-4.9.0-dcgm47-names-busy.prom",
                      [("dcgm-pod-attribution", L4_HOST, "exactly one GPU's series labelled pod=gpuproof-work/"
                        "bench-dcgm-work-i-030791dc5a37cd257 (the pod holds one GPU)", f"0 GPUs: GPU 0 ({L4_UUID}) "
                        "no pod")]),
}


@pytest.mark.parametrize("case", list(WORK_FAULTS))
def test_work_check_fails_on_its_fault(tmp_path, monkeypatch, case):
    gpu_node, namespace, pod, before, during, expectations = WORK_FAULTS[case]
    checker, records = run_work_check(tmp_path, monkeypatch, gpu_node, namespace, pod, before, during)
    failed_as_listed(checker, records, expectations)


def test_no_pod_labels_at_all_says_why():
    found = monitoring.judge_work(L4_HOST, text("kops-l4-gpu-operator-idle.prom"),
                                  text("derived-4.9.0-dcgm47-names-busy.prom"), "ns", "p")
    assert found[0].verdict == "fail" and "pod-resources" in found[0].reason



# ------------------------------------------------------------------------------ finding the cluster's Prometheus

def svc(name: str, namespace: str = "monitoring", labels: dict | None = None, ports=(("http-web", 9090),)):
    return k8s.V1Service(metadata=k8s.V1ObjectMeta(name=name, namespace=namespace, labels=labels or {}),
                         spec=k8s.V1ServiceSpec(ports=[k8s.V1ServicePort(name=n, port=p) for n, p in ports]))


def services_cluster(*services):
    return SimpleNamespace(core=SimpleNamespace(
        list_service_for_all_namespaces=lambda **kw: k8s.V1ServiceList(items=list(services))))


def test_the_clusters_prometheus_is_found_the_surest_first():
    from gpuproof.cluster import prometheus as prom

    kps = svc("kps-kube-prometheus-prometheus", labels={"app": "kube-prometheus-stack-prometheus", "release": "kps"})
    operated = svc("prometheus-operated", labels={"operated-prometheus": "true"}, ports=(("web", 9090),))
    others = [svc("kps-kube-prometheus-alertmanager", labels={"app.kubernetes.io/name": "prometheus"},
                  ports=(("http-web", 9093),)),
              svc("kps-prometheus-node-exporter", labels={"app.kubernetes.io/name": "prometheus-node-exporter"}),
              svc("kps-kube-prometheus-operator", labels={"app": "kube-prometheus-stack-operator"}),
              svc("kubernetes", "default", ports=(("https", 443),))]
    assert prom.find(services_cluster(*others, operated, kps)) == prom.Service(
        "monitoring", "kps-kube-prometheus-prometheus", 9090, "kube-prometheus-stack's Prometheus")
    assert prom.find(services_cluster(*others, operated)) == prom.Service(
        "monitoring", "prometheus-operated", 9090, "the Prometheus operator's governing Service")
    server = svc("prometheus-server", "prom", ports=(("http", 80),))
    assert prom.find(services_cluster(server)).port == 80
    assert prom.find(services_cluster(svc("prometheus-k8s", ports=(("web", 9090), ("reloader-web", 8080))))).why \
        == "kube-prometheus' Prometheus"
    assert prom.find(services_cluster(*others)) is None


def test_a_cluster_that_refuses_the_service_list_has_no_prometheus_found():
    from gpuproof.cluster import prometheus as prom

    def refuse(**kw):
        raise ApiException(status=403, reason="Forbidden")
    assert prom.find(SimpleNamespace(core=SimpleNamespace(list_service_for_all_namespaces=refuse))) is None

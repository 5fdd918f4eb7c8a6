"""ai_service_metrics against real Prometheus (Debian's ``prometheus`` 2.42, installed by ./setup.sh): it scrapes
gpuproof's inference server (``workloads/inference_server.py`` on the CPU, the tiny ``cpu`` preset) every second,
and after N completion requests its ``gpuproof_inference_requests_total`` reads N there
(:func:`monitoring.judge_service_metrics` passes).

The scrape jobs give their targets the labels a PodMonitor's relabelling gives a pod (``namespace``, ``pod``,
``container``). Faults, each judged on what Prometheus itself says:

- ``json-only``: a server that speaks only JSON at ``/metrics`` (the server's own JSON reading, served as a file by
  ``python -m http.server``: what gpuproof's server answered before it spoke the Prometheus format): Prometheus'
  target is down with its parse error, and the judge fails saying so;
- ``wrong-path``: the real server scraped at a path it does not serve: the target is down with its 404;
- ``no-monitor``: a pod no job scrapes: no target, said so.

The suite's check (suites/test_monitoring.py,
``TestAIServiceMetrics::test_inference_server_metrics_reach_prometheus``) runs against a fresh server of its own and
this Prometheus, its cluster side (the pod on a GPU node, the PodMonitor, the requests through the API server's pod
proxy) replaced by the local server: it passes when a job scrapes the pod, and fails
(``ai-service-metrics``, by node, pod, expected and actual) when the pod's target is down, when no monitor selects
the pod, and when the server refuses the requests; it skips without a PodMonitor CRD or a Prometheus.

Also Prometheus' own linter (``promtool check metrics``) on the server's text. Needs ``prometheus`` and
``promtool`` on PATH; without them these tests skip, except under ``GPUPROOF_REQUIRE_TOOLS=1`` or ``CI``.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from types import SimpleNamespace

import pytest

from gpuproof.discovery import monitoring
from gpuproof.cluster import prometheus as prom
from gpuproof.plugin import monitoring_checks as mc
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir
from test_monitoring_prometheus import REQUIRED, free_port, get_json, prometheus_binary, start_prometheus, stop, until
from test_real_gpu_checks import suite
from test_monitoring_service import PROMETHEUS_ACCEPT
from test_workloads_inference import http_json, start_server, stop_server

pytestmark = pytest.mark.server

N = 5
NAMESPACE = "gpuproof-run-1"
NODE = "gpu-node-1"                      # the node a PodMonitor's pod would run on: only named in the findings
PODS = {"inference": "gpuproof-inference-ab12c", "json-only": "json-only-server-0",
        "wrong-path": "gpuproof-inference-wrong-path"}


def target_labels(job: str) -> dict:
    return {"namespace": NAMESPACE, "pod": PODS[job], "container": "server"}


def active_targets(url: str) -> list[dict]:
    return get_json(f"{url}/api/v1/targets?state=active")["data"]["activeTargets"]


def instant(url: str, promql: str) -> list[dict]:
    got = get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert got["status"] == "success", got
    return got["data"]["result"]


@pytest.fixture(scope="module")
def scraped(tmp_path_factory):
    """The inference server, a JSON-only stand-in, and Prometheus scraping both every second (jobs ``inference``,
    ``json-only``, ``wrong-path``) once each target has been scraped at least once."""
    binary = prometheus_binary()
    tmp = tmp_path_factory.mktemp("service-metrics")
    server, proc = start_server(tmp, "--model", "cpu")
    procs: list = []
    try:
        json_dir = tmp / "json-only"
        json_dir.mkdir()
        (json_dir / "metrics").write_text(json.dumps(http_json(server + "/metrics")[1]))
        files = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                                  "--directory", str(json_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True)
        procs.append(files)
        line = files.stdout.readline()          # "Serving HTTP on 127.0.0.1 port N (...)": printed once it listens
        m = re.search(r"port (\d+)", line)
        assert m, f"http.server did not say its port: {line!r}"
        host = server.removeprefix("http://")
        job = {"scrape_interval": "1s", "scrape_timeout": "1s", "metrics_path": "/metrics"}
        jobs = [{"job_name": "inference", **job, "static_configs": [{"targets": [host],
                                                                      "labels": target_labels("inference")}]},
                {"job_name": "json-only", **job, "static_configs": [{"targets": [f"127.0.0.1:{m.group(1)}"],
                                                                      "labels": target_labels("json-only")}]},
                {"job_name": "wrong-path", **job, "metrics_path": "/v1/metrics",
                 "static_configs": [{"targets": [host], "labels": target_labels("wrong-path")}]}]
        prom, url = start_prometheus(binary, tmp, jobs)
        procs.append(prom)

        def every_target_scraped():
            assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            health = {t["labels"]["job"]: t["health"] for t in active_targets(url)}
            return set(health) == set(PODS) and "unknown" not in health.values() and health
        until("Prometheus to have scraped each of its targets once (health up or down, not unknown)",
              every_target_scraped)
        yield SimpleNamespace(prometheus=url, server=server)
    finally:
        for p in reversed(procs):
            stop(p)
        stop_server(proc)


def judge(url: str, job: str, expected: int) -> monitoring.Finding:
    pod = f"{NAMESPACE}/{PODS[job]}"
    result = instant(url, monitoring.service_query(PODS[job], NAMESPACE))
    f, = monitoring.judge_service_metrics(NODE, pod, expected, result, monitoring.pod_targets(active_targets(url),
                                                                                                pod))
    return f


def test_after_n_requests_prometheus_reads_n(scraped):
    url = scraped.prometheus
    assert judge(url, "inference", 0).verdict == "pass"      # scraped before any request: the counter at 0
    for i in range(N):
        code, body = http_json(scraped.server + "/v1/completions", {"prompt": f"hello there {i}", "max_tokens": 4})
        assert code == 200 and body["usage"]["completion_tokens"] == 4, body
    answered = time.time()
    promql = f"timestamp({monitoring.service_query(PODS['inference'], NAMESPACE)})"
    until(f"a scrape of the server by Prometheus that began after the {N}th answer ({promql} > {answered:.3f})",
          lambda: any(float(r["value"][1]) > answered for r in instant(url, promql)))
    f = judge(url, "inference", N)
    assert (f.check, f.verdict, f.node, f.actual) == ("ai-service-metrics", "pass", NODE, f"{N} (job inference)"), f
    # the other series reached it too, with the pod's labels
    tokens, = instant(url, f'gpuproof_inference_generation_tokens_total{{pod="{PODS["inference"]}"}}')
    assert float(tokens["value"][1]) == 4 * N
    assert tokens["metric"]["model_name"] == "gpuproof-llm" and tokens["metric"]["namespace"] == NAMESPACE
    f = judge(url, "inference", N + 1)                       # one more than sent: the judge says so
    assert f.verdict == "fail" and "has not scraped the pod since the requests" in f.reason


@pytest.mark.parametrize("job, words", [
    ("json-only", ["target http://127.0.0.1:", "/metrics is down: ", "not the Prometheus text format"]),
    ("wrong-path", ["/v1/metrics is down: ", "404"]),
])
def test_a_server_prometheus_cannot_scrape_fails_with_prometheus_reason(scraped, job, words):
    f = judge(scraped.prometheus, job, N)
    assert (f.check, f.verdict, f.node, f.actual) == ("ai-service-metrics", "fail", NODE, "no series of the pod"), f
    assert all(w in f.reason for w in words), f.reason
    assert f.message.startswith(f"{NODE}: ai-service-metrics: expected gpuproof_inference_requests_total of pod "
                                f"{NAMESPACE}/{PODS[job]} = {N} (the requests sent), actual no series of the pod (")


def test_a_pod_no_monitor_selects_fails_saying_so(scraped):
    pod = f"{NAMESPACE}/unmonitored-0"
    result = instant(scraped.prometheus, monitoring.service_query("unmonitored-0", NAMESPACE))
    f, = monitoring.judge_service_metrics(NODE, pod, N, result,
                                          monitoring.pod_targets(active_targets(scraped.prometheus), pod))
    assert f.verdict == "fail" and "no PodMonitor or ServiceMonitor selects it" in f.reason


def test_promtool_finds_nothing_to_say_of_the_servers_text(scraped):
    promtool = shutil.which("promtool")
    if promtool is None:
        if REQUIRED:
            pytest.fail("promtool is needed here: ./setup.sh installs Debian's prometheus package", pytrace=False)
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    req = urllib.request.Request(scraped.server + "/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read()
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
    assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), (lint.stdout, lint.stderr)


# ------------------------------------------------------------------------ the suite's check, against this Prometheus

GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
# the run namespace the suite's pod is in -> the scrape path of its job (None: no job scrapes it)
SUITE_NAMESPACES = {"run-ok": "/metrics", "run-wrong-path": "/v1/metrics", "run-unmonitored": None}


@pytest.fixture(scope="module")
def suite_scraped(tmp_path_factory):
    """A fresh server (the ``tiny`` preset) that Prometheus scrapes as pod ``ai-service-metrics`` of the run
    namespaces in :data:`SUITE_NAMESPACES` that have a path."""
    binary = prometheus_binary()
    tmp = tmp_path_factory.mktemp("service-suite")
    server, proc = start_server(tmp, "--model", "tiny")
    procs: list = []
    try:
        host = server.removeprefix("http://")
        jobs = [{"job_name": ns, "scrape_interval": "1s", "scrape_timeout": "1s", "metrics_path": path,
                 "static_configs": [{"targets": [host], "labels": {"namespace": ns, "pod": mc.SERVICE_POD,
                                                                   "container": "server"}}]}
                for ns, path in SUITE_NAMESPACES.items() if path]
        prom, url = start_prometheus(binary, tmp, jobs)
        procs.append(prom)

        def every_target_scraped():
            assert prom.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            health = {t["labels"]["job"]: t["health"] for t in active_targets(url)}
            return len(health) == len(jobs) and "unknown" not in health.values() and health
        until("Prometheus to have scraped the suite's server in each job once", every_target_scraped)
        yield SimpleNamespace(prometheus=url, server=server)
    finally:
        for p in reversed(procs):
            stop(p)
        stop_server(proc)


def sender(url: str):
    """The suite's send_completions, to a local URL instead of through the API server's pod proxy."""
    def send(cluster, served, n):
        errors = []
        for i in range(n):
            try:
                code, _ = http_json(url + "/v1/completions", {"prompt": f"request {i + 1}", "max_tokens": 4})
            except OSError as exc:
                errors.append(f"request {i + 1}: {type(exc).__name__}: {exc}")
                continue
            if code != 200:
                errors.append(f"request {i + 1}: HTTP {code}")
        return errors
    return send


# a cluster whose Services include no Prometheus (the suite looks when --prometheus is not given)
NO_SERVICES = SimpleNamespace(core=SimpleNamespace(list_service_for_all_namespaces=lambda **kw: SimpleNamespace(
    items=[])))


def run_service_check(tmp_path, monkeypatch, prometheus: str | None, namespace: str, send_to: str,
                      crd: bool = True):
    """The suite's check, its cluster side replaced: the pod is ``<namespace>/ai-service-metrics`` on NODE, its
    requests go to ``send_to``. Its records, the PodMonitors it created, and the checker."""
    module = suite("monitoring")
    created = []

    @contextlib.contextmanager
    def serving(run, node, product):
        yield mc.Served(run.namespace, mc.SERVICE_POD, node, 8000, {"gpuproof.dev/workload": "x"})

    monkeypatch.setattr(prom, "podmonitors_served", lambda cluster: crd)
    monkeypatch.setattr(prom, "monitor_labels",
                        lambda cluster: ({"release": "kps"}, "the podMonitorSelector of Prometheus monitoring/kps"))
    monkeypatch.setattr(mc, "create_pod_monitor", lambda cluster, served, labels: created.append((served.pod,
                                                                                                  labels)))
    monkeypatch.setattr(mc, "serving", serving)
    monkeypatch.setattr(mc, "send_completions", sender(send_to))
    monkeypatch.setattr(mc, "SERVICE_DISCOVERY_S", 3.0)        # Prometheus here scrapes every second
    options = {"prometheus": prometheus}
    request = SimpleNamespace(config=SimpleNamespace(getoption=lambda name, default=None: options.get(name, default)))
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE)
    module.TestAIServiceMetrics().test_inference_server_metrics_reach_prometheus(
        needs_real_gpus=None, target=SimpleNamespace(cluster=NO_SERVICES),
        run=SimpleNamespace(namespace=namespace, labels={"gpuproof.dev/run": "r1"}),
        gpu_products={GPU_PRODUCT: [NODE]}, prometheus_server=lambda: mc.prometheus_of(request, NO_SERVICES),
        request=request, check=checker)
    path = run_dir.path / "checks.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return checker, records, created


def test_the_suites_service_check_passes_when_prometheus_scrapes_the_pod(suite_scraped, tmp_path, monkeypatch):
    checker, records, created = run_service_check(tmp_path, monkeypatch, suite_scraped.prometheus, "run-ok",
                                                  suite_scraped.server)
    checker.finish()
    assert created == [("run-ok/ai-service-metrics", {"release": "kps", "gpuproof.dev/run": "r1"})]
    sent, rec = [r for r in records if r["check"] == "ai-service-metrics"]
    assert (sent["verdict"], sent["actual"]) == ("pass", ""), sent          # the requests, then Prometheus' count
    assert (rec["verdict"], rec["target"]) == ("pass", NODE), rec
    assert rec["expected"].startswith("gpuproof_inference_requests_total of pod run-ok/ai-service-metrics = ")
    assert rec["actual"] == f"{rec['expected'].split(' = ')[1].split()[0]} (job run-ok)"


def test_the_suites_service_check_skips_without_a_podmonitor_crd_or_a_prometheus(tmp_path, monkeypatch):
    with pytest.raises(pytest.skip.Exception, match=r"serves no PodMonitor \(monitoring.coreos.com/v1"):
        run_service_check(tmp_path, monkeypatch, "http://127.0.0.1:9", "run-ok", "http://127.0.0.1:9", crd=False)
    with pytest.raises(pytest.skip.Exception, match=r"no Prometheus named \(--prometheus URL\) and none found in the "
                                                    "cluster"):
        run_service_check(tmp_path, monkeypatch, None, "run-ok", "http://127.0.0.1:9")


def expect(namespace: str) -> str:
    return f"gpuproof_inference_requests_total of pod {namespace}/ai-service-metrics = {N} (the requests sent)"


# id: (the run namespace, where its requests go: the suite's server or a port nothing listens on,
#      [(check, node, expected, the actual's start, words of the message)] that must fail)
SUITE_FAULTS = {
    "target-down": ("run-wrong-path", "server",
                    [("ai-service-metrics", NODE, expect("run-wrong-path"), "no series of the pod",
                      "/v1/metrics is down: server returned HTTP status 404")]),
    "no-monitor-selects-the-pod": ("run-unmonitored", "server",
                                   [("ai-service-metrics", NODE, expect("run-unmonitored"), "no series of the pod",
                                     "no PodMonitor or ServiceMonitor selects it")]),
    "server-refuses-requests": ("run-ok", "closed",
                                [("ai-service-metrics", NODE, f"{N} completions from run-ok/ai-service-metrics "
                                  "through the API server's pod proxy", "request 1: URLError: ",
                                  "gpuproof's inference server")]),
}


@pytest.mark.parametrize("case", list(SUITE_FAULTS))
def test_the_suites_service_check_fails_on_its_fault(suite_scraped, tmp_path, monkeypatch, case):
    namespace, where, expectations = SUITE_FAULTS[case]
    send_to = suite_scraped.server if where == "server" else f"http://127.0.0.1:{free_port()}"
    checker, records, _ = run_service_check(tmp_path, monkeypatch, suite_scraped.prometheus, namespace, send_to)
    with pytest.raises(pytest.fail.Exception) as raised:
        checker.finish()
    for check, target, expected, actual, words in expectations:
        rec = next((r for r in records if r["check"] == check and r["verdict"] == "fail"), None)
        assert rec is not None, records
        assert (rec["target"], rec["expected"]) == (target, expected), rec
        assert rec["actual"].startswith(actual) and words in rec["message"], rec
        assert rec["message"] in str(raised.value).splitlines() and rec["message"].startswith(f"{target}: ")

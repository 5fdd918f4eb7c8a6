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

Also Prometheus' own linter (``promtool check metrics``) on the server's text. Needs ``prometheus`` and
``promtool`` on PATH; without them these tests skip, except under ``GPUPROOF_REQUIRE_TOOLS=1`` or ``CI``.
"""

from __future__ import annotations

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
from test_monitoring_prometheus import REQUIRED, get_json, prometheus_binary, start_prometheus, stop, until
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

"""ai_service_metrics, the pure parts (issue #39): gpuproof's inference server speaks the Prometheus text format at
``GET /metrics`` to a scraper and JSON to gpuproof's own readers, and :func:`monitoring.judge_service_metrics` judges
what Prometheus stored of it.

- the Accept header decides (:func:`inference_server.wants_prometheus`): Prometheus 2.42's header and plain
  ``text/plain`` get the text; no header, ``*/*``, ``application/json`` (what loadgen asks for) get JSON;
- the text (:func:`inference_server.prometheus_text`) parses strictly (``workloads/dcgm_series.py``'s parser), every
  family has ``# HELP`` and ``# TYPE`` before its one sample, counters end in ``_total``, label values are escaped;
- the server itself, on a thread of this process (the model not loaded: /metrics answers before /health does),
  answers each Accept with its format (loadgen, which cannot be imported here, asks for ``application/json``; its
  capacity search reads the JSON off the real server in tests/test_workloads_inference.py);
- the judge: the counter at N passes; below N, above N, no series with the target down (its scrape error said) or
  no target at all fail, naming the node, the pod, the expected and the actual.

Against real Prometheus: tests/test_monitoring_service_prometheus.py.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request

import pytest

from gpuproof.bench.workloads import import_workload
from gpuproof.discovery import monitoring

server_mod = import_workload("inference_server")
dcgm = import_workload("dcgm_series")

PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")      # Prometheus 2.42's scrape request
READING = {"server": "gpuproof", "wall_s": 12.5, "process_cpu_s": 3.25, "cpu_budget_cores": 1.0, "requests": 7,
           "ok": 5, "errors": 1, "rejected": 1, "prompt_tokens": 40, "completion_tokens": 80, "handler_cpu_s": 0.1,
           "queue_s": 0.25, "model_s": 1.5, "server_s": 2.0, "waiting": 2, "running": 3, "max_batch": 16,
           "engine": {"busy_s": 4.0, "forward_s": 3.0}, "gpu": {"available": False, "util_pct_sum": 0.0, "n": 0},
           "ready": True}


@pytest.mark.parametrize("accept, text", [
    (PROMETHEUS_ACCEPT, True),
    ("text/plain;version=0.0.4", True),
    ("text/plain", True),
    ("application/openmetrics-text; version=1.0.0", True),
    (None, False),
    ("", False),
    ("*/*", False),
    ("application/json", False),
    ("application/json, text/plain;q=0.5", False),
    ("text/plain;q=0.5, application/json;q=0.9", False),
    ("application/json;q=0.2, text/plain", True),
    ("text/plain;q=0, */*", False),
    ("text/html", False),
])
def test_the_accept_header_chooses_the_format(accept, text):
    assert server_mod.wants_prometheus(accept) is text


def families(text: str) -> dict[str, dict]:
    """name -> {"help", "type", "samples"} of a text exposition, every HELP/TYPE line before its samples."""
    out: dict[str, dict] = {}
    current = None
    for line in text.splitlines():
        if m := re.match(r"^# (HELP|TYPE) ([a-zA-Z_:][a-zA-Z0-9_:]*) (.+)$", line):
            kind, name, rest = m.groups()
            fam = out.setdefault(name, {"samples": []})
            assert kind.lower() not in fam, f"{kind} twice for {name}"
            assert not fam["samples"], f"{kind} of {name} after its samples"
            fam[kind.lower()] = rest
            current = name
        elif line and not line.startswith("#"):
            name = re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*", line).group(0)
            assert name == current, f"sample {name} outside its family ({current})"
            out[name]["samples"].append(line)
    return out


def test_the_text_is_the_prometheus_format_with_help_and_type():
    text = server_mod.prometheus_text(READING, "gpuproof-llm")
    assert text.endswith("\n") and "\n\n" not in text
    samples = {s.name: s for s in dcgm.parse(text)}           # strict: a malformed line raises
    fams = families(text)
    assert set(fams) == set(samples) == set(server_mod.PROM_SERIES) | {"gpuproof_inference_info"}
    for name, fam in fams.items():
        assert fam["help"] and fam["type"] in ("counter", "gauge") and len(fam["samples"]) == 1, name
        assert name.endswith("_total") == (fam["type"] == "counter"), name
    values = {name: s.value for name, s in samples.items()}
    assert values["gpuproof_inference_requests_total"] == 7
    assert values["gpuproof_inference_request_success_total"] == 5
    assert values["gpuproof_inference_generation_tokens_total"] == 80
    assert values["gpuproof_inference_prompt_tokens_total"] == 40
    assert values["gpuproof_inference_requests_running"] == 3
    assert values["gpuproof_inference_requests_waiting"] == 2
    assert values["gpuproof_inference_batch_slots"] == 16
    assert values["gpuproof_inference_engine_busy_seconds_total"] == 4.0
    assert values["gpuproof_inference_ready"] == 1
    assert values["process_cpu_seconds_total"] == 3.25
    assert samples["gpuproof_inference_requests_total"].labels == {"model_name": "gpuproof-llm"}
    assert samples["process_cpu_seconds_total"].labels == {}
    assert samples["gpuproof_inference_info"].labels == {"model_name": "gpuproof-llm", "server": "gpuproof",
                                                         "max_batch": "16"}


def test_label_values_are_escaped_and_an_unloaded_engine_leaves_its_series_out():
    odd = 'a "quoted"\\name\nwith a newline'
    text = server_mod.prometheus_text({**READING, "max_batch": None, "engine": {}, "ready": False}, odd)
    samples = {s.name: s for s in dcgm.parse(text)}
    assert samples["gpuproof_inference_requests_total"].labels["model_name"] == odd
    assert "gpuproof_inference_batch_slots" not in samples
    assert "gpuproof_inference_engine_busy_seconds_total" not in samples
    assert samples["gpuproof_inference_ready"].value == 0
    assert samples["gpuproof_inference_info"].labels["max_batch"] == ""


@pytest.fixture
def loading_server():
    """The inference server's HTTP side on a thread, the model not loaded (as between its bind and /health 200)."""
    srv = server_mod.Server(("127.0.0.1", 0), request_timeout=5.0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def get(url: str, accept: str | None) -> tuple[str, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept is not None else {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.headers["Content-Type"], r.read()


def test_the_server_answers_prometheus_text_to_a_scraper_and_json_to_gpuproof(loading_server):
    kind, body = get(loading_server + "/metrics", PROMETHEUS_ACCEPT)
    assert kind == "text/plain; version=0.0.4; charset=utf-8"
    samples = {s.name: s.value for s in dcgm.parse(body.decode())}
    assert samples["gpuproof_inference_requests_total"] == 0 and samples["gpuproof_inference_ready"] == 0
    for accept in (None, "*/*", "application/json"):
        kind, body = get(loading_server + "/metrics", accept)
        assert kind == "application/json" and json.loads(body)["requests"] == 0, accept
    kind, body = get(loading_server + "/metrics", "application/json")    # what loadgen's probe_metrics asks
    assert json.loads(body)["ready"] is False and "process_cpu_s" in json.loads(body)


# ---------------------------------------------------------------------------- the judge

NODE = "gpu-node-1"
POD = "gpuproof-run-1/gpuproof-inference-ab12c"


def row(value, pod="gpuproof-inference-ab12c", namespace="gpuproof-run-1", job="gpuproof-run-1/gpuproof-inference"):
    return {"metric": {"__name__": monitoring.SERVICE_COUNTER, "pod": pod, "namespace": namespace, "job": job,
                       "model_name": "gpuproof-llm"}, "value": [1700000000.0, str(value)]}


def test_the_counter_at_n_passes():
    f, = monitoring.judge_service_metrics(NODE, POD, 5, [row(5)])
    assert (f.check, f.verdict, f.node) == ("ai-service-metrics", "pass", NODE)
    assert f.expected == "gpuproof_inference_requests_total of pod gpuproof-run-1/gpuproof-inference-ab12c = 5 " \
                         "(the requests sent)"
    assert f.actual == "5 (job gpuproof-run-1/gpuproof-inference)"
    assert monitoring.service_query("gpuproof-inference-ab12c", "gpuproof-run-1") == \
        'gpuproof_inference_requests_total{namespace="gpuproof-run-1",pod="gpuproof-inference-ab12c"}'


UP = {"scrapeUrl": "http://10.0.0.7:8000/metrics", "health": "up", "lastError": ""}
DOWN = {"scrapeUrl": "http://10.0.0.7:8000/metrics", "health": "down",
        "lastError": '"INVALID" is not a valid start token'}      # Prometheus 2.42 on a JSON answer
# case: (result, targets, the actual, words of the reason)
FAULTS = {
    "below-n": ([row(3)], [UP], "3 (job gpuproof-run-1/gpuproof-inference)", "has not scraped the pod since"),
    "above-n": ([row(9)], [UP], "9 (job gpuproof-run-1/gpuproof-inference)", "another client"),
    "two-jobs-one-behind": ([row(5), row(4, job="kubernetes-pods")], [UP, UP],
                            "5 (job gpuproof-run-1/gpuproof-inference), 4 (job kubernetes-pods)",
                            "has not scraped the pod since"),
    "json-only": ([], [DOWN], "no series of the pod",
                  "target http://10.0.0.7:8000/metrics is down: \"INVALID\" is not a valid start token; its "
                  "answer is not the Prometheus text format"),
    "scraped-without-the-counter": ([], [UP], "no series of the pod",
                                    "it is scraped, but its answer has no gpuproof_inference_requests_total"),
    "no-monitor": ([], [], "no series of the pod", "no PodMonitor or ServiceMonitor selects it"),
    "another-pod": ([row(5, pod="gpuproof-inference-zz999")], [], "no series of the pod (series of "
                    "gpuproof-run-1/gpuproof-inference-zz999)", "Prometheus has no target for the pod"),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_each_fault_fails_naming_node_pod_expected_and_actual(case):
    result, targets, actual, reason = FAULTS[case]
    f, = monitoring.judge_service_metrics(NODE, POD, 5, result, targets)
    assert (f.check, f.verdict, f.node, f.actual) == ("ai-service-metrics", "fail", NODE, actual)
    assert reason in f.reason
    assert f.message.startswith(f"{NODE}: ai-service-metrics: expected gpuproof_inference_requests_total of pod "
                                f"{POD} = 5 (the requests sent), actual {actual} (")

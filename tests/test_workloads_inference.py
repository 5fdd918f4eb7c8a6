"""The inference server and the locust load generator, end to end on the CPU, on 127.0.0.1 only."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from gpuproof.bench import get
from gpuproof.workloads import WORKLOADS_DIR, import_workload

wait_until = import_workload("workload_common").wait_until

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def http(url, body=None, timeout=10):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def last_json(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server on 127.0.0.1 and a free port (port 0, read back from --port-file)."""
    port_file = tmp_path_factory.mktemp("srv") / "port"
    proc = subprocess.Popen(
        [sys.executable, str(WORKLOADS_DIR / "inference_server.py"), "--device", "cpu", "--threads", "1",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), "--in-features", "8",
         "--hidden", "32", "--out-features", "3", "--max-batch", "8", "--max-wait-ms", "20"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        port = wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 60, "the port file")
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http(url + "/healthz", timeout=2)[0] == 200, 60, f"{url}/healthz to answer 200")
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def test_server_endpoints(server):
    url, _ = server
    assert http(url + "/healthz") == (200, {"status": "ok"})
    code, info = http(url + "/info")
    assert code == 200 and info["in_features"] == 8 and info["device"] == "cpu"
    code, out = http(url + "/infer", {"inputs": [[0.1] * 8, [0.2] * 8]})
    assert code == 200 and len(out["outputs"]) == 2 and len(out["outputs"][0]) == 3
    assert http(url + "/infer", {"inputs": [[0.1] * 7]})[0] == 400
    assert http(url + "/infer", {"nothing": 1})[0] == 400
    assert http(url + "/nope")[0] == 404


def test_concurrent_requests_are_batched(server):
    url, _ = server
    codes = []
    barrier = threading.Barrier(12)

    def one():
        barrier.wait(timeout=10)
        codes.append(http(url + "/infer", {"inputs": [[0.5] * 8]})[0])

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert codes == [200] * 12
    stats = http(url + "/stats")[1]
    assert max(int(k) for k in stats["batch_size_hist"]) > 1  # several requests shared a forward pass
    assert max(int(k) for k in stats["batch_size_hist"]) <= 8


def test_loadgen_slo_miss_and_server_summary(server):
    url, proc = server
    lg = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), "--url", url, "--rates", "20",
                         "--step-s", "1", "--slo-p99-ms", "0.001"], capture_output=True, text=True,
                        timeout=90, env=ENV)
    assert lg.returncode == 0, lg.stderr[-3000:]
    r = last_json(lg.stdout)
    assert r["overall"]["requests"] > 0 and r["overall"]["errors"] == 0
    assert r["verdict"] == "fail" and r["steps"][0]["slo_met"] is False
    assert r["steps"][0]["goodput_rps"] == 0.0 and r["max_rate_meeting_slo"] is None
    # stop the server: it prints its own summary
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    s = last_json(out)
    assert s["workload"] == "inference_server" and s["ok"] is True
    assert s["stats"]["ok"] >= r["overall"]["requests"]
    assert s["utilization"]["available"] is False or s["utilization"]["n_samples"] >= 0


def test_port_in_use_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / "inference_server.py"), "--device", "cpu",
                               "--port", str(port)], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 2
    r = last_json(proc.stdout)
    assert r["ok"] is False and f"port {port}" in r["error"] and "already in use" in r["error"]


def test_loadgen_readiness_wait_is_bounded():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), "--url", f"http://127.0.0.1:{port}",
                           "--wait-ready", "1"], capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 2 and time.monotonic() - t0 < 30
    assert "timed out after 1s waiting for" in last_json(proc.stdout)["error"]


def test_inference_benchmark_end_to_end():
    """The bench class: server + locust load on loopback, exact percentiles, goodput, SLO verdict."""
    bench = get("inference")
    params = bench.params({**bench.ci_params, "rates": "10,20", "step_s": 2.0, "slo_p99_ms": 2000.0},
                          device="cpu")
    result = bench.run_local(params)
    load = result["load"]
    assert load["stop_reason"] == "steps done" and load["verdict"] == "pass"
    steps = load["steps"]
    assert [s["target_rps"] for s in steps] == [10.0, 20.0]
    for s in steps:
        assert s["errors"] == 0 and s["slo_met"] is True
        assert s["achieved_rps"] == pytest.approx(s["target_rps"], rel=0.35)
        assert s["p50_ms"] <= s["p90_ms"] <= s["p95_ms"] <= s["p99_ms"] <= s["max_ms"]
        assert s["goodput_rps"] == pytest.approx(s["throughput_rps"])  # every request within the SLO
    overall = load["overall"]
    assert overall["requests"] == sum(s["requests"] for s in steps)
    assert load["locust"]["requests"] == overall["requests"]  # locust saw the same requests
    assert load["max_rate_meeting_slo"] == 20.0
    assert result["server"]["stats"]["ok"] == overall["requests"]
    records = bench.to_records(result, node="local", product="cpu")
    p99 = [r for r in records if r.metric == "p99_ms"]
    assert len(p99) == 3 and all(r.unit == "ms" and r.value > 0 for r in p99)
    assert any(r.metric == "slo_verdict_pass" and r.value == 1.0 for r in records)

"""The LLM inference server, the locust client and the capacity search, end to end on the CPU,
on 127.0.0.1 only.

The classification cases are built so that their outcome is structural, not timing luck:

- server-bound: a 15M-parameter model on one torch thread against 64 users; the ramp
  doubles the offered rate until queueing breaks the TTFT SLO, which on one core it
  must; at that step the server's engine loop is never idle;
- client-bound: one user that pauses 1 s after every answer can send at most 1 req/s,
  and every offered rate is >= 2 req/s, so the sends must run late while the server idles;
- offered-range: 1 and 2 req/s of 16-in/8-out requests to a 0.1M-parameter model with
  SLOs of seconds: nothing can fail, so the search runs out of range.
"""

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
STEP_KEYS = {"offered_rps", "achieved_rps", "client_cpu", "schedule_lag_p50_ms", "schedule_lag_p95_ms",
             "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "e2e_p99_ms",
             "output_tokens_per_s", "goodput_rps", "slo_attainment", "slo_met", "server"}


def http(url, body=None, timeout=30):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_json(url, body=None, timeout=30):
    code, raw = http(url, body, timeout)
    return code, json.loads(raw or b"{}")


def last_json(text):
    lines = [line for line in text.splitlines() if line.strip()]
    return json.loads(lines[-1])


def start_server(tmp_path, *args):
    port_file = tmp_path / "port"
    proc = subprocess.Popen(
        [sys.executable, str(WORKLOADS_DIR / "inference_server.py"), "--device", "cpu", "--threads", "1",
         "--host", "127.0.0.1", "--port", "0", "--port-file", str(port_file), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    port = wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 90, "the port file")
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http(url + "/health", timeout=2)[0] == 200, 120, f"{url}/health to answer 200")
    return url, proc


def stop_server(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The CPU-path server (preset 'cpu', one torch thread) on 127.0.0.1 and a free port."""
    url, proc = start_server(tmp_path_factory.mktemp("srv"), "--model", "cpu")
    try:
        yield url, proc
    finally:
        stop_server(proc)


def wait_idle(url):
    def idle():
        m = http_json(url + "/metrics")[1]
        return m["waiting"] == 0 and m["running"] == 0

    wait_until(idle, 60, f"{url} to have no request in flight")


def loadgen(url, *args, timeout=150):
    t0 = time.monotonic()
    lg = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), "--url", url, *map(str, args)],
                        capture_output=True, text=True, timeout=timeout, env=ENV)
    assert lg.returncode == 0, lg.stderr[-3000:]
    r = last_json(lg.stdout)
    r["_wall_s"] = time.monotonic() - t0
    r["_log"] = lg.stderr
    return r


# ------------------------------------------------------------------ the model


def test_kv_cache_decode_matches_full_recompute():
    """Decoding with the cache gives the tokens a full forward pass over the whole sequence gives."""
    llm = import_workload("llm_model")
    m = llm.LLM(2, 64, 4, 512, 64, slots=3, device="cpu", seed=1)
    prompts = [[5, 9, 100, 7], [3, 4, 200, 11]]
    firsts = m.prefill(prompts, 0)
    seqs = [p + [t] for p, t in zip(prompts, firsts)]
    for _ in range(5):  # batched decode steps for both sequences
        nxt = m.decode([s[-1] for s in seqs], [len(s) - 1 for s in seqs])
        seqs = [s + [t] for s, t in zip(seqs, nxt)]
    for s in seqs:  # recompute from scratch in a spare slot: the same greedy tokens
        ref = list(s[:4])
        for _ in range(6):
            ref.append(m.prefill([ref], 2)[0])
        assert ref == s


def test_engine_batches_continuously_and_honours_max_tokens():
    llm = import_workload("llm_model")
    engine = llm.Engine(llm.LLM(2, 64, 4, 512, 128, slots=4, device="cpu", seed=0)).start()
    try:
        reqs = [llm.Request([1 + i, 2, 3], max_tokens=3 + 2 * i, ignore_eos=True) for i in range(6)]
        for r in reqs:
            engine.submit(r)
        for r in reqs:
            toks = []
            while (t := r.out.get(timeout=60)) is not None:
                toks.append(t)
            assert len(toks) == r.max_tokens and r.finish == "length" and r.error is None
            assert r.t_first is not None and r.model_s > 0
        c = engine.snapshot()
        assert c["finished"] == 6 and 1 < c["max_batch_seen"] <= 4  # several sequences per step, slots respected
        assert 0 < c["forward_s"] <= c["busy_s"]
    finally:
        engine.stop()


# ------------------------------------------------------------------ the server's API


def test_openai_endpoints(server):
    url, _ = server
    assert http_json(url + "/health") == (200, {"status": "ok"})
    code, models = http_json(url + "/v1/models")
    assert code == 200 and models["data"][0]["id"] == "gpuproof-llm" and models["data"][0]["max_model_len"] == 512
    code, out = http_json(url + "/v1/completions", {"model": "gpuproof-llm", "prompt": "one two three",
                                                    "max_tokens": 5, "ignore_eos": True})
    assert code == 200 and out["object"] == "text_completion"
    assert out["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}
    assert len(out["choices"][0]["text"].split()) == 5 and out["choices"][0]["finish_reason"] == "length"
    assert out["gpuproof"]["model_ms"] > 0

    code, raw = http(url + "/v1/completions", {"prompt": [1, 2, 3, 4], "max_tokens": 4, "stream": True,
                                               "stream_options": {"include_usage": True}})
    events = [line[len("data: "):] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    assert code == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["text"]]
    assert len(texts) == 4
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 4

    assert http(url + "/v1/completions", {"prompt": "x " * 600, "max_tokens": 4})[0] == 400  # over the context
    assert http(url + "/v1/completions", {"prompt": {"no": 1}})[0] == 400
    assert http(url + "/v1/completions", {"prompt": "a", "max_tokens": 0})[0] == 400
    assert http(url + "/nope")[0] == 404
    code, m = http_json(url + "/metrics")
    assert code == 200 and m["ok"] >= 2 and m["model_s"] > 0 and m["process_cpu_s"] > 0
    assert m["engine"]["forward_s"] > 0 and m["cpu_budget_cores"] == 1.0


def test_concurrent_streams_share_decode_steps(server):
    url, _ = server
    before = http_json(url + "/metrics")[1]["engine"]
    codes = []
    barrier = threading.Barrier(6)

    def one():
        barrier.wait(timeout=10)
        codes.append(http(url + "/v1/completions", {"prompt": "a b c", "max_tokens": 40, "stream": True,
                                                    "ignore_eos": True})[0])

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert codes == [200] * 6
    after = http_json(url + "/metrics")[1]["engine"]
    rows, steps = after["batch_rows"] - before["batch_rows"], after["decode_steps"] - before["decode_steps"]
    assert rows == 6 * 39 and steps < rows  # 39 decode tokens each (the first comes from prefill), batched


# ------------------------------------------------------------------ capacity search and its bound


def test_capacity_is_server_bound_by_model_compute(server):
    url, _ = server
    wait_idle(url)
    r = loadgen(url, "--rates", "2:64", "--step-s", "2.5", "--drain-s", "30", "--input-tokens", "64",
                "--output-tokens", "32", "--slo-ttft-ms", "1000", "--slo-tpot-ms", "500",
                "--slo-attainment", "0.9", "--users", "64", "--bisect-steps", "2")
    steps = r["steps"]
    assert all(STEP_KEYS <= set(s) for s in steps)
    assert r["bound_by"] == "server", (r["bound_reason"], r["_log"][-3000:])
    assert r["capacity_rps"] is not None and r["capacity_rps"] == r["max_passing_rps"]
    assert r["capacity_rps"] < r["first_failing_rps"] <= 64
    failing = next(s for s in steps if s["offered_rps"] == r["first_failing_rps"] and not s["slo_met"])
    srv = failing["server"]
    assert srv["engine_busy"] >= 0.75          # the engine loop never idled
    assert srv["forward_share_of_busy"] > 0.8  # ... and spent its time in the model's forward passes
    assert failing["client_cpu"] < 0.9
    cap = r["at_capacity"]["server"]
    # the server's own work per request (handler CPU + scheduler) is a small share of the model's
    assert cap["overhead_fraction"] < 0.25, cap
    assert cap["model_ms"] > cap["overhead_ms"]
    print(f"\ncapacity {r['capacity_rps']} req/s bound by server: {r['bound_reason']}; overhead "
          f"{cap['overhead_ms']:.1f} ms/request = {cap['overhead_fraction']:.1%} (model {cap['model_ms']:.0f} ms); "
          f"{len(steps)} steps in {r['_wall_s']:.0f}s")


def test_starved_client_is_client_bound_not_a_capacity(server):
    url, _ = server
    wait_idle(url)  # nothing left over from an earlier test keeps the server busy
    r = loadgen(url, "--rates", "2:8", "--step-s", "2", "--drain-s", "20", "--input-tokens", "16",
                "--output-tokens", "8", "--users", "1", "--think-ms", "1000", "--slo-ttft-ms", "5000",
                "--slo-tpot-ms", "1000")
    assert r["bound_by"] == "client", (r["bound_reason"], r["_log"][-3000:])
    assert r["capacity_rps"] is None and r["verdict"] == "inconclusive"
    s = r["steps"][0]
    assert s["offered_rps"] == 2.0 and s["achieved_rps"] < 1.5 and s["schedule_lag_p95_ms"] > 500
    assert s["bound_by"] == "client" and s["late_fraction"] > 0.1


def test_too_small_a_range_is_offered_range_not_a_capacity():
    """Through the bench class (server + load generator as subprocesses), as `gpuproof bench` runs it."""
    bench = get("inference")
    params = bench.params(bench.ci_params, device="cpu")
    result = bench.run_local(params)
    load = result["load"]
    assert load["bound_by"] == "offered-range", load["bound_reason"]
    assert load["capacity_rps"] is None and load["max_passing_rps"] == 2.0
    assert [s["offered_rps"] for s in load["steps"]] == [1.0, 2.0]
    for s in load["steps"]:
        assert STEP_KEYS <= set(s) and s["errors"] == 0 and s["slo_met"]
        assert s["mean_output_tokens"] == 8  # ignore_eos + min_tokens: exactly max_tokens
    assert result["server"]["stats"]["ok"] == sum(s["ok"] for s in load["steps"])
    assert result["server"]["per_request_ms"]["model"] > 0
    records = bench.to_records(result, node="local", product="cpu")
    names = {r.metric for r in records}
    assert {"ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s", "goodput_rps", "bound_by",
            "server_overhead_fraction", "run_server_overhead_ms"} <= names
    assert "capacity_rps" not in names  # the top of the offered range is not a capacity
    assert [r.parameters["bound_by"] for r in records if r.metric == "bound_by"] == ["offered-range"]


def test_url_drives_a_separately_started_server(tmp_path):
    """`gpuproof bench --local inference --url URL --model NAME` against a server started on its own."""
    url, proc = start_server(tmp_path, "--model", "tiny", "--model-name", "served-elsewhere")
    try:
        out = tmp_path / "reports"
        cli = subprocess.run([sys.executable, "-m", "gpuproof.cli", "bench", "--local", "inference", "--url", url,
                              "--model", "served-elsewhere", "--rates", "1,2", "--step-s", "2", "--users", "8",
                              "--input-tokens", "16", "--output-tokens", "8", "--slo-ttft-ms", "5000",
                              "--slo-tpot-ms", "1000", "--out", str(out), "--run-id", "u1", "--quiet"],
                             capture_output=True, text=True, timeout=150, env=ENV)
        assert cli.returncode == 0, cli.stderr[-3000:]
        served = http_json(url + "/metrics")[1]
    finally:
        stop_server(proc)
    raw = json.loads((out / "u1" / "bench-inference.json").read_text())
    load = raw["load"]
    assert load["url"] == url and load["model"] == "served-elsewhere" and raw["server"] is None
    assert load["bound_by"] == "offered-range" and load["capacity_rps"] is None
    assert served["ok"] == sum(s["ok"] for s in load["steps"]) > 0  # every request reached that server
    for s in load["steps"]:
        assert STEP_KEYS <= set(s) and s["errors"] == 0 and s["mean_output_tokens"] == 8
        assert s["server"]["model_ms"] > 0  # its /metrics answers the same as the built-in one's
    metrics = [json.loads(line) for line in (out / "u1" / "metrics.jsonl").read_text().splitlines()]
    assert {"ttft_p99_ms", "tpot_p50_ms", "output_tokens_per_s", "goodput_rps", "bound_by"} <= \
        {m["metric"] for m in metrics}


# ------------------------------------------------------------------ failures that must be clear


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

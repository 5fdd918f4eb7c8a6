"""The LLM inference server, the locust client and the capacity search, end to end on the CPU,
on 127.0.0.1 only.

Every outcome here is structural, not a measure of this machine's speed (how fast the CPU
server is, how busy it is at its capacity and what its own overhead costs are figures:
``benchmarks/aiperf_compare.py``, in ``benchmarks/RESULTS.md``):

- the capacity search against ``loadstub.py`` with a queue of known service rate: past it
  the stub completes that many requests per second whatever is offered, so the search must
  find the overload, say the server fell behind, and report a capacity at that rate;
- the real server's /metrics: how full it was (running requests against its batch slots,
  waiting ones) adds up over a load step, within what its slots allow;
- client-bound: one user that pauses 1 s after every answer can send at most 1 req/s,
  and every offered rate is >= 2 req/s, so the sends must run late while the server idles;
- offered-range: 1 and 2 req/s of 16-in/8-out requests to a 0.1M-parameter model with
  SLOs of seconds and at most 2 answers a pace window may miss: nothing can fail, so the
  search runs out of range;
- what bound a step (``loadclient.classify``) on step records written out by hand: busy alone
  is never saturation.
"""

import json
import os
import platform
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
from gpuproof.bench.workloads import WORKLOADS_DIR, import_workload
from loadprocs import ahead, start_process, stop_process

# torch at collection: its first import runs ldconfig, a process the unit tier's guard refuses inside a unit test
# (the model's tests below failed so when this file ran alone)
pytest.importorskip("torch")
wait_until = import_workload("workload_common").wait_until
rules = import_workload("loadclient")

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
STEP_KEYS = {"offered_rps", "sent_rps", "served_rps", "completion_rps", "queue_growth", "keeps_pace", "client_cpu",
             "client_cpu_per_request_ms", "client_bound", "schedule_lag_p50_ms", "schedule_lag_p95_ms",
             "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "e2e_p99_ms",
             "output_tokens_per_s", "goodput_rps", "slo_attainment", "slo_met", "server", "headroom"}


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


def loadgen(url, *args, timeout=150, nice=0):
    t0 = time.monotonic()
    lg = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), "--url", url, *map(str, args)],
                        capture_output=True, text=True, timeout=timeout, env=ENV, preexec_fn=ahead(nice))
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


def search_the_stub(tmp_path, *args) -> dict:
    """loadgen's search (``args``) against the stub queue that starts at most 10 answers per second; its result.

    The stub and the load generator run ahead of the machine's other work where the test may (root: loadprocs.ahead):
    CI runs that started these tests beside four workers' clusters held the sends back, and the load generator rightly
    called a step client-bound (at 16 req/s, at 4, or no capacity found at all), which says nothing of the search. A
    search with such a step is measured once more, saying why."""
    for attempt in (1, 2):
        url, proc = start_process("loadstub.py", tmp_path, "--ttft-ms", "50", "--token-gap-ms", "5",
                                  "--service-rps", "10", nice=-10)
        try:
            r = loadgen(url, *args, "--step-s", "4", "--drain-s", "30", "--input-tokens", "16", "--output-tokens", "8",
                        "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--users", "64", "--metrics-path", "",
                        nice=-10)
        finally:
            stop_process(proc)
        held = [s for s in r["steps"] if not s["valid"] and s.get("bound_by") == "client"]
        if attempt == 1 and held:
            print(f"the step at {held[0]['offered_rps']:g} req/s was client-bound ({held[0]['invalid_reason']}): "
                  "measuring again")
            continue
        return r


@pytest.mark.server  # tier: a workload server or loadgen as a process
def test_capacity_search_finds_a_known_service_rate(tmp_path):
    """Against a queue that starts at most 10 answers per second: the ramp (2, 4, 8, 16) must fail at
    16, where the stub completes 10 per second and the rest pile up; the next probe is just below
    what 16 completed, and the capacity is a rate the stub sustains (its pace window allows 2 answers either way
    over 2 s: up to 1 req/s above the service rate can pass unseen)."""
    r = search_the_stub(tmp_path, "--rates", "2:64")
    steps = r["steps"]
    assert all(STEP_KEYS <= set(s) for s in steps)
    assert [s["offered_rps"] for s in steps[:4]] == [2.0, 4.0, 8.0, 16.0]
    over = steps[3]
    assert over["keeps_pace"] is False and not over["slo_met"] and over["valid"], \
        (over["fail_reasons"], over.get("invalid_reason"), over.get("bound_reason"))
    # the queue starts its n answers at least (n - 1) / 10 s apart
    assert over["served_rps"] <= 10.0 * over["ok"] / (over["ok"] - 1)
    assert over["completion_rps"] <= 10.0 + 2 / over["pace_window_s"]
    assert over["queue_growth"] > 0 and over["sent_rps"] >= 16 * 0.95   # sent on schedule; the queue grew
    assert r["bound_by"] == "server" and "fell behind" in r["bound_reason"], r["bound_reason"]
    # probed below it: that probe fails too where it lies above the service rate (10.5 req/s once, in a CI run), so
    # the lowest failing rate is 16 or a probe above 10
    assert steps[4]["offered_rps"] < over["completion_rps"]
    assert r["first_failing_rps"] == 16.0 or 10.0 < r["first_failing_rps"] < 16.0, r["first_failing_rps"]
    assert 8.0 <= r["capacity_rps"] <= 11.0 and r["capacity_rps"] == r["max_passing_rps"]
    assert r["capacity_completion_rps"] == r["at_capacity"]["completion_rps"]
    assert r["saturation_rps"] <= 10.0 + 2 / over["pace_window_s"]


@pytest.mark.server  # tier: a workload server or loadgen as a process
def test_a_search_whose_first_step_fails_ramps_again_from_below(tmp_path):
    """``--search-start`` above what the queue serves (10 per second): the first step is that rate and
    fails as overload from an empty server (``cold_start``), which brackets nothing; the search ramps
    again from half of it (12, failing warm), and the capacity is found below the ramp's failing step, inside
    LO..HI, without the cold step in the saturation figure."""
    r = search_the_stub(tmp_path, "--rates", "2:64", "--search-start", "24")
    steps = r["steps"]
    rates = [s["offered_rps"] for s in steps]
    assert r["search_start"]["rps"] == 24.0 and r["search_start"]["rule"] == "--search-start 24"
    assert rates[:2] == [24.0, 12.0], rates
    assert steps[0]["cold_start"] is True and steps[0]["keeps_pace"] is False
    assert "ramping again from 12 req/s" in r["_log"]
    assert r["first_failing_rps"] == 12.0 and steps[1]["keeps_pace"] is False, rates
    assert r["capacity_rps"] is not None and 8.0 <= r["capacity_rps"] <= 11.0 and r["bound_by"] == "server", \
        (rates, r["bound_reason"], [s.get("invalid_reason") for s in steps])
    assert r["saturation_rps"] <= 10.0 + 2 / steps[1]["pace_window_s"]


def test_auto_search_start_comes_from_the_batch_slots_and_one_requests_time(server):
    """``--search-start auto`` against the real server: one request timed alone, the server's batch
    slots from its /metrics, and the first step at an eighth of slots / that time (held inside the
    range); the record says so."""
    url, _ = server
    wait_idle(url)
    r = loadgen(url, "--rates", "0.5:64", "--search-start", "auto", "--max-steps", "1", "--step-s", "2",
                "--pace-answers", "0", "--drain-s", "60", "--input-tokens", "16", "--output-tokens", "16",
                "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--users", "16")
    start = r["search_start"]
    e2e_s = start["idle_probe"]["e2e_ms"] / 1e3
    want = min(64.0, max(0.5, 0.125 * 16 / e2e_s))
    assert start["rps"] == pytest.approx(want, rel=0.01), start
    assert start["rule"].startswith("auto: 0.125 x 16 batch slots / "), start["rule"]
    assert r["steps"][0]["offered_rps"] == start["rps"]
    assert f"search starts at {start['rps']:g} req/s" in r["_log"]


def test_server_reports_how_full_it_was(server):
    """Beside "busy": requests running against the batch slots, and waiting, summed over the step."""
    url, _ = server
    wait_idle(url)
    before = http_json(url + "/metrics")[1]
    r = loadgen(url, "--rates", "2", "--step-s", "3", "--drain-s", "60", "--input-tokens", "16",
                "--output-tokens", "16", "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--users", "16")
    after = http_json(url + "/metrics")[1]
    assert before["max_batch"] == after["max_batch"] == 16
    for key in ("running_s", "waiting_s"):
        assert 0 <= before["engine"][key] <= after["engine"][key]
    (s,) = r["steps"]
    room, srv = s["headroom"], s["server"]
    assert STEP_KEYS <= set(s) and s["errors"] == 0 and s["mean_output_tokens"] == 16
    assert room["source"] == "gpuproof /metrics" and room["max_batch"] == 16
    assert 0 < room["running_mean"] <= 16 and room["slots_used"] == room["running_mean"] / 16
    assert room["waiting_mean"] >= 0
    assert srv["requests"] == s["ok"] and srv["model_ms"] > 0 and 0 < srv["engine_busy"] <= 1.0001
    # per engine step: the server's CPU against the device's (on the CPU: the forward calls' wall time)
    assert srv["engine_steps"] > 0 and srv["cpu_ms_per_step"] > 0 and srv["device_ms_per_step"] > 0
    assert 0 < srv["cpu_per_device_step"] < float("inf") and srv["tokens_per_step"] >= 1
    assert srv["device_timer"] == "wall" and srv["cuda_graphs"] == "off" and 0 < srv["device_busy"] <= 1.0001
    assert "batch slots used" in rules.headroom_text(room)


def step_record(busy=1.0, running=2.0, waiting=0.0, keeps_pace=True, gpu=None, late=0.0, sent=4.0):
    """A failing step as loadgen writes it, with only what classify() reads."""
    return {"offered_rps": 4.0, "sent_rps": sent, "errors": 0, "late_fraction": late, "keeps_pace": keeps_pace,
            "completion_rps": 3.0, "schedule_lag_p95_ms": 1.0, "starved_fraction": 0.0,
            "server": {"engine_busy": busy, "cpu_util": 0.5, "gpu_util_pct": gpu},
            "headroom": {"running_mean": running, "max_batch": 16, "slots_used": running / 16,
                         "waiting_mean": waiting, "kv_cache_usage_mean": None}}


def test_busy_alone_is_not_saturation():
    classify = rules.classify
    bound, why = classify(step_record(busy=1.0, running=2.4), 0.75)       # never idle, 2.4 of 16 slots
    assert bound == "server" and "not full" in why and "2.4 of 16 batch slots used" in why, why
    bound, why = classify(step_record(busy=1.0, running=16, waiting=5), 0.75)
    assert bound == "server" and why.startswith("server saturated") and "5.0 waiting" in why, why
    bound, why = classify(step_record(busy=0.5, running=3, keeps_pace=False), 0.75)
    assert bound == "server" and "fell behind" in why, why
    bound, why = classify(step_record(gpu=99.0, running=2), 0.75)           # NVML busy, batch nearly empty
    assert bound == "server" and "not full" in why, why
    bound, why = classify(step_record(gpu=99.0, running=15), 0.75)
    assert bound == "device" and "15.0 of 16" in why, why
    bound, why = classify(step_record(busy=0.2, running=1, late=0.5, sent=2.0), 0.75)
    assert bound == "client" and "sends ran late" in why, why


def test_prometheus_gauges_of_vllm_and_sglang():
    text = ('# HELP vllm:num_requests_running Number of requests running.\n'
            'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
            'vllm:num_requests_running{model_name="m",engine="1"} 2.0\n'
            'vllm:num_requests_waiting{model_name="m"} 7.0\n'
            'vllm:kv_cache_usage_perc{model_name="m"} 0.5\n'
            'vllm:num_requests_running_total 99\n')            # another name with the same prefix: not counted
    assert rules.prom_gauges(text) == {
        "running": 5.0, "waiting": 7.0, "kv_cache_usage": 0.5,
        "names": ["vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"]}
    sgl = rules.prom_gauges('sglang:num_running_reqs{tp_rank="0"} 4\nsglang:num_queue_reqs 0\n'
                                     'sglang:token_usage 0.25\n')
    assert (sgl["running"], sgl["waiting"], sgl["kv_cache_usage"]) == (4.0, 0.0, 0.25)
    room = rules.prom_headroom([{"running": 2.0, "waiting": 0.0}, {"running": 4.0, "waiting": 3.0}])
    assert (room["running_mean"], room["running_max"], room["waiting_mean"], room["waiting_growth"]) == \
        (3.0, 4.0, 1.5, 3.0)
    assert rules.prom_gauges("up 1\n") == {}


def test_starved_client_is_client_bound_not_a_capacity(server):
    url, _ = server
    wait_idle(url)  # nothing left over from an earlier test keeps the server busy
    r = loadgen(url, "--rates", "2:8", "--step-s", "2", "--drain-s", "20", "--input-tokens", "16",
                "--output-tokens", "8", "--users", "1", "--think-ms", "1000", "--slo-ttft-ms", "5000",
                "--slo-tpot-ms", "1000")
    assert r["bound_by"] == "client", (r["bound_reason"], r["_log"][-3000:])
    assert r["capacity_rps"] is None and r["verdict"] == "inconclusive"
    s = r["steps"][0]
    # one user that waits 1 s after each answer sends at most one request per second, so against a
    # schedule of two per second half the sends are at least 0.5 s late, however fast the machine
    assert s["offered_rps"] == 2.0 and s["sent_rps"] < 1.5 and s["schedule_lag_p95_ms"] > 500
    assert s["bound_by"] == "client" and s["late_fraction"] > 0.1 and s["client_bound"] is True


@pytest.mark.server  # tier: a workload server or loadgen as a process
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
    step = result["server"]["per_step"]
    assert step["steps"] > 0 and step["cpu_ms"] > 0 and step["device_ms"] > 0 and step["tokens_per_step"] >= 1
    assert 0 < step["cpu_per_device"] < float("inf") and step["device_timer"] == "wall"
    assert step["cuda_graphs"] == "off" and "per engine step the server's CPU" in bench.headline(result)
    records = bench.to_records(result, node="local", product="cpu")
    names = {r.metric for r in records}
    assert {"ttft_p99_ms", "tpot_p99_ms", "output_tokens_per_s", "goodput_rps", "bound_by",
            "server_overhead_fraction", "run_server_overhead_ms"} <= names
    assert "capacity_rps" not in names  # the top of the offered range is not a capacity
    units = {r.metric: r.unit for r in records}
    assert {m: units.get(m) for m in ("server_cpu_ms_per_step", "device_ms_per_step", "cpu_per_device_step",
                                      "run_server_cpu_ms_per_step", "run_device_ms_per_step",
                                      "run_cpu_per_device_step")} == \
        {"server_cpu_ms_per_step": "ms", "device_ms_per_step": "ms", "cpu_per_device_step": "ratio",
         "run_server_cpu_ms_per_step": "ms", "run_device_ms_per_step": "ms", "run_cpu_per_device_step": "ratio"}
    assert [r.parameters["bound_by"] for r in records if r.metric == "bound_by"] == ["offered-range"]


@pytest.mark.server  # tier: a workload server or loadgen as a process
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


@pytest.mark.server  # tier: a workload server or loadgen as a process
def test_the_server_stops_when_sigterm_reaches_another_of_its_threads(tmp_path):
    """The kernel may hand a process's SIGTERM to any of its threads; Python then only notes it, and a
    main thread parked in a wait that never wakes would never run the handler (on an H200 the server
    ignored SIGTERM for 60 s and gpuproof bench lost the run). Sent to a thread that is not the main
    one (tgkill), the server still stops at once and prints its summary."""
    import ctypes

    url, proc = start_server(tmp_path, "--model", "tiny")
    try:
        tids = [int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid]
        assert tids, "the server runs more than its main thread (HTTP, engine)"
        libc = ctypes.CDLL(None, use_errno=True)
        sys_tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
        # the oldest first (the HTTP and engine threads live as long as the server; a request's may be ending)
        sent = next((tid for tid in sorted(tids) if libc.syscall(sys_tgkill, proc.pid, tid, signal.SIGTERM) == 0),
                    None)
        assert sent, f"tgkill reached none of {tids}: errno {ctypes.get_errno()}"
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert last_json(out)["workload"] == "inference_server"
    assert "stopping" in err


@pytest.mark.server  # tier: a workload server or loadgen as a process
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


@pytest.mark.server  # tier: a workload server or loadgen as a process
def test_loadgen_readiness_wait_is_bounded():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), "--url", f"http://127.0.0.1:{port}",
                           "--wait-ready", "1"], capture_output=True, text=True, timeout=60, env=ENV)
    # --wait-ready 1 against a closed port: it gives up after ~1 s; 30 s only catches a wait that ignores the flag
    assert proc.returncode == 2 and time.monotonic() - t0 < 30
    assert "timed out after 1s waiting for" in last_json(proc.stdout)["error"]

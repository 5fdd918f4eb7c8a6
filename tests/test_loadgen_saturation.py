"""A load step the client limited is marked invalid, in the records and in the report, and is
never taken for the server's limit or for a capacity.

- end to end: the load generator is asked for 20,000 req/s against ``loadstub.py`` (an
  endpoint that computes nothing and costs far less CPU per request than the client). One
  locust process cannot send that on one core, whatever this machine is doing: either its
  CPU reaches the threshold or it falls short of the offered rate while the endpoint's own
  per-request time stays at zero. Both are the client's limit;
- the rules themselves (``loadclient.step_validity``) on step records written out by hand,
  so that each rule is seen to decide on its own;
- the capacity search against the real inference server with the CPU threshold at 0: every
  step is then over it, so even steps that meet the SLO may not give a capacity.
"""

import subprocess
import sys

import pytest

from gpuproof.bench import get
from gpuproof.report.data import load_run
from gpuproof.report.html import render_html
from gpuproof.report.summary import render_summary
from gpuproof.results import RunDir
from gpuproof.bench.workloads import WORKLOADS_DIR, import_workload

rules = import_workload("loadclient")
from loadprocs import ENV, last_json, start_process, stop_process  # noqa: E402




def run_loadgen(*args, timeout=180):
    proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return last_json(proc.stdout)



# ------------------------------------------------------------------ a really saturated client


def test_saturated_client_is_invalid_in_records_and_report(stub, tmp_path):
    r = run_loadgen("--url", stub, "--rates", "20000", "--step-s", "2", "--drain-s", "1", "--users", "64",
                    "--input-tokens", "16", "--output-tokens", "8", "--metrics-path", "")
    (s,) = r["steps"]
    assert s["offered_rps"] == 20000 and s["sent_rps"] < 20000 * 0.9   # both recorded, short of the offer
    proc = s["client"]["processes"][0]
    assert proc["role"] == "local" and proc["cpu"] > 0 and 0 < proc["cores"] <= 1
    assert s["client_cpu"] == proc["cpu"] and s["errors"] > 0 and s["failed"] == 0   # unsent, not refused
    assert s["valid"] is False and s["invalid_reason"].startswith("client"), s["invalid_reason"]
    assert s["client_bound"] is True and s["client_cpu_per_request_ms"] > 0
    assert r["invalid_steps"] == [0] and r["client_saturated"] is True
    assert r["bound_by"] == "client" and r["capacity_rps"] is None and r["verdict"] == "inconclusive"
    assert r["validity_rule"]["cpu_threshold"] == rules.CPU_SATURATION == 0.9

    # the records and both reports carry the mark
    bench = get("inference")
    records = bench.to_records({"load": r, "server": None}, node="local", product="stub")
    marks = [x for x in records if x.metric == "step_valid"]
    assert len(marks) == 1, "no step_valid record"
    valid = marks[0]
    assert valid.value == 0.0 and valid.parameters["invalid_reason"] == s["invalid_reason"]
    assert not any(x.metric == "capacity_rps" for x in records)
    run = RunDir(tmp_path / "run")
    run.add_metrics(records)
    md = render_summary(load_run(run.path))
    row = next(line for line in md.splitlines() if line.startswith("| stub | 20000 |"))
    assert "⚠️ invalid: client" in row, row
    assert "not the server's limit" in md
    page = render_html(load_run(run.path))
    assert "Invalid load steps, limited by the load generator" in page and "20000 req/s" in page


def test_each_steps_verdict_follows_from_its_own_figures(stub):
    """Whether a step is valid is the rules applied to what the step recorded (not how fast this
    machine is: what one client process sends per CPU-second is a figure, benchmarks/LOAD.md)."""
    r = run_loadgen("--url", stub, "--rates", "20,40", "--step-s", "1.5", "--drain-s", "5", "--users", "8",
                    "--input-tokens", "16", "--output-tokens", "8", "--metrics-path", "")
    for s in r["steps"]:
        again = rules.step_validity(s, s["latency_baseline"], rate_tolerance=r["validity_rule"]["rate_tolerance"],
                                    max_error_rate=0.0, cpu_threshold=r["validity_rule"]["cpu_threshold"])
        if s["valid"]:
            assert again == (True, None) and s["invalid_reason"] is None
        else:   # by the rules, or a failing step whose sends ran late (loadclient.classify)
            assert s["invalid_reason"] == again[1] or again[0] and s["invalid_reason"].startswith(
                "client-bound: sends ran late"), (s["invalid_reason"], again)
        assert s["client_bound"] == (not s["valid"])
        assert s["sent"] == s["requests"] == round(s["offered_rps"] * 1.5) and s["errors"] == 0
        assert s["client_cpu_per_request_ms"] == s["client_cpu_s"] / s["sent"] * 1e3
    assert r["invalid_steps"] == [s["step"] for s in r["steps"] if not s["valid"]]


# ------------------------------------------------------------------ the rules, each on its own


def step(offered=100.0, sent_rps=100.0, cpu=0.3, cores=1.0, sent=100, failed=0, srv_p50=None, ttft_p50=None,
         role="local", missing=()):
    return {"offered_rps": offered, "sent_rps": sent_rps, "sent": sent, "failed": failed,
            "server_latency_p50_ms": srv_p50, "ttft_p50_ms": ttft_p50,
            "client": {"processes": [{"role": role, "index": 0, "cpu": cpu, "cores": cores}],
                       "missing_workers": list(missing)}}


def validity(s, idle=None):
    return rules.step_validity(s, idle or {"server_ms": 10.0, "ttft_ms": 12.0}, rate_tolerance=0.1,
                               max_error_rate=0.0)


def test_cpu_rule_uses_the_share_of_the_cores_the_process_may_use():
    assert validity(step(cpu=0.5)) == (True, None)
    ok, why = validity(step(cpu=0.95))
    assert not ok and "95% of its 1 usable core" in why
    ok, why = validity(step(cpu=0.46, cores=0.5))     # a pod limited to half a core: 92% of what it has
    assert not ok and "92%" in why
    ok, why = validity(step(cpu=0.95, role="worker"))
    assert not ok and "worker 0" in why
    master = step(cpu=0.2)
    master["client"]["processes"].append({"role": "master", "index": 0, "cpu": 0.99, "cores": 1.0})
    assert validity(master) == (True, None)            # the master steers; it sends nothing
    ok, why = validity(step(missing=[1]))
    assert not ok and "worker(s) 1 did not report" in why


def test_rate_rule_needs_flat_server_latency():
    short = dict(offered=100.0, sent_rps=60.0)
    ok, why = validity(step(**short, srv_p50=12.0))                       # flat: the client fell behind
    assert not ok and "sent 60 < offered 100" in why and "server's own time" in why
    assert validity(step(**short, srv_p50=400.0)) == (True, None)          # queueing: the server's limit
    ok, why = validity(step(**short, ttft_p50=15.0), {"ttft_ms": 12.0})    # no server timing: TTFT stands in
    assert not ok and "time to first token" in why
    assert validity(step(**short, srv_p50=12.0, failed=30)) == (True, None)  # refusals explain the shortfall
    assert validity(step(sent_rps=95.0, srv_p50=12.0)) == (True, None)     # within the rate tolerance


@pytest.mark.server  # tier: the inference server as a process
def test_invalid_passing_steps_give_no_capacity(tmp_path):
    """The real server and a search it would pass at 1 and 2 req/s; with the CPU threshold at 0
    every step is over it, so the search must stop at the first one and report no capacity."""
    url, proc = start_process("inference_server.py", tmp_path, "--device", "cpu", "--threads", "1", "--model", "tiny")
    try:
        r = run_loadgen("--url", url, "--rates", "1:2", "--step-s", "2", "--drain-s", "20", "--users", "4",
                        "--input-tokens", "16", "--output-tokens", "8", "--slo-ttft-ms", "5000",
                        "--slo-tpot-ms", "1000", "--client-cpu-threshold", "0", "--wait-ready", "120")
    finally:
        stop_process(proc)
    s = r["steps"][0]
    assert s["slo_met"] is True and s["valid"] is False and "client saturated" in s["invalid_reason"]
    assert len(r["steps"]) == 1, "the search went on past an invalid step"
    assert r["capacity_rps"] is None and r["max_passing_rps"] is None and r["at_capacity"] is None
    assert r["bound_by"] == "client" and r["invalid_steps"] == [0]


def test_the_client_cores_never_exceed_one():
    c = rules.usable_cores()
    assert 0 < c["cores"] <= 1 and c["cores"] <= c["affinity_cpus"]
    if c["cgroup_quota_cpus"]:
        assert c["cores"] <= c["cgroup_quota_cpus"]

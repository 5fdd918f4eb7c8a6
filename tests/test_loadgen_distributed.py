"""locust's distributed mode: a master and N worker processes that together offer one schedule,
the worker count sized from a measured per-core rate, and the pods that do the same in a cluster.

Everything runs on 127.0.0.1: the real inference server (tiny model, CPU) or ``loadstub.py``,
``loadgen.py`` as the locust master, its workers as separate processes. The counts are
checked three ways: what the master recorded per worker and step, what each worker process
says it sent when it exits, and what the server says it answered.
"""

import json
import math
import socket
import subprocess
import sys
import urllib.request

import pytest

from gpuproof.bench import loadpods
from gpuproof.bench import workloads as wl
from gpuproof.bench.workloads import WORKLOADS_DIR, import_workload

rules = import_workload("loadclient")
from loadprocs import ENV, last_json, start_process, stop_process, wait_until  # noqa: E402
LABELS = {"app.kubernetes.io/managed-by": "gpuproof", "gpuproof.dev/run": "r1"}




def loadgen(*args, timeout=240, expect_rc=0):
    proc = subprocess.Popen([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == expect_rc, err[-3000:]
    r = last_json(out)
    r["_pid"], r["_log"] = proc.pid, err
    return r


def served_ok(url):
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return json.loads(resp.read())["ok"]



# ------------------------------------------------------------------ master + workers on loopback


@pytest.mark.server  # tier: a server and loadgens as processes
def test_master_and_workers_share_one_schedule_and_the_counts_add_up(tmp_path):
    url, server = start_process("inference_server.py", tmp_path, "--device", "cpu", "--threads", "1",
                                "--model", "tiny")
    try:
        wait_until(lambda: urllib.request.urlopen(url + "/health", timeout=2).status == 200, 120, "the server")
        before = served_ok(url)
        r = loadgen("--url", url, "--workers", 2, "--rates", "3,6", "--step-s", 2, "--drain-s", 20, "--users", 8,
                    "--input-tokens", 16, "--output-tokens", 8, "--slo-ttft-ms", 5000, "--slo-tpot-ms", 1000)
        answered = served_ok(url) - before
    finally:
        stop_process(server)
    lc = r["load_client"]
    assert lc["mode"] == "distributed" and lc["workers"] == 2 and lc["master_port"]
    # two worker processes, neither of them the master, each saying so when it exited
    seen = lc["workers_seen"]
    assert len({w["pid"] for w in seen}) == 2 and r["_pid"] not in {w["pid"] for w in seen}
    ends = lc["worker_processes"]
    assert [w["exit_code"] for w in ends] == [0, 0] and {w["workload"] for w in ends} == {"loadgen-worker"}
    assert {w["pid"] for w in ends} == {w["pid"] for w in seen}
    assert all(w["master"] == f"127.0.0.1:{lc['master_port']}" for w in ends)
    # per step: every request of the schedule was sent once, the workers split it evenly
    for s in r["steps"]:
        n = round(s["offered_rps"] * 2)
        workers = [p for p in s["client"]["processes"] if p["role"] == "worker"]
        assert [p["index"] for p in workers] == [0, 1] and s["client"]["senders"] == 2
        assert sum(p["sent"] for p in workers) == s["sent"] == s["requests"] == n
        assert sorted(p["sent"] for p in workers) == [n // 2, n - n // 2]
        assert all(p["cpu"] is not None and p["cores"] > 0 for p in workers)
        assert s["errors"] == 0 and s["ok"] == s["sent"], s["first_error"]   # whether the SLOs held is a figure
    # the workers' own totals, the master's records and the server all agree
    assert sum(w["sent"] for w in ends) == sum(s["sent"] for s in r["steps"]) == 6 + 12
    assert sum(w["answered_ok"] for w in ends) == sum(s["ok"] for s in r["steps"]) == answered


def test_auto_sizes_workers_from_the_measured_per_core_rate(stub):
    # a target far above what two workers can send: the measured rate asks for more, capped at 2
    r = loadgen("--url", stub, "--workers", "auto", "--calibrate-s", 1, "--target-rps", 1e6, "--max-workers", 2,
                "--rates", 20, "--step-s", 1, "--drain-s", 5, "--users", 8, "--input-tokens", 16,
                "--output-tokens", 8, "--metrics-path", "")
    lc = r["load_client"]
    cal, sizing = lc["calibration"], lc["sizing"]
    assert cal["per_core_rps"] == cal["requests"] / cal["client_cpu_s"] > 0 and cal["errors"] == 0
    assert cal["max_tokens"] == 8 and cal["token_gap_ms"] == 1.0        # answers shaped and paced like a server's
    # the stub counted the same requests, give or take those in flight at the window's two ends; its window runs
    # from before the client's to after it (a /stats read each side), so it may hold up to requests_around
    assert cal["requests"] - cal["users"] <= cal["stub_requests"] <= cal["requests_around"] + cal["users"]
    assert sizing["needed"] == math.ceil(1e6 / (cal["per_core_rps"] * rules.HEADROOM)) > 2
    assert lc["mode"] == "distributed" and lc["workers"] == 2 and sizing["capped"]
    assert len(lc["worker_processes"]) == 2 and r["steps"][0]["client"]["senders"] == 2
    # a target one process covers: one worker (a master steers it, so that more can join later)
    r = loadgen("--url", stub, "--workers", "auto", "--calibrate-s", 1, "--target-rps", 5, "--rates", 5,
                "--step-s", 1, "--drain-s", 5, "--users", 4, "--input-tokens", 16, "--output-tokens", 8,
                "--metrics-path", "")
    lc = r["load_client"]
    assert lc["sizing"]["needed"] == 1 and lc["workers"] == 1 and lc["mode"] == "distributed"
    assert [p["role"] for p in r["steps"][0]["client"]["processes"]] == ["master", "worker"]


def test_auto_resizes_from_the_previous_steps_cpu_per_request(stub):
    """The first step runs on the one worker the given per-core rate asks for; the second is sized from
    the CPU that worker spent per request in the first. With a headroom of 0.001 any real cost (a
    streamed request costs the client far more than 0.05 ms) asks for more than one worker at 10 req/s,
    so a second worker joins, up to --max-workers 2, and the two split the second step's schedule."""
    r = loadgen("--url", stub, "--workers", "auto", "--per-core-rps", 1e6, "--headroom", 0.001, "--max-workers", 2,
                "--rates", "5,10", "--step-s", 1, "--drain-s", 5, "--users", 8, "--input-tokens", 16,
                "--output-tokens", 8, "--metrics-path", "")
    first, second = r["steps"]
    assert first["client_sizing"] is None and first["client"]["senders"] == 1
    sizing = second["client_sizing"]
    assert sizing["cpu_per_request_ms"] == first["client_cpu_per_request_ms"] > 0
    assert sizing["before"] == 1 and sizing["senders"] == 2 and sizing["needed"] > 2 and sizing["short"]
    workers = [p for p in second["client"]["processes"] if p["role"] == "worker"]
    assert [p["index"] for p in workers] == [0, 1] and sum(p["sent"] for p in workers) == second["sent"] == 10
    assert r["load_client"]["workers"] == 2 and len(r["load_client"]["worker_processes"]) == 2


def test_sizing_rule():
    assert rules.size_workers(1000, 500, headroom=1.0)["workers"] == 2
    assert rules.size_workers(1000, 500, headroom=0.7)["workers"] == 3          # 1000 / 350 = 2.86
    assert rules.size_workers(1000, 5000)["workers"] == 1
    assert rules.size_workers(3500, 500, headroom=1.0)["workers"] == 7          # exact multiple: no extra worker
    capped = rules.size_workers(1e6, 100, max_workers=4)
    assert capped["workers"] == 4 and capped["capped"] and capped["needed"] == math.ceil(1e6 / 70)
    assert "capped at 4" in capped["rule"]
    with pytest.raises(ValueError, match="per_core_rps must be > 0"):
        rules.size_workers(100, 0)
    assert loadpods.size_workers(1000, 500, 0.5)["workers"] == 4                 # gpuproof uses the same rule


def test_master_port_in_use_is_a_clear_error(stub):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = loadgen("--url", stub, "--workers", 2, "--master-port", port, "--rates", 5, "--step-s", 1,
                    "--metrics-path", "", timeout=60, expect_rc=2)
    assert r["ok"] is False and f"port {port} is already in use" in r["error"]


# ------------------------------------------------------------------ the same in a cluster: pods


def test_cluster_pods_are_one_master_and_n_workers():
    args = ["--rates", "1:1024", "--users", "512", "--workers", "auto", "--target-rps", "800", "--output-tokens",
            "128", "--headroom", "0.7", "--no-ignore-eos"]
    svc, master, job = loadpods.distributed_manifests("infer-h100", "http://infer-h100.ns.svc:8000", args, 3,
                                                      labels=LABELS, namespace="ns")
    cmd = master["spec"]["containers"][0]["command"]
    assert cmd[:2] == ["python", "/gpuproof/workloads/loadgen.py"]
    assert cmd[cmd.index("--expect-workers") + 1] == "3" and "--master" in cmd and "--no-ignore-eos" in cmd
    assert cmd[cmd.index("--master-port") + 1] == str(loadpods.MASTER_PORT)
    assert "--workers" not in cmd and "--target-rps" not in cmd and "--headroom" not in cmd   # sizing is done
    assert cmd[cmd.index("--rates") + 1] == "1:1024" and cmd[cmd.index("--users") + 1] == "512"
    assert svc["kind"] == "Service" and svc["metadata"]["name"] == "infer-h100-master"
    assert svc["spec"]["selector"] == {k: v for k, v in master["metadata"]["labels"].items()
                                       if k.startswith("gpuproof.dev/") and k != "gpuproof.dev/run"}
    assert svc["spec"]["ports"][0]["port"] == loadpods.MASTER_PORT
    assert job["kind"] == "Job" and job["spec"]["parallelism"] == job["spec"]["completions"] == 3
    pod = job["spec"]["template"]["spec"]
    wcmd = pod["containers"][0]["command"]
    assert "--worker" in wcmd and wcmd[wcmd.index("--master-host") + 1] == "infer-h100-master.ns.svc"
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1"}}
    assert "nodeSelector" not in pod and "tolerations" not in pod          # no GPU for the client
    for obj in (svc, master, job):
        assert LABELS.items() <= obj["metadata"]["labels"].items()
    assert LABELS.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    cal = loadpods.calibration_pod("infer-h100-cal", args, labels=LABELS, namespace="ns")
    ccmd = cal["spec"]["containers"][0]["command"]
    assert "--calibrate-only" in ccmd and ccmd[ccmd.index("--target-rps") + 1] == "800"
    assert ccmd[ccmd.index("--output-tokens") + 1] == "128" and "--workers" not in ccmd
    assert cal["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "1"}   # the size of one worker
    with pytest.raises(ValueError, match="at most 50 characters"):
        loadpods.distributed_manifests("x" * 51, "http://a", [], 2, labels=LABELS, namespace="ns")


def test_configmap_ships_the_distributed_mode_files():
    data = wl.configmap(labels=LABELS, namespace="ns", include_pynvml=False)["data"]
    assert {"loadgen.py", "locustfile.py", "loadclient.py", "loadstub.py"} <= set(data)

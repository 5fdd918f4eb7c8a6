"""Figure: the load generator's requests per second per CPU core, against wrk, same endpoint.

Starts ``workloads/inference_server.py`` on 127.0.0.1 (a free port) pinned to one core,
then drives the same endpoint, pinned to another core, with

- ``workloads/loadgen.py`` unthrottled (``--rates 0 --users U``: locust FastHttpUser,
  every request timed by our own code), and
- ``wrk -t1 -cU -dD`` (a Lua script for the POST body), and
- bare locust: a FastHttpUser with ``wait_time = constant(0)`` and nothing else (no
  per-request recording), to show what our recording adds on top of locust,

and reports for each: requests, achieved req/s, the generator's CPU seconds (from
getrusage of the child) and requests per CPU-second ("per core"). Endpoints: ``GET
/healthz`` (cheapest) and ``POST /infer`` (the model). Loopback only.

    python benchmarks/loadgen_vs_wrk.py --seconds 10 --users 32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WL = REPO / "workloads"
sys.path.append(str(WL))

from workload_common import wait_until  # noqa: E402


def child_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def pinned(cpu: int | None):
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, {cpu})


def run_loadgen(url: str, path: str, get: bool, seconds: float, users: int, cpu: int | None) -> dict:
    cmd = [sys.executable, str(WL / "loadgen.py"), "--url", url, "--rates", "0", "--users", str(users),
           "--step-s", str(seconds), "--path", path, "--slo-p99-ms", "1000"] + (["--get"] if get else [])
    c0 = child_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pinned(cpu), timeout=seconds + 120)
    cpu_s = child_cpu() - c0
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    n = r["overall"]["requests"]
    return {"tool": "gpuproof loadgen (locust FastHttpUser)", "requests": n, "rps": n / r["elapsed_s"],
            "cpu_s_process": cpu_s, "cpu_s_load_only": r["loadgen_cpu_s"],
            "rps_per_core": n / cpu_s, "rps_per_core_load_only": r["rps_per_core"],
            "p99_ms": r["overall"]["p99_ms"], "errors": r["overall"]["errors"]}


RAW_LOCUST = """
import locust, sys, time, resource, json, gevent
from locust import FastHttpUser, task, constant
from locust.env import Environment
url, path, seconds, users, get = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
body = json.dumps({"inputs": [[0.1] * 256]})
class U(FastHttpUser):
    wait_time = constant(0)
    @task
    def t(self):
        if get:
            self.client.get(path)
        else:
            self.client.post(path, data=body, headers={"Content-Type": "application/json"})
env = Environment(user_classes=[U], host=url)
r = env.create_local_runner()
t0 = time.perf_counter()
r.start(users, spawn_rate=users)
gevent.sleep(seconds)
el = time.perf_counter() - t0
r.quit()
t = env.stats.total
print(json.dumps({"requests": t.num_requests, "elapsed": el, "errors": t.num_failures,
                  "p99_ms": t.get_response_time_percentile(0.99)}))
"""


def run_raw_locust(url: str, path: str, get: bool, seconds: float, users: int, cpu: int | None) -> dict:
    c0 = child_cpu()
    proc = subprocess.run([sys.executable, "-c", RAW_LOCUST, url, path, str(seconds), str(users), "1" if get else "0"],
                          capture_output=True, text=True, preexec_fn=pinned(cpu), timeout=seconds + 120)
    cpu_s = child_cpu() - c0
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tool": "bare locust FastHttpUser (no recording)", "requests": r["requests"],
            "rps": r["requests"] / r["elapsed"], "cpu_s_process": cpu_s, "rps_per_core": r["requests"] / cpu_s,
            "p99_ms": float(r["p99_ms"]), "errors": r["errors"]}


def run_wrk(url: str, path: str, body: str | None, seconds: float, users: int, cpu: int | None) -> dict:
    cmd = ["wrk", "-t1", f"-c{users}", f"-d{int(seconds)}s", "--latency"]
    tmp = None
    if body is not None:
        tmp = tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False)
        tmp.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                  f"wrk.body = {json.dumps(body)}\n")
        tmp.close()
        cmd += ["-s", tmp.name]
    cmd.append(url + path)
    c0 = child_cpu()
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=pinned(cpu), timeout=seconds + 60)
    cpu_s = child_cpu() - c0
    if tmp:
        os.unlink(tmp.name)
    out = proc.stdout
    n = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s*([\d.]+)", out).group(1))
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    p99_ms = float(p99.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[p99.group(2)] if p99 else None
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"tool": "wrk 4.1 (-t1)", "requests": n, "rps": rps, "cpu_s_process": cpu_s,
            "rps_per_core": n / cpu_s if cpu_s else None, "p99_ms": p99_ms,
            "errors": int(errors.group(1)) if errors else 0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--users", type=int, default=8, help="concurrent users / wrk connections (default 8)")
    p.add_argument("--server-cpu", type=int, default=0)
    p.add_argument("--client-cpu", type=int, default=1)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not shutil.which("wrk"):
        print("wrk is not installed (Debian/Ubuntu: apt-get install -y wrk)", file=sys.stderr)
        return 2
    ncpu = os.cpu_count() or 1
    scpu = args.server_cpu if args.server_cpu < ncpu else None
    ccpu = args.client_cpu if args.client_cpu < ncpu else None
    with tempfile.TemporaryDirectory() as tmp:
        port_file = os.path.join(tmp, "port")
        server = subprocess.Popen(
            [sys.executable, str(WL / "inference_server.py"), "--device", "cpu", "--threads", "1", "--host",
             "127.0.0.1", "--port", "0", "--port-file", port_file, "--sample-hz", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, preexec_fn=pinned(scpu))
        try:
            port = int(wait_until(lambda: os.path.exists(port_file) and open(port_file).read().strip(), 60,
                                  "the server's port file"))
            url = f"http://127.0.0.1:{port}"
            wait_until(lambda: urllib.request.urlopen(url + "/healthz", timeout=2).status == 200, 120,
                       f"{url}/healthz to answer 200")
            body = json.dumps({"inputs": [[0.1] * 256]})
            rows = []
            for path, get in (("/healthz", True), ("/infer", False)):
                for tool in ("loadgen", "locust", "wrk"):
                    if tool == "loadgen":
                        r = run_loadgen(url, path, get, args.seconds, args.users, ccpu)
                    elif tool == "locust":
                        r = run_raw_locust(url, path, get, args.seconds, args.users, ccpu)
                    else:
                        r = run_wrk(url, path, None if get else body, args.seconds, args.users, ccpu)
                    r["endpoint"] = ("GET " if get else "POST ") + path
                    rows.append(r)
                    print(f"{r['endpoint']:14} {r['tool']:40} {r['rps']:9.0f} req/s  {r['rps_per_core']:9.0f} "
                          f"req/CPU-s  p99 {r['p99_ms']} ms  errors {r['errors']}", file=sys.stderr)
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=30)
    print(f"\n{ncpu} CPUs; server pinned to CPU {scpu}, generators to CPU {ccpu}; {args.users} users/connections, "
          f"{args.seconds:g}s per run\n")
    print("| endpoint | generator | requests | req/s | generator CPU s (whole process) | req per CPU-second | "
          "req per CPU-second, load phase only | p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        load_only = r.get("rps_per_core_load_only")
        print(f"| {r['endpoint']} | {r['tool']} | {r['requests']} | {r['rps']:.0f} | {r['cpu_s_process']:.2f} | "
              f"{r['rps_per_core']:.0f} | {f'{load_only:.0f}' if load_only else '-'} | {r['p99_ms']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

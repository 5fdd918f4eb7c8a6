"""Figures: what one locust worker of gpuproof's load generator costs per request, and how the
distributed mode scales from 1 to 4 workers.

Every generator drives the same loopback endpoint, ``workloads/loadstub.py`` (one asyncio
process that streams ``--tokens`` SSE events per request from prebuilt bytes and computes
nothing), with the same request: ``POST /v1/completions`` with a 64-word prompt,
``"stream": true`` and ``max_tokens = --tokens``. The generators:

- ``gpuproof worker``: ``loadgen.py --master --expect-workers 1`` and one
  ``loadgen.py --worker``, one open-loop step offered far above what it can send, so the
  worker runs flat out (with its per-request records: TTFT, inter-token gaps, schedule lag);
- ``bare locust``: ``locust --headless`` with a FastHttpUser whose one task posts the same
  body and reads the whole answer (no parsing, no records, no schedule);
- ``wrk``: ``wrk -t1 -c<users>`` with a Lua script that posts the same body.

Each runs ``--warm-s`` seconds before a ``--seconds`` window; in the window the stub's own
counter gives the requests (so every generator is counted the same way), and
``/proc/<pid>/stat`` (utime + stime of all threads) the CPU of the generator processes and
of the stub. "req per CPU-second" = requests in the window / generator CPU seconds in it.
The scaling part runs the master with 1, 2, 3, 4 workers the same way and adds up the
workers' CPU; the master's own CPU comes from its step record (it steers, it does not send).
Rounds alternate the generators; the tables give the median over ``--rounds``.

    apt-get install -y wrk
    .venv/bin/python benchmarks/load_client.py --tokens 16 --users 32 --seconds 8 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ROOT / "workloads"
PY = sys.executable
TICK = os.sysconf("SC_CLK_TCK")
PROMPT = " ".join(["the quick brown fox jumps over a lazy dog"] * 8)[:400]

BARE_LOCUSTFILE = '''
from locust import FastHttpUser, task, constant

BODY = {body!r}


class Bare(FastHttpUser):
    wait_time = constant(0)

    @task
    def complete(self):
        self.client.post("/v1/completions", data=BODY, headers={{"Content-Type": "application/json"}})
'''

WRK_LUA = '''
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
'''


def cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def stub_stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/stats", timeout=10) as resp:
        return json.loads(resp.read())


def wait_for(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stub:
    def __init__(self, tmp: str):
        pf = os.path.join(tmp, "stub.port")
        self.proc = subprocess.Popen([PY, str(WORKLOADS / "loadstub.py"), "--port", "0", "--port-file", pf],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        port = wait_for(lambda: os.path.exists(pf) and open(pf).read().strip(), 30, "loadstub to listen")
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> dict:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out.splitlines()[-1])


def measure(stub: Stub, pids, warm_s: float, seconds: float, min_warm_requests: int = 200) -> dict:
    """The window: requests the stub served, CPU of ``pids`` (a callable giving the current list)."""
    r0 = stub_stats(stub.url)["requests"]
    wait_for(lambda: stub_stats(stub.url)["requests"] - r0 >= min_warm_requests, 60, "the generator to send")
    time.sleep(warm_s)                       # let it reach a steady rate; the window follows
    procs = pids()
    s0, c0 = stub_stats(stub.url), {p: cpu_s(p) for p in procs}
    sc0, t0 = cpu_s(stub.proc.pid), time.monotonic()
    time.sleep(seconds)                      # the measurement window itself
    s1, c1 = stub_stats(stub.url), {p: cpu_s(p) for p in procs}
    sc1, t1 = cpu_s(stub.proc.pid), time.monotonic()
    wall = t1 - t0
    reqs = s1["requests"] - s0["requests"]
    per = {p: c1[p] - c0[p] for p in procs}
    gen = sum(per.values())
    return {"requests": reqs, "wall_s": wall, "rps": reqs / wall, "gen_cpu_s": gen, "gen_cores": gen / wall,
            "per_process_cores": [v / wall for v in per.values()],
            "req_per_cpu_s": reqs / gen if gen > 0 else None, "stub_cores": (sc1 - sc0) / wall,
            "load_avg_1m": os.getloadavg()[0]}


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            out += [int(x) for x in open(f"/proc/{pid}/task/{task}/children").read().split()]
        except OSError:
            pass
    return out


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_workers(stub: Stub, n: int, args, tmp: str) -> dict:
    """loadgen master (started here with --master) + n workers we start; flat-out open-loop step."""
    port = free_port()
    step_s = args.warm_s + args.seconds + 10
    master = subprocess.Popen(
        [PY, str(WORKLOADS / "loadgen.py"), "--url", stub.url, "--master", "--expect-workers", str(n),
         "--master-bind-host", "127.0.0.1", "--master-port", str(port), "--rates", str(args.offered_rps),
         "--step-s", str(step_s), "--drain-s", "1", "--users", str(args.users * n), "--output-tokens",
         str(args.tokens), "--input-tokens", "64", "--metrics-path", "", "--max-steps", "1",
         "--health-path", "/health"],
        stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, f"master{n}.err"), "w"), text=True)
    workers = [subprocess.Popen([PY, str(WORKLOADS / "loadgen.py"), "--worker", "--master-port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(n)]
    try:
        m = measure(stub, lambda: [w.pid for w in workers], args.warm_s, args.seconds)
        out, _ = master.communicate(timeout=step_s + 120)
        result = json.loads(out.splitlines()[-1])
        step = result["steps"][0]
        m["worker_cpu_in_step"] = [p["cpu"] for p in step["client"]["processes"] if p["role"] == "worker"]
        m["master_cpu_in_step"] = next(p["cpu"] for p in step["client"]["processes"] if p["role"] == "master")
        m["step_valid"], m["invalid_reason"] = step["valid"], step["invalid_reason"]
    finally:
        stop(master)
        for w in workers:
            stop(w)
    return m


def run_bare_locust(stub: Stub, args, tmp: str) -> dict:
    body = json.dumps({"prompt": PROMPT, "max_tokens": args.tokens, "stream": True, "ignore_eos": True})
    lf = os.path.join(tmp, "bare_locustfile.py")
    Path(lf).write_text(BARE_LOCUSTFILE.format(body=body))
    locust = shutil.which("locust", path=str(Path(PY).parent)) or "locust"
    proc = subprocess.Popen([locust, "-f", lf, "--headless", "-u", str(args.users), "-r", str(args.users),
                             "-t", f"{int(args.warm_s + args.seconds + 30)}s", "--host", stub.url,
                             "--only-summary", "--loglevel", "WARNING"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return measure(stub, lambda: [proc.pid], args.warm_s, args.seconds)
    finally:
        stop(proc)


def run_wrk(stub: Stub, args, tmp: str) -> dict:
    body = json.dumps({"prompt": PROMPT, "max_tokens": args.tokens, "stream": True, "ignore_eos": True})
    lua = os.path.join(tmp, "post.lua")
    Path(lua).write_text(WRK_LUA.format(body=json.dumps(body)))
    proc = subprocess.Popen(["wrk", "-t1", f"-c{args.users}", f"-d{int(args.warm_s + args.seconds + 30)}s",
                             "-s", lua, stub.url + "/v1/completions"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return measure(stub, lambda: [proc.pid], args.warm_s, args.seconds)
    finally:
        stop(proc)


def calibration(args) -> dict:
    """loadgen's own calibration figure (what --workers auto sizes from), with whole answers like the
    generators here get (``--calibrate-token-gap-ms 0``; its default streams tokens 1 ms apart)."""
    out = subprocess.run([PY, str(WORKLOADS / "loadgen.py"), "--calibrate-only", "--output-tokens", str(args.tokens),
                          "--input-tokens", "64", "--calibrate-users", str(args.users), "--calibrate-token-gap-ms",
                          "0", "--calibrate-s", str(args.seconds)],
                         capture_output=True, text=True, timeout=300)
    return json.loads(out.stdout.splitlines()[-1])["calibration"]


def med(rows: list[dict], key: str):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=16, help="SSE events (max_tokens) per answer (default 16)")
    p.add_argument("--users", type=int, default=32, help="concurrent users / connections per generator (default 32)")
    p.add_argument("--seconds", type=float, default=8.0, help="measurement window (default 8)")
    p.add_argument("--warm-s", type=float, default=2.0, help="warm-up before the window (default 2)")
    p.add_argument("--rounds", type=int, default=3, help="rounds, generators alternating (default 3)")
    p.add_argument("--offered-rps", type=float, default=20000, help="open-loop offer to the workers (default 20000)")
    p.add_argument("--max-workers", type=int, default=4, help="scaling: 1..this many workers (default 4)")
    p.add_argument("--skip", default="", help="comma list of parts to skip: compare,scaling,calibration")
    p.add_argument("--json", default="", help="also write all raw rows here")
    args = p.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    if not shutil.which("wrk") and "compare" not in skip:
        print("wrk is not installed (apt-get install -y wrk)", file=sys.stderr)
        return 2
    locust_version = subprocess.run([PY, "-c", "import locust; print(locust.__version__)"], capture_output=True,
                                    text=True).stdout.strip()
    env = {"python": sys.version.split()[0], "cpus": os.cpu_count(), "machine": platform.machine(),
           "kernel": platform.release(), "locust": locust_version,
           "wrk": (subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("\n")[0].strip()
                   if shutil.which("wrk") else None)}
    print(json.dumps({"env": env, "args": vars(args)}), flush=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="gpuproof-loadbench-") as tmp:
        stub = Stub(tmp)
        try:
            for rnd in range(args.rounds):
                if "compare" not in skip:
                    for name, fn in (("gpuproof worker", lambda: run_workers(stub, 1, args, tmp)),
                                     ("bare locust FastHttpUser", lambda: run_bare_locust(stub, args, tmp)),
                                     ("wrk -t1", lambda: run_wrk(stub, args, tmp))):
                        row = {"part": "compare", "generator": name, "round": rnd, **fn()}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                if "scaling" not in skip:
                    for n in range(1, args.max_workers + 1):
                        row = {"part": "scaling", "workers": n, "round": rnd, **run_workers(stub, n, args, tmp)}
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                if "calibration" not in skip:
                    cal = calibration(args)
                    row = {"part": "calibration", "round": rnd, **cal}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            stub_summary = stub.close()
    print(json.dumps({"stub": stub_summary}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "args": vars(args), "rows": rows}, indent=1))

    print(f"\n{args.tokens} SSE events per answer, {args.users} users/connections per generator, "
          f"{args.seconds:g}s windows, median of {args.rounds} rounds\n")
    cmp_rows = [r for r in rows if r["part"] == "compare"]
    if cmp_rows:
        print("| generator | req/s | generator CPU (cores) | req per CPU-second | stub CPU (cores) |")
        print("|---|---|---|---|---|")
        for g in ("gpuproof worker", "bare locust FastHttpUser", "wrk -t1"):
            rs = [r for r in cmp_rows if r["generator"] == g]
            print(f"| {g} | {med(rs, 'rps'):.0f} | {med(rs, 'gen_cores'):.2f} | {med(rs, 'req_per_cpu_s'):.0f} | "
                  f"{med(rs, 'stub_cores'):.2f} |")
    cal_rows = [r for r in rows if r["part"] == "calibration"]
    if cal_rows:
        print(f"\nloadgen --calibrate-only: {med(cal_rows, 'per_core_rps'):.0f} requests per CPU-second "
              f"(at {med(cal_rows, 'client_cpu'):.0%} CPU; stub {med(cal_rows, 'stub_cpu'):.2f} cores)")
    sc = [r for r in rows if r["part"] == "scaling"]
    if sc:
        base = med([r for r in sc if r["workers"] == 1], "rps")
        print("\n| workers | req/s | x 1 worker | workers' CPU (cores) | per worker (cores) | req per CPU-second "
              "| master CPU (cores) | stub CPU (cores) | steps valid |")
        print("|---|---|---|---|---|---|---|---|---|")
        for n in sorted({r["workers"] for r in sc}):
            rs = [r for r in sc if r["workers"] == n]
            rps = med(rs, "rps")
            print(f"| {n} | {rps:.0f} | {rps / base:.2f} | {med(rs, 'gen_cores'):.2f} | "
                  f"{med(rs, 'gen_cores') / n:.2f} | {med(rs, 'req_per_cpu_s'):.0f} | "
                  f"{med(rs, 'master_cpu_in_step') or 0:.3f} | {med(rs, 'stub_cores'):.2f} | "
                  f"{sum(1 for r in rs if r['step_valid'])}/{len(rs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

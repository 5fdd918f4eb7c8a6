"""Who sends a step's requests: this process (:class:`LocalSender`) or a locust master steering worker processes or
pods (:class:`MasterSender`, and :func:`worker_main` on the workers' side), both a :class:`Sender`; and the
calibration of this client's requests per CPU-second against loadstub.py. Part of loadgen.py."""

from __future__ import annotations

import locustfile  # noqa: F401  (first: imports locust, which monkey-patches the standard library)

import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time

import gevent
from gevent.event import Event
from locust.env import Environment

import loadclient
import workload_common as common
from loadgen_server import _get
from locustfile import PLAN, InferenceUser

HERE = os.path.dirname(os.path.abspath(__file__))


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _wait(pred, timeout: float, what: str, interval: float = 0.05):
    return common.wait_until(pred, timeout, what, interval=interval)


def _collect(idx: int) -> list[dict]:
    """The records of step ``idx`` (records of earlier steps that came in late are dropped)."""
    recs = [r for r in PLAN.records if r["step"] == idx]
    PLAN.records = []
    return recs


def _run_share(idx: int, rate: float, step_s: float, drain_s: float, lead_s: float,
               share: tuple[int, int] = (0, 1)) -> tuple[float, list[dict]]:
    """Send this process's share of one step; wait for its answers (at most ``drain_s``)."""
    t0 = PLAN.begin_step(idx, rate, step_s, lead_s=lead_s, share=share)
    PLAN.step_done.wait(timeout=max(0.0, t0 + step_s + drain_s - time.perf_counter()))
    PLAN.end_step()
    return t0, _collect(idx)


def _proc(role: str, index: int, cpu_s: float, wall_s: float, cores: dict, recs: list[dict] | None,
          pid: int | None = None, host: str | None = None) -> dict:
    p = {"role": role, "index": index, "pid": pid or os.getpid(), "host": host or socket.gethostname(),
         "cpu_s": cpu_s, "wall_s": wall_s, "cpu": cpu_s / wall_s if wall_s > 0 else None,
         "cores": cores.get("cores") or 1.0}
    if recs is not None:
        p.update(sent=len(recs), ok=sum(1 for r in recs if r["ok"]))
    return p


class Sender:
    """What the search sends a step through: locust's users started once, then one step at a time (its records,
    the CPU of every process that sent, workers that did not report), whether locust warned of its own CPU, quit.

    ``mode`` names it in the result; ``grows`` is true where more load processes can join between steps."""

    mode = ""
    grows = False
    workers = 1
    cpu_warning_flag = ""     # the locust runner's attribute set once it warned of the CPU

    def __init__(self, args, base: str):
        self.args = args
        self.cores = loadclient.usable_cores()
        self.env = Environment(user_classes=[InferenceUser], host=base)

    def starting(self, users: int) -> str:
        return f"{users} locust users to start"

    def start(self, users: int) -> None:
        self.runner.start(users, spawn_rate=max(100.0, float(users)))
        _wait(lambda: self.runner.user_count >= users, 60, self.starting(users))

    def run_step(self, idx: int, rate: float, step_s: float) -> dict:
        raise NotImplementedError

    def cpu_warning(self) -> bool:
        return bool(getattr(self.runner, self.cpu_warning_flag, False))

    def quit(self) -> dict:
        self.runner.quit()
        return {}


class LocalSender(Sender):
    """Sends from this process (locust's LocalRunner)."""

    mode = "local"
    cpu_warning_flag = "cpu_warning_emitted"

    def __init__(self, args, base: str):
        super().__init__(args, base)
        self.runner = self.env.create_local_runner()
        self.workers = 1

    def run_step(self, idx: int, rate: float, step_s: float) -> dict:
        a = self.args
        cpu0, w0 = _cpu_s(), time.perf_counter()
        t0, recs = _run_share(idx, rate, step_s, a.drain_s, lead_s=_lead(a, idx, 0.05))
        cpu1, w1 = _cpu_s(), time.perf_counter()
        return {"t0": t0, "n": max(1, round(rate * step_s)), "records": recs, "wall_s": w1 - w0,
                "processes": [_proc("local", 0, cpu1 - cpu0, w1 - w0, self.cores, recs)], "missing": []}


class MasterSender(Sender):
    """A locust master: N worker processes (local ones it starts, or pods) send, it only steers.

    Messages (locust's custom messages over its ZeroMQ link): worker -> ``gp_hello`` (pid, host,
    cores) once its handlers are in place; master -> ``gp_config`` (what to send), then per step
    ``gp_step`` (step, rate, its share i of N, lead time); worker -> ``gp_step_done`` (its
    records with send times relative to its step start, its CPU seconds and wall time)."""

    mode = "distributed"
    cpu_warning_flag = "worker_cpu_warning_emitted"

    def __init__(self, args, base: str, workers: int, bind_host: str, port: int, spawn_local: bool):
        super().__init__(args, base)
        self.workers = workers
        self.runner = self.env.create_master_runner(bind_host, port)
        self.port = self.runner.server.port
        self.hello: dict[str, dict] = {}
        self.reports: dict[int, dict[str, dict]] = {}
        self.expect: tuple[int, set] | None = None
        self.all_in = Event()
        self.runner.register_message("gp_hello", self._on_hello)
        self.runner.register_message("gp_step_done", self._on_done)
        self.local: list[tuple[subprocess.Popen, str]] = []
        self.tmp = tempfile.TemporaryDirectory(prefix="gpuproof-loadgen-") if spawn_local else None
        self.grows = spawn_local          # local workers: more can be started between steps
        self.cfg: dict | None = None
        self.configured: set[str] = set()
        for i in range(workers if spawn_local else 0):
            self._spawn(i)
        common.log(f"locust master on {bind_host}:{self.port}, expecting {workers} workers"
                   + (" (started here)" if spawn_local else ""))

    def _spawn(self, i: int) -> None:
        out = os.path.join(self.tmp.name, f"worker{i}")
        cmd = [sys.executable, os.path.join(HERE, "loadgen.py"), "--worker", "--master-host", "127.0.0.1",
               "--master-port", str(self.port)]
        with open(out + ".out", "w") as so, open(out + ".err", "w") as se:
            self.local.append((subprocess.Popen(cmd, stdout=so, stderr=se, stdin=subprocess.DEVNULL), out))

    def grow(self, workers: int, users: int) -> None:
        """Start local workers up to ``workers`` (between steps); locust spreads the users over them."""
        for i in range(self.workers, workers):
            self._spawn(i)
        self.workers = workers
        self.wait_workers(self.args.wait_workers_s)
        self.configure(self.cfg)
        _wait(lambda: self.runner.user_count >= users and len(self.runner.clients.running) >= workers, 60,
              f"{users} locust users on {workers} workers")

    def _on_hello(self, environment, msg, **kw) -> None:
        self.hello[msg.node_id] = msg.data

    def _on_done(self, environment, msg, **kw) -> None:
        step = msg.data["step"]
        self.reports.setdefault(step, {})[msg.node_id] = msg.data
        if self.expect and self.expect[0] == step and self.expect[1] <= set(self.reports[step]):
            self.all_in.set()

    def _dead_local(self) -> str | None:
        for p, out in self.local:
            if p.poll() is not None:
                err = open(out + ".err").read().strip().splitlines()[-5:]
                return f"local worker pid {p.pid} exited with status {p.returncode}: " + " | ".join(err)
        return None

    def wait_workers(self, timeout: float) -> None:
        def ready():
            dead = self._dead_local()
            if dead:
                raise RuntimeError(dead)
            return len(self.hello) >= self.workers

        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {self.workers} locust workers to "
                                   f"connect to the master on port {self.port} ({len(self.hello)} connected)")
            gevent.sleep(0.05)

    def configure(self, cfg: dict) -> None:
        """Tell the workers that have not heard it yet what to send."""
        self.cfg = cfg
        for cid in sorted(set(self.hello) - self.configured):
            self.runner.send_message("gp_config", cfg, client_id=cid)
            self.configured.add(cid)

    def starting(self, users: int) -> str:
        return f"{users} locust users to start on {self.workers} workers (started: {self.runner.user_count})"

    def run_step(self, idx: int, rate: float, step_s: float) -> dict:
        a = self.args
        ids = sorted(self.hello)
        self.all_in.clear()
        self.expect = (idx, set(ids))
        cpu0, w0 = _cpu_s(), time.perf_counter()
        lead = _lead(a, idx, 0.25)
        t0 = time.perf_counter() + lead
        for i, cid in enumerate(ids):
            self.runner.send_message("gp_step", {"step": idx, "rate": rate, "step_s": step_s, "drain_s": a.drain_s,
                                                 "lead_s": lead, "index": i, "of": len(ids)}, client_id=cid)
        self.all_in.wait(timeout=max(0.0, t0 + step_s + a.drain_s + 15.0 - time.perf_counter()))
        cpu1, w1 = _cpu_s(), time.perf_counter()
        got = self.reports.pop(idx, {})
        recs: list[dict] = []
        procs = [_proc("master", 0, cpu1 - cpu0, w1 - w0, self.cores, None)]
        missing = []
        for i, cid in enumerate(ids):
            d = got.get(cid)
            if d is None:
                missing.append(i)
                continue
            for r in d["records"]:
                r["sent"] = t0 + r.pop("sent_rel")
            recs += d["records"]
            procs.append(_proc("worker", i, d["cpu_s"], d["wall_s"], {"cores": d["cores"]}, d["records"],
                               pid=d["pid"], host=d["host"]))
        return {"t0": t0, "n": max(1, round(rate * step_s)), "records": recs, "wall_s": w1 - w0,
                "processes": procs, "missing": missing}

    def quit(self) -> dict:
        """Stop the workers (locust's quit message); the local ones' own summaries."""
        super().quit()
        summaries = []
        for p, out in self.local:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            lines = [x for x in open(out + ".out").read().splitlines() if x.strip().startswith("{")]
            err = open(out + ".err").read().strip().splitlines()[-8:]
            summary = json.loads(lines[-1]) if lines else {"ok": False, "error": "no JSON result: " + " | ".join(err)}
            summary["exit_code"] = p.returncode
            summaries.append(summary)
        if self.tmp:
            self.tmp.cleanup()
        return {"worker_processes": summaries, "workers_seen": [
            {"index": i, **self.hello[cid]} for i, cid in enumerate(sorted(self.hello))]}


def worker_main(args) -> int:
    """A locust worker: connects to the master, sends its share of each step, reports back."""
    cores = loadclient.usable_cores()
    env = Environment(user_classes=[InferenceUser])
    try:
        runner = env.create_worker_runner(args.master_host, args.master_port)
    except ConnectionError:
        return common.fail_usage(f"no locust master answered at {args.master_host}:{args.master_port}")
    totals = {"steps": 0, "sent": 0, "answered_ok": 0, "cpu_s": 0.0}

    def on_config(environment, msg, **kw):
        PLAN.configure(msg.data)
        environment.host = msg.data["url"]

    def on_step(environment, msg, **kw):
        d = msg.data
        cpu0, w0 = _cpu_s(), time.perf_counter()
        t0, recs = _run_share(d["step"], d["rate"], d["step_s"], d["drain_s"], d["lead_s"], (d["index"], d["of"]))
        cpu1, w1 = _cpu_s(), time.perf_counter()
        for r in recs:
            r["sent_rel"] = r.pop("sent") - t0
        totals.update(steps=totals["steps"] + 1, sent=totals["sent"] + len(recs),
                      answered_ok=totals["answered_ok"] + sum(1 for r in recs if r["ok"]),
                      cpu_s=totals["cpu_s"] + cpu1 - cpu0)
        runner.send_message("gp_step_done", {"step": d["step"], "records": recs, "cpu_s": cpu1 - cpu0,
                                             "wall_s": w1 - w0, "cores": cores["cores"], "pid": os.getpid(),
                                             "host": socket.gethostname()})

    runner.register_message("gp_config", on_config)
    runner.register_message("gp_step", on_step, concurrent=True)
    runner.send_message("gp_hello", {"pid": os.getpid(), "host": socket.gethostname(), **cores})
    common.log(f"locust worker {os.getpid()} connected to {args.master_host}:{args.master_port}")
    runner.greenlet.join()
    result = common.base_result("loadgen-worker")
    result.update(pid=os.getpid(), master=f"{args.master_host}:{args.master_port}", cores=cores, **totals,
                  ok=True)
    common.emit(result)
    return 0


def _lead(args, idx: int, default: float) -> float:
    """Seconds from now to the step's first send: ``default``, or for the first step until
    ``--start-epoch`` (when that is later), read from ``--start-epoch-file`` once it holds one."""
    if idx == 0 and getattr(args, "start_epoch_file", ""):
        args.start_epoch = start_epoch_from(args.start_epoch_file, args.wait_ready)
    if idx == 0 and args.start_epoch:
        return max(default, args.start_epoch - time.time())
    return default


def start_epoch_from(path: str, timeout: float) -> float:
    """The Unix time written into ``path`` by whoever starts this client, once it is there: a client
    that takes seconds to start can then be started first and sent off at a moment decided later.
    The file is read every 10 ms (a file has no watch here), for ``timeout`` seconds at most."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return float(text)
        except FileNotFoundError:
            pass
        except ValueError:
            raise SystemExit(f"loadgen: --start-epoch-file {path}: {text!r} is not a Unix time") from None
        if time.monotonic() >= deadline:
            raise SystemExit(f"loadgen: no start time in --start-epoch-file {path} after {timeout:.0f} s")
        time.sleep(0.01)


# ------------------------------------------------------------------ calibration: this client's rate per CPU-second


def calibrate(seconds: float, users: int, token_gap_ms: float = 1.0, warm_s: float = 1.0) -> dict:
    """Requests per CPU-second of this client (the same InferenceUser and records) against
    ``loadstub.py`` on 127.0.0.1, answers shaped like the real ones (PLAN's max_tokens), their
    tokens written ``token_gap_ms`` apart as a server streams them (so the client reads one event
    per socket read, as it will against the real server; whole answers at once cost it about a
    third less per request, which would oversize each worker).

    The stub gets far more tickets than the client can send, so the client runs flat out;
    requests finished in the window / this process's CPU seconds in it = the per-core rate.
    """
    with tempfile.TemporaryDirectory(prefix="gpuproof-calibrate-") as tmp:
        port_file = os.path.join(tmp, "port")
        stub = subprocess.Popen([sys.executable, os.path.join(HERE, "loadstub.py"), "--port", "0",
                                 "--port-file", port_file, "--token-gap-ms", str(token_gap_ms)],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, text=True)
        env = None
        try:
            port = _wait(lambda: os.path.exists(port_file) and open(port_file).read().strip(), 30,
                         "the calibration endpoint (loadstub.py) to listen")
            url = f"http://127.0.0.1:{port}"
            env = Environment(user_classes=[InferenceUser], host=url)
            runner = env.create_local_runner()
            runner.start(users, spawn_rate=max(100.0, float(users)))
            _wait(lambda: runner.user_count >= users, 60, f"{users} locust users to start")
            rate = 50_000.0
            idx = -1
            t_start = PLAN.begin_step(idx, rate, warm_s + seconds + 1.0, lead_s=0.0)
            gevent.sleep(warm_s)
            # the stub's counts are read around the client's window: requests that finish while a /stats read is
            # on its way (long on a busy machine) count for the stub only, so the client's count over the stub's
            # window (``requests_around``) is kept too
            around0 = PLAN.done.get(idx, 0)
            s0 = json.loads(_get(url + "/stats")[1])
            cpu0, w0, d0 = _cpu_s(), time.perf_counter(), PLAN.done.get(idx, 0)
            gevent.sleep(seconds)
            cpu1, w1, d1 = _cpu_s(), time.perf_counter(), PLAN.done.get(idx, 0)
            s1 = json.loads(_get(url + "/stats")[1])
            around1 = PLAN.done.get(idx, 0)
            PLAN.end_step()
            _wait(lambda: PLAN.inflight == 0, 30, "the calibration requests to finish")
            recs = _collect(idx)
            PLAN.done.pop(idx, None)
            runner.quit()
        finally:
            stub.terminate()
            try:
                stub.wait(timeout=10)
            except subprocess.TimeoutExpired:
                stub.kill()
                stub.wait()
    done, cpu, wall = d1 - d0, cpu1 - cpu0, w1 - w0
    errors = sum(1 for r in recs if not r["ok"])
    if done <= 0 or cpu <= 0:
        raise RuntimeError("calibration sent no requests")
    stub_req = s1["requests"] - s0["requests"]
    return {
        "per_core_rps": done / cpu, "requests": done, "window_s": wall, "client_cpu_s": cpu,
        "client_cpu": cpu / wall, "answered_rps": done / wall, "errors": errors, "users": users,
        "max_tokens": PLAN.max_tokens, "token_gap_ms": token_gap_ms,
        "endpoint": "loadstub.py on 127.0.0.1 (same answer shape, no compute)",
        "stub_cpu": (s1["cpu_s"] - s0["cpu_s"]) / wall, "stub_requests": stub_req,
        "requests_around": around1 - around0,
        "stub_cpu_per_request_us": (s1["cpu_s"] - s0["cpu_s"]) / stub_req * 1e6 if stub_req else None,
        "since_start_s": w0 - t_start,
    }

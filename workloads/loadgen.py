"""LLM load generator and capacity search: locust as a library against an OpenAI-compatible
``/v1/completions`` endpoint (gpuproof's own ``inference_server.py``, vLLM, TGI, SGLang, NIM).

Long: the load steps, the client's own pace and CPU accounting, the capacity search (bisection, search start,
what bound it) and locust's master/worker distribution are one measurement loop; loadclient.py, locustfile.py and
loadstub.py already hold the sender, the locust user and the stand-in server.

Per request (see ``locustfile.py``): time to first token (TTFT), time per output token
(TPOT) and the gaps between streamed tokens, end-to-end latency, output tokens. Input and
output lengths are fixed and seeded (``--input-tokens`` words, ``max_tokens`` with
``ignore_eos``/``min_tokens`` so servers that honor them generate exactly that many).

A step offers a rate for ``--step-s`` seconds (open loop, see locustfile.py) and then
waits for the answers (at most ``--drain-s``). Each step records four rates
(``throughput_definitions`` in the result):

- ``offered_rps``: what the schedule offered;
- ``sent_rps``: requests sent per second of sending (the client keeping its schedule);
- ``served_rps``: answered requests / first request sent to last answer received, AIPerf's
  request throughput. Past saturation it is what the server served, not what was offered;
- ``completion_rps``: answers per second over the second half of the sending, and
  ``queue_growth``: how many more requests were queued at its end than at its start (each
  level averaged over a quarter of that half: ``loadclient.pace``): in flight, or where the
  server reports its batch slots (gpuproof's server), in flight beyond them (``queue_counts``);
- ``late_rps``: the answers' rate over the last quarter of the sending, where a
  continuous-batching server's batch is fullest (the lower of first-to-last and the count
  over the quarter: ``loadclient.pace``).

A step **passes** when the server kept pace and met the SLOs: its completions over the
second half fell short of the offered rate by no more than ``--rate-tolerance`` (or 2
requests; the number in flight did not grow, or it grew while the server filled its batch and
its late answers came as fast as the offer: ``late_rps`` within the tolerance, with no more
requests waiting beyond its batch slots where it reports them), at least
``--slo-attainment`` of its requests met every SLO (``--slo-ttft-ms``, ``--slo-tpot-ms``)
and no more than ``--max-error-rate`` failed. A step whose completions fall behind its sends
is overloaded even with no errors and every SLO met inside it. Why the second half: by then
the first answers are back, so a server that keeps up holds a steady number of requests in
flight while one that cannot lets them pile up by (offered - served) per second. For that the step must last several
times the server's latency: it sends for ``--step-s`` or ``PACE_FACTOR`` (4) times the longest median
latency of the earlier steps that kept pace, whichever is longer, and in a search long enough
for that half to hold ``--pace-answers`` (40) answers at the offered rate, so that the two
answers at its edges are within the search's 5% (``step_s_rule`` says which rule set it); a step
whose first answers (those sent in its first quarter) took longer than half of it has
``pace_judged: false`` and passes or fails on its SLOs and errors alone.
Goodput = requests meeting every SLO per second of the served span.

Every step also records the CPU of every process that sent (``client.processes``: CPU
seconds per wall second and the cores it may use; ``client_cpu_per_request_ms``), the
schedule lag, how full the server was (``headroom``: mean requests running against its
batch slots, mean waiting, KV cache used, from gpuproof's /metrics or a Prometheus
/metrics of vLLM, SGLang or TGI read every ``--metrics-interval-s``) beside how busy it was
(``server``), and ``valid``: a step where the client was the limit (its CPU at
``--client-cpu-threshold`` of what it may use, or its sends short of the offered rate while
the server's latency stayed flat; see ``loadclient.py``) has ``valid: false``,
``client_bound: true`` and ``invalid_reason``. An invalid step is never a capacity and never
the server's limit.

``--rates LO:HI`` (default) searches for the capacity: the offered rate goes S,
S*``--ramp-factor``, ... up to HI until a step fails or is invalid, then up to
``--bisect-steps`` more steps narrow the bracket (an invalid step ends the search). A step
that failed because the server fell behind says what the server can serve: the next probe
is just below its completion rate, and nothing above that rate (plus the tolerance) is
tried again; otherwise the bracket is bisected geometrically, until
failing/passing <= 1 + ``--precision``. S is LO, a rate given (``--search-start``), or
``--search-start auto``: an eighth of what the server could complete if batching cost nothing
(its batch slots over one request's time alone), inside LO..HI (``search_start``). A first
step above LO that fails (``cold_start``: it filled the batch from nothing at the full rate) is
followed by a ramp from S / ramp-factor, so that every step that brackets the capacity starts
with the batch its previous step filled. ``--rates a,b,c`` runs exactly those rates.
The capacity is the highest valid passing rate, reported with the rate the server completed
there (``capacity_completion_rps``) and what it served when overloaded (``saturation_rps``).
What bound it is judged on the lowest failing step, in this order; "busy" alone is never
saturation (a loop that never idles with most batch slots free has room):

- ``client``: the step is invalid (above), or the signals below do not point at the
  server and the sends ran late against the schedule;
- ``device``: the GPU was busy (NVML utilization, from the server's ``/metrics``) at least
  ``--busy-threshold`` and the server was full (slots or KV cache used at that share, a
  queue, or completions behind the sends);
- ``server``: the server's process busy (CPU time per wall second over its CPU budget, or
  its engine loop never idle) at least ``--busy-threshold`` and full; or completions behind
  the sends with the client on schedule; or the SLO missed with the client on schedule
  (the reason then says how full the server was);
- ``offered-range``: no step failed; the search ran out of range.

Only ``device`` and ``server`` give ``capacity_rps``; ``client`` and ``offered-range``
leave it null (``max_passing_rps`` keeps the highest valid rate that passed).

More load than one process can send: locust's distributed mode. ``--workers N`` starts a
locust master here and N worker processes on 127.0.0.1 (``--master-port``, default a free
one); each worker sends every N-th request of the same schedule and reports its records
and CPU to the master after each step. ``--workers auto`` first measures this client's
rate per CPU-second against a local stand-in endpoint with answers of the same shape
(``loadstub.py``, tokens streamed 1 ms apart, ``--calibrate-s``) and sizes
N = ceil(target / (per-core rate x ``--headroom``)), the target being ``--target-rps`` or
the top of ``--rates``. That is the first guess: before every later step the workers are
sized again from the CPU the sending processes actually spent per request in the previous
step (idle time included) and more local workers are started when the next rate needs them
(``client_sizing`` in the step; ``short: true`` when they could not be: ``--max-workers``,
or worker pods started elsewhere).
``--calibrate-only`` prints just that measurement. In a cluster (``gpuproof/bench/loadpods.py``)
the master runs with ``--master --expect-workers N`` and N worker pods run ``--worker
--master-host H``. A run is bounded by ``--max-steps``, ``--max-duration-s`` and
``--max-requests``. Needs only the standard library and locust (no torch).
"""

from __future__ import annotations

import locustfile  # first: imports locust, which monkey-patches the standard library

import errno
import http.client
import json
import logging
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import gevent
from gevent.event import Event
from locust.env import Environment

import loadclient
import workload_common as common
from locustfile import PLAN, InferenceUser, make_prompts


class _SpawnRateFilter(logging.Filter):
    """Every user is spawned at once on purpose (they wait for tickets from the schedule, not for a
    ramp), which locust warns about above 100 per second: on a GPU run the warning was the only
    noise in the log, and it reads like a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "spawn rate is very high" not in record.getMessage()


logging.getLogger("locust.runners").addFilter(_SpawnRateFilter())

PCTS = (50, 90, 99)
BOUNDS = ("device", "server", "client", "offered-range")
HERE = os.path.dirname(os.path.abspath(__file__))
N_PROMPTS = 64
CLUSTER_MASTER_PORT = 5557
PACE_FACTOR = 4.0     # a step sends for at least this many times the server's latency (see Runner.step_length)
PACE_ANSWERS = 40     # a search step's judged half holds this many answers at the offered rate (Runner.step_length)
THROUGHPUTS = {
    "offered_rps": "the rate the step's schedule offered",
    "sent_rps": "requests sent / the sending span (the client keeping its schedule)",
    "served_rps": "answered requests / first request sent to last answer received (AIPerf's request throughput)",
    "completion_rps": "answers per second over the second half of the sending (the server keeping pace)",
    "late_rps": "answers per second over the last quarter of the sending (a full batch; loadclient.pace)",
}
EPOCH_OFFSET = time.time() - time.perf_counter()   # perf_counter -> Unix time, for the records


def _get(url: str, timeout: float = 5.0, accept: str = "") -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def wait_ready(base: str, health_path: str, timeout: float) -> None:
    """Poll the health endpoint until it answers 200, at most ``timeout`` seconds."""
    common.wait_until(lambda: _get(base + health_path, timeout=2.0)[0] == 200, timeout,
                      f"{base}{health_path} to answer 200", interval=0.1)


def served_model(base: str) -> str:
    """The first model id /v1/models lists ('' when it lists none)."""
    code, body = _get(base + "/v1/models")
    if code != 200:
        return ""
    data = json.loads(body).get("data") or []
    return data[0].get("id", "") if data else ""


def probe_metrics(base: str, path: str) -> tuple[str | None, dict | None]:
    """What the endpoint's metrics path serves: ("gpuproof", its JSON), ("prometheus", the gauges
    of :data:`PROM_GAUGES` it has: vLLM, SGLang, TGI), or (None, None)."""
    if not path:
        return None, None
    try:
        # gpuproof's server answers a scraper (text/plain) in the Prometheus format: ask for its JSON by name;
        # vLLM, SGLang and TGI answer text whatever is asked
        code, body = _get(base + path, timeout=5.0, accept="application/json")
    except OSError:
        return None, None
    if code != 200:
        return None, None
    try:
        m = json.loads(body)
    except ValueError:
        gauges = loadclient.prom_gauges(body.decode(errors="replace"))
        return ("prometheus", gauges) if gauges else (None, None)
    return ("gpuproof", m) if isinstance(m, dict) and "process_cpu_s" in m else (None, None)


def server_metrics(base: str, path: str) -> dict | None:
    """gpuproof's JSON /metrics, or None (another server: Prometheus text, 404, ...)."""
    kind, m = probe_metrics(base, path)
    return m if kind == "gpuproof" else None


class GaugeSampler:
    """Reads a Prometheus endpoint's gauges every ``interval`` seconds during a step (a greenlet of
    this process): gauges say how full the server is now, so a step needs samples, not two readings."""

    def __init__(self, url: str, interval: float):
        self.url, self.interval = url, interval
        self.samples: list[dict] = []
        self.stop_event = Event()
        self.greenlet = gevent.spawn(self._run)

    def _read(self) -> None:
        try:
            code, body = _get(self.url, timeout=max(1.0, self.interval))
        except OSError:
            return
        if code == 200:
            g = loadclient.prom_gauges(body.decode(errors="replace"))
            if g:
                self.samples.append(g)

    def _run(self) -> None:
        self._read()
        while not self.stop_event.wait(self.interval):   # the sampling period, not a wait for a condition
            self._read()

    def stop(self) -> dict | None:
        """Stop sampling; the headroom over the samples (see :func:`headroom`)."""
        self.stop_event.set()
        self.greenlet.join(timeout=10)
        self._read()
        return loadclient.prom_headroom(self.samples)


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _pcts(values: list[float], prefix: str, scale: float = 1e3) -> dict:
    out = {f"{prefix}_p{q}_ms": (common.percentile(values, q) * scale if values else None) for q in PCTS}
    out[f"{prefix}_mean_ms"] = common.mean(values) * scale if values else None
    return out


def _server_ms(timing: dict | None) -> float | None:
    """The server's own time for one request (gpuproof's per-request queue + model time)."""
    if not isinstance(timing, dict) or timing.get("queue_ms") is None:
        return None
    return (timing.get("queue_ms") or 0.0) + (timing.get("model_ms") or 0.0)


def server_side(m0: dict | None, m1: dict | None) -> dict | None:
    """The server's busy fractions, how full it was, and the per-request time split between two
    gpuproof /metrics readings."""
    if not m0 or not m1:
        return None
    dw = m1["wall_s"] - m0["wall_s"]
    if dw <= 0:
        return None
    e0, e1 = m0.get("engine") or {}, m1.get("engine") or {}
    d = {k: m1.get(k, 0) - m0.get(k, 0) for k in ("ok", "handler_cpu_s", "queue_s", "model_s", "process_cpu_s")}
    busy = e1.get("busy_s", 0) - e0.get("busy_s", 0)
    fwd = e1.get("forward_s", 0) - e0.get("forward_s", 0)
    n = d["ok"]
    out = {
        "cpu_util": d["process_cpu_s"] / dw / max(1e-9, m1.get("cpu_budget_cores") or 1.0),
        "engine_busy": busy / dw,
        "forward_share_of_busy": fwd / busy if busy > 0 else None,
        "requests": n,
        "mean_batch": ((e1.get("batch_rows", 0) - e0.get("batch_rows", 0))
                       / max(1, e1.get("decode_steps", 0) - e0.get("decode_steps", 0))),
    }
    if n:
        handler = d["handler_cpu_s"] / n * 1e3
        sched = (busy - fwd) / n * 1e3
        model = d["model_s"] / n * 1e3
        out.update(handler_cpu_ms=handler, scheduler_ms=sched, overhead_ms=handler + sched, model_ms=model,
                   queue_ms=d["queue_s"] / n * 1e3,
                   overhead_fraction=(handler + sched) / (handler + sched + model) if handler + sched + model > 0
                   else None)
    g0, g1 = m0.get("gpu") or {}, m1.get("gpu") or {}
    dn = g1.get("n", 0) - g0.get("n", 0)
    out["gpu_util_pct"] = (g1.get("util_pct_sum", 0) - g0.get("util_pct_sum", 0)) / dn if dn > 0 else None
    return out


def step_stats(idx: int, rate: float, step_s: float, t0: float, n: int, recs: list[dict], args,
               slots: int | None = None) -> dict:
    """The statistics of one step from its requests' records."""
    ok = [r for r in recs if r["ok"]]
    sends = sorted(r["sent"] for r in recs)
    ended = sorted(r["sent"] + r["e2e_s"] for r in recs if r["e2e_s"] is not None)
    answered = sorted(r["sent"] + r["e2e_s"] for r in ok)
    span = max(step_s, sends[-1] - t0 + 1.0 / rate) if sends else step_s      # how long sending took
    first_send = sends[0] if sends else t0
    # AIPerf's benchmark duration: the first request sent to the last answer received
    served_span = answered[-1] - first_send if answered else None
    ttft = [r["ttft_s"] for r in ok]
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    itl = [g for r in ok for g in r["itl_s"]]
    e2e = [r["e2e_s"] for r in ok]
    srv_ms = [v for v in (_server_ms(r.get("server")) for r in ok) if v is not None]
    good = [r for r in ok if r["ttft_s"] * 1e3 <= args.slo_ttft_ms
            and (r["tokens"] <= 1 or (r["e2e_s"] - r["ttft_s"]) / (r["tokens"] - 1) * 1e3 <= args.slo_tpot_ms)]
    lags = [r["lag_s"] for r in recs]
    late_tol = max(0.05, 0.5 / rate)
    errors = n - len(ok)
    codes: dict[str, int] = {}
    for r in recs:
        codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
    out_tokens = sum(r["tokens"] for r in ok)
    kept = loadclient.pace(sends, ended, answered, t0, span, rate, args.rate_tolerance, slots)
    # how long the first answers took (those sent in the first quarter: little queue yet, even
    # when overloaded): the pace is judged only when its window starts after they came back
    early = [r["e2e_s"] for r in ok if r["sent"] <= t0 + span / 4]
    fill = common.percentile(early, 50) if early else None
    judged = fill is not None and fill <= span / 2
    row = {
        "step": idx,
        "step_s": step_s,
        "offered_rps": rate,
        "requests": n,
        "sent": len(recs),
        "ok": len(ok),
        "errors": errors,
        "error_rate": errors / n if n else None,
        "failed": len(recs) - len(ok),          # sent and answered with an error (errors also count unsent)
        "send_span_s": span,
        "sent_rps": len(recs) / span,
        "served_span_s": served_span,
        "served_rps": len(ok) / served_span if served_span else 0.0,
        "first_send_epoch": first_send + EPOCH_OFFSET,
        "last_answer_epoch": answered[-1] + EPOCH_OFFSET if answered else None,
        **{k: kept[k] for k in ("completion_rps", "queue_growth", "in_flight_mid", "in_flight_end", "late_rps",
                                "caught_up", "queue_counts")},
        "pace_window_s": kept["window_s"],
        "fill_latency_s": fill,
        "pace_judged": judged,
        "keeps_pace": kept["keeps_pace"] if judged else None,
        "goodput_rps": len(good) / served_span if served_span else 0.0,
        "slo_attainment": len(good) / n if n else None,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / served_span if served_span else 0.0,
        "mean_output_tokens": out_tokens / len(ok) if ok else None,
        **_pcts(ttft, "ttft"), **_pcts(tpot, "tpot"), **_pcts(itl, "itl"), **_pcts(e2e, "e2e"),
        "server_latency_p50_ms": common.percentile(srv_ms, 50) if srv_ms else None,
        "server_latency_p10_ms": common.percentile(srv_ms, 10) if srv_ms else None,
        "ttft_p10_ms": common.percentile(ttft, 10) * 1e3 if ttft else None,
        "schedule_lag_p50_ms": (common.percentile(lags, 50) or 0) * 1e3 if lags else None,
        "schedule_lag_p95_ms": (common.percentile(lags, 95) or 0) * 1e3 if lags else None,
        "schedule_lag_max_ms": max(lags) * 1e3 if lags else None,
        "late_fraction": sum(1 for x in lags if x > late_tol) / len(lags) if lags else None,
        "starved_fraction": sum(1 for r in recs if r["starved"]) / len(recs) if recs else None,
        "status_codes": codes,
        "first_error": next((r["error"] for r in recs if r["error"]), None),
    }
    reasons = []
    if row["error_rate"] is not None and row["error_rate"] > args.max_error_rate:
        reasons.append(f"error rate {row['error_rate']:.2f} > {args.max_error_rate:g}")
    if row["slo_attainment"] is not None and row["slo_attainment"] < args.slo_attainment:
        reasons.append(f"{row['slo_attainment']:.0%} of requests met the SLOs (< {args.slo_attainment:.0%})")
    if row["keeps_pace"] is False:
        reasons.append(f"overloaded: completions {row['completion_rps']:.3g} req/s < offered {rate:.3g} over the "
                       f"step's second half, {row['queue_growth']} more requests in flight at its end")
    row["slo_met"] = not reasons
    row["fail_reasons"] = reasons
    return row


def idle_latency(base: str, n: int, timeout: float = 120.0) -> dict:
    """The server's latency with nothing else in flight: ``n`` streamed requests one after another
    (after one more to warm up), median TTFT, whole request and, where the server reports it, its own
    time."""
    u = urllib.parse.urlsplit(base)
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    ttfts, e2es, servers, errors = [], [], [], []
    conn = cls(u.hostname, u.port, timeout=timeout)
    try:
        for i in range(n + 1):
            t0 = time.perf_counter()
            conn.request("POST", PLAN.path, PLAN.body(), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                errors.append(f"HTTP {resp.status}")
                resp.read()
                continue
            first, srv = None, None
            while line := resp.readline():
                line = line.strip()
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                msg = json.loads(line[5:])
                choices = msg.get("choices") or []
                if first is None and choices and choices[0].get("text"):
                    first = time.perf_counter() - t0
                srv = _server_ms(msg.get("gpuproof")) if msg.get("gpuproof") else srv
            if i and first is not None:   # the first one warms up
                ttfts.append(first * 1e3)
                e2es.append((time.perf_counter() - t0) * 1e3)
                if srv is not None:
                    servers.append(srv)
    except (OSError, ValueError, http.client.HTTPException) as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()
    return {"n": len(ttfts), "source": f"idle probe ({len(ttfts)} sequential requests, median)",
            "ttft_ms": common.median(ttfts) if ttfts else None,
            "e2e_ms": common.median(e2es) if e2es else None,
            "server_ms": common.median(servers) if len(servers) == len(ttfts) and servers else None,
            "errors": errors[:3]}


# ------------------------------------------------------------------ senders: this process, or a master + workers


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


class LocalSender:
    """Sends from this process (locust's LocalRunner)."""

    mode = "local"
    grows = False

    def __init__(self, args, base: str):
        self.args = args
        self.cores = loadclient.usable_cores()
        self.env = Environment(user_classes=[InferenceUser], host=base)
        self.runner = self.env.create_local_runner()
        self.workers = 1

    def start(self, users: int) -> None:
        self.runner.start(users, spawn_rate=max(100.0, float(users)))
        _wait(lambda: self.runner.user_count >= users, 60, f"{users} locust users to start")

    def run_step(self, idx: int, rate: float, step_s: float) -> dict:
        a = self.args
        cpu0, w0 = _cpu_s(), time.perf_counter()
        t0, recs = _run_share(idx, rate, step_s, a.drain_s, lead_s=_lead(a, idx, 0.05))
        cpu1, w1 = _cpu_s(), time.perf_counter()
        return {"t0": t0, "n": max(1, round(rate * step_s)), "records": recs, "wall_s": w1 - w0,
                "processes": [_proc("local", 0, cpu1 - cpu0, w1 - w0, self.cores, recs)], "missing": []}

    def cpu_warning(self) -> bool:
        return bool(getattr(self.runner, "cpu_warning_emitted", False))

    def quit(self) -> dict:
        self.runner.quit()
        return {}


class MasterSender:
    """A locust master: N worker processes (local ones it starts, or pods) send, it only steers.

    Messages (locust's custom messages over its ZeroMQ link): worker -> ``gp_hello`` (pid, host,
    cores) once its handlers are in place; master -> ``gp_config`` (what to send), then per step
    ``gp_step`` (step, rate, its share i of N, lead time); worker -> ``gp_step_done`` (its
    records with send times relative to its step start, its CPU seconds and wall time)."""

    mode = "distributed"

    def __init__(self, args, base: str, workers: int, bind_host: str, port: int, spawn_local: bool):
        self.args, self.workers = args, workers
        self.cores = loadclient.usable_cores()
        self.env = Environment(user_classes=[InferenceUser], host=base)
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

    def start(self, users: int) -> None:
        self.runner.start(users, spawn_rate=max(100.0, float(users)))
        _wait(lambda: self.runner.user_count >= users, 60,
              f"{users} locust users to start on {self.workers} workers (started: {self.runner.user_count})")

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

    def cpu_warning(self) -> bool:
        return bool(getattr(self.runner, "worker_cpu_warning_emitted", False))

    def quit(self) -> dict:
        """Stop the workers (locust's quit message); the local ones' own summaries."""
        self.runner.quit()
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


# ------------------------------------------------------------------ the capacity search


def build_parser():
    p = common.parser(
        "loadgen.py",
        "LLM load (locust, streamed /v1/completions): TTFT, TPOT, output tokens/s, goodput, and a capacity "
        "search that says what bound it (device, server, client, offered-range); one process or locust's "
        "distributed mode (a master + N workers). One JSON object.",
        epilog="examples:\n"
               "  python loadgen.py --url http://127.0.0.1:8000                       # search 1..1024 req/s\n"
               "  python loadgen.py --url http://vllm:8000 --model meta-llama/Llama-3.1-8B-Instruct \\\n"
               "      --input-tokens 512 --output-tokens 128 --slo-ttft-ms 500 --slo-tpot-ms 50\n"
               "  python loadgen.py --url http://127.0.0.1:8000 --rates 2,4,8 --step-s 5   # fixed rates\n"
               "  python loadgen.py --url http://127.0.0.1:8000 --workers auto            # master + N workers here\n"
               "  python loadgen.py --calibrate-only --output-tokens 128                  # req/s per core\n"
               "  python loadgen.py --url http://svc:8000 --master --expect-workers 4     # in a pod; workers:\n"
               "  python loadgen.py --worker --master-host loadgen-master                 #   one per pod\n",
    )
    p.add_argument("--url", default="", help="base URL of the server, e.g. http://127.0.0.1:8000 (not for --worker)")
    p.add_argument("--model", default="", help="model name to send (default: the first one /v1/models lists)")
    p.add_argument("--rates", default="1:1024",
                   help="LO:HI searches for the capacity in that range (default 1:1024); a,b,c runs those rates")
    p.add_argument("--search-start", default="lo",
                   help="where a search's ramp starts: lo (LO of --rates, default), a rate, or auto (an eighth of "
                        "batch slots / one request's time alone, from the server's /metrics and an idle probe); "
                        "a first step that fails is followed by a ramp from half of it")
    p.add_argument("--ramp-factor", type=float, default=2.0, help="ramp: next rate = rate x this (default 2)")
    p.add_argument("--bisect-steps", type=int, default=3, help="bisection steps after the ramp (default 3)")
    p.add_argument("--precision", type=float, default=0.05,
                   help="stop bisecting when failing/passing rate <= 1 + this (default 0.05)")
    p.add_argument("--step-s", type=float, default=15.0,
                   help=f"seconds of sending per step at least (default 15; longer when {PACE_FACTOR:g}x the server's "
                        "latency is longer, so that a growing queue shows)")
    p.add_argument("--start-epoch", type=float, default=0.0,
                   help="send the first step's first request at this Unix time (its schedule runs from there), "
                        "to interleave with another client's constant schedule (default: at once)")
    p.add_argument("--start-epoch-file", default="",
                   help="like --start-epoch, the Unix time read from this file, waiting (--wait-ready seconds "
                        "at most) until something writes it there")
    p.add_argument("--pace-answers", type=int, default=PACE_ANSWERS,
                   help=f"a search step sends long enough for its second half to hold this many answers at the "
                        f"offered rate (default {PACE_ANSWERS}: the answers at the window's edges are then within 5%%; "
                        "0 = off); fixed --rates a,b send for --step-s")
    p.add_argument("--drain-s", type=float, default=60.0,
                   help="after a step's last send, wait at most this long for its answers (default 60)")
    p.add_argument("--input-tokens", type=int, default=512, help="prompt length in words ~ tokens (default 512)")
    p.add_argument("--output-tokens", type=int, default=128, help="max_tokens per request (default 128)")
    p.add_argument("--no-ignore-eos", action="store_true",
                   help="do not send ignore_eos/min_tokens (for servers that refuse them)")
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0, help="time-to-first-token SLO (default 1000 ms)")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, help="time-per-output-token SLO (default 100 ms)")
    p.add_argument("--slo-attainment", type=float, default=0.95,
                   help="share of a step's requests that must meet every SLO (default 0.95)")
    p.add_argument("--max-error-rate", type=float, default=0.0, help="errors a passing step may have (default 0)")
    p.add_argument("--rate-tolerance", type=float, default=0.05,
                   help="a step fails when its completions fall short of the offered rate by more than this share "
                        "(or the client's sends do: then the step is invalid) (default 0.05)")
    p.add_argument("--busy-threshold", type=float, default=0.75,
                   help="GPU or server busy fraction that counts as saturated (default 0.75)")
    p.add_argument("--client-cpu-threshold", type=float, default=loadclient.CPU_SATURATION,
                   help="a sending process at this share of the CPU it may use makes the step invalid (default 0.9)")
    p.add_argument("--flat-factor", type=float, default=loadclient.FLAT_FACTOR,
                   help="server latency p50 within this factor of the idle latency counts as flat (default 2)")
    p.add_argument("--idle-probes", type=int, default=0,
                   help="measure the idle latency with this many sequential requests before the search (default 0: "
                        "the lowest 10th percentile of the steps' latencies stands in for it)")
    p.add_argument("--users", type=int, default=512, help="locust users (concurrent requests at most; default 512)")
    p.add_argument("--think-ms", type=float, default=0.0,
                   help="each user pauses this long after an answer (default 0; a slow client for tests)")
    p.add_argument("--max-steps", type=int, default=20, help="steps at most (default 20)")
    p.add_argument("--max-duration-s", type=float, default=3600.0, help="no new step after this long (default 3600)")
    p.add_argument("--max-requests", type=int, default=1_000_000, help="no new step after this many (default 1e6)")
    p.add_argument("--health-path", default="/v1/models", help="readiness path polled first (default /v1/models)")
    p.add_argument("--metrics-path", default="/metrics",
                   help="gpuproof's JSON metrics path on the server ('' = do not ask; default /metrics)")
    p.add_argument("--metrics-interval-s", type=float, default=1.0,
                   help="a Prometheus /metrics (vLLM, SGLang, TGI) is read this often during a step (default 1)")
    p.add_argument("--wait-ready", type=float, default=120.0, help="seconds to wait for readiness (default 120)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
    g = p.add_argument_group("distributed mode (locust master + workers)")
    g.add_argument("--workers", default="1",
                   help="N: a locust master here and N worker processes on 127.0.0.1 (1 = this process sends); "
                        "'auto': N from a calibration of this client's per-core rate (default 1)")
    g.add_argument("--target-rps", type=float, default=None,
                   help="the rate --workers auto sizes for (default: the top of --rates)")
    g.add_argument("--headroom", type=float, default=loadclient.HEADROOM,
                   help="size workers to run at most this share of their per-core rate (default 0.7)")
    g.add_argument("--max-workers", type=int, default=loadclient.MAX_WORKERS, help="workers at most (default 16)")
    g.add_argument("--calibrate-s", type=float, default=3.0, help="seconds of calibration (default 3)")
    g.add_argument("--calibrate-token-gap-ms", type=float, default=1.0,
                   help="the calibration endpoint writes tokens this far apart, as a server streaming them "
                        "(default 1; 0 = whole answers at once, which costs the client less)")
    g.add_argument("--calibrate-users", type=int, default=256, help="users during the calibration (default 256)")
    g.add_argument("--per-core-rps", type=float, default=None,
                   help="size --workers auto from this per-core rate instead of calibrating")
    g.add_argument("--calibrate-only", action="store_true",
                   help="only measure this client's requests per CPU-second (and size for --target-rps)")
    g.add_argument("--master", action="store_true",
                   help="be a locust master for --expect-workers workers started elsewhere (pods)")
    g.add_argument("--expect-workers", type=int, default=0, help="workers a --master waits for")
    g.add_argument("--wait-workers-s", type=float, default=300.0, help="how long to wait for them (default 300)")
    g.add_argument("--worker", action="store_true", help="be a locust worker of --master-host:--master-port")
    g.add_argument("--master-host", default="127.0.0.1", help="the master's address (--worker; default 127.0.0.1)")
    g.add_argument("--master-port", type=int, default=None,
                   help=f"the master's port (default: a free one for local workers, {CLUSTER_MASTER_PORT} with "
                        "--master/--worker)")
    g.add_argument("--master-bind-host", default=None,
                   help="address the master binds (default 127.0.0.1 for local workers, * with --master)")
    return p


def parse_rates(text: str) -> tuple[str, list[float]]:
    if ":" in text:
        lo, hi = (float(x) for x in text.split(":", 1))
        if not 0 < lo <= hi:
            raise ValueError("LO:HI needs 0 < LO <= HI")
        return "search", [lo, hi]
    rates = common.parse_float_list(text)
    if not rates or any(r <= 0 for r in rates):
        raise ValueError("rates must be > 0")
    return "list", sorted(rates)


def _round(r: float) -> float:
    return float(f"{r:.3g}")


# --search-start auto: a search starts at this share of what the server could complete if batching cost
# nothing (batch slots / one request's time alone), three ramp steps below that bound at the default x2. On an
# H200 the 7b model served 0.4 of that bound (a request takes 1.8 s alone, 4-5 s in a full batch): a quarter
# of it, 8.7 req/s, failed its TTFT SLO from an empty server while 13.7 passed after a ramp.
SEARCH_START_SHARE = 0.125
AUTO_PROBES = 3   # requests timed alone (after one more to warm up), median: one read 1.1 s and 1.8 s on an H200


def search_start(text: str, lo: float, hi: float, idle: dict | None, slots: int | None) -> tuple[float, str]:
    """The first rate of a capacity search, and why: LO (``--search-start lo``, the default), a rate
    given, or ``auto``: SEARCH_START_SHARE of ``slots / idle e2e`` (Little's law: with every batch slot
    busy and no slowdown from batching, the server completes ``slots`` requests per request time; a
    real server completes less, so the ramp reaches the capacity from below in a step or two, where
    starting at 1 req/s takes several steps that each wait for ``--pace-answers`` answers, 80 s at 1
    req/s). Without the server's batch slots or an idle latency, auto starts at LO. Always inside
    LO..HI: the range stays the user's. A start above LO that fails is not taken as the bracket (see
    ``Runner.search``)."""
    if text in ("", "lo"):
        return lo, f"LO of --rates ({lo:g})"
    held = f", held inside {lo:g}:{hi:g}"
    if text != "auto":
        r = float(text)
        return min(hi, max(lo, r)), f"--search-start {r:g}" + ("" if lo <= r <= hi else held)
    e2e = (idle or {}).get("e2e_ms")
    if not slots or not e2e:
        why = "the server does not report its batch slots" if not slots else "the idle probe got no answer"
        return lo, f"auto: LO of --rates ({lo:g}), {why}"
    bound = slots / (e2e / 1e3)
    want = SEARCH_START_SHARE * bound
    return _round(min(hi, max(lo, want))), (
        f"auto: {SEARCH_START_SHARE:g} x {slots} batch slots / {e2e / 1e3:.3g} s for one request alone "
        f"(= {bound:.3g} req/s if batching cost nothing)" + ("" if lo <= want <= hi else held))


class Runner:
    def __init__(self, args, base: str, sender, idle: dict | None):
        self.args, self.base, self.sender, self.idle = args, base, sender, idle
        self.steps: list[dict] = []
        self.requests = 0
        self.floor: dict = {"server_ms": None, "ttft_ms": None, "source": "lowest p10 of the steps so far"}
        self.metrics_kind = probe_metrics(base, args.metrics_path)[0]
        self.t_start = time.perf_counter()
        self.searching = False    # a capacity search (--rates LO:HI): steps hold --pace-answers answers
        self.start_rps: float | None = None   # where a search's ramp starts (--search-start), LO when None

    def budget_left(self) -> bool:
        a = self.args
        return (len(self.steps) < a.max_steps and time.perf_counter() - self.t_start < a.max_duration_s
                and self.requests < a.max_requests)

    def step_length(self, rate: float) -> tuple[float, str]:
        """How long the next step sends: ``--step-s``, or longer where one of two rules asks for more.

        - ``PACE_FACTOR`` times the longest median latency of the steps so far that kept pace (or
          passed while too short to tell). Whether the queue grows is read over a step's second half,
          which must start after the first answers are back and still hold as many answers again
          (``loadclient.pace``). A failing step's latency is left out: it holds the queue's wait, not
          the server's time.
        - In a capacity search, ``--pace-answers`` answers in that second half at the offered rate.
          The pace is a count of answers against the offer, and the count is uncertain by the answers
          at the window's edges (``PACE_SLACK``): with 40 of them that is 5%, the search's precision.
          A slow server (a CPU model at 1 req/s) otherwise gets 10 answers a 20 s step, and a
          capacity 10-15% off its sustained rate. Fixed rates (``--rates a,b``) send for ``--step-s``.
        """
        a = self.args
        lat = [s["e2e_p50_ms"] / 1e3 if s.get("keeps_pace") else s["fill_latency_s"] for s in self.steps
               if s.get("e2e_p50_ms") and (s.get("keeps_pace") or not s.get("pace_judged") and s["slo_met"])]
        rules = [(a.step_s, "--step-s")]
        if lat:
            rules.append((PACE_FACTOR * max(lat), f"{PACE_FACTOR:g} x the median latency {max(lat):.3g}s of an "
                                                  "earlier step"))
        if self.searching and a.pace_answers > 0:
            rules.append((2 * a.pace_answers / rate, f"{a.pace_answers} answers in the judged half at {rate:g} req/s"))
        need, why = max(rules, key=lambda r: r[0])
        return (a.step_s, "--step-s") if need <= a.step_s else (_round(need), why)

    def size_senders(self, rate: float) -> dict | None:
        """The load processes this rate needs, from the CPU they spent per request in the previous
        step (each process may use its usable cores, see loadclient.usable_cores); more local
        workers are started when the sender can (``--workers auto``)."""
        a = self.args
        prev = self.steps[-1] if self.steps else None
        per_req = (prev or {}).get("client_cpu_per_request_ms")
        if not per_req:
            return None
        cores = min((p["cores"] for p in prev["client"]["processes"] if p["role"] != "master"), default=1.0)
        sizing = loadclient.size_workers(rate, cores / (per_req / 1e3), a.headroom, a.max_workers)
        have = self.sender.workers
        if sizing["workers"] > have and self.sender.grows:
            common.log(f"more load processes for {rate:g} req/s: {sizing['rule']} (from the previous step's "
                       f"{per_req:.2f} ms of client CPU per request); {have} -> {sizing['workers']}")
            self.sender.grow(sizing["workers"], a.users)
        return {**sizing, "cpu_per_request_ms": per_req, "cores_per_process": cores, "before": have,
                "senders": self.sender.workers, "short": sizing["needed"] > self.sender.workers}

    def step(self, rate: float) -> dict:
        a, idx = self.args, len(self.steps)
        step_s, step_rule = self.step_length(rate)
        sizing = self.size_senders(rate)
        m0 = server_metrics(self.base, a.metrics_path) if self.metrics_kind == "gpuproof" else None
        gauges = (GaugeSampler(self.base + a.metrics_path, a.metrics_interval_s)
                  if self.metrics_kind == "prometheus" else None)
        out = self.sender.run_step(idx, rate, step_s)
        m1 = server_metrics(self.base, a.metrics_path) if self.metrics_kind == "gpuproof" else None
        recs, n, procs = out["records"], out["n"], out["processes"]
        self.requests += len(recs)
        row = step_stats(idx, rate, step_s, out["t0"], n, recs, a, slots=(m0 or {}).get("max_batch"))
        senders = [p for p in procs if p["role"] != "master" and p.get("cpu") is not None]
        cpu_s = sum(p["cpu_s"] for p in senders)
        row.update(
            step_s_rule=step_rule,
            client_cpu=max((p["cpu"] for p in senders), default=None),
            client_cpu_of_usable=max((p["cpu"] / p["cores"] for p in senders), default=None),
            client_cpu_s=cpu_s,
            client_cpu_per_request_ms=cpu_s / len(recs) * 1e3 if recs else None,
            client_sizing=sizing,
            wall_s=out["wall_s"], unanswered=n - len(recs), server=server_side(m0, m1),
            headroom=loadclient.gpuproof_headroom(m0, m1) if m0 else gauges.stop() if gauges else None,
            client={"mode": self.sender.mode, "senders": len(senders), "processes": procs,
                    "missing_workers": out["missing"], "cpu_threshold": a.client_cpu_threshold})
        if row["unanswered"]:
            row["fail_reasons"].append(f"{row['unanswered']} requests unanswered {a.drain_s:g}s after the step")
            row["slo_met"] = False
        for key, col in (("server_ms", "server_latency_p10_ms"), ("ttft_ms", "ttft_p10_ms")):
            if row[col] is not None:
                self.floor[key] = min(row[col], self.floor[key] if self.floor[key] is not None else math.inf)
        row["latency_baseline"] = dict(self.idle or self.floor)
        valid, why = loadclient.step_validity(row, row["latency_baseline"], rate_tolerance=a.rate_tolerance,
                                              max_error_rate=a.max_error_rate, cpu_threshold=a.client_cpu_threshold,
                                              flat_factor=a.flat_factor)
        if valid and not row["slo_met"]:
            row["bound_by"], row["bound_reason"] = loadclient.classify(row, a.busy_threshold)
            if row["bound_by"] == "client":
                valid, why = False, f"client-bound: {row['bound_reason']}"
        row["valid"], row["invalid_reason"] = valid, why
        if not valid:
            row["bound_by"], row["bound_reason"] = "client", why
        row["client_bound"] = not valid
        self.steps.append(row)
        srv = row["server"] or {}
        common.log(f"step {idx}: offered {rate:g} req/s for {step_s:g}s, sent {row['sent_rps']:.3g}, served "
                   f"{row['served_rps']:.3g} (completions {row['completion_rps']:.3g} in the second half, queue "
                   f"{row['queue_growth']:+d}" + (f", late {row['late_rps']:.3g}" if row.get('late_rps') else "")
                   + (": batch filling, caught up" if row.get("caught_up") else "") + "), "
                   f"TTFT p99 {row['ttft_p99_ms'] or 0:.0f} ms, TPOT p99 "
                   f"{row['tpot_p99_ms'] or 0:.1f} ms, {row['output_tokens_per_s']:.0f} tok/s, client CPU "
                   f"{row['client_cpu'] or 0:.0%} ({len(senders)} sender(s), "
                   f"{row['client_cpu_per_request_ms'] or 0:.2f} ms/request), lag p95 "
                   f"{row['schedule_lag_p95_ms'] or 0:.0f} ms, "
                   + (f"server busy {srv.get('engine_busy', 0):.0%} " if srv else "")
                   + f"({loadclient.headroom_text(row['headroom'])}): "
                   + ("INVALID (" + why + ")" if not valid else "SLO met" if row["slo_met"]
                      else f"FAIL ({'; '.join(row['fail_reasons'])}) -> {row['bound_by']}"))
        return row

    def ceiling(self, failing: dict) -> float:
        """The lowest rate known to fail: the failing step's or, when it failed because the server fell
        behind, just above what the server completed there (it cannot sustain more than it serves)."""
        f, c = failing["offered_rps"], _served_at_most(failing)
        return min(f, c * (1 + self.args.rate_tolerance)) if failing.get("keeps_pace") is False and c else f

    def next_probe(self, passing: float | None, failing: dict, top: float) -> float | None:
        """Just below what the failing step's server completed, when that fell short of the offer (it
        was overloaded, or too slow for the step to tell) and is untried and inside the bracket; else
        the geometric middle of the bracket."""
        a = self.args
        tried = {s["offered_rps"] for s in self.steps}
        c = _served_at_most(failing)
        if failing.get("keeps_pace") is not True and c and c < failing["offered_rps"]:
            guess = _round(c * (1 - a.rate_tolerance / 2))
            if (passing or 0.0) < guess < top and guess not in tried:
                return guess
        mid = _round(math.sqrt(passing * top) if passing else top / a.ramp_factor)
        return None if mid in tried or mid >= top or (passing is not None and mid <= passing) else mid

    def search(self, mode: str, rates: list[float]) -> tuple[float | None, dict | None]:
        """Returns (highest valid passing rate, lowest failing or invalid step)."""
        a = self.args
        passing: float | None = None
        failing: dict | None = None
        if mode == "list":
            for r in rates:
                if not self.budget_left():
                    break
                s = self.step(r)
                bad = not (s["valid"] and s["slo_met"])
                if bad and (failing is None or r < failing["offered_rps"]):
                    failing = s
            below = [s["offered_rps"] for s in self.steps if s["valid"] and s["slo_met"]
                     and (failing is None or s["offered_rps"] < failing["offered_rps"])]
            return (max(below) if below else None), failing
        lo, hi = rates
        r = self.start_rps or lo
        cold = r > lo    # a first step above LO starts on an empty server, with no ramp below it
        self.searching = True
        while self.budget_left():
            s = self.step(r)
            if not (s["valid"] and s["slo_met"]):
                if cold and s["valid"]:
                    # Its batch filled from nothing at the full rate: the first answers wait for the fill, and
                    # what it completed reads low, so it brackets nothing. Ramp again from below, as from LO.
                    s["cold_start"], cold = True, False
                    r = max(lo, _round(r / a.ramp_factor))
                    common.log(f"the search's first step failed from an empty server: ramping again from {r:g} "
                               "req/s, so each step starts with the batch the step before it filled")
                    continue
                failing = s
                break
            cold = False
            passing = r
            if r >= hi:
                break
            r = min(hi, _round(r * a.ramp_factor))
        for _ in range(a.bisect_steps):
            if failing is None or not failing["valid"] or not self.budget_left():
                break
            top = self.ceiling(failing)
            if passing is not None and top / passing <= 1 + a.precision:
                break
            r = self.next_probe(passing, failing, top)
            if r is None:
                break
            s = self.step(r)
            if not s["valid"]:   # the client could not measure this rate: keep what the valid steps found
                break
            if s["slo_met"]:
                passing = r
            else:
                failing = s
        return passing, failing


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


def _served_at_most(step: dict) -> float | None:
    """What an overloaded step's server completed at its fastest: the late answers' rate (a full batch)
    where there were enough of them, else the second half's completions (a batch still filling there
    reads low: the search then probes below what the server sustains)."""
    late, c = step.get("late_rps"), step.get("completion_rps")
    return max(late, c or 0.0) if late else c


def _check_port(host: str, port: int) -> str | None:
    """None when ``port`` can be bound on ``host``, else why not."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("" if host == "*" else host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"--master-port {port}: port {port} is already in use on {host}"
            return f"--master-port {port}: cannot bind {host}:{port}: {exc}"
    return None


def _configure_plan(args, model: str) -> dict:
    PLAN.model, PLAN.max_tokens, PLAN.ignore_eos = model, args.output_tokens, not args.no_ignore_eos
    PLAN.think_s = args.think_ms / 1e3
    PLAN.prompts = make_prompts(N_PROMPTS, args.input_tokens, args.seed)
    return {"model": model, "max_tokens": args.output_tokens, "ignore_eos": not args.no_ignore_eos,
            "think_s": args.think_ms / 1e3, "n_prompts": N_PROMPTS, "input_tokens": args.input_tokens,
            "seed": args.seed}


def _validate(args) -> str | None:
    if args.step_s <= 0 or args.users < 1 or args.output_tokens < 1 or args.input_tokens < 1 \
            or args.ramp_factor <= 1 or not 0 < args.slo_attainment <= 1:
        return ("--step-s > 0, --users/--input-tokens/--output-tokens >= 1, --ramp-factor > 1 "
                "and 0 < --slo-attainment <= 1 please")
    if args.workers != "auto" and not (args.workers.isdigit() and int(args.workers) >= 1):
        return f"--workers {args.workers!r}: a whole number >= 1 or 'auto'"
    if args.pace_answers < 0:
        return "--pace-answers >= 0 please (0 = steps of --step-s)"
    if args.search_start not in ("lo", "auto"):
        try:
            if float(args.search_start) <= 0:
                raise ValueError
        except ValueError:
            return f"--search-start {args.search_start!r}: lo, auto or a rate > 0"
    if not 0 < args.headroom <= 1 or args.max_workers < 1 or args.calibrate_s <= 0:
        return "0 < --headroom <= 1, --max-workers >= 1 and --calibrate-s > 0 please"
    if args.master and args.expect_workers < 1:
        return "--master needs --expect-workers N (N >= 1)"
    if not (args.url or args.worker or args.calibrate_only):
        return "--url is required (except with --worker or --calibrate-only)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker:
        args.master_port = args.master_port or CLUSTER_MASTER_PORT
        return worker_main(args)
    try:
        mode, rates = parse_rates(args.rates)
    except ValueError as exc:
        return common.fail_usage(f"--rates {args.rates!r}: {exc}")
    bad = _validate(args)
    if bad:
        return common.fail_usage(bad)
    cores = loadclient.usable_cores()
    target = args.target_rps or max(rates)
    if args.calibrate_only:
        _configure_plan(args, "stub")
        try:
            cal = calibrate(args.calibrate_s, args.calibrate_users, args.calibrate_token_gap_ms)
        except (RuntimeError, TimeoutError) as exc:
            return common.fail_usage(f"calibration failed: {exc}")
        result = common.base_result("loadgen-calibration")
        result.update(calibration=cal, cores=cores, ok=True,
                      sizing=loadclient.size_workers(target, cal["per_core_rps"], args.headroom, args.max_workers))
        common.log(f"calibration: {cal['per_core_rps']:.0f} requests per CPU-second "
                   f"({cal['requests']} in {cal['window_s']:.1f}s at {cal['client_cpu']:.0%} CPU)")
        common.emit(result)
        return 0
    base = args.url.rstrip("/")
    try:
        wait_ready(base, args.health_path, args.wait_ready)
    except TimeoutError as exc:
        return common.fail_usage(str(exc))
    model = args.model or served_model(base)
    cfg = {**_configure_plan(args, model), "url": base}

    calibration = sizing = None
    if args.master:
        workers = args.expect_workers
    elif args.workers == "auto":
        if args.per_core_rps:
            calibration = {"per_core_rps": args.per_core_rps, "given": True}
        else:
            try:
                calibration = calibrate(args.calibrate_s, args.calibrate_users, args.calibrate_token_gap_ms)
            except (RuntimeError, TimeoutError) as exc:
                return common.fail_usage(f"calibration failed: {exc}")
            common.log(f"calibration: {calibration['per_core_rps']:.0f} requests per CPU-second of this client")
        sizing = loadclient.size_workers(target, calibration["per_core_rps"], args.headroom, args.max_workers)
        workers = sizing["workers"]
        common.log(f"workers for {target:g} req/s: {sizing['rule']}")
    else:
        workers = int(args.workers)

    # --workers auto: a master and local workers, so that a step that needs more of them can have them
    distributed = args.master or workers > 1 or args.workers == "auto"
    if distributed:
        bind = args.master_bind_host or ("*" if args.master else "127.0.0.1")
        port = args.master_port if args.master_port is not None else (CLUSTER_MASTER_PORT if args.master else 0)
        if port:
            busy = _check_port(bind, port)
            if busy:
                return common.fail_usage(busy)
        sender = MasterSender(args, base, workers, bind, port, spawn_local=not args.master)
        sender.grows = sender.grows and args.workers == "auto"
        try:
            sender.wait_workers(args.wait_workers_s)
        except (TimeoutError, RuntimeError) as exc:
            sender.quit()
            return common.fail_usage(str(exc))
        sender.configure(cfg)
    else:
        sender = LocalSender(args, base)
    try:
        sender.start(args.users)
    except TimeoutError as exc:
        sender.quit()
        return common.fail_usage(str(exc))
    idle = idle_latency(base, args.idle_probes) if args.idle_probes > 0 else None
    if idle and idle["ttft_ms"] is None:
        idle = None
    common.log(f"load: {mode} {rates} req/s, {args.step_s:g}s steps, {args.users} users on {workers} "
               f"{'workers' if distributed else 'process'}, {args.input_tokens} in / {args.output_tokens} out "
               f"tokens, model {model or '(none)'} at {base}"
               + (f"; idle TTFT {idle['ttft_ms']:.1f} ms" if idle else ""))
    t0_epoch = time.time()
    run = Runner(args, base, sender, idle)
    start = None
    if mode == "search" and args.search_start != "lo":
        probe = idle
        if args.search_start == "auto" and not (probe and probe.get("e2e_ms")):
            common.log(f"search start: timing one request alone, {AUTO_PROBES} times (auto)")
            probe = idle_latency(base, AUTO_PROBES)
        slots = (server_metrics(base, args.metrics_path) or {}).get("max_batch") if run.metrics_kind == "gpuproof" \
            else None
        rps, why = search_start(args.search_start, *rates, probe, slots)
        run.start_rps, start = rps, {"rps": rps, "rule": why, "idle_probe": probe}
        common.log(f"search starts at {rps:g} req/s: {why}")
    try:
        passing, failing = run.search(mode, rates)
    finally:
        cpu_warning = sender.cpu_warning()
        ended = sender.quit()
    if failing is None:
        bound, why = "offered-range", (f"no step failed up to {max(s['offered_rps'] for s in run.steps):g} req/s: "
                                       "the capacity is above the offered range" if run.steps else "no step ran")
    else:
        bound, why = failing["bound_by"], failing["bound_reason"]
    capacity = passing if bound in ("device", "server") else None
    cap_step = next((s for s in run.steps if s["offered_rps"] == passing and s["slo_met"] and s["valid"]), None)
    invalid = [s["step"] for s in run.steps if not s["valid"]]
    # what the server completed while over capacity: its service rate, whatever was offered
    overloaded = [_served_at_most(s) for s in run.steps if s["valid"] and s.get("keeps_pace") is False
                  and not s.get("cold_start")]
    result = common.base_result("loadgen")
    result.update(
        url=base, model=model, mode=mode, rates=rates, search_start=start, ramp_factor=args.ramp_factor,
        step_s=args.step_s, input_tokens=args.input_tokens, output_tokens=args.output_tokens,
        ignore_eos=not args.no_ignore_eos, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
        slo_attainment=args.slo_attainment, max_error_rate=args.max_error_rate, users=args.users,
        think_ms=args.think_ms, started_epoch=t0_epoch, elapsed_s=time.perf_counter() - run.t_start,
        steps=run.steps,
        capacity_rps=capacity,
        capacity_completion_rps=cap_step["completion_rps"] if capacity is not None and cap_step else None,
        saturation_rps=common.median(overloaded) if overloaded else None,
        throughput_definitions=THROUGHPUTS,
        bound_by=bound,
        bound_reason=why,
        max_passing_rps=passing,
        first_failing_rps=failing["offered_rps"] if failing else None,
        at_capacity=cap_step,
        invalid_steps=invalid,
        client_saturated=bool(invalid),
        validity_rule={"cpu_threshold": args.client_cpu_threshold, "flat_factor": args.flat_factor,
                       "flat_slack_ms": loadclient.FLAT_SLACK_MS, "rate_tolerance": args.rate_tolerance},
        idle_latency=idle,
        latency_baseline=idle or run.floor,
        load_client={"mode": sender.mode, "workers": sender.workers, "cores_per_process": cores["cores"],
                     "host_cpus": cores["host_cpus"], "target_rps": target, "calibration": calibration,
                     "sizing": sizing, "master_port": getattr(sender, "port", None), **ended},
        server_metrics=any(s.get("server") for s in run.steps),
        client_cpu_max=max((s["client_cpu"] for s in run.steps if s["client_cpu"] is not None), default=None),
        locust_cpu_warning=cpu_warning,
        locust_version=locustfile.locust.__version__,
        verdict="pass" if capacity is not None else "inconclusive",
        ok=bool(run.steps) and any(s["ok"] for s in run.steps),
    )
    common.log(f"capacity {capacity} req/s"
               + (f" (completing {result['capacity_completion_rps']:.3g} req/s)" if capacity is not None and cap_step
                  else "")
               + (f", {result['saturation_rps']:.3g} req/s served when overloaded" if overloaded else "")
               + f", bound by {bound}: {why}"
               + (f"; invalid steps (client-limited): {invalid}" if invalid else ""))
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

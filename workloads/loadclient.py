"""The rules ``loadgen.py`` judges every load step by: the CPU the client may use, when a step
measured the client instead of the server (below), how many locust workers a rate needs,
whether the server kept pace with the offered rate (:func:`pace`), how full the server was
(:func:`gpuproof_headroom`, :func:`prom_gauges`) and what bound a failing step (:func:`classify`).

Standard library only and no locust import, so gpuproof (``gpuproof/bench/loadpods.py``) and
tests import it as plain code; ``loadgen.py`` applies it to every step.

A step is **invalid** (``valid: false`` and ``invalid_reason``) when the client, not the
server, was the limit:

- **CPU**: a process that sent requests used at least ``CPU_SATURATION`` (90 %) of the CPU
  it can use. A locust process sends from one Python thread under gevent, so it can use one
  core at most; less when its cgroup quota (a pod's CPU limit) or its CPU affinity allows
  less: ``usable = min(1, quota, CPUs in the affinity mask)``. 90 % is also the level at
  which locust itself warns that it may be constraining the throughput;
- **rate with flat latency**: the client's sends (``sent_rps``: requests sent per second of
  sending) fell short of the offered rate by more than the step's rate tolerance, errors do
  not explain the shortfall, and the server's latency
  stayed flat: its median is within ``FLAT_FACTOR`` (2x) of the idle latency (plus
  ``FLAT_SLACK_MS``). A server at its limit queues, so its latency grows; a shortfall
  without that growth means the client did not send on time (too few users, a starved or
  throttled process). "Server latency" is the server's own per-request time (queue +
  model) where it reports one (gpuproof's server), else the client's TTFT. The idle
  latency is the lowest 10th percentile of the steps so far (the current one included:
  even an overloaded step's first requests meet an empty queue), or, with
  ``loadgen.py --idle-probes N``, the median of N requests sent one at a time first.

An invalid step never gives a capacity and never names the server as the bound: the
capacity search stops at it and reports ``bound_by: client``.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left, bisect_right
from statistics import fmean as mean

CPU_SATURATION = 0.90   # share of the usable CPU at which a load process counts as saturated
FLAT_FACTOR = 2.0       # server latency p50 within this factor of the idle latency is "flat"
FLAT_SLACK_MS = 20.0    # ... plus this much, so that millisecond jitter on a fast endpoint is flat too
HEADROOM = 0.7          # size workers to run at most this share of their per-core rate at the target
MAX_WORKERS = 16
LATE_ANSWERS = 8       # answers the last quarter needs before its rate is read (fewer: the count alone judges)
PACE_SLACK = 2          # answers a step's pace window may be short by whatever the rate (those at its edges)


def cgroup_cpu_quota() -> float | None:
    """CPUs this process's cgroup may use (``cpu.max`` v2, ``cfs_quota_us`` v1); None when unlimited."""
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        with open("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") as f:
            quota = int(f.read())
        with open("/sys/fs/cgroup/cpu/cpu.cfs_period_us") as f:
            period = int(f.read())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def usable_cores() -> dict:
    """The CPU one load process can use: one core at most (one Python thread), less under a quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    cores = min([1.0, float(affinity)] + ([quota] if quota else []))
    return {"cores": cores, "affinity_cpus": affinity, "cgroup_quota_cpus": quota, "host_cpus": os.cpu_count()}


def step_validity(step: dict, idle: dict | None, *, rate_tolerance: float, max_error_rate: float,
                  cpu_threshold: float = CPU_SATURATION, flat_factor: float = FLAT_FACTOR,
                  flat_slack_ms: float = FLAT_SLACK_MS) -> tuple[bool, str | None]:
    """``(valid, reason)`` of one load step (see the module doc).

    ``step`` needs ``offered_rps``, ``sent_rps``, ``sent``, ``failed`` (sent and failed) and
    ``client.processes`` (each with ``cpu`` = CPU seconds per wall second and ``cores`` = usable
    cores) and, for the rate rule, ``server_latency_p50_ms`` or ``ttft_p50_ms``; ``idle`` the idle
    latency (``server_ms``, ``ttft_ms``).
    """
    procs = (step.get("client") or {}).get("processes") or []
    senders = [p for p in procs if p.get("role") != "master"]
    for p in senders:
        if p.get("cpu") is None:
            continue
        share = p["cpu"] / max(1e-9, p.get("cores") or 1.0)
        if share >= cpu_threshold:
            who = f"{p['role']} {p['index']}" if p.get("role") == "worker" else "load generator"
            return False, (f"client saturated: {who} used {share:.0%} of its {p.get('cores') or 1:g} usable "
                           f"core(s) (>= {cpu_threshold:.0%})")
    missing = (step.get("client") or {}).get("missing_workers") or []
    if missing:
        return False, f"client incomplete: worker(s) {', '.join(map(str, missing))} did not report this step"
    offered, sent_rps = step["offered_rps"], step["sent_rps"]
    if sent_rps >= offered * (1 - rate_tolerance):
        return True, None
    sent = step.get("sent") or 0
    failed = step["failed"] if step.get("failed") is not None else step.get("errors") or 0
    if sent and failed / sent > max_error_rate:
        return True, None   # the server refused or failed requests: its problem, not the client's
    now, base, what = latency_pair(step, idle)
    if now is None or base is None:
        return True, None
    if now <= base * flat_factor + flat_slack_ms:
        return False, (f"client could not keep the rate: sent {sent_rps:.3g} < offered {offered:.3g} req/s "
                       f"while {what} stayed flat (p50 {now:.1f} ms, idle {base:.1f} ms)")
    return True, None


def latency_pair(step: dict, idle: dict | None) -> tuple[float | None, float | None, str]:
    """(this step's server latency p50, the idle one, what they are) for the flat-latency rule."""
    idle = idle or {}
    if step.get("server_latency_p50_ms") is not None and idle.get("server_ms") is not None:
        return step["server_latency_p50_ms"], idle["server_ms"], "the server's own time per request"
    return step.get("ttft_p50_ms"), idle.get("ttft_ms"), "the time to first token"


def size_workers(target_rps: float, per_core_rps: float, headroom: float = HEADROOM,
                 max_workers: int = MAX_WORKERS) -> dict:
    """Locust workers for ``target_rps``: ceil(target / (rate one worker sends x headroom)). The rate
    comes from a calibration (requests per CPU-second on one core) or, during a search, from the CPU
    a worker spent per request in the previous step (its usable cores / CPU seconds per request)."""
    if target_rps <= 0 or per_core_rps <= 0 or not 0 < headroom <= 1 or max_workers < 1:
        raise ValueError("target_rps and per_core_rps must be > 0, 0 < headroom <= 1, max_workers >= 1")
    needed = max(1, math.ceil(target_rps / (per_core_rps * headroom) - 1e-9))
    return {"workers": min(needed, max_workers), "needed": needed, "capped": needed > max_workers,
            "target_rps": target_rps, "per_core_rps": per_core_rps, "headroom": headroom,
            "max_workers": max_workers,
            "rule": f"ceil({target_rps:g} / ({per_core_rps:.4g} x {headroom:g})) = {needed}"
                    + (f", capped at {max_workers}" if needed > max_workers else "")}


# how full a server is, from the Prometheus gauges of the servers that publish them (summed over
# label sets): requests running (batch slots used), requests waiting, share of the KV cache used
PROM_GAUGES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
}


def prom_gauges(text: str) -> dict:
    """``{"running": x, "waiting": y, "kv_cache_usage": z, "names": [...]}`` from Prometheus text
    (each key only when the server publishes one of its names)."""
    wanted = {name: key for key, names in PROM_GAUGES.items() for name in names}
    out: dict = {}
    seen = set()
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        key = wanted.get(name)
        if key is None:
            continue
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        out[key] = out.get(key, 0.0) + value
        seen.add(name)
    if out:
        out["names"] = sorted(seen)
    return out


def prom_headroom(samples: list[dict]) -> dict | None:
    if not samples:
        return None

    def series(key):
        return [s[key] for s in samples if key in s]

    running, waiting, kv = series("running"), series("waiting"), series("kv_cache_usage")
    return {"source": "prometheus " + ",".join(samples[-1].get("names", [])), "samples": len(samples),
            "running_mean": mean(running) if running else None,
            "running_max": max(running) if running else None, "max_batch": None, "slots_used": None,
            "waiting_mean": mean(waiting) if waiting else None,
            "waiting_max": max(waiting) if waiting else None,
            "waiting_growth": waiting[-1] - waiting[0] if waiting else None,
            "kv_cache_usage_mean": mean(kv) if kv else None, "kv_cache_usage_max": max(kv) if kv else None}


def gpuproof_headroom(m0: dict | None, m1: dict | None) -> dict | None:
    """How full gpuproof's server was between two /metrics readings: mean running requests against
    its batch slots, mean waiting requests, and the queue then and now."""
    if not m0 or not m1 or "running_s" not in (m1.get("engine") or {}):
        return None
    dw = m1["wall_s"] - m0["wall_s"]
    if dw <= 0:
        return None
    e0, e1 = m0["engine"], m1["engine"]
    running = (e1["running_s"] - e0.get("running_s", 0.0)) / dw
    slots = m1.get("max_batch")
    return {"source": "gpuproof /metrics", "running_mean": running, "running_max": None, "max_batch": slots,
            "slots_used": running / slots if slots else None,
            "waiting_mean": (e1["waiting_s"] - e0.get("waiting_s", 0.0)) / dw, "waiting_max": None,
            "waiting_growth": m1.get("waiting", 0) - m0.get("waiting", 0),
            "kv_cache_usage_mean": None, "kv_cache_usage_max": None}


def engine_steps(e0: dict, e1: dict, dw: float) -> dict:
    """Per engine step between two readings (a server that times its steps: ``llm_step.StepClock``): the server's
    CPU and the device's milliseconds, their ratio, tokens per step and the device's share of the wall time."""
    steps = e1.get("steps", 0) - e0.get("steps", 0)
    if "cpu_s" not in e1 or steps <= 0:
        return {}
    cpu, dev = e1["cpu_s"] - e0.get("cpu_s", 0.0), e1["device_s"] - e0.get("device_s", 0.0)
    tokens = sum(e1.get(k, 0) - e0.get(k, 0) for k in ("prefill_tokens", "decode_tokens"))
    return {"engine_steps": steps, "cpu_ms_per_step": cpu / steps * 1e3, "device_ms_per_step": dev / steps * 1e3,
            "cpu_per_device_step": cpu / dev if dev > 0 else None, "tokens_per_step": tokens / steps,
            "device_busy": dev / dw, "device_timer": e1.get("device_timer"), "cuda_graphs": e1.get("cuda_graphs")}


def headroom_text(room: dict | None) -> str:
    """'2.4 of 16 batch slots used, 0.0 waiting' (what a user reads beside "busy")."""
    if not room:
        return "how full it was: not reported"
    parts = []
    if room.get("running_mean") is not None:
        parts.append(f"{room['running_mean']:.1f} of {room['max_batch']} batch slots used" if room.get("max_batch")
                     else f"{room['running_mean']:.1f} requests running")
    if room.get("kv_cache_usage_mean") is not None:
        parts.append(f"KV cache {room['kv_cache_usage_mean']:.0%} used")
    if room.get("waiting_mean") is not None:
        parts.append(f"{room['waiting_mean']:.1f} waiting")
    return ", ".join(parts) or "how full it was: not reported"


def is_full(room: dict | None, threshold: float) -> bool:
    """The server had no room: batch slots (or KV cache) used at ``threshold`` or more, or a queue."""
    if not room:
        return False
    return ((room.get("slots_used") or 0.0) >= threshold or (room.get("kv_cache_usage_mean") or 0.0) >= threshold
            or (room.get("waiting_mean") or 0.0) >= 1.0)


def pace(sends: list[float], ended: list[float], answered: list[float], t0: float, span: float,
         rate: float, tolerance: float, slots: int | None = None) -> dict:
    """Whether the answers kept pace with the sends, over the second half of the sending.

    By then the requests of the first half have come back (loadgen makes a step last several
    times the server's latency, see ``Runner.step_length``), so a server that keeps up
    completes requests as fast as they are offered and holds a steady number in flight; one that
    cannot serves its own rate and the queue grows by the difference. The growth is read from the
    number in flight averaged over the first and the last quarter of the window (scaled to the
    whole window), not at its two instants: in a steady state that number swings by a few
    requests as batches finish (3 of 10 at 1 req/s on a CPU model), more than ``slack`` allows,
    and an average over a quarter of the window smooths that swing while a real backlog, which
    grows all the time, still shows. The step is behind when that growth plus the sends it owed
    exceed ``slack``: ``PACE_SLACK`` requests, or ``tolerance`` of the window's offer when more.
    ``completion_rps`` is the answers counted in the window.

    A continuous-batching server gets faster as its batch fills (one decode step serves every running
    request), so near its capacity a step starting from an empty queue takes long to settle: the number
    in flight rises while the server speeds up towards a balance, and a finite window reads that as
    growth. ``late_rps``, the rate of the answers in the last quarter of the sending (where the batch is
    fullest: the lower of first-to-last and count-over-the-quarter), tells the two apart: a
    step whose queue grew but whose late answers came as fast as the offer (within ``tolerance``) with
    the sends on time was filling its batch, and keeps pace; an overloaded server's late answers come at
    its own, lower rate. It also tells the search what the server can complete at most.

    Where the server says how many requests it batches (``slots``: gpuproof's server's
    ``max_batch``), its queue (``queue_growth``) is what is in flight beyond them, the requests
    that wait, and a step whose late answers caught up must also not have grown that queue:
    requests joining a batch with free slots are served at once, an overloaded server fills its
    slots and then its queue grows. Without ``slots`` the queue is everything in flight.
    Completions keep pace either way: the in-flight count did not grow (``in_flight_growth``), or
    the late answers came as fast as the offer."""
    mid, end = t0 + span / 2, t0 + span

    def in_flight(t):
        return bisect_right(sends, t) - bisect_right(ended, t)

    def queued(t):
        return max(0, in_flight(t) - slots)

    def level(a, b, count=in_flight, n=64):
        return mean(count(a + (b - a) * (i + 0.5) / n) for i in range(n))

    window = end - mid
    quarter = window / 4
    lvl_mid, lvl_end = level(mid, mid + quarter), level(end - quarter, end)
    scale = window / (window - quarter)
    grew = (lvl_end - lvl_mid) * scale                                  # in flight
    growth = ((level(end - quarter, end, queued) - level(mid, mid + quarter, queued)) * scale if slots
              else grew)                                                # the queue: beyond the slots, or all
    done = bisect_right(answered, end) - bisect_right(answered, mid)
    expected = rate * window
    # sends behind the schedule, less the one a window of whole sends may hold more or fewer of
    owed = max(0.0, expected - (bisect_right(sends, end) - bisect_right(sends, mid)) - 1)
    slack = max(PACE_SLACK, tolerance * expected)
    shortfall = grew + owed
    late = answered[bisect_left(answered, end - span / 4):bisect_right(answered, end)]
    # two readings of that rate, the lower kept: first to last answer (no edge counted, but alike
    # requests admitted together finish together, and a window that cuts such a cluster reads high)
    # and the count over the quarter (off by the answers at its edges)
    late_rps = (min((len(late) - 1) / (late[-1] - late[0]), len(late) / (span / 4))
                if len(late) >= LATE_ANSWERS and late[-1] > late[0] else None)
    caught_up = (late_rps is not None and late_rps >= rate * (1 - tolerance) and owed <= slack
                 and (not slots or growth + owed <= slack))
    return {"window_s": window, "completion_rps": done / window, "in_flight_mid": round(lvl_mid, 1),
            "in_flight_end": round(lvl_end, 1), "in_flight_growth": round(grew), "queue_growth": round(growth),
            "late_rps": late_rps,
            "queue_counts": f"in flight beyond the server's {slots} batch slots" if slots else "in flight",
            "caught_up": shortfall > slack and caught_up,
            "keeps_pace": shortfall <= slack or caught_up, "shortfall": shortfall, "slack": slack}


# On a GPU, a step whose server CPU time is at least this share of the GPU's time (both per engine step, from the
# server's /metrics: ``llm_step.StepClock``) is bound by the server's Python, not the device. CUDA events count the
# gaps that slow launches leave between kernels, so a launch-bound step reads a device time about equal to its CPU
# time (ratio ~1, above 1 with the scheduler's own Python); a GPU-bound one reads well above it (ratio << 1).
# NVML cannot tell them apart: a sample period counts as busy when any kernel ran in it.
PYTHON_BOUND_RATIO = 0.9


def python_bound(srv: dict) -> bool:
    """The server's CPU per step is >= PYTHON_BOUND_RATIO of the GPU's (CUDA-event timing only: on the CPU the
    device time is the model's compute on the same cores, and the ratio is the scheduler's share of it)."""
    ratio = srv.get("cpu_per_device_step")
    return srv.get("device_timer") == "cuda-events" and ratio is not None and ratio >= PYTHON_BOUND_RATIO


def classify(step: dict, threshold: float) -> tuple[str, str]:
    """What bound a failing valid step: 'client', 'device' or 'server' (see loadgen's doc), and why.
    (A saturated client was already caught by :func:`step_validity`.) Busy alone is never
    saturation: a loop never idle with most of its batch slots free has room."""
    srv = step.get("server") or {}
    room = step.get("headroom")
    full = is_full(room, threshold) or step.get("keeps_pace") is False
    fullness = headroom_text(room)
    gpu = srv.get("gpu_util_pct")
    busy = max(srv.get("cpu_util") or 0.0, srv.get("engine_busy") or 0.0)
    behind = (f"completions {step['completion_rps']:.3g} < offered {step['offered_rps']:.3g} req/s, "
              if step.get("keeps_pace") is False else "")
    if python_bound(srv) and full:
        return "server", (f"the server's Python bounds the GPU: {srv['cpu_ms_per_step']:.2f} ms of its CPU per "
                          f"engine step against the GPU's {srv['device_ms_per_step']:.2f} ms (ratio "
                          f"{srv['cpu_per_device_step']:.2f} >= {PYTHON_BOUND_RATIO}), {behind}{fullness}")
    if gpu is not None and gpu >= threshold * 100 and full:
        return "device", f"GPU busy {gpu:.0f}% (NVML) and the server full: {behind}{fullness}"
    if srv and busy >= threshold and full:
        return "server", (f"server saturated: {behind}busy {busy:.0%} (process CPU {srv.get('cpu_util') or 0:.0%} "
                          f"of its budget, engine loop busy {srv.get('engine_busy') or 0:.0%}), {fullness}")
    late = step.get("late_fraction") or 0.0
    if late > 0.1 or step["sent_rps"] < step["offered_rps"] * 0.9 and step["errors"] == 0:
        return "client", (f"sends ran late ({late:.0%} late, p95 lag {step.get('schedule_lag_p95_ms') or 0:.0f} ms, "
                          f"{step.get('starved_fraction') or 0:.0%} waited for a free user) while the server "
                          f"was {'busy ' + format(busy, '.0%') + ', ' + fullness if srv else 'not reporting'}")
    if step.get("keeps_pace") is False:
        return "server", (f"completions fell behind the sends "
                          f"({step['completion_rps']:.3g} < {step['offered_rps']:.3g} "
                          f"req/s) with the client on schedule; {fullness}")
    if not srv and not room:
        return "server", "SLO missed with the client on schedule; the endpoint reports no metrics"
    return "server", (f"SLO missed with the client on schedule and the server not full ({fullness}"
                      + (f", busy {busy:.0%}" if srv else "") + ")")

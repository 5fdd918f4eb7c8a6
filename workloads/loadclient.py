"""What the load client knows about itself: the CPU it may use, when a load step measured the
client instead of the server, and how many locust workers a target rate needs.

Standard library only and no locust import, so gpuproof (``gpuproof/loadpods.py``) and
tests import it as plain code; ``loadgen.py`` applies it to every step.

A step is **invalid** (``valid: false`` and ``invalid_reason``) when the client, not the
server, was the limit:

- **CPU**: a process that sent requests used at least ``CPU_SATURATION`` (90 %) of the CPU
  it can use. A locust process sends from one Python thread under gevent, so it can use one
  core at most; less when its cgroup quota (a pod's CPU limit) or its CPU affinity allows
  less: ``usable = min(1, quota, CPUs in the affinity mask)``. 90 % is also the level at
  which locust itself warns that it may be constraining the throughput;
- **rate with flat latency**: the achieved rate fell short of the offered one by more than
  the step's rate tolerance, errors do not explain the shortfall, and the server's latency
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

CPU_SATURATION = 0.90   # share of the usable CPU at which a load process counts as saturated
FLAT_FACTOR = 2.0       # server latency p50 within this factor of the idle latency is "flat"
FLAT_SLACK_MS = 20.0    # ... plus this much, so that millisecond jitter on a fast endpoint is flat too
HEADROOM = 0.7          # size workers to run at most this share of their per-core rate at the target
MAX_WORKERS = 16


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

    ``step`` needs ``offered_rps``, ``achieved_rps``, ``sent``, ``failed`` (sent and failed) and
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
    offered, achieved = step["offered_rps"], step["achieved_rps"]
    if achieved >= offered * (1 - rate_tolerance):
        return True, None
    sent = step.get("sent") or 0
    failed = step["failed"] if step.get("failed") is not None else step.get("errors") or 0
    if sent and failed / sent > max_error_rate:
        return True, None   # the server refused or failed requests: its problem, not the client's
    now, base, what = latency_pair(step, idle)
    if now is None or base is None:
        return True, None
    if now <= base * flat_factor + flat_slack_ms:
        return False, (f"client could not keep the rate: achieved {achieved:.3g} < offered {offered:.3g} req/s "
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
    """Locust workers (one core each) for ``target_rps``: ceil(target / (per-core rate x headroom))."""
    if target_rps <= 0 or per_core_rps <= 0 or not 0 < headroom <= 1 or max_workers < 1:
        raise ValueError("target_rps and per_core_rps must be > 0, 0 < headroom <= 1, max_workers >= 1")
    needed = max(1, math.ceil(target_rps / (per_core_rps * headroom) - 1e-9))
    return {"workers": min(needed, max_workers), "needed": needed, "capped": needed > max_workers,
            "target_rps": target_rps, "per_core_rps": per_core_rps, "headroom": headroom,
            "max_workers": max_workers,
            "rule": f"ceil({target_rps:g} / ({per_core_rps:.4g} x {headroom:g})) = {needed}"
                    + (f", capped at {max_workers}" if needed > max_workers else "")}

"""Load test of the inference server with locust used as a library.

Steps through target request rates (``--rates``, requests/s, ``--step-s`` seconds each)
with locust's FastHttpUser and a load shape (see locustfile.py), records the exact
latency of every request itself, and prints one JSON object with, per step and overall:
requests, achieved rate, error rate, exact p50/p90/p95/p99/max latency, goodput
(requests/s answered OK within the p99 SLO) and the verdict against ``--slo-p99-ms``
(p99 within the SLO and error rate within ``--max-error-rate``).

It waits (bounded by ``--wait-ready``) for the server's health endpoint first and reads
the model's input width from ``/info``. A run is bounded by the steps' total time and
by ``--max-requests``. Needs only the standard library and locust (no torch).
"""

from __future__ import annotations

import locustfile  # first: imports locust, which monkey-patches the standard library

import json
import random
import resource
import sys
import time
import urllib.error
import urllib.request

import gevent
from locust.env import Environment
from locust.runners import STATE_STOPPED

import workload_common as common
from locustfile import PLAN, InferenceUser, StepRateShape

PERCENTILES = (50, 90, 95, 99)


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


def wait_ready(base: str, health_path: str, timeout: float) -> None:
    """Poll the health endpoint until it answers 200, at most ``timeout`` seconds."""
    common.wait_until(lambda: _get(base + health_path)[0] == 200, timeout,
                      f"{base}{health_path} to answer 200", interval=0.1)


def latency_stats(lat_s: list[float]) -> dict:
    out = {f"p{q}_ms": (common.percentile(lat_s, q) * 1e3 if lat_s else None) for q in PERCENTILES}
    out["max_ms"] = max(lat_s) * 1e3 if lat_s else None
    out["mean_ms"] = common.mean(lat_s) * 1e3 if lat_s else None
    return out


def summarize(records, duration_s: float, slo_p99_ms: float | None, max_error_rate: float,
              target_rps: float | None = None) -> dict:
    """Statistics of one step (or of the whole run) from (t, latency, ok, step, code) rows."""
    n = len(records)
    ok_lat = [r[1] for r in records if r[2]]
    errors = n - len(ok_lat)
    row = {
        "target_rps": target_rps,
        "duration_s": duration_s,
        "requests": n,
        "ok": len(ok_lat),
        "errors": errors,
        "error_rate": errors / n if n else None,
        "achieved_rps": n / duration_s if duration_s > 0 else None,
        "throughput_rps": len(ok_lat) / duration_s if duration_s > 0 else None,
        "status_codes": {},
        **latency_stats(ok_lat),
    }
    for r in records:
        row["status_codes"][str(r[4])] = row["status_codes"].get(str(r[4]), 0) + 1
    if slo_p99_ms is not None:
        good = sum(1 for r in records if r[2] and r[1] * 1e3 <= slo_p99_ms)
        row["goodput_rps"] = good / duration_s if duration_s > 0 else None
        row["slo_met"] = bool(n) and row["p99_ms"] is not None and row["p99_ms"] <= slo_p99_ms \
            and row["error_rate"] <= max_error_rate
    return row


def build_parser():
    p = common.parser(
        "loadgen.py",
        "Step load against the inference server with locust (FastHttpUser); exact latency "
        "percentiles, goodput and a p99 SLO verdict as one JSON object.",
        epilog="examples:\n"
               "  python loadgen.py --url http://127.0.0.1:8000 --rates 10,50,100 --step-s 10 --slo-p99-ms 50\n"
               "  python loadgen.py --url http://gpuproof-infer:8000 --rates 100,200,400\n"
               "  python loadgen.py --url http://127.0.0.1:8000 --rates 0 --users 64   # as fast as possible\n",
    )
    p.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--rates", default="10,20,50",
                   help="target requests/s per step, comma list (0 = unthrottled); default 10,20,50")
    p.add_argument("--step-s", type=float, default=10.0, help="seconds per step (default 10)")
    p.add_argument("--slo-p99-ms", type=float, default=100.0, help="p99 latency SLO in ms (default 100)")
    p.add_argument("--max-error-rate", type=float, default=0.0,
                   help="error rate a step may have and still meet the SLO (default 0)")
    p.add_argument("--user-rps", type=float, default=20.0,
                   help="target rate per simulated user; users per step = ceil(rate / this) (default 20)")
    p.add_argument("--max-users", type=int, default=1000, help="users per step at most (default 1000)")
    p.add_argument("--users", type=int, default=32, help="users for an unthrottled (rate 0) step (default 32)")
    p.add_argument("--max-requests", type=int, default=2_000_000,
                   help="stop after this many requests (default 2,000,000)")
    p.add_argument("--drain-s", type=float, default=30.0,
                   help="after the last step, wait at most this long for answers still due (default 30)")
    p.add_argument("--rows", type=int, default=1, help="input rows per request (default 1)")
    p.add_argument("--path", default="/infer", help="request path (default /infer)")
    p.add_argument("--get", action="store_true", help="send GET requests without a body (e.g. --path /healthz)")
    p.add_argument("--health-path", default="/healthz", help="readiness path polled first (default /healthz)")
    p.add_argument("--wait-ready", type=float, default=120.0,
                   help="seconds to wait for the health endpoint (default 120)")
    p.add_argument("--in-features", type=int, default=0,
                   help="input width (default 0: read it from the server's /info)")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        rates = common.parse_float_list(args.rates)
    except ValueError as exc:
        return common.fail_usage(f"--rates: {exc}")
    if not rates or any(r < 0 for r in rates) or args.step_s <= 0 or args.max_requests < 1:
        return common.fail_usage("--rates needs rates >= 0, --step-s > 0 and --max-requests >= 1")
    base = args.url.rstrip("/")
    try:
        wait_ready(base, args.health_path, args.wait_ready)
    except TimeoutError as exc:
        return common.fail_usage(str(exc))
    in_features = args.in_features
    if not in_features and not args.get:
        code, body = _get(base + "/info")
        if code != 200:
            return common.fail_usage(f"{base}/info answered {code}; pass --in-features")
        in_features = int(json.loads(body)["in_features"])

    rng = random.Random(args.seed)
    PLAN.rates, PLAN.step_s = rates, args.step_s
    PLAN.user_rps, PLAN.max_users, PLAN.unthrottled_users = args.user_rps, args.max_users, args.users
    PLAN.path, PLAN.method = args.path, ("GET" if args.get else "POST")
    PLAN.bodies = [json.dumps({"inputs": [[round(rng.gauss(0, 1), 4) for _ in range(in_features)]
                                          for _ in range(args.rows)]}).encode() for _ in range(16)]
    env = Environment(user_classes=[InferenceUser], shape_class=StepRateShape(), host=base)
    runner = env.create_local_runner()

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    common.log(f"load: {len(rates)} steps of {args.step_s:g}s at {rates} req/s against {base}{args.path}")
    PLAN.t0 = time.perf_counter()
    t0_epoch = time.time()
    runner.start_shape()
    end = PLAN.t0 + PLAN.duration_s
    drain_deadline = end + args.drain_s  # answers to requests sent before the end are still awaited
    reason = "steps done"
    while True:
        gevent.sleep(0.02)
        now = time.perf_counter()
        if len(PLAN.records) >= args.max_requests:
            reason = f"--max-requests {args.max_requests} reached"
            break
        if now >= end and PLAN.inflight == 0:
            break
        if now >= drain_deadline:
            reason = f"{PLAN.inflight} requests still unanswered {args.drain_s:g}s after the last step"
            break
        if runner.state == STATE_STOPPED and now < end:
            reason = "locust stopped early"
            break
    elapsed = min(time.perf_counter(), end) - PLAN.t0
    runner.quit()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu_s = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)

    records = list(PLAN.records)
    steps = []
    for i, rate in enumerate(rates):
        recs = [r for r in records if r[3] == i]
        # the last step may have ended early (max-requests); use the time it really ran
        dur = min(args.step_s, max(0.0, elapsed - i * args.step_s))
        steps.append({"step": i, "users": PLAN.users_for(rate),
                      **summarize(recs, dur, args.slo_p99_ms, args.max_error_rate, rate or None)})
    overall = summarize(records, min(elapsed, PLAN.duration_s), args.slo_p99_ms, args.max_error_rate)
    passing = [s["target_rps"] for s in steps if s.get("slo_met") and s["target_rps"]]
    locust_total = env.stats.total
    result = common.base_result("loadgen")
    result.update(
        url=base + args.path,
        rates=rates,
        step_s=args.step_s,
        slo_p99_ms=args.slo_p99_ms,
        max_error_rate=args.max_error_rate,
        stop_reason=reason,
        started_epoch=t0_epoch,
        elapsed_s=elapsed,
        steps=steps,
        overall=overall,
        max_rate_meeting_slo=max(passing) if passing else None,
        # every step that ran must meet the SLO (a step with no answered request does not)
        verdict="pass" if records and all(s.get("slo_met") for s in steps if s["duration_s"] > 0) else "fail",
        loadgen_cpu_s=cpu_s,
        rps_per_core=len(records) / cpu_s if cpu_s > 0 else None,
        locust={  # locust's own, bucket-rounded view, for comparison only
            "requests": locust_total.num_requests,
            "failures": locust_total.num_failures,
            "p50_ms": locust_total.get_response_time_percentile(0.5) if locust_total.num_requests else None,
            "p99_ms": locust_total.get_response_time_percentile(0.99) if locust_total.num_requests else None,
            "version": locustfile.locust.__version__,
        },
        ok=bool(records),
    )
    for s in steps:
        common.log(f"step {s['step']}: target {s['target_rps']} req/s, achieved {s['achieved_rps']:.1f}, "
                   f"p99 {s['p99_ms']} ms, errors {s['errors']}, SLO {'met' if s.get('slo_met') else 'MISSED'}")
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""LLM load generator and capacity search: locust as a library against an OpenAI-compatible
``/v1/completions`` endpoint (gpuproof's own ``inference_server.py``, vLLM, TGI, SGLang, NIM).

Per request (see ``locustfile.py``): time to first token (TTFT), time per output token
(TPOT) and the gaps between streamed tokens, end-to-end latency, output tokens. Input and
output lengths are fixed and seeded (``--input-tokens`` words, ``max_tokens`` with
``ignore_eos``/``min_tokens`` so servers that honor them generate exactly that many).

A step offers a rate for ``--step-s`` seconds (open loop, see locustfile.py) and then
waits for the answers (at most ``--drain-s``). It meets the SLO when at least
``--slo-attainment`` of its requests meet every SLO (``--slo-ttft-ms``, ``--slo-tpot-ms``),
no more than ``--max-error-rate`` fail, and the achieved rate (answered requests per
second of sending) is within ``--rate-tolerance`` of the offered one.
Goodput = requests meeting every SLO per second.

``--rates LO:HI`` (default) searches for the capacity: the offered rate goes LO,
LO*``--ramp-factor``, ... up to HI until a step fails, then ``--bisect-steps`` steps bisect
(geometrically) between the last passing and the first failing rate. ``--rates a,b,c``
runs exactly those rates. The capacity is the highest passing rate, and what bound it is
judged on the lowest failing step, in this order:

- ``client``: the load generator's own CPU time reached 90% of a core (locust's own warning
  level), or the signals below do not point at the server and the sends ran late against
  the schedule (too few users, or users pacing themselves with ``--think-ms``);
- ``device``: the GPU was busy (NVML utilization, from the server's ``/metrics``) at least
  ``--busy-threshold``;
- ``server``: the server's process was busy: CPU time per wall second over its CPU budget
  (one core on a GPU, torch's threads on the CPU), or its engine loop never idle, at
  least ``--busy-threshold``; an endpoint without gpuproof's ``/metrics`` that fails the
  SLO with the client keeping up is also ``server``;
- ``offered-range``: no step failed; the search ran out of range.

Only ``device`` and ``server`` give ``capacity_rps``; ``client`` and ``offered-range``
leave it null (``max_passing_rps`` keeps the highest rate that passed). Every step
reports its offered rate, achieved rate, client CPU and schedule lag. A run is bounded by
``--max-steps``, ``--max-duration-s`` and ``--max-requests``. Needs only the standard
library and locust (no torch).
"""

from __future__ import annotations

import locustfile  # first: imports locust, which monkey-patches the standard library

import json
import math
import resource
import sys
import time
import urllib.error
import urllib.request

import gevent
from locust.env import Environment
from locust.runners import CPU_WARNING_THRESHOLD

import workload_common as common
from locustfile import PLAN, InferenceUser, make_prompts

PCTS = (50, 90, 99)
BOUNDS = ("device", "server", "client", "offered-range")


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
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


def server_metrics(base: str, path: str) -> dict | None:
    """gpuproof's JSON /metrics, or None (another server: Prometheus text, 404, ...)."""
    if not path:
        return None
    try:
        code, body = _get(base + path, timeout=5.0)
        m = json.loads(body) if code == 200 else None
    except (ValueError, OSError):
        return None
    return m if isinstance(m, dict) and "process_cpu_s" in m else None


def _cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _pcts(values: list[float], prefix: str, scale: float = 1e3) -> dict:
    out = {f"{prefix}_p{q}_ms": (common.percentile(values, q) * scale if values else None) for q in PCTS}
    out[f"{prefix}_mean_ms"] = common.mean(values) * scale if values else None
    return out


def server_side(m0: dict | None, m1: dict | None) -> dict | None:
    """The server's busy fractions and per-request time split between two /metrics readings."""
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


def step_stats(idx: int, rate: float, step_s: float, t0: float, n: int, recs: list[dict], args) -> dict:
    """The statistics of one step from its requests' records."""
    ok = [r for r in recs if r["ok"]]
    last_send = max((r["sent"] for r in recs), default=t0)
    span = max(step_s, last_send - t0 + 1.0 / rate)          # how long sending took
    last_done = max((r["sent"] + r["e2e_s"] for r in ok), default=t0 + step_s)
    ttft = [r["ttft_s"] for r in ok]
    tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["tokens"] - 1) for r in ok if r["tokens"] > 1]
    itl = [g for r in ok for g in r["itl_s"]]
    e2e = [r["e2e_s"] for r in ok]
    good = [r for r in ok if r["ttft_s"] * 1e3 <= args.slo_ttft_ms
            and (r["tokens"] <= 1 or (r["e2e_s"] - r["ttft_s"]) / (r["tokens"] - 1) * 1e3 <= args.slo_tpot_ms)]
    lags = [r["lag_s"] for r in recs]
    late_tol = max(0.05, 0.5 / rate)
    errors = n - len(ok)
    codes: dict[str, int] = {}
    for r in recs:
        codes[str(r["code"])] = codes.get(str(r["code"]), 0) + 1
    out_tokens = sum(r["tokens"] for r in ok)
    row = {
        "step": idx,
        "offered_rps": rate,
        "requests": n,
        "sent": len(recs),
        "ok": len(ok),
        "errors": errors,
        "error_rate": errors / n if n else None,
        "send_span_s": span,
        "achieved_rps": len(ok) / span,
        "goodput_rps": len(good) / span,
        "slo_attainment": len(good) / n if n else None,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / max(step_s, last_done - t0),
        "mean_output_tokens": out_tokens / len(ok) if ok else None,
        **_pcts(ttft, "ttft"), **_pcts(tpot, "tpot"), **_pcts(itl, "itl"), **_pcts(e2e, "e2e"),
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
    if row["achieved_rps"] < rate * (1 - args.rate_tolerance):
        reasons.append(f"achieved {row['achieved_rps']:.3g} req/s < offered {rate:.3g}")
    row["slo_met"] = not reasons
    row["fail_reasons"] = reasons
    return row


def classify(step: dict, threshold: float) -> tuple[str, str]:
    """What bound a failing step: 'client', 'device' or 'server' (see the module doc), and why."""
    cpu = step.get("client_cpu") or 0.0
    if cpu * 100 >= CPU_WARNING_THRESHOLD:
        return "client", f"load generator CPU {cpu:.0%} of a core (locust warns at {CPU_WARNING_THRESHOLD}%)"
    srv = step.get("server") or {}
    gpu = srv.get("gpu_util_pct")
    if gpu is not None and gpu >= threshold * 100:
        return "device", f"GPU busy {gpu:.0f}% (NVML)"
    busy = max(srv.get("cpu_util") or 0.0, srv.get("engine_busy") or 0.0)
    if srv and busy >= threshold:
        return "server", (f"server busy {busy:.0%} (process CPU {srv.get('cpu_util') or 0:.0%} of its budget, "
                          f"engine loop busy {srv.get('engine_busy') or 0:.0%})")
    late = step.get("late_fraction") or 0.0
    if late > 0.1 or step["achieved_rps"] < step["offered_rps"] * 0.9 and step["errors"] == 0:
        return "client", (f"sends ran late ({late:.0%} late, p95 lag {step.get('schedule_lag_p95_ms') or 0:.0f} ms, "
                          f"{step.get('starved_fraction') or 0:.0%} waited for a free user) while the server "
                          f"was {'busy ' + format(busy, '.0%') if srv else 'not reporting'}")
    if not srv:
        return "server", "SLO missed with the client on schedule; the endpoint reports no gpuproof /metrics"
    return "server", f"SLO missed with the client on schedule and nothing saturated (server busy {busy:.0%})"


def build_parser():
    p = common.parser(
        "loadgen.py",
        "LLM load (locust, streamed /v1/completions): TTFT, TPOT, output tokens/s, goodput, and a capacity "
        "search that says what bound it (device, server, client, offered-range). One JSON object.",
        epilog="examples:\n"
               "  python loadgen.py --url http://127.0.0.1:8000                       # search 1..1024 req/s\n"
               "  python loadgen.py --url http://vllm:8000 --model meta-llama/Llama-3.1-8B-Instruct \\\n"
               "      --input-tokens 512 --output-tokens 128 --slo-ttft-ms 500 --slo-tpot-ms 50\n"
               "  python loadgen.py --url http://127.0.0.1:8000 --rates 2,4,8 --step-s 5   # fixed rates\n",
    )
    p.add_argument("--url", required=True, help="base URL of the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default="", help="model name to send (default: the first one /v1/models lists)")
    p.add_argument("--rates", default="1:1024",
                   help="LO:HI searches for the capacity in that range (default 1:1024); a,b,c runs those rates")
    p.add_argument("--ramp-factor", type=float, default=2.0, help="ramp: next rate = rate x this (default 2)")
    p.add_argument("--bisect-steps", type=int, default=3, help="bisection steps after the ramp (default 3)")
    p.add_argument("--precision", type=float, default=0.1,
                   help="stop bisecting when failing/passing rate <= 1 + this (default 0.1)")
    p.add_argument("--step-s", type=float, default=15.0, help="seconds of sending per step (default 15)")
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
    p.add_argument("--rate-tolerance", type=float, default=0.1,
                   help="a step fails when achieved < offered x (1 - this) (default 0.1)")
    p.add_argument("--busy-threshold", type=float, default=0.75,
                   help="GPU or server busy fraction that counts as saturated (default 0.75)")
    p.add_argument("--users", type=int, default=512, help="locust users (concurrent requests at most; default 512)")
    p.add_argument("--think-ms", type=float, default=0.0,
                   help="each user pauses this long after an answer (default 0; a slow client for tests)")
    p.add_argument("--max-steps", type=int, default=20, help="steps at most (default 20)")
    p.add_argument("--max-duration-s", type=float, default=3600.0, help="no new step after this long (default 3600)")
    p.add_argument("--max-requests", type=int, default=1_000_000, help="no new step after this many (default 1e6)")
    p.add_argument("--health-path", default="/v1/models", help="readiness path polled first (default /v1/models)")
    p.add_argument("--metrics-path", default="/metrics",
                   help="gpuproof's JSON metrics path on the server ('' = do not ask; default /metrics)")
    p.add_argument("--wait-ready", type=float, default=120.0, help="seconds to wait for readiness (default 120)")
    p.add_argument("--seed", type=int, default=0, help="prompt seed (default 0)")
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


class Runner:
    def __init__(self, args, base: str):
        self.args, self.base = args, base
        self.steps: list[dict] = []
        self.t_start = time.perf_counter()

    def budget_left(self) -> bool:
        a = self.args
        return (len(self.steps) < a.max_steps and time.perf_counter() - self.t_start < a.max_duration_s
                and len(PLAN.records) < a.max_requests)

    def step(self, rate: float) -> dict:
        a, idx = self.args, len(self.steps)
        m0, cpu0, w0 = server_metrics(self.base, a.metrics_path), _cpu_s(), time.perf_counter()
        t0 = PLAN.begin_step(idx, rate, a.step_s)
        n = len(PLAN.due)
        deadline = t0 + a.step_s + a.drain_s
        while time.perf_counter() < deadline:
            if PLAN.next_ticket >= n and PLAN.done.get(idx, 0) >= n:
                break
            gevent.sleep(0.02)
        PLAN.end_step()
        cpu1, w1 = _cpu_s(), time.perf_counter()
        m1 = server_metrics(self.base, a.metrics_path)
        recs = [r for r in PLAN.records if r["step"] == idx]
        row = step_stats(idx, rate, a.step_s, t0, n, recs, a)
        row.update(client_cpu=(cpu1 - cpu0) / (w1 - w0), wall_s=w1 - w0, unanswered=n - len(recs),
                   server=server_side(m0, m1))
        if row["unanswered"]:
            row["fail_reasons"].append(f"{row['unanswered']} requests unanswered {a.drain_s:g}s after the step")
            row["slo_met"] = False
        if not row["slo_met"]:
            row["bound_by"], row["bound_reason"] = classify(row, a.busy_threshold)
        self.steps.append(row)
        srv = row["server"] or {}
        common.log(f"step {idx}: offered {rate:g} req/s, achieved {row['achieved_rps']:.3g}, TTFT p99 "
                   f"{row['ttft_p99_ms'] or 0:.0f} ms, TPOT p99 {row['tpot_p99_ms'] or 0:.1f} ms, "
                   f"{row['output_tokens_per_s']:.0f} tok/s, client CPU {row['client_cpu']:.0%}, lag p95 "
                   f"{row['schedule_lag_p95_ms'] or 0:.0f} ms, server busy {srv.get('engine_busy', 0):.0%}: "
                   + ("SLO met" if row["slo_met"] else f"FAIL ({'; '.join(row['fail_reasons'])}) -> "
                                                       f"{row['bound_by']}"))
        return row

    def search(self, mode: str, rates: list[float]) -> tuple[float | None, dict | None]:
        """Returns (highest passing rate, lowest failing step)."""
        a = self.args
        passing: float | None = None
        failing: dict | None = None
        if mode == "list":
            for r in rates:
                if not self.budget_left():
                    break
                s = self.step(r)
                if s["slo_met"] and (failing is None or r < failing["offered_rps"]):
                    passing = r if passing is None else max(passing, r)
                elif not s["slo_met"] and (failing is None or r < failing["offered_rps"]):
                    failing = s
            if failing is not None and passing is not None and passing > failing["offered_rps"]:
                passing = max((r for r in rates if r < failing["offered_rps"]), default=None)
            return passing, failing
        lo, hi = rates
        r = lo
        while self.budget_left():
            s = self.step(r)
            if not s["slo_met"]:
                failing = s
                break
            passing = r
            if r >= hi:
                break
            r = min(hi, _round(r * a.ramp_factor))
        for _ in range(a.bisect_steps):
            if failing is None or failing["bound_by"] == "client" or not self.budget_left():
                break
            f = failing["offered_rps"]
            if passing is not None and f / passing <= 1 + a.precision:
                break
            mid = _round(math.sqrt(passing * f) if passing else f / a.ramp_factor)
            if mid in (passing, f):
                break
            s = self.step(mid)
            if s["slo_met"]:
                passing = mid
            else:
                failing = s
        return passing, failing


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        mode, rates = parse_rates(args.rates)
    except ValueError as exc:
        return common.fail_usage(f"--rates {args.rates!r}: {exc}")
    if args.step_s <= 0 or args.users < 1 or args.output_tokens < 1 or args.input_tokens < 1 \
            or args.ramp_factor <= 1 or not 0 < args.slo_attainment <= 1:
        return common.fail_usage("--step-s > 0, --users/--input-tokens/--output-tokens >= 1, --ramp-factor > 1 "
                                 "and 0 < --slo-attainment <= 1 please")
    base = args.url.rstrip("/")
    try:
        wait_ready(base, args.health_path, args.wait_ready)
    except TimeoutError as exc:
        return common.fail_usage(str(exc))
    model = args.model or served_model(base)
    PLAN.model, PLAN.max_tokens, PLAN.ignore_eos = model, args.output_tokens, not args.no_ignore_eos
    PLAN.think_s = args.think_ms / 1e3
    PLAN.prompts = make_prompts(64, args.input_tokens, args.seed)
    env = Environment(user_classes=[InferenceUser], host=base)
    runner = env.create_local_runner()
    runner.start(args.users, spawn_rate=max(100.0, float(args.users)))
    try:
        common.wait_until(lambda: runner.user_count >= args.users, 60, f"{args.users} locust users to start")
    except TimeoutError as exc:
        runner.quit()
        return common.fail_usage(str(exc))
    common.log(f"load: {mode} {rates} req/s, {args.step_s:g}s steps, {args.users} users, {args.input_tokens} in / "
               f"{args.output_tokens} out tokens, model {model or '(none)'} at {base}")
    t0_epoch = time.time()
    run = Runner(args, base)
    try:
        passing, failing = run.search(mode, rates)
    finally:
        runner.quit()
    if failing is None:
        bound, why = "offered-range", (f"no step failed up to {max(s['offered_rps'] for s in run.steps):g} req/s: "
                                       "the capacity is above the offered range" if run.steps else "no step ran")
    else:
        bound, why = failing["bound_by"], failing["bound_reason"]
    capacity = passing if bound in ("device", "server") else None
    cap_step = next((s for s in run.steps if s["offered_rps"] == passing and s["slo_met"]), None)
    result = common.base_result("loadgen")
    result.update(
        url=base, model=model, mode=mode, rates=rates, ramp_factor=args.ramp_factor,
        step_s=args.step_s, input_tokens=args.input_tokens, output_tokens=args.output_tokens,
        ignore_eos=not args.no_ignore_eos, slo_ttft_ms=args.slo_ttft_ms, slo_tpot_ms=args.slo_tpot_ms,
        slo_attainment=args.slo_attainment, max_error_rate=args.max_error_rate, users=args.users,
        think_ms=args.think_ms, started_epoch=t0_epoch, elapsed_s=time.perf_counter() - run.t_start,
        steps=run.steps,
        capacity_rps=capacity,
        bound_by=bound,
        bound_reason=why,
        max_passing_rps=passing,
        first_failing_rps=failing["offered_rps"] if failing else None,
        at_capacity=cap_step,
        server_metrics=any(s.get("server") for s in run.steps),
        client_cpu_max=max((s["client_cpu"] for s in run.steps), default=None),
        locust_cpu_warning=bool(getattr(runner, "cpu_warning_emitted", False)),
        locust_version=locustfile.locust.__version__,
        verdict="pass" if capacity is not None else "inconclusive",
        ok=bool(run.steps) and any(s["ok"] for s in run.steps),
    )
    common.log(f"capacity {capacity} req/s, bound by {bound}: {why}")
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""The statistics of one load step from its requests' records: rates, latencies, goodput, pace, and why the step
failed (pure: the standard library, loadclient.py and workload_common.py). Part of loadgen.py."""

from __future__ import annotations

import time

import loadclient
import workload_common as common

PCTS = (50, 90, 99)
THROUGHPUTS = {
    "offered_rps": "the rate the step's schedule offered",
    "sent_rps": "requests sent / the sending span (the client keeping its schedule)",
    "served_rps": "answered requests / first request sent to last answer received (AIPerf's request throughput)",
    "completion_rps": "answers per second over the second half of the sending (the server keeping pace)",
    "late_rps": "answers per second over the last quarter of the sending (a full batch; loadclient.pace)",
}
EPOCH_OFFSET = time.time() - time.perf_counter()   # perf_counter -> Unix time, for the records


def _pcts(values: list[float], prefix: str, scale: float = 1e3) -> dict:
    out = {f"{prefix}_p{q}_ms": (common.percentile(values, q) * scale if values else None) for q in PCTS}
    out[f"{prefix}_mean_ms"] = common.mean(values) * scale if values else None
    return out


def _server_ms(timing: dict | None) -> float | None:
    """The server's own time for one request (gpuproof's per-request queue + model time)."""
    if not isinstance(timing, dict) or timing.get("queue_ms") is None:
        return None
    return (timing.get("queue_ms") or 0.0) + (timing.get("model_ms") or 0.0)


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

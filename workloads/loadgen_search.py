"""The capacity search: the rates asked for (``--rates``), where a search starts (``--search-start``), how long
each step sends, and :class:`Runner`, which runs the steps through a sender, judges them and brackets the capacity.
Part of loadgen.py (README: "loadgen.py step by step")."""

from __future__ import annotations

import math
import time

import loadclient
import workload_common as common
from loadgen_server import GaugeSampler, probe_metrics, server_metrics, server_side
from loadgen_stats import step_stats

BOUNDS = ("device", "server", "client", "offered-range")
PACE_FACTOR = 4.0     # a step sends for at least this many times the server's latency (see Runner.step_length)
PACE_ANSWERS = 40     # a search step's judged half holds this many answers at the offered rate (Runner.step_length)


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
                   + (f"(CPU {srv['cpu_ms_per_step']:.2f} / device {srv['device_ms_per_step']:.2f} ms per step) "
                      if srv.get("cpu_ms_per_step") is not None else "")
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


def _served_at_most(step: dict) -> float | None:
    """What an overloaded step's server completed at its fastest: the late answers' rate (a full batch)
    where there were enough of them, else the second half's completions (a batch still filling there
    reads low: the search then probes below what the server sustains)."""
    late, c = step.get("late_rps"), step.get("completion_rps")
    return max(late, c or 0.0) if late else c

"""LLM load generator and capacity search: locust as a library against an OpenAI-compatible
``/v1/completions`` endpoint (gpuproof's own ``inference_server.py``, vLLM, TGI, SGLang, NIM).

What a step sends and records, how the search runs and what bound it, and the distributed mode: workloads/README.md,
"loadgen.py step by step". This file is the workload (its options and its run); its parts are loadgen_server.py (the
server's readiness, metrics and idle latency), loadgen_stats.py (a step's statistics, pure), loadgen_senders.py (this
process or a locust master and its workers; the calibration) and loadgen_search.py (the capacity search), their names
re-exported here so ``loadgen.<name>`` keeps naming them. Needs only the standard library and locust (no torch).
"""

from __future__ import annotations

import locustfile  # first: imports locust, which monkey-patches the standard library

import errno
import logging
import socket
import sys
import time

import loadclient
import workload_common as common
from locustfile import PLAN, make_prompts

# the parts, re-exported: loadgen.<name> names every one of them (tests/test_loadgen_steps.py, test_search_start.py)
from loadgen_search import (AUTO_PROBES, BOUNDS, PACE_ANSWERS, PACE_FACTOR, SEARCH_START_SHARE,  # noqa: F401
                            Runner, _round, _served_at_most, parse_rates, search_start)
from loadgen_senders import (HERE, LocalSender, MasterSender, Sender, _collect, _cpu_s, _lead, _proc,  # noqa: F401
                             _run_share, _wait, calibrate, start_epoch_from, worker_main)
from loadgen_server import (GaugeSampler, _get, idle_latency, probe_metrics, served_model,  # noqa: F401
                            server_metrics, server_side, wait_ready)
from loadgen_stats import EPOCH_OFFSET, PCTS, THROUGHPUTS, _pcts, _server_ms, step_stats  # noqa: F401


class _SpawnRateFilter(logging.Filter):
    """Every user is spawned at once on purpose (they wait for tickets from the schedule, not for a
    ramp), which locust warns about above 100 per second: on a GPU run the warning was the only
    noise in the log, and it reads like a problem."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "spawn rate is very high" not in record.getMessage()


logging.getLogger("locust.runners").addFilter(_SpawnRateFilter())

N_PROMPTS = 64
CLUSTER_MASTER_PORT = 5557


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

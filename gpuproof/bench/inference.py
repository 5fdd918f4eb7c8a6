"""Benchmark ``inference``: LLM serving under load, and the capacity the server reaches within its SLOs.

Runs ``workloads/inference_server.py`` (the built-in OpenAI-compatible server) and ``workloads/loadgen.py`` (locust,
streamed requests): per load step TTFT, TPOT, end-to-end latency, output tokens/s and goodput, and a capacity search
that says what bound it (device, server, client, offered-range); steps the load client limited are marked invalid.
On this host server and load generator are two processes; in a cluster the server is a Deployment + Service and the
load generator a pod, or locust's master and N worker pods when one process cannot offer the rate
(:mod:`gpuproof.bench.loadpods`). With ``params["url"]`` only the load, against the user's endpoint.
"""

from __future__ import annotations

import os
import tempfile

from ..errors import GpuproofError, WaitTimeout
from ..results import MetricRecord
from . import loadpods, metrics
from . import workloads as wl
from .base import (Benchmark, WorkloadProcess, applied, ensure_configmap, flag_args, pod_name, pod_ready, present,
                   read_samples, register, wait_until)

LOADGEN_IMAGE_ENV = "GPUPROOF_LOADGEN_IMAGE"


def load_generator_image(run=None):
    """The load generator's image in a cluster: the cluster's workload image where it lends one (it has locust),
    else ``$GPUPROOF_LOADGEN_IMAGE``, else locust's own."""
    return getattr(run, "workload_image", None) or os.environ.get(LOADGEN_IMAGE_ENV) or wl.DEFAULT_LOADGEN_IMAGE


@register
class Inference(Benchmark):
    name = "inference"
    script = "inference_server"
    description = ("LLM serving (OpenAI-compatible, streamed): TTFT, TPOT, output tokens/s, goodput and a capacity "
                   "search that says what bound it (device, server, client, offered-range); steps the load client "
                   "limited are marked invalid; locust master + N workers when one process cannot offer the rate")
    defaults = {"rates": "1:1024", "step_s": 15.0, "drain_s": 60.0, "input_tokens": 512, "output_tokens": 128,
                "slo_ttft_ms": 1000.0, "slo_tpot_ms": 100.0, "slo_attainment": 0.95, "max_error_rate": 0.0,
                "users": 512, "bisect_steps": 3, "pace_answers": None, "search_start": "auto", "size": "auto",
                "max_batch": None, "sample_hz": 10.0, "threads": None, "url": None, "model": None,
                # the load client: one process, N, or 'auto' (N from a calibration of its per-core rate)
                "workers": "auto", "target_rps": None, "headroom": None, "max_workers": None, "calibrate_s": None}
    # A GPU's search starts at an eighth of batch slots / one request's time (loadgen --search-start auto): from
    # 1 req/s the 7b model's first two steps took 120 s (40 answers each) under a sixth of its capacity on an H200.
    # On the CPU the model is a stand-in and its capacity a smoke figure: search steps start at LO and hold 10
    # answers in their judged half, not loadgen's 40 (which would be 80 s steps at 1 req/s); CI's steps are
    # --step-s (0 = off)
    cpu_defaults = {"rates": "1:256", "step_s": 4.0, "drain_s": 30.0, "input_tokens": 64, "output_tokens": 32,
                    "slo_ttft_ms": 1000.0, "slo_tpot_ms": 200.0, "users": 64, "bisect_steps": 2, "workers": 1,
                    "pace_answers": 10, "search_start": "lo"}
    ci_params = {"rates": "1:2", "step_s": 2.0, "input_tokens": 16, "output_tokens": 8, "slo_ttft_ms": 5000.0,
                 "slo_tpot_ms": 1000.0, "slo_attainment": 0.5, "users": 8, "size": "tiny", "threads": 1,
                 "workers": 1, "pace_answers": 0}
    server_flags = {"device": "--device", "size": "--model", "max_batch": "--max-batch", "sample_hz": "--sample-hz",
                    "threads": "--threads"}
    load_flags = {"rates": "--rates", "step_s": "--step-s", "drain_s": "--drain-s", "input_tokens": "--input-tokens",
                  "output_tokens": "--output-tokens", "slo_ttft_ms": "--slo-ttft-ms", "slo_tpot_ms": "--slo-tpot-ms",
                  "slo_attainment": "--slo-attainment", "max_error_rate": "--max-error-rate", "users": "--users",
                  "think_ms": "--think-ms", "bisect_steps": "--bisect-steps", "pace_answers": "--pace-answers",
                  "search_start": "--search-start",
                  "ramp_factor": "--ramp-factor",
                  "max_steps": "--max-steps", "max_requests": "--max-requests", "model": "--model",
                  "workers": "--workers", "target_rps": "--target-rps", "headroom": "--headroom",
                  "max_workers": "--max-workers", "calibrate_s": "--calibrate-s", "per_core_rps": "--per-core-rps"}
    timeout_s = 3600
    local_modules = ("torch", "locust")     # the built-in server, and locust for the load generator

    def cli_params(self, args, device: str = "auto") -> dict:
        return {"sample_hz": args.sample_hz, "threads": args.threads, "rates": args.rates, "step_s": args.step_s,
                "url": args.url, "model": args.model, "input_tokens": args.input_tokens,
                "output_tokens": args.output_tokens, "slo_ttft_ms": args.slo_ttft_ms, "slo_tpot_ms": args.slo_tpot_ms,
                "users": args.users}

    def headline(self, result: dict) -> str:
        load = result.get("load") or {}
        cap = load.get("at_capacity") or {}
        srv = cap.get("server") or {}
        head = (f"capacity {load.get('capacity_rps')} req/s, bound by {load.get('bound_by')} "
                f"({load.get('bound_reason')})")
        if load.get("capacity_rps") is not None:
            head += (f"; at capacity TTFT p99 {cap.get('ttft_p99_ms') or 0:.0f} ms, TPOT p99 "
                     f"{cap.get('tpot_p99_ms') or 0:.1f} ms, {cap.get('output_tokens_per_s') or 0:.0f} output tokens/s")
            if srv.get("overhead_fraction") is not None:
                head += (f", server overhead {srv['overhead_ms']:.1f} ms/request = {srv['overhead_fraction']:.1%} "
                         f"of {srv['overhead_ms'] + srv['model_ms']:.0f} ms")
        step = (result.get("server") or {}).get("per_step") or {}
        if step.get("cpu_per_device") is not None:
            head += (f"; per engine step the server's CPU {step['cpu_ms']:.2f} ms against the device's "
                     f"{step['device_ms']:.2f} ms ({step['device_timer']}): ratio {step['cpu_per_device']:.2f}, "
                     f"{step['tokens_per_step']:.1f} tokens/step, CUDA graphs {step.get('cuda_graphs')}")
        if result.get("server_error"):
            head += f"; {result['server_error']}"
        return head
    ready_timeout_s = 600.0

    def workload_args(self, params: dict) -> list[str]:
        return flag_args(params, self.server_flags)

    def load_args(self, params: dict) -> list[str]:
        return flag_args(params, self.load_flags)

    def run_local(self, params: dict, echo: bool = False) -> dict:
        """Server and load generator as two local processes on 127.0.0.1 (a free port); with
        ``params["url"]`` only the load generator, against that endpoint."""
        load_args = self.load_args(params) + ["--wait-ready", str(self.ready_timeout_s)]
        if params.get("url"):
            with WorkloadProcess("loadgen", ["--url", params["url"], *load_args], echo=echo) as load:
                return self.combine(load.wait(self.timeout_s), None, [])
        with tempfile.TemporaryDirectory(prefix="gpuproof-inference-") as tmp:
            port_file = os.path.join(tmp, "port")
            samples_file = os.path.join(tmp, "samples.jsonl")
            server_args = self.workload_args(params) + ["--host", "127.0.0.1", "--port", "0",
                                                        "--port-file", port_file, "--samples-out", samples_file]
            with WorkloadProcess("inference_server", server_args, echo=echo) as server:
                def port():
                    if server.proc.poll() is not None:
                        raise GpuproofError("the inference server exited before listening:\n"
                                            + "\n".join(server.stderr_tail[-10:]))
                    return os.path.exists(port_file) and open(port_file).read().strip()

                p = int(wait_until(port, 120, "the inference server to bind its port"))
                url = f"http://127.0.0.1:{p}"
                with WorkloadProcess("loadgen", ["--url", url, *load_args], echo=echo) as load:
                    load_result = load.wait(self.timeout_s)
                server.terminate()
                try:
                    server_result = server.wait(60)
                except WaitTimeout as exc:
                    # wait() has killed it: the load's figures stand; only what the server itself knew is lost
                    why = (f"the inference server did not stop within 60 s of SIGTERM and was killed: its own "
                           f"summary (utilization, per-request costs) is missing ({str(exc).splitlines()[0]})")
                    server_result = {"error": why, "utilization": {"available": False, "reason": why}}
            samples = read_samples(samples_file)
        return self.combine(load_result, server_result, samples)

    def combine(self, load: dict, server: dict | None, samples: list[dict]) -> dict:
        result = {"workload": "inference", "load": load, "server": server, "samples": samples,
                  "device": (server or {}).get("device"), "device_name": (server or {}).get("device_name"),
                  "endpoint": load.get("url"), "ok": bool(load.get("ok")), "verdict": load.get("verdict")}
        if load.get("error"):
            result["error"] = f"load generator: {load['error']}"
        if (server or {}).get("error"):
            result["server_error"] = server["error"]
        # utilization per load step, from the server's samples and the steps' wall times
        t0 = load.get("started_epoch")
        if samples and t0:
            phases, start = [], t0
            for s in load.get("steps") or []:
                phases.append({"name": f"step{s['step']}", "start": start, "end": start + s["wall_s"]})
                start += s["wall_s"]
            relabelled = []
            for row in samples:
                ph = next((ph["name"] for ph in phases if ph["start"] <= row["ts"] < ph["end"]), "idle")
                relabelled.append({**row, "phase": ph})
            summary = metrics.summarize(relabelled, phases)
            summary.update(available=True, reason=None)
            server_util = (server or {}).get("utilization") or {}
            for key in ("sampler_cost", "sampler_cpu_seconds", "hz", "devices", "ticks", "missed_ticks"):
                if key in server_util:
                    summary[key] = server_util[key]
            result["utilization"] = summary
        else:
            result["utilization"] = (server or {}).get("utilization") or {
                "available": False, "reason": "a server gpuproof did not start: its GPU is not sampled here"}
        return result

    def params(self, overrides: dict | None = None, device: str = "auto") -> dict:
        """As for every benchmark, except that against ``url`` (the user's server, most likely on a
        GPU) the GPU defaults apply whatever this host has."""
        if (overrides or {}).get("url"):
            device = "cuda" if device == "cpu" else device
        return super().params(overrides, device)

    STEP_METRICS = {
        "ttft_p50_ms": "ms", "ttft_p90_ms": "ms", "ttft_p99_ms": "ms",
        "tpot_p50_ms": "ms", "tpot_p90_ms": "ms", "tpot_p99_ms": "ms", "itl_p50_ms": "ms", "itl_p99_ms": "ms",
        "output_tokens_per_s": "tokens/s", "goodput_rps": "req/s", "slo_attainment": "ratio",
        "error_rate": "ratio", "requests": "count", "slo_met": "bool", "client_cpu": "ratio",
        "schedule_lag_p95_ms": "ms", "client_cpu_of_usable": "ratio",
        # offered, sent and served rates (loadgen.THROUGHPUTS); completions over the step's second
        # half against the offer, and how the requests in flight grew (the server keeping pace)
        "sent_rps": "req/s", "served_rps": "req/s", "completion_rps": "req/s", "queue_growth": "count",
        "keeps_pace": "bool", "client_cpu_per_request_ms": "ms", "client_bound": "bool",
    }
    # how full the server was, beside how busy (gpuproof's /metrics, or vLLM/SGLang/TGI Prometheus gauges)
    HEADROOM_METRICS = {"running_mean": ("server_running", "count"), "slots_used": ("server_slots_used", "ratio"),
                        "waiting_mean": ("server_waiting", "count"),
                        "kv_cache_usage_mean": ("server_kv_cache_used", "ratio")}
    SERVER_METRICS = {"engine_busy": ("server_busy", "ratio"), "overhead_ms": ("server_overhead_ms", "ms"),
                      "model_ms": ("model_ms_per_request", "ms"),
                      "overhead_fraction": ("server_overhead_fraction", "ratio"),
                      "gpu_util_pct": ("gpu_util_pct", "%"),
                      # per engine step (the built-in server's llm_step.StepClock): its CPU against the device's
                      "cpu_ms_per_step": ("server_cpu_ms_per_step", "ms"),
                      "device_ms_per_step": ("device_ms_per_step", "ms"),
                      "cpu_per_device_step": ("cpu_per_device_step", "ratio"),
                      "tokens_per_step": ("tokens_per_step", "tokens"), "device_busy": ("device_busy", "ratio")}
    # the whole run's steps (the server's summary, warm-up left out): recorded in every run of the built-in server
    RUN_STEP_METRICS = {"cpu_ms": ("run_server_cpu_ms_per_step", "ms"), "device_ms": ("run_device_ms_per_step", "ms"),
                        "cpu_per_device": ("run_cpu_per_device_step", "ratio"),
                        "tokens_per_step": ("run_tokens_per_step", "tokens"), "steps": ("run_engine_steps", "count"),
                        "device_share_of_busy": ("run_device_share_of_busy", "ratio")}

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        load = result.get("load") or {}
        server = result.get("server") or {}
        base = {"device": result.get("device"), "endpoint": "builtin" if server else load.get("url"),
                "model": load.get("model"), "input_tokens": load.get("input_tokens"),
                "output_tokens": load.get("output_tokens"), "slo_ttft_ms": load.get("slo_ttft_ms"),
                "slo_tpot_ms": load.get("slo_tpot_ms"), "step_s": load.get("step_s"),
                "params": server.get("params"), "max_batch": server.get("max_batch")}
        recs = []
        for row in load.get("steps") or []:
            p = {**base, "step": row.get("step"), "target_rps": row.get("offered_rps")}
            # end-to-end latency under the names the report layer plots (p50_ms ... as latency)
            for q in (50, 90, 99):
                recs.append(self.record(f"p{q}_ms", row.get(f"e2e_p{q}_ms"), "ms", p, node, product))
            # what the server served: answered requests / first send to last answer (AIPerf's definition)
            recs.append(self.record("throughput_rps", row.get("served_rps"), "req/s", p, node, product))
            for metric, unit in self.STEP_METRICS.items():
                recs.append(self.record(metric, row.get(metric), unit, p, node, product))
            for key, (metric, unit) in self.SERVER_METRICS.items():
                recs.append(self.record(metric, (row.get("server") or {}).get(key), unit, p, node, product))
            room = row.get("headroom") or {}
            for key, (metric, unit) in self.HEADROOM_METRICS.items():
                recs.append(self.record(metric, room.get(key), unit, {**p, "source": room.get("source"),
                                                                      "max_batch": room.get("max_batch")},
                                        node, product))
            # a step the client limited (saturated CPU, or short of the offered rate with flat server
            # latency) is marked here and in the report; it is never a capacity
            if "valid" in row:
                recs.append(self.record("step_valid", bool(row["valid"]), "bool",
                                        {**p, "invalid_reason": row.get("invalid_reason") or ""}, node, product))
                recs.append(self.record("load_senders", (row.get("client") or {}).get("senders"), "count", p,
                                        node, product))
        client = load.get("load_client") or {}
        if client:
            cal = client.get("calibration") or {}
            mode = {**base, "mode": client.get("mode")}
            recs += [
                self.record("load_workers", client.get("workers"), "count", mode, node, product),
                self.record("client_per_core_rps", cal.get("per_core_rps"), "req/CPU-s",
                            {**mode, "given": bool(cal.get("given"))}, node, product),
                self.record("invalid_steps", len(load.get("invalid_steps") or []), "count", mode, node, product),
            ]
        cap = load.get("at_capacity") or {}
        bound = {**base, "bound_by": load.get("bound_by")}
        recs += [
            self.record("capacity_rps", load.get("capacity_rps"), "req/s", bound, node, product),
            self.record("bound_by", 1.0 if load.get("bound_by") else None, "flag", bound, node, product),
            self.record("max_passing_rps", load.get("max_passing_rps"), "req/s", bound, node, product),
            # what the server completed at its capacity, and when offered more than it
            self.record("capacity_completion_rps", load.get("capacity_completion_rps"), "req/s", bound, node,
                        product),
            self.record("saturation_rps", load.get("saturation_rps"), "req/s", bound, node, product),
        ]
        if load.get("capacity_rps") is not None and cap:
            srv = cap.get("server") or {}
            for metric in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "output_tokens_per_s",
                           "goodput_rps"):
                recs.append(self.record(f"capacity_{metric}", cap.get(metric), self.STEP_METRICS[metric], bound,
                                        node, product))
            for key, (metric, unit) in self.SERVER_METRICS.items():
                recs.append(self.record(f"capacity_{metric}", srv.get(key), unit, bound, node, product))
        if server.get("per_request_ms"):
            pr = server["per_request_ms"]
            overhead = pr["handler_cpu"] + pr["scheduler"]
            recs += [
                self.record("run_server_overhead_ms", overhead, "ms", base, node, product),
                self.record("run_model_ms_per_request", pr["model"], "ms", base, node, product),
                self.record("run_server_overhead_fraction",
                            overhead / (overhead + pr["model"]) if overhead + pr["model"] > 0 else None, "ratio",
                            base, node, product),
            ]
        step = server.get("per_step") or {}
        timing = {**base, "device_timer": step.get("device_timer"), "cuda_graphs": step.get("cuda_graphs")}
        for key, (metric, unit) in self.RUN_STEP_METRICS.items():
            recs.append(self.record(metric, step.get(key), unit, timing, node, product))
        return present(recs) + self.utilization_records(result, node, product)

    def manifests(self, params: dict, *, labels: dict, namespace: str, name: str, product: str | None = None,
                  node: str | None = None, image: str = wl.DEFAULT_IMAGE, gpus: int = 1,
                  resource: str = wl.GPU_RESOURCE, loadgen_image: str = wl.DEFAULT_LOADGEN_IMAGE,
                  tolerations: list[dict] | None = None) -> list[dict]:
        server = wl.inference_manifests(name, labels=labels, namespace=namespace, image=image, gpus=gpus,
                                        resource=resource, product=product, node=node,
                                        server_args=self.workload_args(params), tolerations=tolerations)
        # one load generator pod; run_in_cluster sizes and starts a master + N worker pods where needed
        load = wl.loadgen_pod(f"{name}-load", wl.service_url(name, namespace),
                              loadpods.pick_flags(self.load_args(params), drop=loadpods.DISTRIBUTION_FLAGS),
                              labels=labels, namespace=namespace, image=loadgen_image)
        return [*server, load]

    def run_in_cluster(self, run, params: dict, *, product: str, node: str | None, gpus: int = 1,
                       resource: str = wl.GPU_RESOURCE, image: str = wl.DEFAULT_IMAGE,
                       timeout: float | None = None, loadgen_image: str | None = None,
                       tolerations: list[dict] | None = None) -> dict:
        """Deployment + Service on the GPU node; once Ready, the load generator in the cluster
        (:meth:`run_load_in_cluster`), in ``loadgen_image`` (default: :func:`load_generator_image` of the run).
        With ``params["url"]`` (the user's endpoint) only the load."""
        name = pod_name("infer", product)
        loadgen_image = loadgen_image or load_generator_image(run)
        ensure_configmap(run)
        timeout = timeout or self.timeout_s
        if params.get("url"):  # the user's own endpoint: only the load generator, in the cluster
            return self.combine(self.run_load_in_cluster(run, params, params["url"], name, loadgen_image, timeout),
                                None, [])
        server = wl.inference_manifests(name, labels=run.labels, namespace=run.namespace, image=image, gpus=gpus,
                                        resource=resource, product=product, node=node,
                                        server_args=self.workload_args(params), tolerations=tolerations)
        selector = f"{wl.WORKLOAD_LABEL}={name},{wl.COMPONENT_LABEL}=inference-server"
        with applied(run, server):
            run.wait_pods(lambda c: next((p for p in c.values() if pod_ready(p)), None), self.ready_timeout_s,
                          f"the inference server of Deployment {name} to be Ready", label_selector=selector)
            load_result = self.run_load_in_cluster(run, params, wl.service_url(name, run.namespace), name,
                                                   loadgen_image, timeout)
        return self.combine(load_result, None, [])

    def run_load_in_cluster(self, run, params: dict, url: str, name: str, image: str, timeout: float) -> dict:
        """The load generator against ``url`` from pods: one pod, or, when the target rate needs more
        than one pod's CPU, locust's distributed mode (a master pod and N worker pods).

        ``workers: auto`` first runs a calibration pod of the worker's size (its requests per
        CPU-second against a stand-in endpoint with answers of the real shape) and sizes
        N = ceil(target / (per-core rate x headroom)); the calibration goes into the result."""
        args = self.load_args(params)
        workers, calibration, sizing = params.get("workers") or 1, None, None
        if str(workers) == "auto":
            if params.get("per_core_rps"):
                calibration = {"per_core_rps": float(params["per_core_rps"]), "given": True}
                target = params.get("target_rps") or max(float(x) for x in
                                                         str(params.get("rates") or "1").replace(":", ",").split(","))
                sizing = loadpods.size_workers(target, calibration["per_core_rps"], params.get("headroom"),
                                               params.get("max_workers"))
            else:
                pod = loadpods.calibration_pod(f"{name}-cal", args, labels=run.labels, namespace=run.namespace,
                                               image=image)
                with applied(run, [pod]):
                    run.wait_pod_done(pod["metadata"]["name"], timeout=600)
                    cal = wl.pod_result(run, pod["metadata"]["name"],
                                        what="the load generator's calibration pod")
                if not cal.get("ok"):
                    raise GpuproofError(f"the load generator's calibration failed: {cal.get('error')}")
                calibration, sizing = {**cal["calibration"], "in": "pod", "cores": cal.get("cores")}, cal["sizing"]
            workers = sizing["workers"]
        workers = int(workers)
        if workers <= 1:
            load = wl.loadgen_pod(f"{name}-load", url, loadpods.pick_flags(args, drop=loadpods.DISTRIBUTION_FLAGS),
                                  labels=run.labels, namespace=run.namespace, image=image)
            with applied(run, [load]):
                run.wait_pod_done(load["metadata"]["name"], timeout=timeout)
                result = wl.pod_result(run, load["metadata"]["name"], what="the load generator")
        else:
            objs = loadpods.distributed_manifests(name, url, args, workers, labels=run.labels,
                                                  namespace=run.namespace, image=image)
            master = objs[1]["metadata"]["name"]
            with applied(run, objs):
                run.wait_pod_done(master, timeout=timeout)
                result = wl.pod_result(run, master, what=f"the locust master pod {master}")
                result.setdefault("load_client", {})["worker_pods"] = self._worker_pods(run, name, workers)
        result.setdefault("load_client", {}).update(calibration=calibration, sizing=sizing)
        return result

    @staticmethod
    def _worker_pods(run, name: str, workers: int) -> list[dict]:
        """Each worker pod's own totals (its last log line), once the pods have ended (best effort)."""
        selector = loadpods.worker_selector(name)

        def ended(cache):
            pods = list(cache.values())
            return pods if len(pods) >= workers and all(p.status.phase in ("Succeeded", "Failed") for p in pods) \
                else None

        try:
            pods = run.wait_pods(ended, 120, f"the {workers} locust worker pods of {name} to end",
                                 label_selector=selector)
        except WaitTimeout as exc:
            return [{"ok": False, "error": str(exc)}]
        out = []
        for p in pods:
            try:
                out.append({"pod": p.metadata.name, "node": p.spec.node_name,
                            **wl.pod_result(run, p.metadata.name, what=f"worker pod {p.metadata.name}")})
            except GpuproofError as exc:
                out.append({"pod": p.metadata.name, "ok": False, "error": str(exc)})
        return out

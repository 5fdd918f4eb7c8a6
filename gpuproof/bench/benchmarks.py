"""The registered benchmarks: probe, matmul, allreduce, inference."""

from __future__ import annotations

import os
import tempfile
import time

from .. import metrics
from .. import workloads as wl
from ..errors import GpuproofError
from ..results import MetricRecord
from .base import (Benchmark, WorkloadProcess, applied, ensure_configmap, pod_name, pod_ready, read_samples,
                   register, wait_until)


def _utilization(bench: Benchmark, result: dict, node: str, product: str) -> list[MetricRecord]:
    return metrics.to_records(result.get("utilization") or {}, benchmark=bench.name, node=node, product=product)


def _keep(records) -> list[MetricRecord]:
    return [r for r in records if r is not None]


@register
class Probe(Benchmark):
    name = "probe"
    script = "probe"
    description = "torch/CUDA/driver versions, visible GPUs (torch + NVML, MIG) and a checked kernel"
    defaults = {"expect_gpus": None, "threads": None}
    ci_params = {"threads": 1}
    flags = {"device": "--device", "expect_gpus": "--expect-gpus", "threads": "--threads"}
    timeout_s = 600

    def run_local(self, params: dict, echo: bool = False) -> dict:
        from .base import run_workload

        return run_workload(self.script, self.workload_args(params), timeout=self.timeout_s, echo=echo)

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        base = {"device": result.get("device"), "torch": result.get("torch"), "cuda": result.get("cuda_build"),
                "driver": result.get("driver_version")}
        recs = [
            self.record("cuda_devices", len(result.get("torch_devices") or []), "count", base, node, product),
            self.record("nvml_devices", len((result.get("nvml") or {}).get("devices") or []), "count", base,
                        node, product),
            self.record("kernel_check_ok", bool(result.get("ok")), "bool", base, node, product),
        ]
        for d in result.get("torch_devices") or []:
            recs.append(self.record("memory_total_mib", d.get("memory_total_mib"), "MiB",
                                    {**base, "index": d["index"], "name": d["name"], "uuid": d.get("uuid")},
                                    node, product))
        for c in result.get("kernel_checks") or []:
            recs.append(self.record("kernel_check_ms", c.get("elapsed_ms"), "ms", {**base, "on": c["device"]},
                                    node, product))
        return _keep(recs)


@register
class Matmul(Benchmark):
    name = "matmul"
    script = "matmul"
    description = "dense matmul TFLOPS per dtype/size, checked against float64, ratio to datasheet peak"
    defaults = {"dtypes": "auto", "sizes": "8192", "iters": 50, "warmup": 5, "check_size": 256,
                "sample_hz": 10.0, "threads": None}
    cpu_defaults = {"sizes": "512", "iters": 20}
    ci_params = {"sizes": "128", "iters": 5, "warmup": 1, "check_size": 64, "threads": 1}
    flags = {"device": "--device", "dtypes": "--dtypes", "sizes": "--sizes", "iters": "--iters",
             "warmup": "--warmup", "check_size": "--check-size", "sample_hz": "--sample-hz", "threads": "--threads"}
    timeout_s = 3600

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        dev = {"device": result.get("device"), "device_name": result.get("device_name")}
        recs = []
        for r in result.get("results") or []:
            p = {**dev, "dtype": r["dtype"], "m": r["m"], "n": r["n"], "k": r["k"], "iters": r["iters"]}
            recs += [
                self.record("tflops", r["tflops"], "TFLOPS", p, node, product),
                self.record("median_ms", r["median_ms"], "ms", p, node, product),
                self.record("ratio_to_peak", r.get("ratio_to_peak"), "ratio", {**p, "peak_tflops": r.get("peak_tflops")},
                            node, product),
                self.record("sm_clock_mhz_mean", r.get("sm_clock_mhz_mean"), "MHz", p, node, product),
                self.record("throttled_fraction", r.get("throttled_fraction"), "ratio", p, node, product),
            ]
        for c in result.get("checks") or []:
            recs.append(self.record("check_rel_err", c["rel_err"], "ratio",
                                    {**dev, "dtype": c["dtype"], "size": c["size"], "tolerance": c["tolerance"]},
                                    node, product))
        return _keep(recs) + _utilization(self, result, node, product)


@register
class AllReduce(Benchmark):
    name = "allreduce"
    script = "allreduce"
    description = "all-reduce size sweep: algbw, busbw (nccl-tests definitions), #wrong, average busbw"
    defaults = {"min_bytes": "8", "max_bytes": "1G", "sizes": None, "dtype": "float32", "iters": 20, "warmup": 5,
                "nproc": 1, "sample_hz": 10.0, "threads": None}
    cpu_defaults = {"max_bytes": "64M"}
    ci_params = {"sizes": "8,1K,4K", "iters": 5, "warmup": 1, "nproc": 2, "threads": 1}
    flags = {"device": "--device", "min_bytes": "--min-bytes", "max_bytes": "--max-bytes", "sizes": "--sizes",
             "dtype": "--dtype", "iters": "--iters", "warmup": "--warmup", "nproc": "--nproc",
             "sample_hz": "--sample-hz", "threads": "--threads"}
    timeout_s = 3600

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        base = {"device": result.get("device"), "backend": result.get("backend"),
                "world_size": result.get("world_size"), "nnodes": result.get("nnodes")}
        recs = []
        for r in result.get("results") or []:
            p = {**base, "size_bytes": r["size_bytes"], "dtype": r["type"], "redop": r["redop"]}
            recs += [
                self.record("busbw_gbps", r["busbw_gbps"], "GB/s", p, node, product),
                self.record("algbw_gbps", r["algbw_gbps"], "GB/s", p, node, product),
                self.record("time_us", r["time_us"], "us", p, node, product),
                self.record("wrong", r.get("wrong"), "count", p, node, product),
            ]
        recs += [
            self.record("avg_busbw_gbps", result.get("avg_busbw_gbps"), "GB/s", base, node, product),
            self.record("max_busbw_gbps", result.get("max_busbw_gbps"), "GB/s", base, node, product),
            self.record("wrong_total", result.get("wrong_total"), "count", base, node, product),
        ]
        return _keep(recs) + _utilization(self, result, node, product)

    def manifests(self, params: dict, *, labels: dict, namespace: str, name: str, product: str | None = None,
                  node: str | None = None, image: str = wl.DEFAULT_IMAGE, gpus: int = 1,
                  resource: str = wl.GPU_RESOURCE) -> list[dict]:
        args = self.workload_args({**params, "nproc": None})  # torchrun starts the ranks in a pod
        return [wl.workload_pod(name, self.script, args, labels=labels, namespace=namespace, image=image,
                                gpus=gpus, resource=resource, product=product, node=node, torchrun=True)]

    def run_multinode(self, run, params: dict, *, product: str, nnodes: int, gpus_per_node: int,
                      image: str = wl.DEFAULT_IMAGE, timeout: float | None = None) -> dict:
        """Indexed Job over ``nnodes`` nodes of ``product``; the result is in the index-0 pod's log."""
        name = pod_name("ar-multi", product)
        ensure_configmap(run)
        args = self.workload_args({**params, "nproc": None})
        objs = wl.allreduce_multinode(name, nnodes, gpus_per_node, args, labels=run.labels,
                                      namespace=run.namespace, image=image, product=product)
        index_annotation = "batch.kubernetes.io/job-completion-index"

        def index0_done(cache):
            for pod in cache.values():
                ann = pod.metadata.annotations or {}
                if ann.get(index_annotation) == "0" and pod.status.phase in ("Succeeded", "Failed"):
                    return pod
            return None

        with applied(run, objs):
            pod = run.wait_pods(index0_done, timeout or self.timeout_s, f"the index-0 pod of Job {name} to finish",
                                label_selector=f"{wl.WORKLOAD_LABEL}={name}")
            return wl.parse_result(run.pod_logs(pod.metadata.name), what=f"all-reduce pod {pod.metadata.name}")


@register
class Inference(Benchmark):
    name = "inference"
    script = "inference_server"
    description = "HTTP inference server with dynamic batching under stepped locust load: p50-p99, goodput, SLO"
    defaults = {"rates": "50,100,200,400", "step_s": 15.0, "slo_p99_ms": 50.0, "max_error_rate": 0.0,
                "max_batch": 32, "max_wait_ms": 2.0, "hidden": 1024, "layers": 2, "sample_hz": 10.0,
                "threads": None}
    cpu_defaults = {"rates": "10,20,40", "step_s": 5.0, "slo_p99_ms": 200.0}
    ci_params = {"rates": "10,20", "step_s": 2.0, "slo_p99_ms": 1000.0, "hidden": 256, "threads": 1}
    server_flags = {"device": "--device", "max_batch": "--max-batch", "max_wait_ms": "--max-wait-ms",
                    "hidden": "--hidden", "layers": "--layers", "sample_hz": "--sample-hz", "threads": "--threads"}
    load_flags = {"rates": "--rates", "step_s": "--step-s", "slo_p99_ms": "--slo-p99-ms",
                  "max_error_rate": "--max-error-rate", "max_requests": "--max-requests"}
    timeout_s = 1800
    ready_timeout_s = 300.0

    def workload_args(self, params: dict) -> list[str]:
        from .base import flag_args

        return flag_args(params, self.server_flags)

    def load_args(self, params: dict) -> list[str]:
        from .base import flag_args

        return flag_args(params, self.load_flags)

    def run_local(self, params: dict, echo: bool = False) -> dict:
        """Server and load generator as two local processes on 127.0.0.1 (a free port)."""
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
                load_args = self.load_args(params) + ["--wait-ready", str(self.ready_timeout_s)]
                with WorkloadProcess("loadgen", ["--url", url, *load_args], echo=echo) as load:
                    load_result = load.wait(self.timeout_s)
                server.terminate()
                server_result = server.wait(60)
            samples = read_samples(samples_file)
        return self.combine(load_result, server_result, samples)

    def combine(self, load: dict, server: dict | None, samples: list[dict]) -> dict:
        result = {"workload": "inference", "load": load, "server": server, "samples": samples,
                  "device": (server or {}).get("device"), "device_name": (server or {}).get("device_name"),
                  "ok": bool(load.get("ok")), "verdict": load.get("verdict")}
        if load.get("error"):
            result["error"] = f"load generator: {load['error']}"
        # utilization per load step, from the server's samples and the load steps' times
        t0, step = load.get("started_epoch"), load.get("step_s")
        if samples and t0 and step:
            phases = []
            for s in load.get("steps") or []:
                start = t0 + s["step"] * step
                phases.append({"name": f"step{s['step']}", "start": start, "end": start + step})
            relabelled = []
            for row in samples:
                ph = next((ph["name"] for ph in phases if ph["start"] <= row["ts"] < ph["end"]), "idle")
                relabelled.append({**row, "phase": ph})
            summary = metrics.summarize(relabelled, phases)
            summary.update(available=True, reason=None)
            result["utilization"] = summary
        else:
            result["utilization"] = (server or {}).get("utilization")
        return result

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        load = result.get("load") or {}
        server = result.get("server") or {}
        base = {"device": result.get("device"), "slo_p99_ms": load.get("slo_p99_ms"),
                "max_batch": server.get("max_batch"), "step_s": load.get("step_s")}
        recs = []
        units = {"p50_ms": "ms", "p90_ms": "ms", "p95_ms": "ms", "p99_ms": "ms", "max_ms": "ms",
                 "achieved_rps": "req/s", "throughput_rps": "req/s", "goodput_rps": "req/s",
                 "error_rate": "ratio", "requests": "count", "slo_met": "bool"}
        for row in (load.get("steps") or []) + [dict(load.get("overall") or {}, step="overall")]:
            p = {**base, "step": row.get("step"), "target_rps": row.get("target_rps")}
            for metric, unit in units.items():
                recs.append(self.record(metric, row.get(metric), unit, p, node, product))
        recs += [
            self.record("max_rate_meeting_slo", load.get("max_rate_meeting_slo"), "req/s", base, node, product),
            self.record("slo_verdict_pass", load.get("verdict") == "pass", "bool", base, node, product),
            self.record("loadgen_rps_per_core", load.get("rps_per_core"), "req/s/core", base, node, product),
            self.record("mean_batch_size", (server.get("stats") or {}).get("mean_batch_size"), "rows", base,
                        node, product),
        ]
        return _keep(recs) + _utilization(self, result, node, product)

    def manifests(self, params: dict, *, labels: dict, namespace: str, name: str, product: str | None = None,
                  node: str | None = None, image: str = wl.DEFAULT_IMAGE, gpus: int = 1,
                  resource: str = wl.GPU_RESOURCE, loadgen_image: str = wl.DEFAULT_LOADGEN_IMAGE) -> list[dict]:
        server = wl.inference_manifests(name, labels=labels, namespace=namespace, image=image, gpus=gpus,
                                        resource=resource,
                                        product=product, node=node, server_args=self.workload_args(params))
        load = wl.loadgen_pod(f"{name}-load", wl.service_url(name, namespace), self.load_args(params),
                              labels=labels, namespace=namespace, image=loadgen_image)
        return [*server, load]

    def run_in_cluster(self, run, params: dict, *, product: str, node: str | None, gpus: int = 1,
                       resource: str = wl.GPU_RESOURCE, image: str = wl.DEFAULT_IMAGE,
                       timeout: float | None = None, loadgen_image: str = wl.DEFAULT_LOADGEN_IMAGE) -> dict:
        """Deployment + Service on the GPU node; once Ready, the load generator pod in the cluster."""
        name = pod_name("infer", product)
        ensure_configmap(run)
        deployment, service, load = self.manifests(params, labels=run.labels, namespace=run.namespace, name=name,
                                                   product=product, node=node, image=image, gpus=gpus,
                                                   resource=resource, loadgen_image=loadgen_image)
        selector = f"{wl.WORKLOAD_LABEL}={name},{wl.COMPONENT_LABEL}=inference-server"
        with applied(run, [deployment, service]):
            run.wait_pods(lambda c: next((p for p in c.values() if pod_ready(p)), None), self.ready_timeout_s,
                          f"the inference server of Deployment {name} to be Ready", label_selector=selector)
            with applied(run, [load]):
                run.wait_pod_done(load["metadata"]["name"], timeout=timeout or self.timeout_s)
                load_result = wl.parse_result(run.pod_logs(load["metadata"]["name"]), what="the load generator")
        return self.combine(load_result, None, [])


def run_and_record(name: str, run_dir, params: dict, *, node: str = "local", product: str = "",
                   echo: bool = False) -> tuple[dict, list[MetricRecord]]:
    """Run one benchmark locally and add its records and samples to ``run_dir``."""
    from .base import get

    bench = get(name)
    t0 = time.time()
    result = bench.run_local(params, echo=echo)
    samples = result.pop("samples", [])
    result["wall_s"] = time.time() - t0
    records = bench.to_records(result, node=node, product=product)
    for r in records:
        r.parameters.setdefault("run_mode", "local")
    run_dir.add_metrics(records)
    if samples:
        run_dir.add_samples(metrics.sample_rows(samples, benchmark=name, node=node,
                                                product=bench.product_of(result, product)))
    return result, records

"""The benchmark registry and what every benchmark shares.

A benchmark is a registered class (SuperBench style) with

- ``name``, ``description`` and ``defaults`` (parameters for a GPU) plus
  ``cpu_defaults`` (smaller ones when it runs on the CPU) and ``ci_params`` (the small
  sizes suites use on the embedded cluster);
- ``run_local(params) -> dict``: runs the workload script on this host, as a
  subprocess, exactly as a user would (``python workloads/<x>.py ...``), and returns its
  JSON result (with the raw utilization samples under ``"samples"``);
- ``to_records(result, node=, product=) -> list[MetricRecord]``: long-format records;
- ``manifests(params, labels=, namespace=, ...) -> list[dict]`` and
  ``run_in_cluster(run, params, ...)``: the same workload in a cluster;
- what ``gpuproof bench --local`` asks of it: ``cli_params(args, device)`` (which of its options it takes),
  ``headline(result)`` (the line it prints), ``local_modules`` (what must be installed), ``shared_options``
  (options two benchmarks read in senses of their own) and ``samples_utilization``.

Each benchmark is a module of this package; :mod:`gpuproof.bench.benchmarks` imports them in order.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, ClassVar

from ..errors import GpuproofError, WaitTimeout
from ..results import MetricRecord
from . import metrics
from . import workloads as wl

REGISTRY: dict[str, type["Benchmark"]] = {}


def register(cls: type["Benchmark"]) -> type["Benchmark"]:
    if not cls.name or cls.name in REGISTRY:
        raise ValueError(f"benchmark name {cls.name!r} missing or taken")
    REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    return list(REGISTRY)


def get(name: str) -> "Benchmark":
    try:
        return REGISTRY[name]()
    except KeyError:
        raise GpuproofError(f"unknown benchmark {name!r}; known: {', '.join(REGISTRY)}") from None


# ------------------------------------------------------------------ running workload scripts


class WorkloadProcess:
    """A workload script running as a child process, stderr kept (tail) and optionally echoed."""

    def __init__(self, script: str, args: list[str], env: dict | None = None, echo: bool = False):
        self.script = script
        self.cmd = [sys.executable, str(wl.workloads_dir() / f"{script}.py"), *map(str, args)]
        self.echo = echo
        self.stderr_tail: list[str] = []
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self._stdout: list[str] = []
        self._threads = [threading.Thread(target=self._pump_err, daemon=True),
                         threading.Thread(target=self._pump_out, daemon=True)]
        for t in self._threads:
            t.start()

    def _pump_err(self) -> None:
        for line in self.proc.stderr:
            self.stderr_tail = (self.stderr_tail + [line.rstrip("\n")])[-40:]
            if self.echo:
                print(f"  [{self.script}] {line}", end="", file=sys.stderr, flush=True)

    def _pump_out(self) -> None:
        for line in self.proc.stdout:
            self._stdout.append(line)

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()

    def wait(self, timeout: float) -> dict:
        """Wait for the script to end and return its JSON result (GpuproofError if it has none)."""
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait()
            raise WaitTimeout(f"{self.script} did not finish within {timeout:.0f}s; last output:\n"
                              + "\n".join(self.stderr_tail[-15:])) from None
        for t in self._threads:
            t.join(timeout=5)
        out = "".join(self._stdout)
        try:
            result = wl.parse_result(out, what=self.script)
        except GpuproofError:
            raise GpuproofError(f"{' '.join(self.cmd[1:])} exited with status {self.proc.returncode} and "
                                f"no JSON result; its last messages:\n" + "\n".join(self.stderr_tail[-15:])) \
                from None
        result.setdefault("exit_code", self.proc.returncode)
        if self.proc.returncode not in (0, 1):
            msg = result.get("error") or "\n".join(self.stderr_tail[-10:])
            raise GpuproofError(f"{self.script} failed (exit {self.proc.returncode}): {msg}")
        return result

    def __enter__(self) -> "WorkloadProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
                self.proc.wait()


def run_workload(script: str, args: list[str], timeout: float = 3600, env: dict | None = None,
                 echo: bool = False) -> dict:
    with WorkloadProcess(script, args, env=env, echo=echo) as p:
        return p.wait(timeout)


def read_samples(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def present(records) -> list[MetricRecord]:
    """The records that have a value (:meth:`Benchmark.record` gives None for a missing one)."""
    return [r for r in records if r is not None]


def flag_args(params: dict, mapping: dict[str, str]) -> list[str]:
    """CLI flags for the parameters that are set: {"iters": "--iters"} -> ["--iters", "50"]."""
    out: list[str] = []
    for key, flag in mapping.items():
        value = params.get(key)
        if value is None or value is False or value == "":
            continue
        if value is True:
            out.append(flag)
        else:
            out += [flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)]
    return out


# ------------------------------------------------------------------ the base class


# the floor of a node's figure against its peers' median where the figures are the CPU's (kubelet nodes over NVIDIA's
# mock NVML): pods measured at once share the cores of one machine, so a node's figure moves with its neighbours' by
# more than GPUs of one SKU ever differ (the census's pool floor, the all-reduce's stragglers)
CPU_PEER_PCT = 50.0


class Benchmark:
    name: ClassVar[str] = ""
    script: ClassVar[str] = ""
    description: ClassVar[str] = ""
    defaults: ClassVar[dict] = {}
    cpu_defaults: ClassVar[dict] = {}
    ci_params: ClassVar[dict] = {}
    flags: ClassVar[dict] = {}          # parameter -> workload CLI flag
    timeout_s: ClassVar[float] = 3600.0

    def params(self, overrides: dict | None = None, device: str = "auto") -> dict:
        """Defaults, then CPU defaults when running on the CPU, then the caller's overrides."""
        p = dict(self.defaults)
        p["device"] = device
        if device == "cpu":
            p.update(self.cpu_defaults)
        p.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return p

    def workload_args(self, params: dict) -> list[str]:
        return flag_args(params, self.flags)

    # -- `gpuproof bench --local`: what of its command line a benchmark takes, what it needs here, the line it prints
    local_modules: ClassVar[tuple[str, ...]] = ("torch",)   # what it needs installed here (the 'bench' extra's)
    # options it reads in a sense of its own (matmul's --sizes are matrices, all-reduce's messages): with two such
    # benchmarks in one run the option is ambiguous, and each takes --<name>-<option> instead
    shared_options: ClassVar[tuple[str, ...]] = ()
    samples_utilization: ClassVar[bool] = True   # its result says what was sampled (noted when nothing was)

    def cli_params(self, args, device: str = "auto") -> dict:
        """The parameters this benchmark takes from ``gpuproof bench``'s options (None: its default), on
        ``device`` (what this host computes on: cpu or cuda)."""
        return {"threads": args.threads}

    def headline(self, result: dict) -> str:
        """One line of the result, printed after the benchmark ran on this host."""
        return ""

    # -- local
    def run_local(self, params: dict, echo: bool = False) -> dict:
        with tempfile.TemporaryDirectory(prefix=f"gpuproof-{self.name}-") as tmp:
            samples = os.path.join(tmp, "samples.jsonl")
            args = self.workload_args(params) + ["--samples-out", samples]
            result = run_workload(self.script, args, timeout=self.timeout_s, echo=echo)
            result["samples"] = read_samples(samples)
        return result

    # -- records
    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        raise NotImplementedError

    def utilization_records(self, result: dict, node: str, product: str) -> list[MetricRecord]:
        """The utilization summary the workload's sampler left in ``result``, as this benchmark's records."""
        return metrics.to_records(result.get("utilization") or {}, benchmark=self.name, node=node, product=product)

    def record(self, metric: str, value: Any, unit: str, params: dict, node: str, product: str) -> MetricRecord | None:
        if value is None:
            return None
        if isinstance(value, bool):
            value = 1.0 if value else 0.0
        return MetricRecord(self.name, metric, float(value), unit, dict(params), node=node, product=product)

    @staticmethod
    def product_of(result: dict, product: str) -> str:
        return product or result.get("device_name") or result.get("device") or ""

    # -- in a cluster
    def manifests(self, params: dict, *, labels: dict, namespace: str, name: str, product: str | None = None,
                  node: str | None = None, image: str = wl.DEFAULT_IMAGE, gpus: int = 1,
                  resource: str = wl.GPU_RESOURCE, tolerations: list[dict] | None = None) -> list[dict]:
        pod = wl.workload_pod(name, self.script, self.workload_args(params), labels=labels, namespace=namespace,
                              image=image, gpus=gpus, resource=resource, product=product, node=node,
                              tolerations=tolerations)
        return [pod]

    def run_in_cluster(self, run, params: dict, *, product: str, node: str | None, gpus: int = 1,
                       resource: str = wl.GPU_RESOURCE, image: str = wl.DEFAULT_IMAGE,
                       timeout: float | None = None, lane=None, tolerations: list[dict] | None = None) -> dict:
        """Run the workload pod on ``node`` (or any node of ``product``); return its JSON result.

        ``lane``: a fan-out's (:class:`gpuproof.plugin.fanout.Lane`): its labels go on the pod, the waits go through
        its shared watch, and the pod is gone before this returns (the node's GPUs free for the next check).
        ``tolerations``: the node's own taints' (gpuproof.cluster.placement.tolerate)."""
        name = pod_name(self.name, self.pod_key(product, node))
        ensure_configmap(run)
        labels = {**run.labels, **(lane.labels if lane is not None else {})}
        objs = self.manifests(params, labels=labels, namespace=run.namespace, name=name, product=product,
                              node=node, image=image, gpus=gpus, resource=resource, tolerations=tolerations)
        with applied(run, objs, lane=lane):
            if lane is not None:
                lane.wait_done(name, timeout=timeout or self.timeout_s)
            else:
                run.wait_pod_done(name, timeout=timeout or self.timeout_s)
            return wl.pod_result(run, name, what=f"{self.name} pod {run.namespace}/{name}"
                                                + (f" on {node}" if node else ""))

    def pod_key(self, product: str, node: str | None) -> str:
        """What names the benchmark's pod: one per product (benchmarks that run on every node: per node)."""
        return product


class NodeBenchmark(Benchmark):
    """A benchmark that judges a node (health, census): one pod per GPU node, and on this host the workload alone,
    without the utilization sampler the throughput benchmarks run beside them."""

    def run_local(self, params: dict, echo: bool = False) -> dict:
        return run_workload(self.script, self.workload_args(params), timeout=self.timeout_s, echo=echo)

    def pod_key(self, product: str, node: str | None) -> str:
        return node or product          # one pod per GPU node


# ------------------------------------------------------------------ cluster helpers


def pod_name(bench: str, product: str, suffix: str = "") -> str:
    """A DNS-safe, short pod name for a benchmark on a product: 'bench-matmul-nvidia-h100-80gb-hbm3'."""
    import re

    slug = re.sub(r"[^a-z0-9]+", "-", (product or "local").lower()).strip("-")
    base = f"bench-{bench}-{slug}"[: 50 - len(suffix)].rstrip("-")
    return base + suffix


def ensure_configmap(run) -> None:
    """Create the workloads ConfigMap in the run namespace once (an existing one is kept). The run remembers it:
    the ConfigMap holds every workload file (several hundred KB), and a fan-out over 1,000 nodes sent it once per
    pod, to hear 409 (benchmarks/SCALE.md)."""
    if getattr(run, "_workloads_shipped", False):
        return
    obj, err = run.try_apply(wl.configmap(labels=run.labels, namespace=run.namespace))
    if err is not None and getattr(err, "status", None) != 409:
        raise GpuproofError(f"could not create the workloads ConfigMap: HTTP {err.status}: {err.reason}")
    run._workloads_shipped = True


def delete_object(run, manifest: dict) -> None:
    """Delete one object we created (errors ignored: the run namespace goes at cleanup anyway). Nothing is sent once
    the run's namespace is being deleted (an interrupted run asks that first): it takes the object with it, and a
    fan-out's hundreds of deletes would only crowd the API server while the run ends (issue #52)."""
    kind, name, ns = manifest["kind"], manifest["metadata"]["name"], run.namespace
    deleting = getattr(run, "deleting", None)
    if deleting is not None and deleting(ns):
        return
    c = run.cluster
    calls: dict[str, Callable[[], Any]] = {
        "Pod": lambda: c.core.delete_namespaced_pod(name, ns, grace_period_seconds=0),
        "Service": lambda: c.core.delete_namespaced_service(name, ns),
        "ConfigMap": lambda: c.core.delete_namespaced_config_map(name, ns),
        "Deployment": lambda: c.apps.delete_namespaced_deployment(name, ns, propagation_policy="Background"),
        "Job": lambda: c.batch.delete_namespaced_job(name, ns, propagation_policy="Background"),
    }
    with contextlib.suppress(Exception):
        calls[kind]()


GONE_WAIT_S = 60.0    # how long a fan-out's worker waits for its deleted pod to leave the API


@contextlib.contextmanager
def applied(run, manifests: list[dict], lane=None):
    """Create the objects, yield, then delete them (so GPUs are free for the next benchmark); with a fan-out's
    ``lane``, wait until its pods are gone too."""
    done: list[dict] = []
    try:
        for m in manifests:
            run.apply(m)
            done.append(m)
        yield done
    finally:
        for m in reversed(done):
            delete_object(run, m)
        if lane is not None:
            for m in done:
                if m["kind"] == "Pod":
                    with contextlib.suppress(Exception):     # the run's cleanup deletes what is left
                        lane.wait_gone(m["metadata"]["name"], GONE_WAIT_S)


def pod_ready(pod) -> bool:
    for cond in (pod.status.conditions or []) if pod.status else []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until truthy; WaitTimeout naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)

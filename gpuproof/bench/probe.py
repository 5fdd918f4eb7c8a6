"""Benchmark ``probe``: what a pod on a GPU node sees, and whether a small kernel computes right.

Runs ``workloads/probe.py``: torch, CUDA (build) and driver versions, the devices torch and NVML see (MIG instances
by their UUIDs) and an exactly checked elementwise + matmul kernel on every visible device. Its records count the
devices and time the kernel check; there is no utilization sampler (``samples_utilization``).
"""

from __future__ import annotations

from ..results import MetricRecord
from .base import Benchmark, present, register, run_workload


@register
class Probe(Benchmark):
    name = "probe"
    script = "probe"
    description = "torch/CUDA/driver versions, visible GPUs (torch + NVML, MIG) and a checked kernel"
    defaults = {"expect_gpus": None, "threads": None}
    ci_params = {"threads": 1}
    flags = {"device": "--device", "expect_gpus": "--expect-gpus", "threads": "--threads"}
    timeout_s = 600
    samples_utilization = False             # no sampler runs beside it, and its result has no summary

    def headline(self, result: dict) -> str:
        return (f"torch {result.get('torch')}, {len(result.get('torch_devices') or [])} CUDA device(s), "
                f"driver {result.get('driver_version')}, kernel check {'ok' if result.get('ok') else 'FAILED'}")

    def run_local(self, params: dict, echo: bool = False) -> dict:
        return run_workload(self.script, self.workload_args(params), timeout=self.timeout_s, echo=echo)

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        base = {"device": result.get("device"), "torch": result.get("torch"), "cuda": result.get("cuda_build"),
                "driver": result.get("driver_version")}
        recs = [
            self.record("cuda_devices", len(result.get("torch_devices") or []), "count", base, node, product),
            self.record("nvml_devices", len((result.get("nvml") or {}).get("devices") or []), "count", base,
                        node, product),
            # what the pod can use, as NVML UUIDs (GPU-... / MIG-...), never NVIDIA_VISIBLE_DEVICES
            self.record("nvml_visible_devices", len(result.get("nvml_uuids") or []), "count",
                        {**base, "uuids": sorted(result.get("nvml_uuids") or [])}, node, product),
            self.record("kernel_check_ok", bool(result.get("ok")), "bool", base, node, product),
        ]
        for d in result.get("torch_devices") or []:
            recs.append(self.record("memory_total_mib", d.get("memory_total_mib"), "MiB",
                                    {**base, "index": d["index"], "name": d["name"], "uuid": d.get("uuid")},
                                    node, product))
        for c in result.get("kernel_checks") or []:
            recs.append(self.record("kernel_check_ms", c.get("elapsed_ms"), "ms", {**base, "on": c["device"]},
                                    node, product))
        return present(recs)

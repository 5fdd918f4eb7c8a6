"""Benchmark ``hbm``: memory bandwidth (HBM on a GPU, host memory on the CPU).

Runs ``workloads/hbm.py``: a device-to-device copy and a read-only reduction over large
buffers; GB/s from the median iteration (bytes = read + written) and the ratio to the
product's datasheet bandwidth (H100 SXM 3.35 TB/s, H200 4.8 TB/s, ...), with the SM clock
and clock-event reasons NVML saw. HBM bandwidth decides LLM decode speed, and tells an
H100 from an H200 where matmul does not.
"""

from __future__ import annotations

from ..results import MetricRecord
from .base import Benchmark, present, register


@register
class Hbm(Benchmark):
    name = "hbm"
    script = "hbm"
    description = "memory bandwidth: device copy and read-only reduction GB/s, ratio to datasheet HBM bandwidth"
    defaults = {"size": "1G", "kernels": "copy,read", "iters": 20, "warmup": 3, "product": None,
                "sample_hz": 10.0, "threads": None}
    cpu_defaults = {"size": "256M", "iters": 10}
    ci_params = {"size": "16M", "iters": 3, "warmup": 1, "threads": 1}
    flags = {"device": "--device", "size": "--size", "kernels": "--kernels", "iters": "--iters",
             "warmup": "--warmup", "product": "--product", "sample_hz": "--sample-hz", "threads": "--threads"}
    timeout_s = 1800

    def cli_params(self, args, device: str = "auto") -> dict:
        return {"threads": args.threads, "size": args.hbm_size, "iters": args.iters}

    def headline(self, result: dict) -> str:
        return "; ".join(f"{r['kernel']} {r['gbps']:.4g} GB/s"
                         + (f" ({r['ratio_to_peak']:.0%} of datasheet)" if r.get("ratio_to_peak") else "")
                         for r in result.get("results") or [])

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        dev = {"device": result.get("device"), "memory": result.get("memory")}   # the GPU's name: the product
        recs = []
        for r in result.get("results") or []:
            p = {**dev, "kernel": r["kernel"], "size_bytes": r["size_bytes"], "iters": r["iters"]}
            recs += [
                self.record("bandwidth_gbps", r["gbps"], "GB/s", p, node, product),
                self.record("median_ms", r["median_ms"], "ms", p, node, product),
                self.record("ratio_to_peak", r.get("ratio_to_peak"), "ratio",
                            {**p, "peak_gbps": r.get("peak_gbps"), "peak_of": result.get("peak_key")}, node, product),
                self.record("sm_clock_mhz_mean", r.get("sm_clock_mhz_mean"), "MHz", p, node, product),
                self.record("throttled_fraction", r.get("throttled_fraction"), "ratio", p, node, product),
                self.record("check_ok", bool(r.get("check_ok")), "bool", p, node, product),
            ]
        return present(recs) + self.utilization_records(result, node, product)

"""Benchmark ``matmul``: dense matmul TFLOPS per dtype and size, checked against float64.

Runs ``workloads/matmul.py``: the median of timed iterations per dtype/size as TFLOPS, its ratio to the product's
datasheet dense peak (and at the SM clock NVML saw), the clock-event (throttle) fraction, and each dtype's error
against a float64 reference; with the utilization sampler's records beside them.
"""

from __future__ import annotations

from ..results import MetricRecord
from .base import Benchmark, present, register


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
    shared_options = ("sizes",)             # matrix sizes (all-reduce's are messages)

    def cli_params(self, args, device: str = "auto") -> dict:
        return {"sample_hz": args.sample_hz, "threads": args.threads, "sizes": args.matmul_sizes or args.sizes,
                "dtypes": args.dtypes, "iters": args.iters}

    def headline(self, result: dict) -> str:
        return "; ".join(f"{r['dtype']} {r['m']}: {r['tflops']:.3g} TFLOPS"
                         + (f" ({r['ratio_to_peak']:.0%} of peak)" if r.get("ratio_to_peak") else "")
                         for r in result.get("results") or [])

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        # the GPU's name is the record's product, not a parameter: parameters are what a run of another GPU type
        # is matched on (`gpuproof report compare` of an A100 run and an H100 run)
        dev = {"device": result.get("device")}
        recs = []
        for r in result.get("results") or []:
            p = {**dev, "dtype": r["dtype"], "m": r["m"], "n": r["n"], "k": r["k"], "iters": r["iters"]}
            recs += [
                self.record("tflops", r["tflops"], "TFLOPS", p, node, product),
                self.record("median_ms", r["median_ms"], "ms", p, node, product),
                self.record("ratio_to_peak", r.get("ratio_to_peak"), "ratio",
                            {**p, "peak_tflops": r.get("peak_tflops")}, node, product),
                self.record("sm_clock_mhz_mean", r.get("sm_clock_mhz_mean"), "MHz", p, node, product),
                self.record("throttled_fraction", r.get("throttled_fraction"), "ratio", p, node, product),
                # TFLOPS / (peak x mean SM clock / max SM clock): absent on the CPU (no clocks)
                self.record("ratio_to_peak_at_clock", r.get("ratio_to_peak_at_clock"), "ratio",
                            {**p, "peak_tflops": r.get("peak_tflops"), "sm_clock_mhz_max": r.get("sm_clock_mhz_max")},
                            node, product),
            ]
        for c in result.get("checks") or []:
            recs.append(self.record("check_rel_err", c["rel_err"], "ratio",
                                    {**dev, "dtype": c["dtype"], "size": c["size"], "tolerance": c["tolerance"]},
                                    node, product))
        return present(recs) + self.utilization_records(result, node, product)

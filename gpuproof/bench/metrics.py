"""GPU utilization sampling for gpuproof: the NVML sampler and its records.

The sampler itself lives in ``workloads/nvml_sampler.py`` because it also runs inside
pods (with only the standard library, torch and pynvml there); this module imports that
same file and adds the conversions to gpuproof's records:

- :func:`to_records`: a sampler summary -> long-format :class:`MetricRecord` rows
  (benchmark ``utilization``; metric ``<field>_<mean|p95>``; parameters name the phase,
  the GPU and the benchmark it ran under);
- :func:`cost_records`: what the sampler itself cost (CPU per tick, % of a core per GPU);
- :func:`sample_rows`: raw samples -> rows for :meth:`RunDir.add_samples`;
- :func:`dcgm_to_records`: DCGM exporter series read from Prometheus
  (:func:`dcgm_phase_summary`) -> records, for GPUs NVML cannot see from here.

With no GPU the sampler records nothing and its summary says why
(``summary["available"] is False``, ``summary["reason"]``); nothing here fails for that.
"""

from __future__ import annotations

from typing import Any

from ..results import MetricRecord
from .workloads import import_workload

_sampler = import_workload("nvml_sampler")

Sampler = _sampler.Sampler
NullSampler = _sampler.NullSampler
make_sampler = _sampler.make_sampler
summarize = _sampler.summarize
decode_reasons = _sampler.decode_reasons
read_prometheus_range = _sampler.read_prometheus_range
dcgm_phase_summary = _sampler.dcgm_phase_summary
dcgm_exporter = _sampler.dcgm_exporter
DEFAULT_HZ = _sampler.DEFAULT_HZ
NUMERIC_FIELDS = _sampler.NUMERIC_FIELDS

UNITS = {
    "gpu_util_pct": "%", "mem_util_pct": "%", "mem_used_mib": "MiB", "power_w": "W",
    "temp_c": "C", "sm_clock_mhz": "MHz", "energy_j": "J", "ecc_corrected": "count",
    "ecc_uncorrected": "count", "throttled_fraction": "ratio",
}


def to_records(summary: dict, *, benchmark: str, node: str = "", product: str = "",
               parameters: dict | None = None) -> list[MetricRecord]:
    """Long-format records of a sampler summary (one per phase, GPU, field and statistic)."""
    out: list[MetricRecord] = []
    if not summary or not summary.get("available"):
        return out
    for phase, pdata in (summary.get("phases") or {}).items():
        for gpu, stats in (pdata.get("gpus") or {}).items():
            params = {**(parameters or {}), "of": benchmark, "phase": phase, "gpu": gpu}

            def add(metric: str, value: Any, unit: str) -> None:
                if value is not None:
                    out.append(MetricRecord("utilization", metric, float(value), unit, dict(params),
                                            node=node, product=product))

            for field in NUMERIC_FIELDS:
                for stat in ("mean", "p95"):
                    add(f"{field}_{stat}", (stats.get(field) or {}).get(stat), UNITS[field])
            for field in ("energy_j", "ecc_corrected", "ecc_uncorrected", "throttled_fraction"):
                add(field, stats.get(field), UNITS[field])
    out += cost_records(summary, benchmark=benchmark, node=node, product=product, parameters=parameters)
    return out


COST_METRICS = {
    "cpu_us_per_tick": ("sampler_cpu_us_per_tick", "us"),
    "pct_of_core_per_gpu": ("sampler_pct_of_core_per_gpu", "%"),
    "total_cpu_s": ("sampler_cpu_s", "s"),
}


def cost_records(summary: dict, *, benchmark: str, node: str = "", product: str = "",
                 parameters: dict | None = None) -> list[MetricRecord]:
    """What the sampler itself cost (``summary["sampler_cost"]``), as records of benchmark ``utilization``."""
    cost = (summary or {}).get("sampler_cost") or {}
    if not summary or not summary.get("available"):
        return []
    params = {**(parameters or {}), "of": benchmark, "hz": summary.get("hz"),
              "gpus": len(summary.get("devices") or [])}
    return [MetricRecord("utilization", metric, float(cost[key]), unit, dict(params), node=node, product=product)
            for key, (metric, unit) in COST_METRICS.items() if cost.get(key) is not None]


DCGM_UNITS = {"_pct": "%", "_mib": "MiB", "_mhz": "MHz", "_c": "C", "_w": "W", "_j": "J"}


def dcgm_to_records(dcgm: dict, *, benchmark: str, node: str = "", product: str = "") -> list[MetricRecord]:
    """Records of :func:`dcgm_phase_summary` output: metric ``dcgm_<quantity>_<mean|p95>`` in gpuproof's unit,
    whichever names the exporter wrote (kept in ``dcgm_name``)."""
    out: list[MetricRecord] = []
    for phase, fields in (dcgm or {}).items():
        for quantity, per_gpu in fields.items():
            unit = next((u for suffix, u in DCGM_UNITS.items() if quantity.endswith(suffix)), "")
            for gpu, stats in per_gpu.items():
                params = {"of": benchmark, "phase": phase, "gpu": gpu, "source": "dcgm",
                          "exporter_node": stats.get("node", ""), "dcgm_name": stats.get("name", "")}
                for stat in ("mean", "p95"):
                    if stats.get(stat) is not None:
                        out.append(MetricRecord("utilization", f"dcgm_{quantity}_{stat}", float(stats[stat]), unit,
                                                dict(params), node=node, product=product))
    return out


def sample_rows(samples: list[dict], *, benchmark: str, node: str = "", product: str = "") -> list[dict]:
    """Raw samples tagged with where they came from, for RunDir.add_samples."""
    return [{**s, "benchmark": benchmark, "node": node, "product": product} for s in samples]


def unavailable_reason(summary: dict | None) -> str | None:
    """Why nothing was sampled (None when samples were taken)."""
    if summary and summary.get("available"):
        return None
    return (summary or {}).get("reason") or "no utilization summary"

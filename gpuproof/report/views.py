"""Benchmark-specific views of a run's metrics table, shared by summary.md and report.html.

The benchmarks write long-format MetricRecords (see gpuproof.results); these
functions pick out the rows each plot or table needs and tolerate anything missing.
Metrics no view knows are shown by :func:`other_metrics` as a generic table.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re

from .data import params_of

# the metrics the views plot, by the names the benchmarks write them (gpuproof/bench/<benchmark>.py: one vocabulary,
# the rules and the report read the same names): the inference's end-to-end latency percentiles are p<q>_ms
LATENCY_METRICS = ("p50_ms", "p90_ms", "p95_ms", "p99_ms")
KNOWN = {
    "matmul": ("tflops", "ratio_to_peak"),
    "allreduce": ("algbw_gbps", "busbw_gbps", "avg_busbw_gbps", "max_busbw_gbps"),
    "inference": LATENCY_METRICS + ("throughput_rps", "error_rate", "goodput_rps", "step_valid"),
}

# Direction of "better" when a rules file does not say: patterns on "benchmark/metric".
_LOWER = ("*latency*", "*_ms", "*_s", "*seconds*", "*error*", "*fail*", "*time*", "*duration*", "*loss*")
_HIGHER = ("*tflops*", "*bw*", "*bandwidth*", "*gbps*", "*throughput*", "*rps*", "*goodput*", "*ratio_to_peak*")


def default_direction(benchmark: str, metric: str) -> str:
    """``higher_is_better`` / ``lower_is_better`` / ``""`` (unknown) from the metric's name."""
    name = f"{benchmark}/{metric}".lower()
    if any(fnmatch.fnmatchcase(name, p) for p in _LOWER):
        return "lower_is_better"
    if any(fnmatch.fnmatchcase(name, p) for p in _HIGHER):
        return "higher_is_better"
    return ""


def _rows(metrics, benchmark: str, names):
    """The rows of ``benchmark`` whose metric is in ``names``; params parsed, product filled from node."""
    if metrics.empty:
        return metrics
    df = metrics[metrics["benchmark"] == benchmark].copy()
    df = df[df["metric"].isin(list(names))]
    if df.empty:
        return df
    df["params"] = [params_of(p) for p in df["parameters"]]
    df["product"] = [p or n or "?" for p, n in zip(df["product"], df["node"])]
    return df


@dataclasses.dataclass
class MatmulBar:
    product: str
    dtype: str
    tflops: float          # best over shapes and nodes
    peak: float | None     # from tflops / ratio_to_peak of the same row
    shape: str             # the m x n x k that gave the best number
    node: str


def matmul_bars(metrics) -> list[MatmulBar]:
    """Best TFLOP/s per (product, dtype) with the peak it is measured against."""
    df = _rows(metrics, "matmul", KNOWN["matmul"])
    if df.empty:
        return []
    df["dtype"] = [str(p.get("dtype", "?")) for p in df["params"]]
    # the ratio row may carry the peak as an extra parameter (peak_tflops): match without it
    peaks = {}
    for r in df[df["metric"] == "ratio_to_peak"].itertuples():
        shape = _without(r.params, "peak_tflops")
        peak = _num(r.params.get("peak_tflops"))
        peaks[(r.product, r.node, shape)] = (peak, r.value)
    bars = []
    for (product, dtype), group in df[df["metric"] == "tflops"].groupby(["product", "dtype"], sort=True):
        best = group.loc[group["value"].idxmax()]
        peak, ratio = peaks.get((best["product"], best["node"], _without(best["params"], "peak_tflops")),
                                (None, None))
        if not peak and ratio and ratio > 0:
            peak = float(best["value"]) / ratio
        p = best["params"]
        shape = "x".join(str(p[d]) for d in ("m", "n", "k") if d in p)
        bars.append(MatmulBar(product, str(dtype), float(best["value"]), peak, shape, str(best["node"])))
    return bars


@dataclasses.dataclass
class Series:
    name: str
    xs: list[float]
    ys: list[float]


def allreduce_series(metrics, metric: str = "busbw_gbps") -> list[Series]:
    """busbw (GB/s) against message size, one series per product / world size / dtype."""
    df = _rows(metrics, "allreduce", (metric,))
    if df.empty:
        return []
    df["size"] = [_num(p.get("size_bytes")) for p in df["params"]]
    df = df.dropna(subset=["size"])
    df["label"] = [_label(prod, p, ("world_size", "dtype"), {"world_size": "ranks"})
                   for prod, p in zip(df["product"], df["params"])]
    return _series(df, "size")


def inference_series(metrics) -> dict[str, list[Series]]:
    """Latency percentiles and throughput against offered load.

    Returns {"latency <product>": [p50, p90, ...], "throughput": [one per product]}:
    one latency chart per product (percentiles as series), one throughput chart."""
    df = _rows(metrics, "inference", KNOWN["inference"])
    if df.empty:
        return {}
    df["load"] = [_num(p.get("target_rps", p.get("rate", p.get("step")))) for p in df["params"]]
    df = df.dropna(subset=["load"])
    out: dict[str, list[Series]] = {}
    for product, group in df[df["metric"].isin(LATENCY_METRICS)].groupby("product", sort=True):
        group = group.assign(label=[m.replace("_ms", "") for m in group["metric"]])
        out[f"latency {product}"] = _series(group, "load")
    thr = df[df["metric"].isin(("throughput_rps", "goodput_rps"))]
    if not thr.empty:
        several = thr["metric"].nunique() > 1
        thr = thr.assign(label=[p + (f" · {m.replace('_rps', '')}" if several else "")
                                for p, m in zip(thr["product"], thr["metric"])])
        out["throughput"] = _series(thr, "load")
    return out


def inference_load_axis(metrics) -> str:
    """What the inference x axis is: offered load in requests/s, or a step number."""
    df = _rows(metrics, "inference", KNOWN["inference"])
    if not df.empty and any("target_rps" in p or "rate" in p for p in df["params"]):
        return "offered load (requests/s)"
    return "load step"


def inference_table_rows(metrics) -> list[dict]:
    """One row per (product, offered load) with every inference metric as a column; a load step
    the client limited (``step_valid`` 0) has ``step_valid: 0.0`` and its ``invalid_reason``."""
    df = _rows(metrics, "inference", KNOWN["inference"])
    if df.empty:
        return []
    df["load"] = [_num(p.get("target_rps", p.get("rate", p.get("step")))) for p in df["params"]]
    pivot = df.pivot_table(index=["product", "load"], columns="metric", values="value", aggfunc="mean")
    invalid = {(r.product, r.load): str(r.params.get("invalid_reason") or "client-limited")
               for r in df[(df["metric"] == "step_valid") & (df["value"] < 1)].itertuples()}
    rows = []
    for (product, load), values in pivot.iterrows():
        row = {"product": product, "load": load, **{k: v for k, v in values.items() if v == v}}
        if (product, load) in invalid:   # any invalid record at this load marks it (several nodes: any of them)
            row.update(step_valid=0.0, invalid_reason=invalid[(product, load)])
        rows.append(row)
    return rows


def invalid_loads(metrics) -> list[tuple[str, float, str]]:
    """(product, offered load, reason) of the load steps the client limited."""
    return [(r["product"], r["load"], r["invalid_reason"]) for r in inference_table_rows(metrics)
            if r.get("invalid_reason")]


def allreduce_peaks(metrics) -> list[dict]:
    """Per product / world size / dtype: the best busbw and the size it was reached at."""
    df = _rows(metrics, "allreduce", ("busbw_gbps", "avg_busbw_gbps"))
    if df.empty:
        return []
    out = []
    df["world_size"] = [str(p.get("world_size", "")) for p in df["params"]]
    df["dtype"] = [str(p.get("dtype", "")) for p in df["params"]]
    sized = df[df["metric"] == "busbw_gbps"]
    avgs = df[df["metric"] == "avg_busbw_gbps"]   # per run of the sweep: may name no dtype
    for (product, ws, dtype), group in sized.groupby(["product", "world_size", "dtype"], sort=True):
        best = group.loc[group["value"].idxmax()]
        avg = avgs[(avgs["product"] == product) & (avgs["world_size"] == ws)
                   & avgs["dtype"].isin([dtype, ""])]["value"]
        out.append({
            "product": product, "world_size": ws, "dtype": dtype,
            "peak_busbw": float(best["value"]), "at_size": best["params"].get("size_bytes"),
            "avg_busbw": float(avg.mean()) if not avg.empty else None,
        })
    return out


UTILIZATION_COLUMNS = ("gpu_util_pct_mean", "mem_util_pct_mean", "mem_used_mib_mean", "power_w_mean",
                       "temp_c_p95", "sm_clock_mhz_mean", "energy_j", "throttled_fraction",
                       # the DCGM exporter's, through Prometheus (gpuproof bench --prometheus): GPUs keyed by UUID
                       "dcgm_gpu_util_pct_mean", "dcgm_gr_engine_active_mean", "dcgm_power_w_mean")


def utilization_rows(metrics) -> tuple[list[str], list[dict]]:
    """The sampler's summary records (benchmark "utilization"), one row per benchmark,
    phase and GPU, with the columns of UTILIZATION_COLUMNS that are present."""
    if metrics.empty:
        return [], []
    df = metrics[metrics["benchmark"] == "utilization"]
    if df.empty:
        return [], []
    rows: dict[tuple, dict] = {}
    for r in df.itertuples():
        p = params_of(r.parameters)
        key = (r.node, str(p.get("of", "")), str(p.get("phase", "")), str(p.get("gpu", "")))
        rows.setdefault(key, {"node": r.node, "of": key[1], "phase": key[2], "gpu": key[3]})[r.metric] = r.value
    columns = [c for c in UTILIZATION_COLUMNS if any(c in row for row in rows.values())]
    return columns, [rows[k] for k in sorted(rows)]


# parameters that say which node or GPU a metric row is of, not what was measured: left out when rows are grouped
IDENTITY_PARAMS = ("node", "uuid", "gpu", "gpu_index", "gpu_uuid", "index", "host", "pod", "bus_id", "pci_bus_id")
_IDENTITY = re.compile(r'"(?:' + "|".join(IDENTITY_PARAMS) + r')": (?:"(?:[^"\\]|\\.)*"|[^,}]*)(?:, )?')


def metric_spread(metrics) -> list[dict]:
    """Metric rows grouped across nodes and GPUs (their parameters less IDENTITY_PARAMS): benchmark, metric, unit,
    product, parameters (canonical JSON), n, nodes, min, median, max; in the order first seen. Vectorized: 300,000
    rows (a 1,000-node run's health and census figures) take about a second."""
    import pandas as pd

    if metrics.empty:
        return []
    try:
        params = metrics["parameters"].astype("string[pyarrow]")
    except (ImportError, TypeError, ValueError):
        params = metrics["parameters"].astype(str)
    params = params.str.replace(_IDENTITY.pattern, "", regex=True).str.replace(", }", "}", regex=False)
    df = pd.DataFrame({"benchmark": metrics["benchmark"].astype(str), "metric": metrics["metric"].astype(str),
                       "unit": metrics["unit"].astype(str), "product": metrics["product"].astype(str),
                       "parameters": params.astype(str), "node": metrics["node"].astype(str).replace("", None),
                       "value": metrics["value"].astype(float)})
    keys = ["benchmark", "metric", "unit", "product", "parameters"]
    agg = df.groupby(keys, sort=False).agg(n=("value", "size"), nodes=("node", "nunique"), min=("value", "min"),
                                          median=("value", "median"), max=("value", "max")).reset_index()
    return agg.to_dict("records")


def other_metrics(metrics):
    """Rows of benchmarks/metrics no specific view shows."""
    if metrics.empty:
        return metrics
    known = {f"{b}/{m}" for b, names in KNOWN.items() for m in names}
    mask = ~(metrics["benchmark"] + "/" + metrics["metric"]).isin(known) & (metrics["benchmark"] != "utilization")
    return metrics[mask]


def _without(params: dict, *keys: str) -> str:
    return json.dumps({k: v for k, v in params.items() if k not in keys}, sort_keys=True, default=str)


def _num(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _label(product: str, params: dict, keys: tuple[str, ...], names: dict[str, str]) -> str:
    parts = [product]
    for k in keys:
        if k in params:
            parts.append(f"{params[k]} {names[k]}" if k in names else str(params[k]))
    return " · ".join(parts)


def _series(df, xcol: str) -> list[Series]:
    out = []
    for label, group in df.groupby("label", sort=True):
        agg = group.groupby(xcol)["value"].mean().sort_index()
        out.append(Series(str(label), [float(x) for x in agg.index], [float(y) for y in agg.values]))
    return out


# ------------------------------------------------------------------ checks

VERDICT_ORDER = ("fail", "warn", "skip", "pass")


def product_pools(inventory: dict) -> dict[str, str]:
    """GPU product -> pool, for the products that live in exactly one pool."""
    pools: dict[str, set] = {}
    for n in inventory.get("nodes") or []:
        if n.get("product") and n.get("pool"):
            pools.setdefault(n["product"], set()).add(n["pool"])
    return {product: next(iter(p)) for product, p in pools.items() if len(p) == 1}


def pool_of(check: dict, products: dict[str, str] | None = None) -> str:
    """The pool a check belongs to: its pool field, a ``pool/<name>`` target, the one pool
    that has its product (``products`` from :func:`product_pools`), else cluster/other."""
    if check.get("pool"):
        return str(check["pool"])
    target = str(check.get("target") or "")
    if target.startswith("pool/"):
        return target[len("pool/"):]
    product = check.get("product") or (target[len("product/"):] if target.startswith("product/") else "")
    if product and products and product in products:
        return products[product]
    return "cluster" if target in ("", "cluster") else "other"


def group_problems(rows: list[dict], products: dict[str, str] | None = None) -> list[dict]:
    """Identical failures on several targets (same check, expected, actual and message)
    as one row, with "targets" and "pools" lists; order kept."""
    groups: dict[tuple, dict] = {}
    for r in rows:
        key = (r["verdict"], r["feature"], r["check"], r["expected"], r["actual"], r["message"])
        group = groups.setdefault(key, {**r, "targets": [], "pools": []})
        group["targets"].append(r["target"])
        pool = pool_of(r, products)
        if pool not in group["pools"]:
            group["pools"].append(pool)
    return list(groups.values())

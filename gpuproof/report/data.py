"""Loading a run folder into tables the report layer can work with.

Every report (summary.md, report.html, compare, baseline check) starts from
:func:`load_run`, which finds the folder, reads run.json, the checks, metrics and
samples tables (parquet when present, else JSONL), the inventory and junit.xml, and
normalises them so later code does not have to guess at missing columns.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from pathlib import Path
from typing import Any

from ..errors import GpuproofError
from ..results import (
    CHECKS_FILE,
    COVERAGE_FILE,
    INVENTORY_FILE,
    META_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    load_table,
)
from .junit import JUnitResult, read_junit

JUNIT_FILE = "junit.xml"
SUMMARY_FILE = "summary.md"
HTML_FILE = "report.html"

CHECK_COLUMNS = ("feature", "check", "target", "verdict", "expected", "actual", "message", "pool", "product",
                 "run_id", "ts")
METRIC_COLUMNS = ("benchmark", "metric", "value", "unit", "parameters", "node", "product", "cluster", "run_id", "ts")
# Columns of samples.jsonl that identify a sample rather than measure something.
SAMPLE_ID_COLUMNS = {
    "run_id", "ts", "time", "timestamp", "node", "phase", "gpu", "index", "gpu_index", "uuid",
    "gpu_uuid", "name", "gpu_name", "pid", "minor_number", "bus_id", "pci_bus_id", "benchmark", "product",
    "clock_event_reasons", "throttle_reasons",      # bit masks, not quantities
}

# The files that make a folder a run folder (any one of them).
RUN_MARKERS = (META_FILE, CHECKS_FILE, METRICS_FILE, SAMPLES_FILE, JUNIT_FILE, INVENTORY_FILE,
               CHECKS_FILE.replace(".jsonl", ".parquet"), METRICS_FILE.replace(".jsonl", ".parquet"))


def canonical_params(value: Any) -> str:
    """Parameters as the canonical JSON string results.py stores (tolerates dicts and blanks)."""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, default=str)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return "{}"
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return json.dumps({"value": value})
        if not isinstance(parsed, dict):
            parsed = {"value": parsed}
        return json.dumps(parsed, sort_keys=True, default=str)
    return json.dumps({"value": value}, default=str)


def params_of(canonical: str) -> dict:
    try:
        parsed = json.loads(canonical or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def param_label(canonical: str, skip=()) -> str:
    """``{"dtype": "fp16", "m": 4096}`` -> ``dtype=fp16 m=4096`` (for tables)."""
    p = params_of(canonical)
    return " ".join(f"{k}={v}" for k, v in sorted(p.items()) if k not in skip)


class ParamLabels:
    """Short parameter labels for a table: per benchmark, the parameters that have the
    same value in every row (device=cpu, run_mode=local, ...) are left out of each row
    and said once in :meth:`common_note`, so the rows show only what tells them apart."""

    def __init__(self, pairs):
        by_bench: dict[str, list[dict]] = {}
        for benchmark, parameters in pairs:
            by_bench.setdefault(benchmark, []).append(params_of(parameters))
        self.common: dict[str, dict] = {}
        for benchmark, sets in by_bench.items():
            distinct = {json.dumps(p, sort_keys=True, default=str) for p in sets}
            if len(distinct) < 2:
                continue
            keys = set.intersection(*(set(p) for p in sets))
            self.common[benchmark] = {k: sets[0][k] for k in sorted(keys) if all(p[k] == sets[0][k] for p in sets)}

    def __call__(self, benchmark: str, parameters: str) -> str:
        return param_label(parameters, skip=self.common.get(benchmark, {})) or "-"

    def common_note(self) -> str:
        parts = [f"{b}: " + " ".join(f"{k}={v}" for k, v in c.items()) for b, c in sorted(self.common.items()) if c]
        return ("Parameters shared by every row, left out above: " + "; ".join(parts)) if parts else ""


def metric_sort_key(benchmark: str, metric: str, parameters: str, product: str = "") -> tuple:
    """Order metric rows so message sizes and loads come out in numeric order."""
    ordered = tuple((k, (0, float(v), "") if isinstance(v, (int, float)) else (1, 0.0, str(v)))
                    for k, v in sorted(params_of(parameters).items()))
    return benchmark, metric, product, ordered


@dataclasses.dataclass
class Run:
    """One run folder, loaded."""

    path: Path
    meta: dict
    checks: Any        # DataFrame with CHECK_COLUMNS
    metrics: Any       # DataFrame with METRIC_COLUMNS (parameters canonical JSON, value float)
    samples: Any       # DataFrame, as written (plus a "gpu_key" column when not empty)
    inventory: dict
    junit: JUnitResult | None
    coverage: list[dict] = dataclasses.field(default_factory=list)   # GPU nodes checks left out (coverage.jsonl)

    @property
    def run_id(self) -> str:
        return str(self.meta.get("run_id") or self.path.name)

    @property
    def cluster(self) -> str:
        return str(self.meta.get("cluster") or self.inventory.get("cluster") or "")

    @property
    def kubernetes_version(self) -> str:
        return str(self.inventory.get("kubernetes_version") or self.meta.get("kubernetes_version") or "")

    @property
    def is_empty(self) -> bool:
        return self.checks.empty and self.metrics.empty and self.samples.empty and self.junit is None

    def check_counts(self) -> dict[str, int]:
        counts = {v: 0 for v in ("pass", "fail", "warn", "skip")}
        if not self.checks.empty:
            for verdict, n in self.checks["verdict"].value_counts().items():
                counts[str(verdict)] = int(n)
        return counts

    @property
    def failed(self) -> bool:
        """Whether anything in this run failed (a check or a pytest test)."""
        if self.check_counts()["fail"]:
            return True
        return bool(self.junit and (self.junit.failed or self.junit.errors))

    @property
    def outcome(self) -> str:
        return str(self.meta.get("outcome") or ("failed" if self.failed else ("passed" if not self.is_empty else "")))


def resolve_run(arg: str | os.PathLike, root: str | os.PathLike = "reports") -> Path:
    """A run named by path, by run id under ``reports/``, or ``latest``."""
    path = Path(arg)
    if path.is_dir():
        return path
    root = Path(root)
    if str(arg) == "latest":
        runs = sorted((p for p in root.glob("*") if p.is_dir() and _is_run_dir(p)), key=lambda p: p.name)
        if not runs:
            raise GpuproofError(f"no run folders under {root}/ (run `gpuproof run` first)")
        return runs[-1]
    if (root / str(arg)).is_dir():
        return root / str(arg)
    if path.exists():
        raise GpuproofError(f"{arg} is not a run folder (it is a file; give the folder reports/<run-id>/)")
    raise GpuproofError(f"run folder {arg} not found (give a path like reports/<run-id> or a run id under {root}/)")


def _is_run_dir(path: Path) -> bool:
    return any((path / m).exists() for m in RUN_MARKERS)


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise GpuproofError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise GpuproofError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def _frame(path: Path, name: str, columns: tuple[str, ...]):
    import pandas as pd

    try:
        df = load_table(path, name)
    except (ValueError, OSError) as exc:
        raise GpuproofError(f"{path / name}: cannot be read ({exc})") from exc
    if df.empty:
        return pd.DataFrame(columns=list(columns))
    for col in columns:
        if col not in df.columns:
            df[col] = ""
    return df


def load_run(arg: str | os.PathLike, root: str | os.PathLike = "reports", canonical: bool = True) -> Run:
    """Load a run folder. Raises GpuproofError when it is missing or is not a run folder.

    ``canonical``: metrics' parameters rewritten as canonical JSON, for joining runs (compare, baselines). The reports
    of one run parse them instead and pass False: gpuproof writes them canonical, and rewriting 300,000 (a 1,000-node
    run's) costs seconds. Parameters given as dicts or blanks are made JSON either way."""
    import pandas as pd

    path = resolve_run(arg, root)
    if not _is_run_dir(path):
        raise GpuproofError(
            f"{path} is not a gpuproof run folder: it has none of {', '.join(RUN_MARKERS[:5])}")
    meta = _read_json(path / META_FILE)
    inventory = _read_json(path / INVENTORY_FILE)

    checks = _frame(path, CHECKS_FILE, CHECK_COLUMNS)
    for col in CHECK_COLUMNS:
        checks[col] = checks[col].fillna("").astype(str)

    metrics = _frame(path, METRICS_FILE, METRIC_COLUMNS)
    if not metrics.empty:
        metrics["parameters"] = [canonical_params(v) if canonical or not isinstance(v, str) else v
                                 for v in metrics["parameters"]]
        metrics["value"] = pd.to_numeric(metrics["value"], errors="coerce")
        metrics = metrics.dropna(subset=["value"])
        for col in METRIC_COLUMNS:
            if col not in ("value", "parameters"):
                metrics[col] = metrics[col].fillna("").astype(str)

    samples = load_table(path, SAMPLES_FILE)
    if not samples.empty:
        samples = samples.copy()
        samples["gpu_key"] = gpu_keys(samples)

    junit = read_junit(path / JUNIT_FILE) if (path / JUNIT_FILE).exists() else None
    coverage = load_table(path, COVERAGE_FILE).fillna("").astype(str).to_dict("records")
    return Run(path=path, meta=meta, checks=checks, metrics=metrics, samples=samples,
               inventory=inventory, junit=junit, coverage=coverage)


def gpu_keys(samples) -> list[str]:
    """A readable name per sample row for the GPU it describes: ``node/gpu0`` or the uuid."""
    cols = samples.columns
    idx_col = next((c for c in ("gpu_index", "index", "gpu", "minor_number") if c in cols), None)
    uuid_col = next((c for c in ("gpu_uuid", "uuid") if c in cols), None)
    n = len(samples)
    nodes = samples["node"].tolist() if "node" in cols else [""] * n
    idents = samples[idx_col].tolist() if idx_col else [None] * n
    uuids = samples[uuid_col].tolist() if uuid_col else [None] * n
    keys = []
    for node, ident, uuid in zip(nodes, idents, uuids):
        if _present(ident):
            ident = f"gpu{int(ident)}" if isinstance(ident, numbers.Number) else str(ident)
        elif _present(uuid):
            ident = str(uuid)
        else:
            ident = "gpu"
        keys.append(f"{node}/{ident}" if _present(node) else ident)
    return keys


def _present(value: Any) -> bool:
    return value is not None and value == value and value != ""


def sample_fields(samples) -> list[str]:
    """The numeric measurement columns of a samples table, in a stable, readable order."""
    import pandas as pd

    preferred = ["gpu_util", "mem_util", "mem_used_mib", "power_w", "temp_c", "sm_clock_mhz"]
    fields = []
    for col in samples.columns:
        if col in SAMPLE_ID_COLUMNS or col == "gpu_key":
            continue
        if pd.api.types.is_bool_dtype(samples[col]):
            continue
        values = pd.to_numeric(samples[col], errors="coerce")
        if values.notna().any() and pd.api.types.is_numeric_dtype(samples[col]):
            fields.append(col)
    return sorted(fields, key=lambda c: (preferred.index(c) if c in preferred else len(preferred), c))

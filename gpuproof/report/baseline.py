"""Baselines and regression rules.

A **baseline** (JSON) holds, per (benchmark, metric, parameters, product), the median
over one or more runs of each run's mean value. A **rules file** (YAML) says which
metrics are judged, how much worse they may get, and which way is better::

    rules:
      - metric: matmul/tflops            # glob on "benchmark/metric"
        parameters: {dtype: bf16}        # optional: only rows with these parameters (globs)
        tolerance: 5%                    # or 0.05: allowed relative change for the worse
        direction: higher_is_better
      - metric: "re:inference/p9[09]_ms"   # "re:" = regular expression
        tolerance: 0.10
        direction: lower_is_better
        abs_tolerance: 0.5               # optional: also ignore changes smaller than this (metric's unit)

The first rule that matches a row judges it; rows no rule matches are not judged.
A row is a **regression** when it got worse by more than the tolerance (and by more
than abs_tolerance), **improved** when it got better by more than that, **new** when
the baseline lacks it and **missing** when the run lacks a row the baseline has.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import re
from pathlib import Path
from typing import Any

from ..errors import GpuproofError
from ..results import utcnow
from .data import ParamLabels, Run, metric_sort_key, params_of
from .tables import Table, fmt_num, fmt_pct

KEY = ("benchmark", "metric", "parameters", "product")
DIRECTIONS = ("higher_is_better", "lower_is_better")
BASELINE_KIND = "gpuproof-baseline"
STATUS_ORDER = ("regression", "missing", "improved", "new", "ok")
STATUS_MARK = {"regression": "❌", "missing": "⚠️", "improved": "🟢", "new": "🆕", "ok": "✅"}


class RulesError(GpuproofError):
    """A rules or baseline file is malformed; the message names the file and the field."""

    def __init__(self, source: str, field: str, problem: str):
        super().__init__(f"{source}: {field}: {problem}" if field else f"{source}: {problem}")


# ---------------------------------------------------------------- aggregation

def aggregate(metrics, by_product: bool = True) -> dict[tuple, dict]:
    """One value per (benchmark, metric, parameters, product): the mean over nodes and
    repeated rows. Without ``by_product`` the product is "" (comparing GPU types)."""
    out: dict[tuple, dict] = {}
    if metrics.empty:
        return out
    df = metrics.copy()
    if not by_product:
        df["product"] = ""
    for key, group in df.groupby(list(KEY), sort=True):
        units = [u for u in group["unit"] if u]
        out[tuple(key)] = {"value": float(group["value"].mean()), "unit": units[0] if units else "",
                           "nodes": sorted({n for n in group["node"] if n})}
    return out


def make_baseline(runs: list[Run]) -> dict:
    """A baseline from one or more runs: the median of the runs' values per key."""
    if not runs:
        raise GpuproofError("a baseline needs at least one run")
    per_run = []
    for run in runs:
        if run.metrics.empty:
            raise GpuproofError(f"run {run.path} has no metrics (metrics.jsonl is missing or empty); "
                                "a baseline is made from runs that ran benchmarks")
        per_run.append(aggregate(run.metrics))
    keys = sorted(set().union(*per_run))
    rows = []
    for key in keys:
        values = [agg[key]["value"] for agg in per_run if key in agg]
        unit = next(agg[key]["unit"] for agg in per_run if key in agg)
        rows.append({**dict(zip(KEY, key)), "unit": unit, "value": _median(values), "n": len(values),
                     "min": min(values), "max": max(values)})
    return {"kind": BASELINE_KIND, "version": 1, "created": utcnow(),
            "runs": [{"run_id": r.run_id, "cluster": r.cluster, "path": str(r.path)} for r in runs],
            "metrics": rows}


def _median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def save_baseline(baseline: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(baseline, indent=2, sort_keys=True) + "\n")


def load_baseline(path: str | Path) -> dict[tuple, dict]:
    path = Path(path)
    if not path.is_file():
        raise GpuproofError(f"baseline file {path} not found "
                            f"(make one with `gpuproof report baseline make RUN -o {path}`)")
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise RulesError(str(path), "", f"not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or data.get("kind") != BASELINE_KIND:
        raise RulesError(str(path), "kind", f"not a gpuproof baseline (expected kind: {BASELINE_KIND})")
    if not isinstance(data.get("metrics"), list):
        raise RulesError(str(path), "metrics", "must be a list")
    out = {}
    for i, row in enumerate(data["metrics"]):
        missing = [k for k in KEY + ("value",) if k not in row]
        if missing:
            raise RulesError(str(path), f"metrics[{i}]", f"missing {', '.join(missing)}")
        out[tuple(str(row[k]) for k in KEY)] = {"value": float(row["value"]), "unit": row.get("unit", "")}
    return out


# ---------------------------------------------------------------- rules

@dataclasses.dataclass
class Rule:
    metric: str
    tolerance: float
    direction: str
    parameters: dict = dataclasses.field(default_factory=dict)
    abs_tolerance: float = 0.0
    index: int = 0

    def __post_init__(self) -> None:
        if self.metric.startswith("re:"):
            self._match = re.compile(self.metric[3:]).search
        else:
            pattern = self.metric
            self._match = lambda name: fnmatch.fnmatchcase(name, pattern)

    def matches(self, benchmark: str, metric: str, parameters: str) -> bool:
        if not self._match(f"{benchmark}/{metric}"):
            return False
        params = params_of(parameters)
        for key, want in self.parameters.items():
            if key not in params:
                return False
            wants = want if isinstance(want, list) else [want]
            if not any(fnmatch.fnmatchcase(str(params[key]), str(w)) for w in wants):
                return False
        return True

    def describe(self) -> str:
        arrow = "≥" if self.direction == "higher_is_better" else "≤"
        text = f"{arrow} {'-' if arrow == '≥' else '+'}{self.tolerance:.1%}"
        if self.abs_tolerance:
            text += f" (±{fmt_num(self.abs_tolerance)})"
        return text


def _tolerance(value: Any, source: str, field: str) -> float:
    try:
        if isinstance(value, str) and value.strip().endswith("%"):
            t = float(value.strip()[:-1]) / 100
        elif isinstance(value, bool):
            raise ValueError
        else:
            t = float(value)
    except (TypeError, ValueError):
        raise RulesError(source, field, f"must be a number like 0.05 or '5%', got {value!r}") from None
    if not (0 <= t < 10) or math.isnan(t):
        raise RulesError(source, field, f"must be between 0 and 10 (0.05 = 5%), got {value!r}")
    return t


def parse_rules(data: Any, source: str = "rules") -> list[Rule]:
    """Rules from parsed YAML: a list, or a mapping with a ``rules`` list."""
    if isinstance(data, dict):
        unknown = set(data) - {"rules"}
        if unknown:
            raise RulesError(source, sorted(unknown)[0], "unknown top-level key (expected: rules)")
        data = data.get("rules")
    if not isinstance(data, list) or not data:
        raise RulesError(source, "rules", "must be a non-empty list of rules "
                                          "(each with metric, tolerance, direction)")
    rules = []
    allowed = {"metric", "tolerance", "direction", "parameters", "abs_tolerance"}
    for i, item in enumerate(data):
        where = f"rules[{i}]"
        if not isinstance(item, dict):
            raise RulesError(source, where, "must be a mapping with metric, tolerance, direction")
        unknown = set(item) - allowed
        if unknown:
            raise RulesError(source, f"{where}.{sorted(unknown)[0]}",
                             f"unknown field (allowed: {', '.join(sorted(allowed))})")
        for req in ("metric", "tolerance", "direction"):
            if req not in item:
                raise RulesError(source, f"{where}.{req}", "is required")
        metric = item["metric"]
        if not isinstance(metric, str) or not metric.strip():
            raise RulesError(source, f"{where}.metric", "must be a pattern on benchmark/metric, e.g. matmul/tflops")
        if metric.startswith("re:"):
            try:
                re.compile(metric[3:])
            except re.error as exc:
                raise RulesError(source, f"{where}.metric", f"bad regular expression ({exc})") from None
        direction = item["direction"]
        if direction not in DIRECTIONS:
            raise RulesError(source, f"{where}.direction", f"must be one of {', '.join(DIRECTIONS)}, got {direction!r}")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise RulesError(source, f"{where}.parameters", "must be a mapping of parameter name to value or glob")
        abs_tol = item.get("abs_tolerance", 0.0)
        try:
            abs_tol = float(abs_tol)
        except (TypeError, ValueError):
            raise RulesError(source, f"{where}.abs_tolerance", f"must be a number, got {abs_tol!r}") from None
        rules.append(Rule(metric=metric.strip(), tolerance=_tolerance(item["tolerance"], source, f"{where}.tolerance"),
                          direction=direction, parameters=params, abs_tolerance=abs_tol, index=i))
    return rules


def load_rules(path: str | Path) -> list[Rule]:
    import yaml

    path = Path(path)
    if not path.is_file():
        raise GpuproofError(f"rules file {path} not found")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RulesError(str(path), "", f"not valid YAML ({exc})") from None
    return parse_rules(data, str(path))


# ---------------------------------------------------------------- judging

@dataclasses.dataclass
class Verdict:
    status: str                # regression | missing | improved | new | ok
    benchmark: str
    metric: str
    parameters: str
    product: str
    unit: str
    baseline: float | None
    current: float | None
    rule: Rule

    @property
    def change(self) -> float | None:
        if self.baseline is None or self.current is None:
            return None
        if self.baseline == 0:
            return 0.0 if self.current == 0 else math.copysign(math.inf, self.current)
        return (self.current - self.baseline) / abs(self.baseline)


def judge(baseline: float, current: float, rule: Rule) -> str:
    worse = (baseline - current) if rule.direction == "higher_is_better" else (current - baseline)
    scale = abs(baseline)
    eps = 1e-9 * max(scale, 1.0)

    def beyond(amount: float) -> bool:
        if amount <= rule.abs_tolerance + eps:
            return False
        return scale == 0 or amount / scale > rule.tolerance + 1e-12

    if beyond(worse):
        return "regression"
    if beyond(-worse):
        return "improved"
    return "ok"


@dataclasses.dataclass
class CheckReport:
    verdicts: list[Verdict]
    unjudged: int              # rows in run or baseline that no rule matched
    run_id: str

    def count(self, status: str) -> int:
        return sum(1 for v in self.verdicts if v.status == status)

    @property
    def regressions(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "regression"]

    def headline(self) -> str:
        names = {"regression": "regressions", "new": "new (no baseline)"}
        parts = [f"{self.count(s)} {names.get(s, s) if self.count(s) != 1 or s != 'regression' else s}"
                 for s in STATUS_ORDER]
        return (f"run {self.run_id}: " + ", ".join(parts)
                + (f"; {self.unjudged} metric rows matched no rule" if self.unjudged else ""))

    def table(self, markdown: bool = False, everything: bool = False) -> Table:
        """The judged rows; without ``everything`` only those that are not "ok"."""
        table = Table(["status", "metric", "parameters", "product", "baseline", "current", "change", "allowed", "rule"],
                      align="llllrrrll")
        labels = ParamLabels((v.benchmark, v.parameters) for v in self.verdicts)   # the same with or without --all
        table.note = labels.common_note()
        for v in self.verdicts:
            if v.status == "ok" and not everything:
                continue
            if markdown:
                status = f"{STATUS_MARK[v.status]} {v.status}"
            else:
                status = v.status.upper() if v.status == "regression" else v.status
            unit = f" {v.unit}" if v.unit else ""
            table.add(status, f"{v.benchmark}/{v.metric}", labels(v.benchmark, v.parameters), v.product or "-",
                      "" if v.baseline is None else fmt_num(v.baseline) + unit,
                      "" if v.current is None else fmt_num(v.current) + unit,
                      fmt_pct(v.change), v.rule.describe(), f"#{v.rule.index + 1} {v.rule.metric}")
        return table

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "regressions": self.count("regression"), "unjudged": self.unjudged,
                "verdicts": [{**{k: getattr(v, k) for k in ("status", "benchmark", "metric", "product", "unit",
                                                            "baseline", "current")},
                              "parameters": params_of(v.parameters), "change": v.change,
                              "rule": v.rule.metric, "tolerance": v.rule.tolerance,
                              "direction": v.rule.direction} for v in self.verdicts]}


def check_run(run: Run, baseline: dict[tuple, dict], rules: list[Rule]) -> CheckReport:
    """Judge a run's metrics against a baseline with rules."""
    if run.metrics.empty:
        raise GpuproofError(f"run {run.path} has no metrics (metrics.jsonl is missing or empty); nothing to check")
    current = aggregate(run.metrics)
    verdicts, unjudged = [], 0
    for key in sorted(set(current) | set(baseline)):
        benchmark, metric, parameters, product = key
        rule = next((r for r in rules if r.matches(benchmark, metric, parameters)), None)
        if rule is None:
            unjudged += 1
            continue
        base, cur = baseline.get(key), current.get(key)
        unit = (cur or base)["unit"]
        if base is None:
            status = "new"
        elif cur is None:
            status = "missing"
        else:
            status = judge(base["value"], cur["value"], rule)
        verdicts.append(Verdict(status, benchmark, metric, parameters, product, unit,
                                base["value"] if base else None, cur["value"] if cur else None, rule))
    verdicts.sort(key=lambda v: (STATUS_ORDER.index(v.status),
                                 metric_sort_key(v.benchmark, v.metric, v.parameters, v.product)))
    return CheckReport(verdicts=verdicts, unjudged=unjudged, run_id=run.run_id)

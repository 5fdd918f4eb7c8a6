"""Runs side by side: metric deltas, checks whose verdict changed, the inventory diff.

The first run is the reference ("A"); every later run is compared with it. Metrics
are matched on benchmark, metric and parameters, and on the GPU product when the runs
share products (before/after an upgrade). When the runs have no product in common
(comparing two GPU types) the product is left out of the match and named in the
run's column header instead.
"""

from __future__ import annotations

import dataclasses
import json
import math

from ..errors import GpuproofError
from .baseline import aggregate
from .data import ParamLabels, Run, metric_sort_key, params_of
from .inventory_diff import Change, changes_table, diff_inventories
from .tables import Table, fmt_num, fmt_pct
from .views import default_direction

RUN_ID_PLACEHOLDER = "<run-id>"
VERDICT_RANK = {"fail": 0, "warn": 1, "skip": 2, "pass": 3}
MARK = {"fail": "❌ fail", "warn": "⚠️ warn", "skip": "⏭️ skip", "pass": "✅ pass", "": "— absent"}


@dataclasses.dataclass
class MetricRow:
    benchmark: str
    metric: str
    parameters: str
    product: str
    unit: str
    values: list[float | None]       # one per run

    def delta(self, i: int) -> float | None:
        a, b = self.values[0], self.values[i]
        if a is None or b is None:
            return None
        if a == 0:
            return 0.0 if b == 0 else math.copysign(math.inf, b)
        return (b - a) / abs(a)

    def assessment(self, i: int) -> str:
        """better / worse / "" for run i against run 0, from the metric's usual direction."""
        d = self.delta(i)
        direction = default_direction(self.benchmark, self.metric)
        if d is None or not direction or abs(d) < 1e-9:
            return ""
        up = d > 0
        return "better" if up == (direction == "higher_is_better") else "worse"


@dataclasses.dataclass
class Comparison:
    runs: list[Run]
    by_product: bool
    metrics: list[MetricRow]
    verdict_changes: list[tuple[tuple[str, str, str], list[str]]]   # (feature, check, target) -> verdict per run
    test_changes: list[tuple[str, list[str]]]                       # pytest id -> outcome per run
    inventory_changes: list[list[Change]]                           # run i vs run 0, for i >= 1

    def run_label(self, i: int) -> str:
        run = self.runs[i]
        label = f"{chr(ord('A') + i) if i < 26 else i}: {run.run_id}"
        if not self.by_product:
            products = sorted({p for p in run.metrics.get("product", []) if p}) if not run.metrics.empty else []
            if products:
                label += f" ({', '.join(products)})"
        return label

    def short(self, i: int) -> str:
        return chr(ord("A") + i) if i < 26 else str(i)

    # ------------------------------------------------------------ renderings

    def runs_table(self) -> Table:
        table = Table(["run", "cluster", "Kubernetes", "outcome", "checks pass/fail/warn/skip", "tests pass/fail/skip",
                       "metrics"], align="lllllrr")
        for i, run in enumerate(self.runs):
            c = run.check_counts()
            j = run.junit
            table.add(self.run_label(i), run.cluster or "-", run.kubernetes_version or "-", run.outcome or "-",
                      f"{c['pass']}/{c['fail']}/{c['warn']}/{c['skip']}",
                      f"{j.passed}/{j.failed + j.errors}/{j.skipped}" if j else "-", str(len(run.metrics)))
        return table

    def metrics_table(self, markdown: bool = False, min_change: float = 0.0) -> Table:
        cols = ["metric", "parameters"] + (["product"] if self.by_product else [])
        cols += [f"{self.short(i)}" for i in range(len(self.runs))]
        cols += [f"{self.short(i)} vs A" for i in range(1, len(self.runs))]
        table = Table(cols, align="ll" + ("l" if self.by_product else "") + "r" * (2 * len(self.runs) - 1))
        labels = ParamLabels((m.benchmark, m.parameters) for m in self.metrics)
        table.note = labels.common_note()
        for row in self.metrics:
            deltas = [row.delta(i) for i in range(1, len(self.runs))]
            if min_change and all(d is not None and abs(d) < min_change for d in deltas):
                continue
            unit = f" {row.unit}" if row.unit else ""
            cells = [f"{row.benchmark}/{row.metric}", labels(row.benchmark, row.parameters)]
            if self.by_product:
                cells.append(row.product or "-")
            cells += ["" if v is None else fmt_num(v) + unit for v in row.values]
            for i, d in enumerate(deltas, start=1):
                verdict = row.assessment(i)
                if markdown and verdict:
                    verdict = "🟢" if verdict == "better" else "🔻"
                cells.append((fmt_pct(d) + (f" {verdict}" if verdict else "")) if d is not None else "n/a")
            table.add(*cells)
        return table

    def verdicts_table(self, markdown: bool = False) -> Table:
        cols = ["feature", "check", "target"] + [self.short(i) for i in range(len(self.runs))]
        table = Table(cols)
        for (feature, check, target), verdicts in self.verdict_changes:
            table.add(feature, check, target, *[MARK[v] if markdown else (v or "absent") for v in verdicts])
        return table

    def tests_table(self) -> Table:
        table = Table(["pytest test"] + [self.short(i) for i in range(len(self.runs))])
        for test_id, outcomes in self.test_changes:
            table.add(test_id, *[o or "absent" for o in outcomes])
        return table

    def render(self, fmt: str = "text", min_change: float = 0.0) -> str:
        if fmt == "json":
            return json.dumps(self.to_json(), indent=2, default=str)
        md = fmt == "md"
        out = []

        def section(title: str, body: str) -> None:
            out.append(f"### {title}\n\n{body}\n" if md else f"{title}\n{'=' * len(title)}\n{body}\n")

        def table(t: Table) -> str:
            return t.to_markdown() if md else t.to_text()

        head = f"gpuproof compare: {len(self.runs)} runs, each against A ({self.runs[0].run_id})"
        out.append(f"## {head}\n" if md else f"{head}\n")
        section("Runs", table(self.runs_table()))
        section(f"Checks whose verdict changed ({len(self.verdict_changes)})",
                table(self.verdicts_table(md)) if self.verdict_changes else "No check changed its verdict.")
        if self.test_changes:
            section(f"pytest tests whose outcome changed ({len(self.test_changes)})", table(self.tests_table()))
        for i, changes in enumerate(self.inventory_changes, start=1):
            title = f"Cluster changes {self.short(0)} -> {self.short(i)} ({len(changes)})"
            if not (self.runs[0].inventory and self.runs[i].inventory):
                section(title, "No inventory snapshot in one of the runs.")
            else:
                section(title, table(changes_table(changes)) if changes else "No change in the inventory.")
        mt = self.metrics_table(md, min_change)
        note = "" if self.by_product else ("Runs share no GPU product: metrics matched on benchmark, metric and "
                                           "parameters only.\n\n" if md else
                                           "(runs share no GPU product: matched on benchmark, metric, parameters)\n")
        section(f"Metrics ({len(mt)} rows)", note + (table(mt) if len(mt) else "No metrics to compare."))
        return "\n".join(out).rstrip() + "\n"

    def to_json(self) -> dict:
        return {
            "runs": [{"label": self.short(i), "run_id": r.run_id, "path": str(r.path), "cluster": r.cluster,
                      "kubernetes_version": r.kubernetes_version, "outcome": r.outcome}
                     for i, r in enumerate(self.runs)],
            "matched_on_product": self.by_product,
            "metrics": [{"benchmark": m.benchmark, "metric": m.metric, "parameters": params_of(m.parameters),
                         "product": m.product, "unit": m.unit, "values": m.values,
                         "deltas": [m.delta(i) for i in range(1, len(self.runs))]} for m in self.metrics],
            "verdict_changes": [{"feature": k[0], "check": k[1], "target": k[2], "verdicts": v}
                                for k, v in self.verdict_changes],
            "test_changes": [{"test": k, "outcomes": v} for k, v in self.test_changes],
            "inventory_changes": [[dataclasses.asdict(c) for c in changes] for changes in self.inventory_changes],
        }


def _products(run: Run) -> set[str]:
    return set(run.metrics["product"]) - {""} if not run.metrics.empty else set()


def _worst(verdicts) -> str:
    return min(verdicts, key=lambda v: VERDICT_RANK.get(v, 9))


def compare_runs(runs: list[Run], by: str = "auto") -> Comparison:
    if len(runs) < 2:
        raise GpuproofError("compare needs at least two runs")
    if by not in ("auto", "product", "none"):
        raise GpuproofError(f"--by must be auto, product or none, got {by!r}")
    if by == "auto":
        product_sets = [_products(r) for r in runs]
        by_product = all(s for s in product_sets) and bool(set.intersection(*product_sets)) \
            or not any(product_sets)
    else:
        by_product = by == "product"

    aggs = [aggregate(r.metrics, by_product) for r in runs]
    metrics = []
    for key in sorted(set().union(*aggs), key=lambda k: metric_sort_key(*k)):
        values = [agg[key]["value"] if key in agg else None for agg in aggs]
        unit = next(agg[key]["unit"] for agg in aggs if key in agg)
        metrics.append(MetricRow(*key, unit=unit, values=values))

    verdicts = []
    for run in runs:
        per: dict[tuple, list[str]] = {}
        for r in run.checks.to_dict("records") if not run.checks.empty else []:
            # targets named after the run (namespace/gpuproof-<run-id>-quota) match across runs
            target = r["target"].replace(run.run_id, RUN_ID_PLACEHOLDER) if run.run_id else r["target"]
            per.setdefault((r["feature"], r["check"], target), []).append(r["verdict"])
        verdicts.append({key: _worst(vs) for key, vs in per.items()})
    verdict_changes = []
    for key in sorted(set().union(*verdicts)):
        vs = [v.get(key, "") for v in verdicts]
        if len(set(vs)) > 1:
            verdict_changes.append((key, vs))
    verdict_changes.sort(key=lambda kv: min(VERDICT_RANK.get(v, 9) for v in kv[1]))

    tests = [r.junit.outcomes() if r.junit else None for r in runs]
    test_changes = []
    if sum(t is not None for t in tests) >= 2:
        for test_id in sorted(set().union(*(t for t in tests if t))):
            outcomes = [t.get(test_id, "") if t is not None else "" for t in tests]
            present = [o for o, t in zip(outcomes, tests) if t is not None]
            if len(set(present)) > 1:
                test_changes.append((test_id, outcomes))

    inventory_changes = [diff_inventories(runs[0].inventory, r.inventory) if runs[0].inventory and r.inventory else []
                         for r in runs[1:]]
    return Comparison(runs, by_product, metrics, verdict_changes, test_changes, inventory_changes)

"""A run's check records read once: what summary.md, report.html and failed-nodes.csv show of them (issue #52).

A 1,000-node run writes about 270,000 check records (health alone 187 per node). The reports do not list them: they
lead with what failed, by node, and what was not judged, grouped by reason; they count and summarize what passed per
check and pool, with the spread of the figures each check measured; every record stays in the run folder's
checks.parquet / checks.jsonl. :func:`digest` walks the records once and keeps only that; the renderers read the
digest, never the records again.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import re
import statistics

from .tables import natural_key
from .views import VERDICT_ORDER

FAILED_NODES_FILE = "failed-nodes.csv"
FAILED_NODES_COLUMNS = ("node", "verdict", "pool", "feature", "check", "reason")
MAX_TEXTS = 20                      # distinct non-numeric actual values kept per check and pool
# an actual value that is one figure: a number, a unit, and perhaps a parenthesis ("0.0959 TFLOPS (62%)")
_FIGURE = re.compile(r"^\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*([A-Za-z%][A-Za-z%/]*)?\s*(?:\([^()]*\))?\s*$")
_UUID = re.compile(r"\bGPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_GPU_INDEX = re.compile(r"\bGPU (\d+)\b")
_DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])")


_NAMES: dict[str, re.Pattern] = {}


def reason_key(message: str, target: str = "") -> str:
    """A skip's reason with what differs from node to node and GPU to GPU taken out (the node's own name, GPU
    UUIDs and indexes, measured figures), so one reason on 1,000 nodes is one row: ``<node> GPU <i> (<uuid>): fp32
    matmul <n> TFLOPS: no datasheet figure``. Whole numbers stay (``needs 2 GPUs``)."""
    text = " ".join(str(message or "").split()) or "(no reason given)"
    if target and target != "cluster" and "/" not in target and target in text:
        name = _NAMES.get(target)
        if name is None:
            name = _NAMES[target] = re.compile(r"(?<![0-9A-Za-z])" + re.escape(target) + r"(?![0-9A-Za-z])")
        text = name.sub("<node>", text)
    text = _UUID.sub("<uuid>", text)
    text = _GPU_INDEX.sub("GPU <i>", text)
    return _DECIMAL.sub("<n>", text)


def figure_of(actual: str) -> tuple[float, str] | None:
    """``"0.0959 TFLOPS (62%)"`` -> (0.0959, "TFLOPS"); None when the value is not one figure."""
    m = _FIGURE.match(actual)
    if not m:
        return None
    return float(m.group(1)), m.group(2) or ""


@dataclasses.dataclass
class CheckSummary:
    """One check in one pool: verdict counts, the targets it judged, and the figures of its passes."""

    feature: str
    check: str
    pool: str
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    targets: set = dataclasses.field(default_factory=set)
    values: list = dataclasses.field(default_factory=list)       # numeric actual values of the passes
    units: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    texts: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # other actual values
    more_texts: int = 0                                            # passes whose value was not kept (> MAX_TEXTS)

    def add_pass(self, actual: str, figures: dict) -> None:
        fig = figures.get(actual, False)
        if fig is False:
            fig = figures[actual] = figure_of(actual) if actual else None
        if fig is not None:
            self.values.append(fig[0])
            self.units[fig[1]] += 1
        elif actual in self.texts or len(self.texts) < MAX_TEXTS:
            self.texts[actual] += 1
        else:
            self.more_texts += 1

    def spread(self) -> str:
        """The passes' figures: ``min 0.145 · median 0.154 · max 0.158 TFLOPS (8,000)``, or their values."""
        from .tables import fmt_num, shorten

        parts = []
        if self.values:
            unit = self.units.most_common(1)[0][0]
            unit = f" {unit}" if unit else ""
            lo, hi = min(self.values), max(self.values)
            if lo == hi:
                parts.append(f"{fmt_num(lo)}{unit}" + (" (every one)" if len(self.values) > 1 else ""))
            else:
                parts.append(f"min {fmt_num(lo)} · median {fmt_num(statistics.median(self.values))} · "
                             f"max {fmt_num(hi)}{unit}")
        if self.texts:
            distinct = len(self.texts) + (1 if self.more_texts else 0)
            if distinct == 1 and sum(self.texts.values()) > 1:
                (value, _), = self.texts.items()
                parts.append(f"{shorten(value or '(empty)', 80)} (every one)")
            elif distinct == 1:
                parts.append(shorten(next(iter(self.texts)) or "(empty)", 80))
            else:
                top = ", ".join(f"{shorten(v or '(empty)', 40)} ({n})" for v, n in self.texts.most_common(3))
                more = f"{len(self.texts)}{'+' if self.more_texts else ''} distinct values"
                parts.append(f"{more}: {top}" + (" …" if distinct > 3 else ""))
        return "; ".join(parts)


@dataclasses.dataclass
class NodeSummary:
    """One node: its pool and product, verdict counts, its failed and warned records, its failed pytest tests."""

    name: str
    pool: str = ""
    product: str = ""
    gpus: str = ""
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    problems: list = dataclasses.field(default_factory=list)      # fail and warn records, as read
    tests: list = dataclasses.field(default_factory=list)         # pytest cases on this node that failed or erred
    lost: str = ""                                                # why it was lost during the run, if it was

    @property
    def failed(self) -> int:
        return self.counts["fail"]

    @property
    def warned(self) -> int:
        return self.counts["warn"]

    def what_failed(self, verdicts=("fail",)) -> list[tuple[str, int]]:
        """(``feature: check``, how many records) of this node's problems, in the order they came."""
        counter = collections.Counter(f"{r['feature']}: {r['check']}" for r in self.problems
                                      if r["verdict"] in verdicts)
        return list(counter.items())


@dataclasses.dataclass
class SkipGroup:
    """Records not judged for one reason: of one check, on any number of targets."""

    feature: str
    check: str
    reason: str                     # reason_key of the message
    example: str                    # the first message as written
    records: int = 0
    several: bool = False           # the records' messages differ (by a node, a GPU, a figure)
    targets: dict = dataclasses.field(default_factory=dict)      # target -> pool, in order of appearance

    def add(self, target: str, pool: str, message: str) -> None:
        self.records += 1
        if message != self.example:
            self.several = True
        self.targets.setdefault(target, pool)

    @property
    def text(self) -> str:
        """The reason as shown: the message itself when every record said the same, else its reason_key."""
        return self.reason if self.several else self.example


@dataclasses.dataclass
class Digest:
    counts: collections.Counter
    matrix: dict                     # (feature, pool) -> Counter of verdicts
    features: list
    pools: list
    checks: dict                     # (feature, check, pool) -> CheckSummary
    nodes: dict                      # node name -> NodeSummary (every GPU node of the inventory, and judged nodes)
    problems: list                   # fail and warn records of every target, sorted (verdict, feature, check, target)
    skips: dict                      # (feature, check, reason_key) -> SkipGroup, skips of every target
    left_out: dict                   # (node, reason_key) -> {node, pool, reason, example, messages, checks}
    total: int                       # check records
    gpu: set                         # the GPU nodes' names (every node's, without an inventory)

    def failing_nodes(self) -> list[NodeSummary]:
        """Nodes with a failed check or a failed pytest test, most failures first."""
        out = [n for n in self.nodes.values() if n.failed or n.tests]
        return sorted(out, key=lambda n: (-n.failed, -len(n.tests), natural_key(n.name)))

    def warned_nodes(self) -> list[NodeSummary]:
        return sorted((n for n in self.nodes.values() if n.warned and not (n.failed or n.tests)),
                      key=lambda n: (-n.warned, natural_key(n.name)))

    def node_skips(self) -> list[SkipGroup]:
        """Skips on nodes, one group per check and reason, the most nodes first."""
        groups = [g for g in self.skips.values() if any(t in self.nodes for t in g.targets)]
        return sorted(groups, key=lambda g: (-len(g.targets), g.feature, g.check, g.reason))

    def gpu_nodes(self) -> list[NodeSummary]:
        return sorted(self.nodes.values(), key=lambda n: natural_key(n.name))


def _products(inventory: dict) -> dict[str, str]:
    pools: dict[str, set] = {}
    for n in inventory.get("nodes") or []:
        if n.get("product") and n.get("pool"):
            pools.setdefault(n["product"], set()).add(n["pool"])
    return {product: next(iter(p)) for product, p in pools.items() if len(p) == 1}


def digest_of(run) -> Digest:
    """``run``'s digest, made on first use and kept with the loaded run: every report of it reads the same one."""
    cached = run.__dict__.get("_digest")
    if cached is None:
        cached = run.__dict__["_digest"] = digest(run)
    return cached


def digest(run) -> Digest:
    """Read ``run``'s check records once (and its coverage rows, inventory, junit.xml cases, lost nodes)."""
    inventory = run.inventory or {}
    products = _products(inventory)
    nodes: dict[str, NodeSummary] = {}
    for n in inventory.get("nodes") or []:
        if n.get("name"):
            nodes[n["name"]] = NodeSummary(n["name"], str(n.get("pool") or ""), str(n.get("product") or ""),
                                           str(n.get("gpu_count") or ""))
    gpu_names = {n["name"] for n in inventory.get("nodes") or [] if n.get("name") and n.get("gpu")}
    known = set(nodes)

    def is_node(target: str) -> bool:
        if known:
            return target in known
        return bool(target) and target != "cluster" and "/" not in target

    counts: collections.Counter = collections.Counter()
    matrix: dict = {}
    features: list = []
    pools: list = []
    checks: dict = {}
    problems: list = []
    skips: dict = {}
    left_out: dict = {}
    pool_cache: dict = {}
    figures: dict = {}              # actual value -> figure_of(it): many passes share a value

    def left(node: str, pool: str, message: str, check: str, reason: str = "") -> None:
        key = (node, reason or reason_key(message, node))
        row = left_out.get(key)
        if row is None:
            row = left_out[key] = {"node": node, "pool": pool, "reason": key[1], "example": message,
                                   "messages": 1, "checks": []}
        elif message != row["example"]:
            row["messages"] = 2
        if check not in row["checks"]:
            row["checks"].append(check)

    for r in run.coverage:        # nodes the checks left out when they ran (coverage.jsonl)
        left(r.get("node", ""), r.get("pool", ""), r.get("reason", "") or "(no reason given)",
             f"{r.get('feature', '')}: {r.get('check', '')}")

    df = run.checks
    total = 0 if df.empty else len(df)
    if total:
        cols = [df[c].tolist() for c in ("feature", "check", "target", "verdict", "expected", "actual", "message",
                                         "pool", "product")]
        for feature, check, target, verdict, expected, actual, message, pool, product in zip(*cols):
            key = (pool, target, product)
            where = pool_cache.get(key)
            if where is None:
                known_node = nodes.get(target)
                where = pool_cache[key] = _pool_of(pool or (known_node.pool if known_node else ""), target, product,
                                                   products)
            counts[verdict] += 1
            feat = feature or "(none)"
            cell = matrix.get((feat, where))
            if cell is None:
                cell = matrix[(feat, where)] = collections.Counter()
                if feat not in features:
                    features.append(feat)
                if where not in pools:
                    pools.append(where)
            cell[verdict] += 1
            summary = checks.get((feature, check, where))
            if summary is None:
                summary = checks[(feature, check, where)] = CheckSummary(feature, check, where)
            summary.counts[verdict] += 1
            summary.targets.add(target)
            node = nodes.get(target)
            if node is None and not known and is_node(target):
                node = nodes[target] = NodeSummary(target, where, product)
            if node is not None:
                node.counts[verdict] += 1
            if verdict == "pass":
                summary.add_pass(actual, figures)
            elif verdict in ("fail", "warn"):
                rec = {"feature": feature, "check": check, "target": target, "verdict": verdict,
                       "expected": expected, "actual": actual, "message": message, "pool": pool,
                       "product": product, "where": where}
                problems.append(rec)
                if node is not None:
                    node.problems.append(rec)
            elif verdict == "skip":
                rkey = reason_key(message, target)
                group = skips.get((feature, check, rkey))
                if group is None:
                    group = skips[(feature, check, rkey)] = SkipGroup(feature, check, rkey,
                                                                      message or "(no reason given)")
                group.add(target, where, message or "(no reason given)")
                if node is not None:
                    left(target, where, message or "(no reason given)", f"{feature}: {check}", rkey)
    problems.sort(key=lambda r: (VERDICT_ORDER.index(r["verdict"]), r["feature"], r["check"],
                                 natural_key(r["target"])))
    pools.sort(key=lambda p: (p in ("other", "cluster"), p == "cluster", p))

    if run.junit is not None:       # pytest tests of a node ("test_x[node]") that failed or erred
        for case in run.junit.problems():
            node = nodes.get(_param(case.id))
            if node is not None:
                node.tests.append(case)
    for name, why in ((run.meta.get("extra") or {}).get("lost_nodes") or {}).items():
        node = nodes.setdefault(name, NodeSummary(name))
        node.lost = str(why)
    return Digest(counts, matrix, features, pools, checks, nodes, problems, skips, left_out, total,
                  gpu_names or set(nodes))


def _pool_of(pool: str, target: str, product: str, products: dict[str, str]) -> str:
    """views.pool_of for one record's fields."""
    if pool:
        return pool
    if target.startswith("pool/"):
        return target[len("pool/"):]
    product = product or (target[len("product/"):] if target.startswith("product/") else "")
    if product and product in products:
        return products[product]
    return "cluster" if target in ("", "cluster") else "other"


def _param(case_id: str) -> str:
    """``suites.test_x::test_y[h100-3]`` -> ``h100-3`` (the test's parameter; "" without one)."""
    name = case_id.rpartition("::")[2]
    return name[name.index("[") + 1:-1] if "[" in name and name.endswith("]") else ""


def failed_nodes_rows(d: Digest) -> list[dict]:
    """One row per failed check record on a node, per failed pytest test of a node none of whose checks failed, and
    per node lost during the run: node, verdict (fail | error | lost), pool, feature, check, reason."""
    from .tables import shorten

    rows = []
    for node in sorted(d.nodes.values(), key=lambda n: natural_key(n.name)):
        for r in node.problems:
            if r["verdict"] != "fail":
                continue
            reason = r["message"] or f"expected {r['expected']}, actual {r['actual']}"
            rows.append({"node": node.name, "verdict": "fail", "pool": node.pool or r["where"],
                         "feature": r["feature"], "check": r["check"], "reason": " ".join(reason.split())})
        if not node.failed:
            for case in node.tests:
                rows.append({"node": node.name, "verdict": "error", "pool": node.pool, "feature": "pytest",
                             "check": case.id, "reason": shorten(f"{case.outcome}: {case.message}", 1000)})
        if node.lost:
            rows.append({"node": node.name, "verdict": "lost", "pool": node.pool, "feature": "", "check": "",
                         "reason": " ".join(node.lost.split())})
    return rows


def failed_nodes_csv(d: Digest) -> str:
    """failed-nodes.csv: a header line, then :func:`failed_nodes_rows` (RFC 4180 quoting)."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=FAILED_NODES_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(failed_nodes_rows(d))
    return out.getvalue()

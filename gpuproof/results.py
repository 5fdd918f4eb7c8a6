"""The result records every suite and benchmark writes, and the run folder they go to.

One run = one folder ``reports/<run-id>/``:

- ``run.json``          what was run, against what, when (RunMeta)
- ``checks.jsonl``      one CheckRecord per acceptance check and target (appended as they happen)
- ``metrics.jsonl``     long-format MetricRecords from benchmarks
- ``samples.jsonl``     utilization samples (one row per GPU per tick)
- ``inventory.json``    the cluster snapshot (see gpuproof.discovery.inventory)
- ``*.parquet``         the same tables, written by :meth:`RunDir.finalize`
- ``junit.xml``, ``summary.md``, ``report.html`` (written by the report layer)

JSONL is appended line by line so an interrupted run still leaves readable results;
parquet is written once at the end.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import os
import re
import secrets
import threading
from pathlib import Path
from typing import Any, Iterable

VERDICTS = ("pass", "fail", "warn", "skip")

CHECKS_FILE = "checks.jsonl"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
INVENTORY_FILE = "inventory.json"
COVERAGE_FILE = "coverage.jsonl"     # GPU nodes a check left out, and why (gpuproof.plugin.coverage)
META_FILE = "run.json"


def utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="milliseconds")


def new_run_id(now: _dt.datetime | None = None) -> str:
    """Sortable, unique, safe as a folder name and a Kubernetes label value."""
    now = now or _dt.datetime.now(_dt.timezone.utc)
    return now.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _text(value: Any) -> str:
    """Expected/actual values are stored as text so one column holds any check's values."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, default=str)


@dataclasses.dataclass
class CheckRecord:
    """The verdict of one acceptance check on one target (a node, a pool or the cluster)."""

    feature: str            # advertisement, labels, taints, affinity, preemption, quota, timeslicing, mig, ...
    check: str              # short name of the check, e.g. "capacity-matches-count"
    target: str             # node name, "pool/<name>", or "cluster"
    verdict: str            # pass | fail | warn | skip
    expected: str = ""
    actual: str = ""
    message: str = ""
    pool: str = ""
    product: str = ""
    run_id: str = ""
    ts: str = dataclasses.field(default_factory=utcnow)

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        self.expected = _text(self.expected)
        self.actual = _text(self.actual)


@dataclasses.dataclass
class MetricRecord:
    """One number from a benchmark, in long format (one row per metric)."""

    benchmark: str          # matmul, allreduce, inference, utilization, ...
    metric: str             # tflops, busbw_gbps, p99_ms, ...
    value: float
    unit: str
    parameters: dict = dataclasses.field(default_factory=dict)  # dtype, size, world_size, rate, ...
    node: str = ""
    product: str = ""
    cluster: str = ""
    run_id: str = ""
    ts: str = dataclasses.field(default_factory=utcnow)

    def as_row(self) -> dict:
        row = dataclasses.asdict(self)
        # parameters are kept as a canonical JSON string so runs can be joined on them
        row["parameters"] = json.dumps(self.parameters, sort_keys=True, default=str)
        row["value"] = float(self.value)
        return row


@dataclasses.dataclass
class RunMeta:
    run_id: str
    target: str = "embedded"        # embedded | kubeconfig:<path>#<context> | local
    cluster: str = ""               # a human name for the cluster (context name, "embedded")
    kubernetes_version: str = ""
    gpuproof_version: str = ""
    fleet: str = ""
    started: str = dataclasses.field(default_factory=utcnow)
    finished: str = ""
    argv: list = dataclasses.field(default_factory=list)
    outcome: str = ""               # passed | failed | interrupted
    extra: dict = dataclasses.field(default_factory=dict)


_SAFE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class RunDir:
    """The folder of one run. Thread-safe appends; finalize() writes the parquet tables."""

    def __init__(self, path: str | os.PathLike, meta: RunMeta | None = None):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._files: dict[str, Any] = {}     # open append handles, flushed after every write
        if meta is None and (self.path / META_FILE).exists():
            meta = RunMeta(**json.loads((self.path / META_FILE).read_text()))
        self.meta = meta or RunMeta(run_id=self.path.name)
        self.write_meta()

    @classmethod
    def create(cls, root: str | os.PathLike = "reports", run_id: str | None = None, **meta: Any) -> "RunDir":
        run_id = run_id or new_run_id()
        if not _SAFE.match(run_id):
            raise ValueError(f"run id {run_id!r} is not a safe folder name")
        return cls(Path(root) / run_id, RunMeta(run_id=run_id, **meta))

    @property
    def run_id(self) -> str:
        return self.meta.run_id

    def write_meta(self) -> None:
        self._write_json(META_FILE, dataclasses.asdict(self.meta))

    def _write_json(self, name: str, data: Any) -> None:
        tmp = self.path / (name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
        tmp.replace(self.path / name)

    def _append(self, name: str, rows: Iterable[dict]) -> None:
        lines = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows)
        if not lines:
            return
        with self._lock:
            fh = self._files.get(name)
            if fh is None:
                fh = self._files[name] = open(self.path / name, "a", encoding="utf-8")
            fh.write(lines)
            fh.flush()                       # an interrupted run still leaves whole lines

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()

    def add_check(self, record: CheckRecord) -> CheckRecord:
        record.run_id = record.run_id or self.run_id
        self._append(CHECKS_FILE, [dict(vars(record))])      # flat record: a shallow copy is its dict
        return record

    def add_metric(self, record: MetricRecord) -> MetricRecord:
        record.run_id = record.run_id or self.run_id
        record.cluster = record.cluster or self.meta.cluster
        self._append(METRICS_FILE, [record.as_row()])
        return record

    def add_metrics(self, records: Iterable[MetricRecord]) -> None:
        for r in records:
            self.add_metric(r)

    def add_coverage(self, rows: Iterable[dict]) -> None:
        self._append(COVERAGE_FILE, ({"run_id": self.run_id, **r} for r in rows))

    def add_samples(self, samples: Iterable[dict]) -> None:
        self._append(SAMPLES_FILE, ({"run_id": self.run_id, **s} for s in samples))

    def write_inventory(self, inventory: dict) -> None:
        self._write_json(INVENTORY_FILE, inventory)

    def read_inventory(self) -> dict:
        p = self.path / INVENTORY_FILE
        return json.loads(p.read_text()) if p.exists() else {}

    def read(self, name: str) -> list[dict]:
        p = self.path / name
        if not p.exists():
            return []
        with open(p, encoding="utf-8") as fh:
            return [json.loads(line) for line in fh if line.strip()]

    def checks(self) -> list[dict]:
        return self.read(CHECKS_FILE)

    def metrics(self) -> list[dict]:
        return self.read(METRICS_FILE)

    def samples(self) -> list[dict]:
        return self.read(SAMPLES_FILE)

    def finalize(self, outcome: str = "", tables: bool = True) -> None:
        """Close the run's metadata (run.json), then write parquet copies of the JSONL tables that have rows.

        run.json comes first, so a run interrupted again meanwhile still says how it ended; pandas is imported only
        for a table to write (its import, with pyarrow's, took 10 to 40 s on a loaded machine: issue #52). Without
        ``tables`` (an interrupted run, which ends at once) no parquet copy is written, and run.json says so: the
        JSONL tables hold every record, and the report reads them when there is no parquet copy."""
        self.close()
        self.meta.finished = utcnow()
        if outcome:
            self.meta.outcome = outcome
        if not tables:
            self.meta.extra["tables"] = "JSONL only: the run ended at once (interrupted), without parquet copies"
        self.write_meta()
        for name in (CHECKS_FILE, METRICS_FILE, SAMPLES_FILE) if tables else ():
            rows = self.read(name)
            if rows:
                import pandas as pd

                final = self.path / name.replace(".jsonl", ".parquet")
                tmp = final.with_name(final.name + ".tmp")      # a reader never sees half a file
                pd.DataFrame(rows).to_parquet(tmp, index=False)
                tmp.replace(final)


def load_table(run_path: str | os.PathLike, name: str):
    """A run's table as a DataFrame, from parquet when present, else JSONL."""
    import pandas as pd

    run_path = Path(run_path)
    pq = run_path / name.replace(".jsonl", ".parquet")
    if pq.exists():
        return pd.read_parquet(pq)
    js = run_path / name
    if js.exists():
        return pd.read_json(js, lines=True, dtype=False)
    return pd.DataFrame()

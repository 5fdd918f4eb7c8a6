"""How long a run will take: earlier runs' check durations (their ``junit.xml``) scaled by this run's pace."""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

HISTORY_RUNS = 10          # earlier run folders looked at for durations


def junit_key(nodeid: str) -> str:
    """A test's key as junit.xml has it: 'suites.test_x::test_y[param]' (classname::name)."""
    base, bracket, params = nodeid.partition("[")
    parts = base.split("::")
    parts[0] = re.sub(r"\.py$", "", parts[0].replace("/", "."))
    return ".".join(parts[:-1]) + "::" + parts[-1] + bracket + params


def junit_durations(path: str | Path) -> dict[str, float]:
    """Seconds per test (setup + call + teardown) from a junit.xml, keyed like :func:`junit_key`."""
    out: dict[str, float] = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return out
    for case in root.iter("testcase"):
        try:
            out[f"{case.get('classname', '')}::{case.get('name', '')}"] = float(case.get("time") or "nan")
        except ValueError:
            continue
    return {k: v for k, v in out.items() if math.isfinite(v) and v >= 0}


def history(report_dir: str | Path, run_id: str, target: str, fleet: str = "") -> tuple[dict[str, float], list[str]]:
    """Durations of checks in the latest earlier runs against the same target (and fleet).

    Returns {key: seconds} (the most recent run that timed a check wins) and the run ids used.
    """
    root = Path(report_dir)
    try:
        folders = sorted((p for p in root.iterdir() if p.is_dir() and p.name != run_id), reverse=True)
    except OSError:
        return {}, []
    durations: dict[str, float] = {}
    used: list[str] = []
    for folder in folders:
        if len(used) >= HISTORY_RUNS:
            break
        junit = folder / "junit.xml"
        if not junit.is_file():
            continue
        try:
            meta = json.loads((folder / "run.json").read_text())
        except (OSError, ValueError):
            continue
        if meta.get("target") != target or (meta.get("fleet") or "") != (fleet or ""):
            continue
        found = junit_durations(junit)
        if not found:
            continue
        used.append(folder.name)
        for key, seconds in found.items():
            durations.setdefault(key, seconds)
    return durations, used


class Estimate:
    """Time left in a run: the checks' earlier durations (scaled by this run's pace), else this run's mean."""

    def __init__(self, keys: list[str], earlier: dict[str, float] | None = None):
        self.keys = list(keys)
        self.earlier = dict(earlier or {})
        self.took: dict[str, float] = {}

    @property
    def total(self) -> int:
        return len(self.keys)

    @property
    def done(self) -> int:
        return len(self.took)

    def finished(self, key: str, seconds: float) -> None:
        self.took[key] = max(0.0, seconds)

    def pace(self) -> float:
        """This run's time over the earlier runs' time, for the checks both timed (1 when none)."""
        both = [k for k in self.took if k in self.earlier]
        before = sum(self.earlier[k] for k in both)
        if not both or before <= 0:
            return 1.0
        return min(5.0, max(0.2, sum(self.took[k] for k in both) / before))

    def remaining(self, running: str | None = None, running_for: float = 0.0) -> float | None:
        """Seconds left (None: nothing to go by yet). The check running now counts what it has left."""
        left = [k for k in self.keys if k not in self.took]
        new = [self.took[k] for k in self.took if k not in self.earlier] or list(self.took.values())
        mean = sum(new) / len(new) if new else (sum(self.earlier.values()) / len(self.earlier)
                                                if self.earlier else None)
        pace = self.pace()
        total = 0.0
        for key in left:
            guess = self.earlier[key] * pace if key in self.earlier else mean
            if guess is None:
                return None
            if key == running:
                guess = max(0.0, guess - running_for)
            total += guess
        return total

    def timed_before(self) -> int:
        return sum(1 for k in self.keys if k in self.earlier)

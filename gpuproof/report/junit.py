"""Reading the junit.xml pytest writes (``--junitxml``): counts, failures, skip reasons."""

from __future__ import annotations

import collections
import dataclasses
import xml.etree.ElementTree as ET
from pathlib import Path

from ..errors import GpuproofError


@dataclasses.dataclass
class TestCase:
    id: str            # classname::name, as pytest shows it
    outcome: str       # passed | failed | error | skipped
    message: str = ""  # first line of the failure/error/skip message
    detail: str = ""   # the text body (traceback), trimmed
    time: float = 0.0


@dataclasses.dataclass
class JUnitResult:
    cases: list[TestCase]

    def _count(self, outcome: str) -> int:
        return sum(1 for c in self.cases if c.outcome == outcome)

    @property
    def total(self) -> int:
        return len(self.cases)

    passed = property(lambda self: self._count("passed"))
    failed = property(lambda self: self._count("failed"))
    errors = property(lambda self: self._count("error"))
    skipped = property(lambda self: self._count("skipped"))

    def problems(self) -> list[TestCase]:
        return [c for c in self.cases if c.outcome in ("failed", "error")]

    def skip_reasons(self) -> list[tuple[str, int]]:
        """Skip reasons with how many tests each skipped, most common first."""
        counter = collections.Counter(c.message or "(no reason given)" for c in self.cases if c.outcome == "skipped")
        return counter.most_common()

    def outcomes(self) -> dict[str, str]:
        return {c.id: c.outcome for c in self.cases}


def _first_line(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _case_id(case: ET.Element) -> str:
    classname, name = case.get("classname", ""), case.get("name", "")
    return f"{classname}::{name}" if classname else name


def read_junit(path: str | Path) -> JUnitResult:
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        raise GpuproofError(f"{path}: not valid JUnit XML ({exc})") from exc
    cases = []
    for case in root.iter("testcase"):
        outcome, message, detail = "passed", "", ""
        for tag, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = case.find(tag)
            if el is not None:
                outcome = name
                message = _first_line(el.get("message") or el.text)
                detail = (el.text or "").strip()[-4000:]
                break
        try:
            elapsed = float(case.get("time") or 0)
        except ValueError:
            elapsed = 0.0
        cases.append(TestCase(id=_case_id(case), outcome=outcome, message=message, detail=detail, time=elapsed))
    return JUnitResult(cases=cases)

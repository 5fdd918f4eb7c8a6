"""Reading the junit.xml pytest writes (``--junitxml``): counts, failures, skip reasons; and junit-grouped.xml.

pytest writes one case per test and node: 32,040 cases (7 MB) for a 1,000-node run, about 34 per node. That file
stays as pytest wrote it (gpuproof conformance's evidence links point into it, and earlier runs' durations are read
from it). Beside it, :func:`group_by_node` writes junit-grouped.xml for CI systems' test views: each test's cases on
the nodes where it passed or skipped are one case, a failed case stays by its node: about as many cases as the suites
have tests, whatever the fleet's size. CI systems bound a JUnit file: Buildkite's Test Analytics takes at most 5,000
test results per file (buildkite/docs#1648); GitLab parses at most 30 MB and 500,000 cases per file
(docs.gitlab.com/ci/testing/unit_test_reports) and, since 17.6, refuses one "exceeding permitted complexity" past
250,000 XML objects (gitlab-org/gitlab#507482). pytest's file of a 1,000-node run has 32,040 cases and 152,294
elements, attributes and texts, growing with the nodes (past 250,000 at about 1,600 nodes); the grouped file 73
cases and 514."""

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


GROUPED_FILE = "junit-grouped.xml"
GROUP_PARAM = "nodes"          # a grouped case's parameter: test_x[nodes]


def _node_param(name: str, nodes: set[str]) -> tuple[str, str]:
    """``test_x[h100-3]`` -> (``test_x``, ``h100-3``) when the parameter is one of ``nodes``; else (name, "")."""
    if name.endswith("]") and "[" in name:
        bare, _, param = name[:-1].partition("[")
        if param in nodes:
            return bare, param
    return name, ""


def group_by_node(src: str | Path, dst: str | Path, nodes) -> dict[str, int]:
    """Write ``src`` (pytest's junit.xml) to ``dst`` with each test's per-node cases that passed or skipped as one case,
    ``test_x[nodes]``, where the first of them stood; its time their sum, its outcome passed when any passed (else
    skipped), the nodes and the skip reasons with their counts in its system-out. A case that failed or erred stays
    as pytest wrote it, named by its node. Cases of no node are copied. Returns the counts of both files' cases.

    The case names keep the test's name (``classname::test_x``): what gpuproof conformance's anchors look for."""
    nodes = set(nodes)
    try:
        tree = ET.parse(src)
    except ET.ParseError as exc:
        raise GpuproofError(f"{src}: not valid JUnit XML ({exc})") from exc
    root = tree.getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    before = after = 0
    for suite in suites:
        cases = [c for c in list(suite) if c.tag == "testcase"]
        groups: dict[tuple[str, str], dict] = {}
        for case in cases:
            before += 1
            bare, node = _node_param(case.get("name", ""), nodes)
            if not node or case.find("failure") is not None or case.find("error") is not None:
                continue
            key = (case.get("classname", ""), bare)
            group = groups.get(key)
            if group is None:
                group = groups[key] = {"first": case, "passed": [], "skipped": collections.Counter(),
                                       "skipped_nodes": [], "time": 0.0}
            skip = case.find("skipped")
            if skip is None:
                group["passed"].append(node)
            else:
                group["skipped"][_first_line(skip.get("message") or skip.text) or "(no reason given)"] += 1
                group["skipped_nodes"].append(node)
            try:
                group["time"] += float(case.get("time") or 0)
            except ValueError:
                pass
            if case is not group["first"]:
                suite.remove(case)
        for (_, bare), g in groups.items():
            case = g["first"]
            for child in list(case):
                case.remove(child)
            case.set("name", f"{bare}[{GROUP_PARAM}]")
            case.set("time", f"{g['time']:.3f}")
            lines = []
            if g["passed"]:
                lines.append(f"passed on {len(g['passed'])} node(s): {', '.join(g['passed'])}")
            if g["skipped"]:
                lines.append(f"skipped on {len(g['skipped_nodes'])} node(s): {', '.join(g['skipped_nodes'])}")
                reasons = "; ".join(f"{reason} ({n} nodes)" for reason, n in g["skipped"].most_common())
                lines.append(f"skip reasons: {reasons}")
                if not g["passed"]:
                    skipped = ET.SubElement(case, "skipped", type="pytest.skip",
                                            message=f"skipped on {len(g['skipped_nodes'])} node(s): {reasons}"[:1000])
                    skipped.text = lines[-1]
            ET.SubElement(case, "system-out").text = "\n".join(lines) + "\n"
        counts = collections.Counter()
        for case in suite.iter("testcase"):
            counts["tests"] += 1
            for tag, key in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
                if case.find(tag) is not None:
                    counts[key] += 1
        for key in ("tests", "failures", "errors", "skipped"):
            suite.set(key, str(counts[key]))
        after += counts["tests"]
    tmp = Path(str(dst) + ".tmp")
    tree.write(tmp, encoding="utf-8", xml_declaration=True)
    tmp.replace(dst)
    return {"cases": before, "grouped_cases": after}


def by_test(cases: list[TestCase]) -> list[dict]:
    """The cases of each test, its parameters (nodes) merged: test, cases, passed, failed, error, skipped, time;
    in the order the tests ran."""
    tests: dict[str, dict] = {}
    for c in cases:
        key = c.id.split("[", 1)[0]
        row = tests.get(key)
        if row is None:
            row = tests[key] = {"test": key, "cases": 0, "passed": 0, "failed": 0, "error": 0, "skipped": 0,
                                "time": 0.0}
        row["cases"] += 1
        row[c.outcome] = row.get(c.outcome, 0) + 1
        row["time"] += c.time
    return list(tests.values())

"""Kubernetes AI Conformance evidence from a finished run: ``PRODUCT.yaml`` and ``PRODUCT.md`` for a checklist.

Long: the checklist's reading, the mapping of its requirements to gpuproof's checks, the judging, the two
renderings and the rules a submission must pass belong together; split, the mapping and its readers would drift.

Data, not retyped here: each checklist is upstream's template file as published (``checklists/``, its source in
``checklists/SOURCES.md``), and which of gpuproof's tests give evidence for a requirement is declared where the
test is, by a marker read from the suites' source (:func:`suite_markers`; nothing is imported)::

    @pytest.mark.conformance("secure_accelerator_access", guard=True)       # the upstream test's name
    class TestSecureAcceleratorAccess:
        @pytest.mark.conformance("secure_accelerator_access", checks=(CHECKS["PositiveAccessTest"],))
        def test_PositiveAccessTest(...): ...

    pytestmark = pytest.mark.conformance("gpu_sharing", name="MIG", checks=("*",))   # a whole suite module

How a requirement gets its status (:func:`judge`):

- :func:`checklists` gives each checklist version's requirements (section, id, level, description as the CNCF
  template words it) and, per requirement, the gpuproof evidence that can establish it: its *parts*, one per
  marker (markers of one requirement with the same ``name`` are one part). A part names JUnit anchors (where its
  marker is: ``TestX/Sub`` for a method ``test_Sub`` of a class named after the upstream test, ``TestX`` for the
  class, ``suites.test_x::test_y`` for a function, ``suites.test_x`` for a module) and the suite's feature
  (``FEATURE``) with check-name patterns (``checks``: records of ``checks.jsonl``; ``require``: those that must
  have passed). A part *passed* when something it names passed and nothing failed; *failed* when a check record
  failed or a JUnit case failed or errored; *skipped* when it ran only as skips or warnings; *absent* when the run
  holds nothing it names.
- A requirement whose parts are all needed (``need="all"``) is Implemented when every part passed; one that any
  strategy satisfies (``need="any"``: :data:`ANY_PART`, gpu_sharing) when one part passed. Any failed part makes it
  Not Implemented, whatever else passed, and so does a failed JUnit case under the requirement's ``guard`` anchors
  (markers with ``guard=True``: the upstream test's name) that no part names. Anything else (skipped only,
  absent, only some parts) leaves the status empty, with notes that say what ran and what did not: gpuproof never
  writes Implemented for what the run did not show.
- A requirement without parts is not tested by gpuproof: its status is left empty with the reason
  (:data:`UNTESTED`), for the platform's own evidence.

:func:`check_product` applies the rules of the CNCF repository's CI (scripts/validate.go of
cncf/k8s-ai-conformance) that can be applied offline, plus the evidence-anchor and PRODUCT.md rules; it
returns one line per problem. It does not fetch URLs and does not look up the vendor among CNCF members.

Report layer: imports the base (errors, results) and the report modules only.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import fnmatch
import functools
import os
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from ..errors import GpuproofError
from ..results import CHECKS_FILE, META_FILE
from .data import JUNIT_FILE, Run, load_run

PRODUCT_YAML = "PRODUCT.yaml"
PRODUCT_MD = "PRODUCT.md"
DERIVED_LOG = "checks.log"      # written when the run folder holds no log of its own
# a run's own log, when it has one (first found wins; any other top-level *.log after these)
LOG_NAMES = ("run.log", "gpuproof.log", "e2e.log", "pytest.log")

STATUSES = ("Implemented", "Not Implemented", "Partially Implemented", "N/A")
SECTIONS = {      # key in spec -> heading in PRODUCT.md, in the template's order
    "accelerators": "Accelerators",
    "networking": "Networking",
    "schedulingOrchestration": "Scheduling & Orchestration",
    "observability": "Observability",
    "security": "Security",
    "operator": "Operator",
}
# metadata keys in the template's order -> placeholder; repoUrl is optional for the CNCF CI
METADATA = {
    "kubernetesVersion": "",
    "platformName": "[Platform Name]",
    "platformVersion": "[Platform Version]",
    "vendorName": "[Vendor Name]",
    "websiteUrl": "[Website URL]",
    "repoUrl": "",
    "documentationUrl": "[Documentation URL]",
    "productLogoUrl": "[Product Logo URL (SVG, EPS or AI)]",
    "description": "[Description]",
    "contactEmailAddress": "[Contact Email Address]",
    "k8sConformanceUrl": "[k8s-conformance submission URL: https://github.com/cncf/k8s-conformance/tree/master/"
                         "v<version>/<product>]",
}
OPTIONAL_METADATA = {"repoUrl"}
K8S_CONFORMANCE_URL = re.compile(r"^https://github\.com/cncf/k8s-conformance/tree/(master|main)/v\d+\.\d+/[^/]+/?$")


@dataclasses.dataclass(frozen=True)
class Part:
    """One piece of evidence gpuproof can give for a requirement (an upstream subtest, or one sharing strategy)."""

    name: str                     # how notes name it: the upstream subtest, or what it shows
    junit: tuple[str, ...] = ()   # JUnit anchors: "TestX/Sub" (upstream name), "suites.test_x" (a suite module)
    feature: str = ""             # the gpuproof feature whose check records judge it ("" = JUnit only)
    checks: tuple[str, ...] = ()  # fnmatch patterns of that feature's check names ("*" = all of them)
    require: tuple[str, ...] = ()  # check patterns that must each have passed for the part to count as passed


@dataclasses.dataclass(frozen=True)
class Requirement:
    section: str
    id: str
    level: str                    # MUST | SHOULD
    description: str
    parts: tuple[Part, ...] = ()  # () = gpuproof does not test it
    need: str = "all"             # all parts must pass, or "any" one (at least one strategy)
    untested: str = ""            # why gpuproof does not test it
    guard: tuple[str, ...] = ()   # JUnit anchors: a failed case under one, in no part, fails the requirement too


# ---------------------------------------------------------------------------- the checklists and the mapping

CHECKLIST_DIR = Path(__file__).with_name("checklists")     # upstream's templates, as published (SOURCES.md there)
CHECKLIST_NAME = re.compile(r"^AIConformance-(\d+\.\d+)\.yaml$")
MARKER = "conformance"
MARKER_HELP = ("conformance(requirement, *, checks=(), require=(), name=None, guard=False): the test is evidence for "
               "a Kubernetes AI Conformance requirement (gpuproof conformance reads these markers from the suites' "
               "source: gpuproof/report/conformance.py)")

# gpuproof's own word on the requirements, beside the markers: where one strategy is enough, and why gpuproof
# tests a requirement not (a requirement no test is marked for needs a reason here)
ANY_PART = {"gpu_sharing"}          # "at least one GPU sharing strategy": one part passing is enough
UNTESTED = {
    "virtualized_accelerator": "gpuproof judges the names of vGPU devices a DRA driver publishes, but does not test "
                               "that vGPU profiles are exposed and managed like fractional GPUs",
    "ai_inference": "gpuproof does not install or test a Gateway API implementation (its inference benchmark calls a "
                    "server pod directly)",
    "advanced_inference_ingress": "gpuproof does not test it; upstream leaves it to the Gateway API Inference "
                                  "Extension's own conformance suite",
    "high_performance_networking": "gpuproof's all-reduce benchmark measures bandwidth between pods, but gpuproof "
                                   "does not test how network devices are exposed (DRA, several interfaces per pod)",
    "disaggregated_inference": "gpuproof does not deploy a disaggregated inference solution",
    "cluster_autoscaling": "gpuproof never changes a cluster's size; upstream's TestAcceleratorClusterAutoscaling "
                           "needs a node pool that scales",
    "pod_autoscaling": "gpuproof does not test the HorizontalPodAutoscaler",
    "workload_sandboxing": "gpuproof does not test sandboxed runtimes (gVisor, Kata)",
}
# 1.37 has no DRA requirement (dra_support left the checklist: Kubernetes conformance covers it), so the `dra`
# feature counts only where it shows a requirement of 1.37: sharing a GPU through DRA (gpu_sharing).


def checklist_versions(folder: Path = CHECKLIST_DIR) -> list[str]:
    """The checklist versions gpuproof has upstream's template of ('1.37', ...)."""
    found = [m.group(1) for p in folder.iterdir() if (m := CHECKLIST_NAME.match(p.name))]
    return sorted(found, key=lambda v: tuple(int(x) for x in v.split(".")))


def read_checklist(path: Path) -> tuple[tuple[str, str, str, str], ...]:
    """(section, id, level, description) of every requirement of an upstream checklist file, in its order."""
    import yaml

    doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    out = []
    for section, items in ((doc or {}).get("spec") or {}).items():
        if section not in SECTIONS:
            raise GpuproofError(f"{path}: section {section!r} is not one gpuproof knows ({', '.join(SECTIONS)})")
        for item in items or []:
            out.append((section, str(item["id"]), str(item["level"]), str(item["description"])))
    return tuple(out)


class _NotLiteral(Exception):
    pass


def _literal(node: ast.AST, consts: dict) -> Any:
    """A marker argument's value: literals, and the module's constants by name or subscript (CHECKS["x"])."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_literal(e, consts) for e in node.elts)
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {_literal(k, consts): _literal(v, consts) for k, v in zip(node.keys, node.values)}
    if isinstance(node, ast.Name) and node.id in consts:
        return consts[node.id]
    if isinstance(node, ast.Subscript):
        try:
            return _literal(node.value, consts)[_literal(node.slice, consts)]
        except (KeyError, IndexError, TypeError):
            raise _NotLiteral from None
    raise _NotLiteral


def _is_marker(node: ast.AST) -> bool:
    """A call of ``pytest.mark.conformance`` (or ``mark.conformance``)."""
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == MARKER
            and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "mark")


@dataclasses.dataclass(frozen=True)
class Marked:
    """One ``conformance`` marker in a suite: where it is and what it says."""

    requirement: str
    anchor: str              # the JUnit anchor of the test, class or module it marks
    name: str                # the part's name in notes
    feature: str
    checks: tuple[str, ...]
    require: tuple[str, ...]
    guard: bool
    where: str               # file:line, for errors


def suite_markers(path: Path) -> list[Marked]:
    """The ``conformance`` markers of one suite module, read from its source (nothing is imported): on the module
    (``pytestmark``, anchor ``suites.<module>``), a test function (``suites.<module>::<test>``), a class
    (``<Class>``) or a test method (``<Class>/<test without test_>``, as an upstream subtest is named)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    module = f"suites.{path.stem}"
    consts: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            with contextlib.suppress(_NotLiteral):
                consts[node.targets[0].id] = _literal(node.value, consts)
    feature = str(consts.get("FEATURE", ""))
    found: list[Marked] = []

    def add(call: ast.Call, anchor: str, default_name: str) -> None:
        where = f"{path.name}:{call.lineno}"
        try:
            args = [_literal(a, consts) for a in call.args]
            kwargs = {k.arg: _literal(k.value, consts) for k in call.keywords}
        except _NotLiteral:
            raise GpuproofError(f"{where}: a conformance marker takes literals and the module's constants "
                                "only (gpuproof conformance reads it without importing the suite)") from None
        if len(args) != 1 or not isinstance(args[0], str) or set(kwargs) - {"checks", "require", "name", "guard",
                                                                             "feature"}:
            raise GpuproofError(f"{where}: {MARKER_HELP.split(':')[0]}")
        checks, require = tuple(kwargs.get("checks", ())), tuple(kwargs.get("require", ()))
        found.append(Marked(args[0], anchor, str(kwargs.get("name") or default_name),
                            str(kwargs.get("feature") or feature) if checks else "", checks, require,
                            bool(kwargs.get("guard", False)), where))

    def markers_of(value: ast.AST) -> list[ast.Call]:
        items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
        return [c for c in items if _is_marker(c)]

    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            for call in markers_of(node.value):
                add(call, module, path.stem.removeprefix("test_"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for call in markers_of(ast.List(elts=node.decorator_list)):
                add(call, f"{module}::{node.name}", node.name)
        elif isinstance(node, ast.ClassDef):
            for call in markers_of(ast.List(elts=node.decorator_list)):
                add(call, node.name, node.name)
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    sub = item.name.removeprefix("test_")
                    for call in markers_of(ast.List(elts=item.decorator_list)):
                        add(call, f"{node.name}/{sub}", sub)
    return found


def _suites_folder() -> Path:
    from .. import package_folder

    return package_folder("suites")


def build_requirements(rows, markers: list[Marked]) -> tuple[Requirement, ...]:
    """The checklist's requirements with the evidence the markers name: a requirement's parts in the order of the
    suites' files and of their source (markers of one requirement with the same name are one part: their anchors
    and checks together), its guards the anchors marked ``guard=True``."""
    parts: dict[str, dict[str, Part]] = {}
    guards: dict[str, list[str]] = {}
    for m in markers:
        if m.guard:
            guards.setdefault(m.requirement, []).append(m.anchor)
            continue
        if m.checks and not m.feature:
            raise GpuproofError(f"{m.where}: the marker names checks, but its suite has no FEATURE")
        old = parts.setdefault(m.requirement, {}).get(m.name)
        if old is None:
            parts[m.requirement][m.name] = Part(m.name, (m.anchor,), m.feature, m.checks, m.require)
        elif old.feature != m.feature:
            raise GpuproofError(f"{m.where}: part {m.name!r} of {m.requirement} is marked in two features")
        else:
            parts[m.requirement][m.name] = Part(m.name, (*old.junit, m.anchor), m.feature, (*old.checks, *m.checks),
                                                (*old.require, *m.require))
    out = []
    for section, rid, level, description in rows:
        mine = tuple(parts.get(rid, {}).values())
        untested = "" if mine else UNTESTED.get(rid, "gpuproof has no check marked as evidence for it")
        out.append(Requirement(section, rid, level, description, mine, "any" if rid in ANY_PART else "all",
                               untested, tuple(dict.fromkeys(guards.get(rid, ())))))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def checklists(folder: Path = CHECKLIST_DIR, suites: Path | None = None) -> dict[str, tuple[Requirement, ...]]:
    """version -> requirements, for each checklist upstream published that gpuproof has (``checklists/``), with
    the evidence the suites' ``conformance`` markers name. A marker naming a requirement no checklist has is an
    error (a typo would leave its evidence unread)."""
    suites = suites or _suites_folder()
    markers = [m for path in sorted(suites.glob("test_*.py")) for m in suite_markers(path)]
    rows = {v: read_checklist(folder / f"AIConformance-{v}.yaml") for v in checklist_versions(folder)}
    known = {r[1] for reqs in rows.values() for r in reqs}
    for m in markers:
        if m.requirement not in known:
            raise GpuproofError(f"{m.where}: conformance marker names {m.requirement!r}, a requirement of no "
                                f"checklist gpuproof has ({', '.join(sorted(rows))})")
    return {v: build_requirements(reqs, markers) for v, reqs in rows.items()}


def __getattr__(name: str):
    if name == "CHECKLISTS":            # read on first use: the checklist files and the suites' markers
        return checklists()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def checklist(version: str) -> tuple[str, tuple[Requirement, ...]]:
    """(canonical version, requirements) of a checklist version given as 1.37 or v1.37."""
    v = str(version).strip().removeprefix("v")
    known = checklists()
    if v not in known:
        raise GpuproofError(f"--version {version}: gpuproof has no Kubernetes AI Conformance checklist of that "
                            f"version (it writes evidence for {', '.join(sorted(known))})")
    return v, known[v]


# ---------------------------------------------------------------------------- JUnit anchors


def case_keys(case_id: str) -> set[str]:
    """The names a JUnit case answers to, from its ``classname::name`` id: its name (with and without pytest's
    ``[params]``), its classname, ``classname::name``, and ``Class/Sub`` for a case ``test_Sub`` of a class
    ``...Class`` (pytest's way of writing an upstream ``TestX/Sub``)."""
    classname, sep, name = case_id.partition("::")
    if not sep:
        classname, name = "", classname
    bare = name.split("[", 1)[0]
    keys = {name, bare}
    if classname:
        last = classname.rsplit(".", 1)[-1]
        keys |= {classname, f"{classname}::{bare}", f"{classname}::{name}", f"{last}/{bare}",
                 f"{last}/{bare.removeprefix('test_')}"}
    return keys


def anchor_matches(anchor: str, case_id: str) -> bool:
    """Whether ``#anchor`` finds this case: a key equal to it, or below it (``TestX`` finds ``TestX/Sub``)."""
    return any(k == anchor or k.startswith(anchor + "/") for k in case_keys(case_id))


def junit_case_ids(path: Path) -> list[str]:
    """The ``classname::name`` ids of a JUnit file's cases (raises GpuproofError when it is not JUnit XML)."""
    try:
        root = ET.parse(path).getroot()
    except (ET.ParseError, OSError) as exc:
        raise GpuproofError(f"{path}: not readable JUnit XML ({exc})") from exc
    out = []
    for case in root.iter("testcase"):
        classname, name = case.get("classname", ""), case.get("name", "")
        out.append(f"{classname}::{name}" if classname else name)
    return out


# ---------------------------------------------------------------------------- judging a run


@dataclasses.dataclass
class PartResult:
    part: Part
    verdict: str                                           # pass | fail | skip | absent
    checks_passed: int = 0                                 # check records that passed
    tests_passed: int = 0                                  # JUnit cases that passed
    failures: list[str] = dataclasses.field(default_factory=list)
    reasons: list[str] = dataclasses.field(default_factory=list)   # why it skipped / what it lacks
    warnings: list[str] = dataclasses.field(default_factory=list)  # checks that passed with a warning
    anchors: list[str] = dataclasses.field(default_factory=list)   # JUnit anchors with cases in this run
    targets: set = dataclasses.field(default_factory=set)

    def summary(self) -> str:
        if self.verdict == "pass":
            what = []
            if self.checks_passed:
                what.append(f"{_n(self.checks_passed, 'check')} passed on {_n(len(self.targets), 'target')}")
            if self.tests_passed:
                what.append(f"{_n(self.tests_passed, 'test')} passed")
            warned = f"; with {_n(len(self.warnings), 'warning')}: {'; '.join(self.warnings[:2])}" \
                if self.warnings else ""
            return f"{self.part.name} passed ({', '.join(what)}{warned})"
        if self.verdict == "fail":
            return f"{self.part.name} FAILED: " + "; ".join(self.failures[:3]) + (
                f"; and {len(self.failures) - 3} more" if len(self.failures) > 3 else "")
        if self.verdict == "skip":
            return f"{self.part.name} did not run (" + "; ".join(self.reasons[:2] or ["skipped"]) + ")"
        return f"{self.part.name}: not in this run"


@dataclasses.dataclass
class Judgement:
    requirement: Requirement
    state: str              # implemented | failed | incomplete | skipped | absent | untested
    parts: list[PartResult]

    @property
    def status(self) -> str:
        return {"implemented": "Implemented", "failed": "Not Implemented"}.get(self.state, "")

    @property
    def tested(self) -> bool:
        return self.state in ("implemented", "failed", "incomplete")


def _n(count: int, word: str) -> str:
    return f"{count} {word}" + ("" if count == 1 else "s")


def _one_line(text: str, limit: int = 240) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def judge_part(part: Part, records: list[dict], cases) -> PartResult:
    recs = [r for r in records if part.feature and part.checks and r.get("feature") == part.feature
            and any(fnmatch.fnmatchcase(str(r.get("check", "")), p) for p in part.checks)]
    hits = [c for c in cases if any(anchor_matches(a, c.id) for a in part.junit)]
    res = PartResult(part, "absent")
    res.anchors = [a for a in part.junit if any(anchor_matches(a, c.id) for c in hits)]
    for r in recs:
        verdict, target = r.get("verdict"), str(r.get("target", ""))
        if verdict == "pass":
            res.checks_passed += 1
            res.targets.add(target)
        elif verdict == "fail":
            res.failures.append(_one_line(r.get("message") or f"{target}: {r.get('check')}: expected "
                                          f"{r.get('expected')}, actual {r.get('actual')}"))
        elif verdict == "skip" and r.get("message"):
            res.reasons.append(_one_line(r["message"]))
        elif verdict == "warn":
            res.warnings.append(_one_line(r.get("message") or f"{target}: {r.get('check')}"))
    for c in hits:
        if c.outcome == "passed":
            res.tests_passed += 1
        elif c.outcome in ("failed", "error"):
            res.failures.append(_one_line(f"{c.id}: {c.message or c.outcome}"))
        elif c.message:
            res.reasons.append(_one_line(c.message))
    res.reasons = list(dict.fromkeys(res.reasons + [f"warning: {w}" for w in res.warnings]))
    res.warnings = list(dict.fromkeys(res.warnings))
    missing = [p for p in part.require
               if not any(r.get("verdict") == "pass" and fnmatch.fnmatchcase(str(r.get("check", "")), p) for r in recs)]
    if res.failures:
        res.verdict = "fail"
    elif (res.checks_passed or res.tests_passed) and not missing:
        res.verdict = "pass"
    elif recs or hits:
        res.verdict = "skip"
        if (res.checks_passed or res.tests_passed) and missing:
            res.reasons.insert(0, f"{', '.join(missing)} did not pass")
    return res


def _guarded(req: Requirement, cases) -> list[PartResult]:
    """A failed part for the failed JUnit cases under the requirement's guard anchors that no part names."""
    others = [c for c in cases if c.outcome in ("failed", "error")
              and any(anchor_matches(a, c.id) for a in req.guard)
              and not any(anchor_matches(a, c.id) for p in req.parts for a in p.junit)]
    if not others:
        return []
    part = Part(f"other tests of {', '.join(req.guard)}", junit=req.guard)
    return [PartResult(part, "fail", failures=[_one_line(f"{c.id}: {c.message or c.outcome}") for c in others],
                       anchors=list(req.guard))]


def judge(run: Run, requirements: tuple[Requirement, ...]) -> list[Judgement]:
    records = run.checks.to_dict("records") if not run.checks.empty else []
    cases = run.junit.cases if run.junit is not None else []
    out = []
    for req in requirements:
        if not req.parts:
            out.append(Judgement(req, "untested", []))
            continue
        parts = [judge_part(p, records, cases) for p in req.parts]
        if req.guard:
            parts += _guarded(req, cases)
        passed = [p for p in parts if p.verdict == "pass"]
        if any(p.verdict == "fail" for p in parts):
            state = "failed"
        elif passed and (req.need == "any" or len(passed) == len(parts)):
            state = "implemented"
        elif passed:
            state = "incomplete"
        elif any(p.verdict == "skip" for p in parts):
            state = "skipped"
        else:
            state = "absent"
        out.append(Judgement(req, state, parts))
    return out


# ---------------------------------------------------------------------------- PRODUCT.yaml


@dataclasses.dataclass
class RunFacts:
    """What the notes say about the run the evidence comes from."""

    run_id: str
    target: str
    kubernetes_version: str
    cluster: str

    @property
    def simulated(self) -> bool:
        return self.target in ("embedded", "local")

    def phrase(self) -> str:
        where = "gpuproof's embedded (simulated) cluster" if self.simulated else (self.cluster or self.target or
                                                                                  "an unnamed cluster")
        k8s = f", Kubernetes {self.kubernetes_version}" if self.kubernetes_version else ""
        return f"gpuproof run {self.run_id} ({where}{k8s})"


def _notes(j: Judgement, facts: RunFacts) -> str:
    req = j.requirement
    parts = "; ".join(p.summary() for p in j.parts)
    own = "gpuproof's own checks (not the upstream Go suite), their JUnit cases named after the upstream tests"
    named = any("/" in a or a.startswith("Test") for p in j.parts for a in p.part.junit)
    by = f" by {own}" if named else ""
    if j.state == "untested":
        return (f"Not tested by gpuproof: {req.untested}. Add the platform's own evidence (documentation URLs or "
                "test output) and set the status.")
    if j.state == "implemented":
        return f"Tested in {facts.phrase()}{by}: {parts}."
    if j.state == "failed":
        return (f"FAILED in {facts.phrase()}{by}: {parts}. Not Implemented until the failure is fixed and a new "
                "run passes.")
    need = "every part" if req.need == "all" else "one part"
    if j.state == "incomplete":
        return (f"Not established by {facts.phrase()}, which needs {need} to pass: {parts}. Complete it with the "
                "platform's own evidence for what did not run, then set the status.")
    return (f"Not established by {facts.phrase()}: {parts}. Run gpuproof's checks for it where they apply, or add "
            "the platform's own evidence, then set the status.")


def metadata_for(run: Run, version: str, overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The template's metadata: placeholders in [brackets] (which the CNCF CI refuses), what the run recorded
    named in them, and the overrides given."""
    meta = dict(METADATA)
    meta["kubernetesVersion"] = f"v{version}"
    if run.cluster:
        meta["platformName"] = f"[Platform Name: the run's cluster was {run.cluster}]"
    if run.kubernetes_version:
        meta["platformVersion"] = f"[Platform Version: the cluster reported Kubernetes {run.kubernetes_version}]"
    for key, value in (overrides or {}).items():
        if key not in METADATA:
            raise GpuproofError(f"metadata {key!r}: not a field of the checklist's metadata (one of "
                                f"{', '.join(METADATA)})")
        meta[key] = str(value)
    return meta


def build_product(run: Run, version: str, prefix: str, log_name: str,
                  metadata: dict[str, str] | None = None) -> tuple[dict, list[Judgement]]:
    """The PRODUCT.yaml document (a dict in the template's order) and the judgements behind it. Evidence links
    are ``file://<prefix>/junit.xml#<anchor>`` and ``file://<prefix>/<log_name>``."""
    v, requirements = checklist(version)
    facts = RunFacts(run.run_id, str(run.meta.get("target", "")), run.kubernetes_version, run.cluster)
    judgements = judge(run, requirements)
    spec: dict[str, list[dict]] = {s: [] for s in SECTIONS}
    base = f"file://{prefix}/" if prefix else "file://"
    for j in judgements:
        evidence = []
        if j.tested:
            evidence = [f"{base}{JUNIT_FILE}#{a}" for p in j.parts if p.verdict in ("pass", "fail") for a in p.anchors]
            evidence.append(f"{base}{log_name}")
        spec[j.requirement.section].append({
            "id": j.requirement.id, "description": j.requirement.description, "level": j.requirement.level,
            "status": j.status, "evidence": list(dict.fromkeys(evidence)), "notes": _notes(j, facts)})
    return {"metadata": metadata_for(run, v, metadata), "spec": spec}, judgements


def render_yaml(doc: dict, header: str = "") -> str:
    import yaml

    body = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, default_flow_style=False, width=10_000)
    lines = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    return lines + ("\n" if lines else "") + body


def _header(run: Run, version: str, judgements: list[Judgement]) -> str:
    facts = RunFacts(run.run_id, str(run.meta.get("target", "")), run.kubernetes_version, run.cluster)
    lines = [f"Kubernetes AI Conformance checklist v{version}, filled in by `gpuproof conformance` from",
             f"{facts.phrase()}.",
             "A requirement gpuproof tested has its status from the run, with the run's JUnit cases and log as",
             "evidence. An empty status means this run did not establish it: its notes say why. Add the platform's",
             "own evidence there (documentation URLs or test output), set the status, fill in the metadata in",
             "[brackets], then rewrite PRODUCT.md: gpuproof conformance --markdown <this folder>."]
    if facts.simulated:
        lines.append("This run was against gpuproof's embedded, simulated cluster: evidence for trying the pipeline,"
                     " not for a submission.")
    if run.kubernetes_version and not re.match(rf"^v?{re.escape(version)}(\.|$|[-+])", run.kubernetes_version):
        lines.append(f"The run's cluster reported Kubernetes {run.kubernetes_version}, not {version}: a "
                     f"v{version} submission needs a run against a {version} cluster.")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- PRODUCT.md

_ICON = {"Implemented": "✅", "Not Implemented": "❌", "Partially Implemented": "🟠", "N/A": "➖", "": "⬜"}


def _title(rid: str) -> str:
    acronyms = {"ai": "AI", "gpu": "GPU", "dra": "DRA", "api": "API", "crd": "CRD"}
    return " ".join(acronyms.get(w, w.capitalize()) for w in rid.split("_"))


def _cell(text: Any) -> str:
    return " ".join(str(text or "").split()).replace("|", "\\|")


def _link(item: str) -> str:
    if item.startswith(("http://", "https://")):
        return f"[{item}]({item})"
    return f"`{item}`"


def render_markdown(doc: dict) -> str:
    """PRODUCT.md from the PRODUCT.yaml document: the platform, a summary by status, every requirement at a
    glance, then each with its evidence and notes. A pure function of the document (the rules compare)."""
    meta = doc.get("metadata") or {}
    spec = doc.get("spec") or {}
    version = str(meta.get("kubernetesVersion", ""))
    name = str(meta.get("platformName") or "Platform")
    out = [f"# Kubernetes AI Conformance {version}: {name}", "", "## Platform", "", "| | |", "|:--|:--|"]
    for key, label in (("vendorName", "Vendor"), ("platformName", "Platform"), ("platformVersion", "Platform version"),
                       ("kubernetesVersion", "Kubernetes version"), ("websiteUrl", "Website"),
                       ("documentationUrl", "Documentation"), ("repoUrl", "Repository"),
                       ("contactEmailAddress", "Contact"), ("k8sConformanceUrl", "Kubernetes conformance")):
        if meta.get(key):
            out.append(f"| **{label}** | {_cell(meta[key])} |")
    if meta.get("description"):
        out += ["", f"> {_cell(meta['description'])}"]
    reqs = [(section, r) for section in SECTIONS for r in (spec.get(section) or [])]
    counts: dict[str, int] = {}
    for _, r in reqs:
        counts[str(r.get("status") or "")] = counts.get(str(r.get("status") or ""), 0) + 1
    out += ["", "## Summary", "", "| Status | Requirements |", "|:--|:--:|"]
    for status in (*STATUSES, ""):
        if counts.get(status):
            out.append(f"| {_ICON.get(status, '')} {status or 'Not filled in'} | {counts[status]} |")
    out += [f"| **Total** | **{len(reqs)}** |", "", "## At a glance", "",
            "| Section | Requirement | Level | Status |", "|:--|:--|:--:|:--|"]
    for section, r in reqs:
        status = str(r.get("status") or "")
        out.append(f"| {SECTIONS[section]} | {_title(str(r.get('id')))} | {r.get('level', '')} | "
                   f"{_ICON.get(status, '')} {status or 'not filled in'} |")
    out += ["", "## Requirements"]
    for section in SECTIONS:
        items = spec.get(section) or []
        if not items:
            continue
        out += ["", f"### {SECTIONS[section]}"]
        for r in items:
            status = str(r.get("status") or "")
            out += ["", f"#### {_ICON.get(status, '')} {_title(str(r.get('id')))} (`{r.get('id')}`)", "",
                    f"**Level:** {r.get('level', '')} | **Status:** {status or 'not filled in'}", "",
                    f"> {_cell(r.get('description'))}"]
            evidence = [e for e in (r.get("evidence") or []) if e]
            if evidence:
                out += ["", "**Evidence:**", ""] + [f"- {_link(str(e))}" for e in evidence]
            if r.get("notes"):
                out += ["", f"**Notes:** {_cell(r['notes'])}"]
    out += ["", "---", "", "*Generated from PRODUCT.yaml by gpuproof conformance.*", ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- the rules


def _load_yaml(path: Path) -> tuple[Any, str]:
    import yaml

    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")), ""
    except OSError as exc:
        return None, f"{path.name}: cannot be read ({exc.strerror or exc})"
    except yaml.YAMLError as exc:
        return None, f"{path.name}: not valid YAML ({' '.join(str(exc).split())})"


def _evidence_file(link: str, product_dir: Path, root: Path | None) -> tuple[Path | None, list[Path]]:
    """Where a local evidence link points: ``file://`` stripped, ``#anchor`` cut. A relative path is looked up
    from ``root`` when given, else from the product's folder and each folder above it (a submission's links are
    relative to the repository root, e.g. file://v1.37/acme/junit.xml)."""
    path = link.removeprefix("file://").split("#", 1)[0]
    p = Path(path)
    if p.is_absolute():
        tried = [p]
    elif root is not None:
        tried = [root / p]
    else:
        tried = [d / p for d in (product_dir, *product_dir.parents)]
    return next((t for t in tried if t.is_file()), None), tried


def check_product(path: str | os.PathLike, root: str | os.PathLike | None = None) -> list[str]:
    """The rules a PRODUCT.yaml must pass, one line per problem ([] = none): the CNCF CI's (metadata complete and
    no [placeholder]; every category and requirement of the checklist; a valid status; a MUST Implemented; N/A
    with notes; local evidence present) and gpuproof's (a JUnit anchor names a case; PRODUCT.md beside it, as
    rendered from it). ``path`` is the file or its folder."""
    path = Path(path)
    if path.is_dir():
        path = path / PRODUCT_YAML
    if not path.is_file():
        return [f"{path}: no {PRODUCT_YAML} there"]
    doc, err = _load_yaml(path)
    if err:
        return [err]
    if not isinstance(doc, dict):
        return [f"{path.name}: not a mapping with metadata and spec"]
    problems: list[str] = []
    meta, spec = doc.get("metadata"), doc.get("spec")
    version = ""
    if not isinstance(meta, dict):
        problems.append("metadata: missing")
    else:
        for key in METADATA:
            value = meta.get(key)
            if value is None:
                if key not in OPTIONAL_METADATA:
                    problems.append(f"metadata.{key}: missing")
            elif not isinstance(value, str):
                problems.append(f"metadata.{key}: not a string")
            elif not value.strip():
                if key not in OPTIONAL_METADATA:
                    problems.append(f"metadata.{key}: empty")
            elif value.startswith("[") and value.endswith("]"):
                problems.append(f"metadata.{key}: still a placeholder: {value}")
            elif key == "k8sConformanceUrl" and not K8S_CONFORMANCE_URL.match(value):
                problems.append(f"metadata.k8sConformanceUrl: {value} is not of the form "
                                "https://github.com/cncf/k8s-conformance/tree/master/v<version>/<product>")
            elif key == "productLogoUrl" and value.startswith("http") and \
                    not value.lower().endswith((".svg", ".eps", ".ai")):
                problems.append(f"metadata.productLogoUrl: {value} must link to an SVG, EPS or AI file")
        version = str(meta.get("kubernetesVersion") or "").removeprefix("v")
    known = checklists()
    if version not in known:
        problems.append(f"metadata.kubernetesVersion: {meta.get('kubernetesVersion') if isinstance(meta, dict) else ''}"
                        f" names no checklist gpuproof knows ({', '.join('v' + v for v in known)})")
        return problems
    if not isinstance(spec, dict):
        return problems + ["spec: missing"]
    junit_ids: dict[Path, list[str]] = {}
    for req in known[version]:
        items = spec.get(req.section)
        if not isinstance(items, list):
            problems.append(f"spec.{req.section}: missing")
            continue
        found = next((r for r in items if isinstance(r, dict) and r.get("id") == req.id), None)
        where = f"spec.{req.section}.{req.id}"
        if found is None:
            problems.append(f"{where}: missing")
            continue
        status = str(found.get("status") or "")
        evidence = [str(e) for e in (found.get("evidence") or []) if e]
        if req.level == "SHOULD" and not status and not evidence:
            continue                        # a SHOULD left blank is allowed
        if req.level == "MUST" and status != "Implemented":
            problems.append(f"{where}: a MUST needs status Implemented, it is " + (repr(status) if status else "empty"))
        elif status not in STATUSES:
            problems.append(f"{where}: status {status!r} is not one of {', '.join(STATUSES)}")
        if status == "N/A" and not str(found.get("notes") or "").strip():
            problems.append(f"{where}: status N/A needs notes saying why")
        for link in evidence:
            if link.startswith(("http://", "https://")):
                continue                    # the CNCF CI fetches these; not here
            file, tried = _evidence_file(link, path.parent, Path(root) if root else None)
            if file is None:
                problems.append(f"{where}: evidence {link} not found (looked at {tried[0]})")
                continue
            anchor = link.partition("#")[2]
            if anchor and file.suffix == ".xml":
                if file not in junit_ids:
                    try:
                        junit_ids[file] = junit_case_ids(file)
                    except GpuproofError:
                        junit_ids[file] = []
                if not any(anchor_matches(anchor, c) for c in junit_ids[file]):
                    problems.append(f"{where}: evidence {link}: no JUnit test case named {anchor} in {file.name}")
    md = path.with_name(PRODUCT_MD)
    if not md.is_file():
        problems.append(f"{PRODUCT_MD}: missing beside {PRODUCT_YAML} (gpuproof conformance --markdown "
                        f"{path.parent} writes it)")
    elif md.read_text(encoding="utf-8") != render_markdown(doc):
        problems.append(f"{PRODUCT_MD}: out of sync with {PRODUCT_YAML} (gpuproof conformance --markdown "
                        f"{path.parent} rewrites it)")
    return problems


# ---------------------------------------------------------------------------- the evidence folder


def _run_log(run_path: Path) -> Path | None:
    for name in LOG_NAMES:
        if (run_path / name).is_file():
            return run_path / name
    return next(iter(sorted(run_path.glob("*.log"))), None)


def derived_log(run: Run) -> str:
    """A plain log of the run from its records (for a run folder without a log): every check, then every test."""
    lines = [f"# gpuproof run {run.run_id}: its checks ({CHECKS_FILE}) and tests ({JUNIT_FILE}), one a line,",
             "# written by gpuproof conformance because the run folder holds no log of its own."]
    for r in (run.checks.to_dict("records") if not run.checks.empty else []):
        text = f"{r.get('ts', '')} {str(r.get('verdict', '')).upper():4} {r.get('feature')}/{r.get('check')} " \
               f"{r.get('target')}"
        if r.get("verdict") != "pass" and (r.get("expected") or r.get("actual")):
            text += f" expected={_one_line(r.get('expected'), 200)} actual={_one_line(r.get('actual'), 200)}"
        if r.get("message"):
            text += f" : {_one_line(r['message'], 400)}"
        lines.append(text)
    for c in (run.junit.cases if run.junit is not None else []):
        lines.append(f"TEST {c.outcome:7} {c.id} ({c.time:.2f} s)" + (f" : {_one_line(c.message, 400)}"
                                                                       if c.message else ""))
    return "\n".join(lines) + "\n"


@dataclasses.dataclass
class Evidence:
    folder: Path
    judgements: list[Judgement]
    problems: list[str]             # what check_product says of the written folder
    notes: list[str]                # warnings for the person (a simulated run, another Kubernetes version)


def _out_folder(out: str | os.PathLike) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise GpuproofError(f"-o {out}: is a file, not a folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise GpuproofError(f"-o {out}: cannot create the folder ({exc.strerror or exc})") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise GpuproofError(f"-o {out}: the folder is not writable")
    return out


def default_prefix(out: str | os.PathLike) -> str:
    """The links' path to the evidence folder: -o as given (relative links, as a submission's repository has
    them: file://v1.37/acme/junit.xml), without ./ or a trailing slash; absolute when it climbs with '..'."""
    path = Path(out)
    if ".." in path.parts:
        return path.resolve().as_posix()
    text = path.as_posix().rstrip("/")
    return "" if text in ("", ".") else text.removeprefix("./")


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise GpuproofError(f"{path}: cannot be written ({exc.strerror or exc})") from None


def _copy(src: Path, dst: Path) -> None:
    if src.resolve() == dst.resolve():
        return
    try:
        shutil.copyfile(src, dst)
    except OSError as exc:
        raise GpuproofError(f"{dst}: cannot be written ({exc.strerror or exc})") from None


def write_evidence(run_arg: str | os.PathLike, out: str | os.PathLike, version: str = "1.37",
                   metadata: dict[str, str] | None = None, prefix: str | None = None) -> Evidence:
    """The evidence folder ``out``: PRODUCT.yaml, PRODUCT.md, the run's junit.xml, its log (or one derived from its
    records) and checks.jsonl; then the rules, applied to what was written."""
    v, _ = checklist(version)
    run = load_run(run_arg)
    if run.checks.empty and run.junit is None:
        raise GpuproofError(f"{run.path}: the run recorded no checks ({CHECKS_FILE}) and no {JUNIT_FILE}: "
                            "nothing to take evidence from")
    folder = _out_folder(out)
    log = _run_log(run.path)
    log_name = log.name if log else DERIVED_LOG
    prefix = default_prefix(out) if prefix is None else prefix.rstrip("/")
    doc, judgements = build_product(run, v, prefix, log_name, metadata)
    if (run.path / JUNIT_FILE).is_file():
        _copy(run.path / JUNIT_FILE, folder / JUNIT_FILE)
    if log:
        _copy(log, folder / log_name)
    else:
        _write(folder / DERIVED_LOG, derived_log(run))
    if (run.path / CHECKS_FILE).is_file():
        _copy(run.path / CHECKS_FILE, folder / CHECKS_FILE)
    if (run.path / META_FILE).is_file():
        _copy(run.path / META_FILE, folder / META_FILE)
    header = _header(run, v, judgements)
    _write(folder / PRODUCT_YAML, render_yaml(doc, header))
    _write(folder / PRODUCT_MD, render_markdown(doc))
    notes = [line for line in header.splitlines() if line.startswith(("This run was", "The run's cluster"))]
    root = None
    if prefix and not Path(prefix).is_absolute():
        parts = Path(prefix).parts
        resolved = folder.resolve()
        if resolved.parts[-len(parts):] == parts:
            root = Path(*resolved.parts[:-len(parts)])
    return Evidence(folder, judgements, check_product(folder, root=root), notes)


def render_markdown_file(folder: str | os.PathLike) -> Path:
    """Rewrite PRODUCT.md from an edited PRODUCT.yaml (the folder or the file)."""
    path = Path(folder)
    if path.is_dir():
        path = path / PRODUCT_YAML
    if not path.is_file():
        raise GpuproofError(f"{path}: no {PRODUCT_YAML} there")
    doc, err = _load_yaml(path)
    if err:
        raise GpuproofError(err)
    if not isinstance(doc, dict):
        raise GpuproofError(f"{path}: not a mapping with metadata and spec")
    _write(path.with_name(PRODUCT_MD), render_markdown(doc))
    return path.with_name(PRODUCT_MD)

"""gpuproof conformance: Kubernetes AI Conformance 1.37 evidence from a run folder (issue #38 item 5).

Pure: run folders are made in tmp_path with gpuproof's own record writer (RunDir, CheckRecord) and a junit.xml in
the shape pytest writes (xunit2: testsuites/testsuite/testcase with classname and name, skipped/failure children).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest
import yaml

from gpuproof.cli.main import main
from gpuproof.errors import GpuproofError
from gpuproof.report import conformance
from gpuproof.report.conformance import (
    CHECKLISTS,
    PRODUCT_MD,
    PRODUCT_YAML,
    SECTIONS,
    anchor_matches,
    check_product,
    checklist,
    render_markdown,
    render_markdown_file,
    write_evidence,
)
from gpuproof.results import CheckRecord, RunDir

SUITES = Path(__file__).resolve().parents[1] / "suites"
CHECKLIST_1_37_SHA256 = "8d56838e47e17e4ba6a5e013f16f6711a6f4180b8545cd908199231f43fa8f96"
ACCESS = ("PositiveAccessTest", "NegativeIsolationTest", "MultiContainerIsolationTest")
FULL_META = {"websiteUrl": "https://acme.example/k8s", "documentationUrl": "https://acme.example/docs",
             "productLogoUrl": "https://acme.example/logo.svg", "description": "Acme's Kubernetes service.",
             "contactEmailAddress": "k8s@acme.example",
             "k8sConformanceUrl": "https://github.com/cncf/k8s-conformance/tree/master/v1.37/acme",
             "vendorName": "Acme", "platformName": "Acme Kubernetes Service", "platformVersion": "1.37.2-acme.1"}


def write_junit(path: Path, cases) -> None:
    """junit.xml as pytest writes it; cases: (classname, name, outcome, message) with outcome passed | failed |
    error | skipped."""
    rows = []
    for classname, name, outcome, message in cases:
        body = {"passed": "", "failed": f"<failure message={quoteattr(message)}>trace</failure>",
                "error": f"<error message={quoteattr(message)}>trace</error>",
                "skipped": f'<skipped type="pytest.skip" message={quoteattr(message)}>where</skipped>'}[outcome]
        rows.append(f"<testcase classname={quoteattr(classname)} name={quoteattr(name)} time=\"0.5\">{body}"
                    "</testcase>")
    fails = sum(o == "failed" for _, _, o, _ in cases)
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
                    f'errors="0" failures="{fails}" skipped="0" tests="{len(cases)}" time="3.2">'
                    + "".join(rows) + "</testsuite></testsuites>", encoding="utf-8")


def access_cases(outcomes=("passed",) * 3, node="gpu-0"):
    msgs = {"failed": f"{node}: pod without a grant saw 1 GPU (GPU-1234, /dev/nvidia0)",
            "skipped": "no node takes pods with a GPU grant", "passed": ""}
    return [("suites.test_access", f"TestSecureAcceleratorAccess/{sub}[{node}]", o, msgs.get(o, ""))
            for sub, o in zip(ACCESS, outcomes)]


SHARING_CASES = [("suites.test_timeslicing", "test_replicas_co_run_and_one_more_waits[ts-pool]", "passed", ""),
                 ("suites.test_mig", "test_each_pod_gets_its_own_mig_device[mig]", "skipped", "no MIG pool")]


def make_run(root: Path, checks=(), cases=None, run_id="20261128-100000-abc123", target="kubeconfig:/kc#prod",
             k8s="v1.37.1", log: str | None = None) -> Path:
    run = RunDir.create(root, run_id=run_id, target=target, cluster="prod-gpu", kubernetes_version=k8s)
    for rec in checks:
        run.add_check(rec)
    run.close()
    if cases is not None:
        write_junit(run.path / "junit.xml", cases)
    if log is not None:
        (run.path / log).write_text("the run's own log\n")
    return run.path


def sharing_checks(co_running="pass", mig=None):
    out = [CheckRecord("timeslicing", "shared-allocatable", n, "pass", expected="4", actual="4") for n in ("a", "b")]
    out += [CheckRecord("timeslicing", "co-running", n, co_running, expected="4", actual="4" if co_running == "pass"
                        else "3", message="" if co_running == "pass" else f"{n}: co-running: expected 4, actual 3")
            for n in ("a", "b")]
    if mig:
        out.append(CheckRecord("mig", "mig-placement", "mig-0", mig, message=f"mig-0: mig-placement {mig}"))
    return out


def product(folder: Path) -> dict:
    return yaml.safe_load((folder / PRODUCT_YAML).read_text())


def requirement(doc: dict, rid: str) -> dict:
    return next(r for items in doc["spec"].values() for r in items if r["id"] == rid)


@pytest.fixture
def healthy(tmp_path):
    return make_run(tmp_path / "reports", sharing_checks(), access_cases() + SHARING_CASES)


# ---------------------------------------------------------------------------- the checklist and the mapping table


def test_the_1_37_checklist_as_the_reference_lists_it():
    version, reqs = checklist("v1.37")
    assert version == "1.37" and checklist("1.37")[1] is reqs
    assert len(reqs) == 15 and sum(r.level == "MUST" for r in reqs) == 8
    assert len({r.id for r in reqs}) == 15 and {r.section for r in reqs} == set(SECTIONS)
    must = {r.id for r in reqs if r.level == "MUST"}
    assert must == {"ai_inference", "gang_scheduling", "cluster_autoscaling", "pod_autoscaling",
                    "accelerator_metrics", "ai_service_metrics", "secure_accelerator_access", "robust_controller"}
    assert "dra_support" not in {r.id for r in reqs}          # left the checklist: Kubernetes conformance covers it
    for r in reqs:
        assert r.need in ("all", "any") and r.description
        assert bool(r.parts) != bool(r.untested), f"{r.id}: parts or a reason it is untested, one of the two"


def without_markers(path: Path) -> str:
    """A suite's source with its conformance markers cut out (a check a marker names must be named elsewhere)."""
    text = path.read_text()
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == "conformance"]
    for call in calls:
        text = text.replace(ast.get_source_segment(text, call), "")
    return text


def test_the_markers_name_only_features_and_checks_the_suites_have():
    """Drift guard: a feature or check renamed in suites/ must be renamed in its conformance marker (the monitoring
    suite's checks on an exporter's output are named where they are judged, gpuproof/discovery/monitoring.py)."""
    judged_in = SUITES.parent / "gpuproof" / "discovery" / "monitoring.py"
    text = "\n".join([*(without_markers(p) for p in SUITES.glob("test_*.py")), judged_in.read_text()])
    features = set(re.findall(r'^FEATURE = "([a-z_]+)"', text, re.M))
    parts = [p for reqs in CHECKLISTS.values() for r in reqs for p in r.parts]
    assert {p.feature for p in parts if p.feature} - features == set()
    for p in parts:
        for pattern in (*p.checks, *p.require):
            if pattern != "*":
                assert f'"{pattern.rstrip("*")}' in text, f"{p.name}: no check named like {pattern!r} in suites/"
        for anchor in p.junit:
            if anchor.startswith("suites."):
                module = anchor.split("::")[0].removeprefix("suites.")
                assert (SUITES / f"{module}.py").is_file(), anchor
                if "::" in anchor:
                    assert f"def {anchor.split('::')[1]}(" in (SUITES / f"{module}.py").read_text(), anchor


def test_the_checklist_is_upstreams_file_as_published():
    """checklists/AIConformance-1.37.yaml is cncf/k8s-ai-conformance's docs/AIConformance-1.37.yaml at the commit
    SOURCES.md names, byte for byte (its size and digest pinned here); every requirement gpuproof judges has upstream's
    words, read from it."""
    import hashlib

    folder = Path(conformance.__file__).with_name("checklists")
    data = (folder / "AIConformance-1.37.yaml").read_bytes()
    assert len(data) == 8918 and not data.endswith(b"\n")
    assert hashlib.sha256(data).hexdigest() == CHECKLIST_1_37_SHA256
    sources = (folder / "SOURCES.md").read_text()
    assert "`AIConformance-1.37.yaml` | [cncf/k8s-ai-conformance]" in sources
    assert "`docs/AIConformance-1.37.yaml` | `287b44f07bb56bc916f6e2191359d44408a65a84`" in sources
    upstream = yaml.safe_load(data)
    assert upstream["metadata"]["kubernetesVersion"] == "v1.37"
    words = {r["id"]: (section, r["level"], r["description"]) for section, items in upstream["spec"].items()
             for r in items}
    assert {r.id: (r.section, r.level, r.description) for r in CHECKLISTS["1.37"]} == words
    assert [r.id for r in CHECKLISTS["1.37"]] == list(words)


def test_the_mapping_is_the_suites_markers():
    """Which tests give evidence for a requirement is declared on the tests; the parts in the suites' file order."""
    reqs = {r.id: r for r in CHECKLISTS["1.37"]}
    access = reqs["secure_accelerator_access"]
    assert [(p.name, p.junit, p.feature) for p in access.parts] == [
        (s, (f"TestSecureAcceleratorAccess/{s}",), "access") for s in ACCESS]
    assert access.guard == ("TestSecureAcceleratorAccess",) and access.need == "all"
    sharing = reqs["gpu_sharing"]
    assert sharing.need == "any" and sharing.guard == ()
    assert [(p.name, p.junit, p.feature, p.checks, p.require) for p in sharing.parts] == [
        ("DRA: MIG devices by profile and shared claims",
         ("suites.test_dra::test_shared_claim_and_per_pod_claims", "suites.test_dra::test_mig_devices_by_profile"),
         "dra", ("dra-shared-claim", "dra-mig-*"), ()),
        ("MIG", ("suites.test_mig",), "mig", ("*",), ()),
        ("time-slicing", ("suites.test_timeslicing",), "timeslicing", ("*",), ("co-running",))]
    service = reqs["ai_service_metrics"]
    assert [(p.name, p.junit, p.checks) for p in service.parts] == [
        ("TestAIServiceMetrics", ("TestAIServiceMetrics",), ("ai-service-metrics",))]
    drm = reqs["driver_runtime_management"]
    assert [(p.name, p.checks, p.require) for p in drm.parts] == [
        ("VerifiableMechanismExposed", ("driver-version-advertised",), ("driver-version-advertised",)),
        ("DriverAndRuntimeCompatibility", ("driver-version-in-pod", "cuda-driver-version-in-pod"),
         ("driver-version-in-pod",))]
    gang = reqs["gang_scheduling"]
    assert [(p.name, p.junit, p.feature, p.checks) for p in gang.parts] == [
        ("Positive", ("TestGangScheduling/Positive",), "gang", ("gang-bound-together", "gang-runs")),
        ("Negative", ("TestGangScheduling/Negative",), "gang", ("gang-oversize-held",))]
    assert gang.guard == ("TestGangScheduling",) and gang.need == "all"
    assert {rid for rid, r in reqs.items() if r.parts} == {
        "driver_runtime_management", "gpu_sharing", "accelerator_metrics", "ai_service_metrics",
        "secure_accelerator_access", "gang_scheduling", "robust_controller"}
    robust = reqs["robust_controller"]
    assert [(p.name, p.feature, p.checks) for p in robust.parts] == [
        ("OperatorPodsRunning", "operators", ("operator-pods-ready",)),
        ("CRDRegistered", "operators", ("operator-crds-established",)),
        ("WebhookOperational", "operators", ("operator-webhooks-have-ca",)),
        ("WebhookRejectsInvalidCR", "operators", ("operator-webhook-rejects-invalid",)),
        ("ControllerReconcilesCR", "operators", ("operator-job-completes",))]
    assert robust.guard == ("TestRobustCRDControllerOperation",)


def test_a_marker_that_cannot_be_read_or_names_no_requirement_is_refused(tmp_path):
    folder = Path(conformance.__file__).with_name("checklists")
    (tmp_path / "test_x.py").write_text(
        'import pytest\nFEATURE = "x"\n\n@pytest.mark.conformance("gpu_sharng", checks=("a",))\ndef test_a(): pass\n')
    with pytest.raises(GpuproofError, match=r"test_x.py:4: conformance marker names 'gpu_sharng', a requirement of "
                                            r"no checklist gpuproof has \(1.37\)"):
        conformance.checklists(folder, tmp_path)
    (tmp_path / "test_x.py").write_text(
        'import pytest\nFEATURE = "x"\n\n@pytest.mark.conformance("gpu_sharing", checks=names())\ndef test_a(): pass\n')
    with pytest.raises(GpuproofError, match=r"test_x.py:4: a conformance marker takes literals and the module's"):
        conformance.checklists(folder, tmp_path)
    (tmp_path / "test_x.py").write_text(
        'import pytest\n\nclass TestX:\n    @pytest.mark.conformance("gpu_sharing", name="mine")\n'
        '    def test_a(self): pass\n')
    sharing = {r.id: r for r in conformance.checklists(folder, tmp_path)["1.37"]}["gpu_sharing"]
    assert sharing.parts == (conformance.Part("mine", ("TestX/a",)),)


def test_unknown_version_is_refused():
    with pytest.raises(GpuproofError, match=r"--version 1.36: .*1.37"):
        checklist("1.36")


@pytest.mark.parametrize("case, anchor, hit", [
    ("suites.test_access::TestSecureAcceleratorAccess/PositiveAccessTest[gpu-0]",
     "TestSecureAcceleratorAccess/PositiveAccessTest", True),
    ("suites.test_access::TestSecureAcceleratorAccess/PositiveAccessTest[gpu-0]", "TestSecureAcceleratorAccess", True),
    ("suites.test_access.TestSecureAcceleratorAccess::test_PositiveAccessTest[gpu-0]",
     "TestSecureAcceleratorAccess/PositiveAccessTest", True),
    ("TestSecureAcceleratorAccess/MultiContainerIsolationTest", "TestSecureAcceleratorAccess", True),
    ("suites.test_access::TestSecureAcceleratorAccess/PositiveAccessTest[gpu-0]",
     "TestSecureAcceleratorAccess/NegativeIsolationTest", False),
    ("suites.test_access::TestSecureAcceleratorAccessX/PositiveAccessTest", "TestSecureAcceleratorAccess", False),
    ("suites.test_timeslicing::test_replicas_co_run_and_one_more_waits[p]", "suites.test_timeslicing", True),
    ("suites.test_dra::test_mig_devices_by_profile", "suites.test_dra::test_mig_devices_by_profile", True),
    ("suites.test_dra::test_shared_claim_and_per_pod_claims", "suites.test_dra::test_mig_devices_by_profile", False),
])
def test_junit_anchors(case, anchor, hit):
    assert anchor_matches(anchor, case) is hit


# ---------------------------------------------------------------------------- statuses from a run


def test_what_a_healthy_run_shows_is_implemented_with_anchors_and_the_log(healthy, tmp_path):
    out = tmp_path / "v1.37" / "acme"
    write_evidence(healthy, out, "1.37", prefix="v1.37/acme")
    doc = product(out)
    access = requirement(doc, "secure_accelerator_access")
    assert access["status"] == "Implemented"
    assert access["evidence"] == [f"file://v1.37/acme/junit.xml#TestSecureAcceleratorAccess/{s}" for s in ACCESS] + [
        "file://v1.37/acme/checks.log"]
    assert "gpuproof's own checks (not the upstream Go suite)" in access["notes"]
    sharing = requirement(doc, "gpu_sharing")
    assert sharing["status"] == "Implemented"
    assert sharing["evidence"] == ["file://v1.37/acme/junit.xml#suites.test_timeslicing",
                                   "file://v1.37/acme/checks.log"]
    assert "time-slicing passed (4 checks passed on 2 targets, 1 test passed)" in sharing["notes"]
    assert "MIG did not run (no MIG pool)" in sharing["notes"]
    for rid in ("accelerator_metrics", "ai_service_metrics", "driver_runtime_management"):   # not in this run
        r = requirement(doc, rid)
        assert r["status"] == "" and r["evidence"] == [] and r["notes"].startswith("Not established by gpuproof run")
        assert ": not in this run" in r["notes"]
    gang = requirement(doc, "gang_scheduling")      # the gang suite (suites/test_gang.py) was not in this run
    assert gang["status"] == "" and gang["evidence"] == []
    assert gang["notes"].startswith("Not established by gpuproof run") and ": not in this run" in gang["notes"]
    robust = requirement(doc, "robust_controller")    # the operators suite was not in this run either
    assert robust["status"] == "" and ": not in this run" in robust["notes"]
    assert (out / "junit.xml").read_bytes() == (healthy / "junit.xml").read_bytes()
    assert (out / "checks.jsonl").is_file() and (out / "checks.log").is_file()
    assert (out / PRODUCT_MD).read_text() == render_markdown(doc)


def test_the_evidence_files_exist_and_every_anchor_names_a_case(healthy, tmp_path):
    out = tmp_path / "v1.37" / "acme"
    ev = write_evidence(healthy, out, prefix="v1.37/acme")
    assert not [p for p in ev.problems if "evidence" in p or PRODUCT_MD in p]
    assert check_product(out, root=tmp_path) == ev.problems


def test_a_failed_must_says_so(tmp_path):
    run = make_run(tmp_path / "r", cases=access_cases(("passed", "failed", "passed")))
    ev = write_evidence(run, tmp_path / "out")
    access = requirement(product(tmp_path / "out"), "secure_accelerator_access")
    assert access["status"] == "Not Implemented"
    assert access["notes"].startswith("FAILED in gpuproof run 20261128-100000-abc123 (prod-gpu, Kubernetes v1.37.1)")
    assert "NegativeIsolationTest FAILED: suites.test_access::TestSecureAcceleratorAccess/NegativeIsolationTest" \
           "[gpu-0]: gpu-0: pod without a grant saw 1 GPU (GPU-1234, /dev/nvidia0)" in access["notes"]
    assert "file://" + (tmp_path / "out").as_posix() + "/junit.xml#TestSecureAcceleratorAccess/NegativeIsolationTest" \
        in access["evidence"]
    assert "spec.security.secure_accelerator_access: a MUST needs status Implemented, it is 'Not Implemented'" \
        in ev.problems


def test_another_failed_test_under_the_upstream_name_fails_the_requirement(tmp_path):
    """gpuproof's further access checks (NVIDIA_VISIBLE_DEVICES=all in a pod without a grant) carry the upstream
    test's name too: their failure is the requirement's, their pass adds nothing it needs."""
    env = ("suites.test_access", "TestSecureAcceleratorAccess/EnvVarIsolationTest[gpu-0]", "failed",
           "gpu-0: pod without a grant, NVIDIA_VISIBLE_DEVICES=all: saw 8 GPUs")
    write_evidence(make_run(tmp_path / "r", cases=access_cases() + [env]), tmp_path / "out", prefix="ev")
    access = requirement(product(tmp_path / "out"), "secure_accelerator_access")
    assert access["status"] == "Not Implemented"
    assert "other tests of TestSecureAcceleratorAccess FAILED: suites.test_access::TestSecureAcceleratorAccess/" \
           "EnvVarIsolationTest[gpu-0]: gpu-0: pod without a grant, NVIDIA_VISIBLE_DEVICES=all: saw 8 GPUs" \
        in access["notes"]
    assert "file://ev/junit.xml#TestSecureAcceleratorAccess" in access["evidence"]
    write_evidence(make_run(tmp_path / "p", cases=access_cases() + [env[:2] + ("passed", "")]), tmp_path / "p-out")
    assert requirement(product(tmp_path / "p-out"), "secure_accelerator_access")["status"] == "Implemented"


def test_the_access_suites_own_cases_and_records_judge_the_requirement(tmp_path):
    """As suites/test_access.py writes them: JUnit cases TestSecureAcceleratorAccess::test_<subtest>[<node>] of the
    module's class, and one check record per node and subtest (feature access); its EnvVarIsolationTest failing on one
    node fails the requirement, naming the node and the GPUs the pod reached."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpuproof_suite_access", SUITES / "test_access.py")
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    access_parts = {p.name: p.checks for r in CHECKLISTS["1.37"] if r.id == "secure_accelerator_access"
                    for p in r.parts}
    assert access_parts == {k: (v,) for k, v in suite.CHECKS.items() if k in ACCESS}
    cls = "suites.test_access.TestSecureAcceleratorAccess"

    def run(env_verdict: str, name: str) -> dict:
        checks = [CheckRecord("access", suite.CHECKS[sub], node, "pass") for sub in ACCESS for node in ("a", "b")]
        env_msg = ("b: pod access-env-b container ungranted-env-all on b, granted nothing with "
                   "NVIDIA_VISIBLE_DEVICES=all: expected no GPU, actual 2 GPUs: /dev/nvidia0, /dev/nvidia1")
        checks += [CheckRecord("access", "access-envvar-none", "a", "pass"),
                   CheckRecord("access", "access-envvar-none", "b", env_verdict,
                               message=env_msg if env_verdict == "fail" else "")]
        cases = [(cls, f"test_{sub}[{node}]", "passed", "") for sub in ACCESS for node in ("a", "b")]
        cases += [(cls, "test_EnvVarIsolationTest[a]", "passed", ""),
                  (cls, "test_EnvVarIsolationTest[b]", "failed" if env_verdict == "fail" else "passed", env_msg)]
        write_evidence(make_run(tmp_path / name, checks, cases), tmp_path / f"{name}-out", prefix="ev")
        return requirement(product(tmp_path / f"{name}-out"), "secure_accelerator_access")

    ok = run("pass", "ok")
    assert ok["status"] == "Implemented", ok["notes"]
    assert ok["evidence"][:3] == [f"file://ev/junit.xml#TestSecureAcceleratorAccess/{s}" for s in ACCESS]
    assert "PositiveAccessTest passed (2 checks passed on 2 targets, 2 tests passed)" in ok["notes"]
    bad = run("fail", "bad")
    assert bad["status"] == "Not Implemented"
    assert "other tests of TestSecureAcceleratorAccess FAILED: suites.test_access.TestSecureAcceleratorAccess::" \
           "test_EnvVarIsolationTest[b]: b: pod access-env-b container ungranted-env-all" in bad["notes"]


def test_skipped_only_is_not_implemented(tmp_path):
    run = make_run(tmp_path / "r", cases=access_cases(("skipped",) * 3))
    write_evidence(run, tmp_path / "out")
    access = requirement(product(tmp_path / "out"), "secure_accelerator_access")
    assert access["status"] == "" and access["evidence"] == []
    assert "Kubernetes v1.37.1): PositiveAccessTest did not run (no node takes pods with a GPU grant)" \
        in access["notes"]


def test_a_requirement_only_partly_shown_is_not_implemented(tmp_path):
    run = make_run(tmp_path / "r", cases=access_cases(("passed",)))      # only the positive test ran
    write_evidence(run, tmp_path / "out", prefix="ev")
    access = requirement(product(tmp_path / "out"), "secure_accelerator_access")
    assert access["status"] == ""
    assert access["evidence"] == ["file://ev/junit.xml#TestSecureAcceleratorAccess/PositiveAccessTest",
                                  "file://ev/checks.log"]
    assert "needs every part to pass: PositiveAccessTest passed (1 test passed); NegativeIsolationTest: not in this " \
           "run; MultiContainerIsolationTest: not in this run" in access["notes"]


def test_gpu_sharing_needs_one_strategy_shown_and_none_failing(tmp_path):
    def sharing(name, checks, cases=()):
        run = make_run(tmp_path / name, checks, list(cases))
        write_evidence(run, tmp_path / f"{name}-out")
        return requirement(product(tmp_path / f"{name}-out"), "gpu_sharing")

    advertised_only = sharing("adv", [CheckRecord("timeslicing", "shared-allocatable", "a", "pass")])
    assert advertised_only["status"] == "" and "co-running did not pass" in advertised_only["notes"]
    broken_mig = sharing("mig", sharing_checks(mig="fail"))
    assert broken_mig["status"] == "Not Implemented" and "MIG FAILED: mig-0: mig-placement fail" in broken_mig["notes"]
    no_co_run = sharing("co", sharing_checks(co_running="fail"))
    assert no_co_run["status"] == "Not Implemented" and "a: co-running: expected 4, actual 3" in no_co_run["notes"]
    dra = sharing("dra", [CheckRecord("dra", "dra-shared-claim", "cluster", "pass")],
                  [("suites.test_dra", "test_shared_claim_and_per_pod_claims", "passed", "")])
    assert dra["status"] == "Implemented"
    assert dra["evidence"][0].endswith("junit.xml#suites.test_dra::test_shared_claim_and_per_pod_claims")


def test_a_run_without_junit_is_judged_by_its_check_records(tmp_path):
    run = make_run(tmp_path / "r", sharing_checks())
    write_evidence(run, tmp_path / "out")
    sharing = requirement(product(tmp_path / "out"), "gpu_sharing")
    assert sharing["status"] == "Implemented" and [e.rsplit("/", 1)[1] for e in sharing["evidence"]] == ["checks.log"]
    assert not (tmp_path / "out" / "junit.xml").exists()


def test_the_runs_own_log_is_the_evidence_when_it_has_one(tmp_path):
    run = make_run(tmp_path / "r", sharing_checks(), SHARING_CASES, log="run.log")
    write_evidence(run, tmp_path / "out", prefix="out")
    assert "file://out/run.log" in requirement(product(tmp_path / "out"), "gpu_sharing")["evidence"]
    assert (tmp_path / "out" / "run.log").read_text() == "the run's own log\n"
    assert not (tmp_path / "out" / "checks.log").exists()


def test_metadata_placeholders_what_the_run_recorded_and_overrides(healthy, tmp_path):
    write_evidence(healthy, tmp_path / "a")
    meta = product(tmp_path / "a")["metadata"]
    assert meta["kubernetesVersion"] == "v1.37" and meta["vendorName"] == "[Vendor Name]"
    assert meta["platformVersion"] == "[Platform Version: the cluster reported Kubernetes v1.37.1]"
    assert meta["platformName"] == "[Platform Name: the run's cluster was prod-gpu]"
    write_evidence(healthy, tmp_path / "b", metadata={"vendorName": "Acme", "repoUrl": "https://git.example/acme"})
    meta = product(tmp_path / "b")["metadata"]
    assert meta["vendorName"] == "Acme" and meta["repoUrl"] == "https://git.example/acme"
    with pytest.raises(GpuproofError, match="metadata 'vendor': not a field"):
        write_evidence(healthy, tmp_path / "c", metadata={"vendor": "Acme"})


def test_a_simulated_run_or_another_kubernetes_version_is_said(tmp_path):
    run = make_run(tmp_path / "r", sharing_checks(), target="embedded", k8s="v1.35.4")
    ev = write_evidence(run, tmp_path / "out")
    assert any("embedded, simulated cluster" in n for n in ev.notes)
    assert any("reported Kubernetes v1.35.4, not 1.37" in n for n in ev.notes)
    text = (tmp_path / "out" / PRODUCT_YAML).read_text()
    assert text.startswith("# Kubernetes AI Conformance checklist v1.37") and "# This run was against" in text
    assert "gpuproof's embedded (simulated) cluster, Kubernetes v1.35.4" in requirement(
        product(tmp_path / "out"), "gpu_sharing")["notes"]


def test_warnings_are_said_with_a_pass_and_alone_are_no_pass(tmp_path):
    warned = sharing_checks() + [CheckRecord("timeslicing", "shared-product-suffix", "a", "warn",
                                             message="a: product label lacks -SHARED")]
    write_evidence(make_run(tmp_path / "w", warned), tmp_path / "w-out")
    sharing = requirement(product(tmp_path / "w-out"), "gpu_sharing")
    assert sharing["status"] == "Implemented" and "with 1 warning: a: product label lacks -SHARED" in sharing["notes"]
    only = [CheckRecord("mig", "mig-profile-known", "m", "warn", message="m: unknown profile 9g.99gb")]
    write_evidence(make_run(tmp_path / "o", only), tmp_path / "o-out")
    sharing = requirement(product(tmp_path / "o-out"), "gpu_sharing")
    assert sharing["status"] == "" and "MIG did not run (warning: m: unknown profile 9g.99gb)" in sharing["notes"]


def test_a_whole_synthetic_run(tmp_path):
    """gpuproof's synthetic run (every record kind, a failed label check, skipped MIG tests): nothing it holds
    establishes a 1.37 requirement, and the folder is still whole."""
    from synthetic_runs import make_run as synthetic

    ev = write_evidence(synthetic(tmp_path, "20250101-120000-abc123"), tmp_path / "out")
    states = {j.requirement.id: j.state for j in ev.judgements}
    assert states["gpu_sharing"] == "skipped" and states["secure_accelerator_access"] == "absent"
    assert all(p.startswith(("spec.", "metadata.")) for p in ev.problems)


def test_an_output_above_the_working_folder_gets_absolute_links(healthy, tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    ev = write_evidence(healthy, "../ev")
    link = requirement(product(tmp_path / "ev"), "gpu_sharing")["evidence"][0]
    assert link == f"file://{(tmp_path / 'ev').resolve().as_posix()}/junit.xml#suites.test_timeslicing"
    assert not [p for p in ev.problems if "evidence" in p]


# ---------------------------------------------------------------------------- the rules


@pytest.fixture
def complete(healthy, tmp_path):
    """An evidence folder that passes every rule: gpuproof's output, its metadata given, and the platform's own
    evidence for the MUSTs gpuproof does not test (a local file here, since the rules fetch no URL)."""
    out = tmp_path / "v1.37" / "acme"
    meta = dict(FULL_META)
    meta.update({"repoUrl": ""})
    write_evidence(healthy, out, metadata=meta, prefix="v1.37/acme")
    (out / "platform-evidence.md").write_text("our own evidence\n")
    doc = product(out)
    for items in doc["spec"].values():
        for r in items:
            if r["level"] == "MUST" and r["status"] != "Implemented":
                r.update(status="Implemented", evidence=["file://v1.37/acme/platform-evidence.md"],
                         notes="the platform's own evidence")
    edit(out, doc)
    return out


def edit(folder: Path, doc: dict, markdown: bool = True) -> None:
    (folder / PRODUCT_YAML).write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    if markdown:
        render_markdown_file(folder)


def test_a_complete_folder_passes_every_rule(complete, tmp_path):
    assert check_product(complete, root=tmp_path) == []
    assert check_product(complete) == []             # found from the folders above it, as from a repository's root


def test_the_generated_folder_fails_only_on_what_the_platform_must_add(healthy, tmp_path):
    ev = write_evidence(healthy, tmp_path / "out")
    untested_musts = {r.id for r in CHECKLISTS["1.37"] if r.level == "MUST"} - {"secure_accelerator_access"}
    assert {p.split(":")[0].rsplit(".", 1)[1] for p in ev.problems if p.startswith("spec.")} == untested_musts
    assert all(p.startswith(("spec.", "metadata.")) for p in ev.problems)
    assert all("still a placeholder" in p for p in ev.problems if p.startswith("metadata."))


def _drop_website(doc):
    del doc["metadata"]["websiteUrl"]


def _set(section, rid, **fields):
    def change(doc):
        next(r for r in doc["spec"][section] if r["id"] == rid).update(fields)
    return change


def _meta(key, value):
    def change(doc):
        doc["metadata"][key] = value
    return change


def _drop_requirement(doc):
    doc["spec"]["security"] = [r for r in doc["spec"]["security"] if r["id"] != "secure_accelerator_access"]


def _drop_section(doc):
    del doc["spec"]["operator"]


BROKEN = {
    "placeholder": (_meta("vendorName", "[Vendor Name]"), "metadata.vendorName: still a placeholder: [Vendor Name]"),
    "missing field": (_drop_website, "metadata.websiteUrl: missing"),
    "empty field": (_meta("description", ""), "metadata.description: empty"),
    "not a string": (_meta("platformVersion", 1.37), "metadata.platformVersion: not a string"),
    "k8s conformance url": (_meta("k8sConformanceUrl", "https://example.com/acme"),
                            "metadata.k8sConformanceUrl: https://example.com/acme is not of the form"),
    "logo": (_meta("productLogoUrl", "https://acme.example/logo.png"), "must link to an SVG, EPS or AI file"),
    "version": (_meta("kubernetesVersion", "v1.99"), "metadata.kubernetesVersion: v1.99 names no checklist"),
    "requirement": (_drop_requirement, "spec.security.secure_accelerator_access: missing"),
    "section": (_drop_section, "spec.operator: missing"),
    "must": (_set("security", "secure_accelerator_access", status="Partially Implemented"),
             "spec.security.secure_accelerator_access: a MUST needs status Implemented, it is 'Partially Implemented'"),
    "status": (_set("accelerators", "virtualized_accelerator", status="Done", evidence=["https://acme.example/v"]),
               "spec.accelerators.virtualized_accelerator: status 'Done' is not one of Implemented, Not Implemented, "
               "Partially Implemented, N/A"),
    "n/a notes": (_set("security", "workload_sandboxing", status="N/A", notes=""),
                  "spec.security.workload_sandboxing: status N/A needs notes saying why"),
    "evidence file": (_set("operator", "robust_controller", evidence=["file://v1.37/acme/robust.md"]),
                      "spec.operator.robust_controller: evidence file://v1.37/acme/robust.md not found"),
    "anchor": (_set("security", "secure_accelerator_access",
                    evidence=["file://v1.37/acme/junit.xml#TestSecureAcceleratorAccess/SomethingElse"]),
               "evidence file://v1.37/acme/junit.xml#TestSecureAcceleratorAccess/SomethingElse: no JUnit test case "
               "named TestSecureAcceleratorAccess/SomethingElse in junit.xml"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_each_broken_rule_is_one_clear_line(complete, tmp_path, name):
    change, expected = BROKEN[name]
    doc = product(complete)
    change(doc)
    edit(complete, doc)
    problems = check_product(complete, root=tmp_path)
    assert len(problems) == 1 and expected in problems[0], problems


def test_product_md_missing_or_out_of_sync(complete, tmp_path):
    doc = product(complete)
    doc["spec"]["security"][1]["notes"] = "edited by hand"
    edit(complete, doc, markdown=False)
    assert check_product(complete, root=tmp_path) == [
        f"{PRODUCT_MD}: out of sync with {PRODUCT_YAML} (gpuproof conformance --markdown {complete} rewrites it)"]
    (complete / PRODUCT_MD).unlink()
    assert check_product(complete, root=tmp_path) == [
        f"{PRODUCT_MD}: missing beside {PRODUCT_YAML} (gpuproof conformance --markdown {complete} writes it)"]


def test_a_should_left_blank_is_allowed_but_not_with_evidence(complete, tmp_path):
    doc = product(complete)
    _set("accelerators", "virtualized_accelerator", status="", evidence=[], notes="")(doc)
    edit(complete, doc)
    assert check_product(complete, root=tmp_path) == []
    _set("accelerators", "virtualized_accelerator", evidence=["https://acme.example/vgpu"])(doc)
    edit(complete, doc)
    assert check_product(complete, root=tmp_path) == [
        "spec.accelerators.virtualized_accelerator: status '' is not one of Implemented, Not Implemented, "
        "Partially Implemented, N/A"]


def test_not_yaml_or_no_product(tmp_path):
    assert check_product(tmp_path) == [f"{tmp_path / PRODUCT_YAML}: no {PRODUCT_YAML} there"]
    (tmp_path / PRODUCT_YAML).write_text("metadata: [unclosed\n")
    [line] = check_product(tmp_path)
    assert line.startswith(f"{PRODUCT_YAML}: not valid YAML (") and "\n" not in line


# ---------------------------------------------------------------------------- the command


def test_the_command_writes_the_folder_and_lists_what_is_left(healthy, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["conformance", "--version", "1.37", str(healthy), "-o", "v1.37/acme", "--vendor", "Acme",
               "--platform-name", "Acme KS", "--meta", "websiteUrl=https://acme.example"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "wrote v1.37/acme/PRODUCT.yaml and PRODUCT.md (Kubernetes AI Conformance v1.37):" in out
    assert re.search(r"secure_accelerator_access +MUST +Implemented", out)
    assert re.search(r"gang_scheduling +MUST +\(not in this run\)", out)
    assert "still to do before a submission" in err and "gang_scheduling: a MUST needs status Implemented" in err
    doc = product(tmp_path / "v1.37" / "acme")
    assert doc["metadata"]["vendorName"] == "Acme" and doc["metadata"]["websiteUrl"] == "https://acme.example"
    assert requirement(doc, "gpu_sharing")["evidence"][0] == "file://v1.37/acme/junit.xml#suites.test_timeslicing"
    assert main(["conformance", "--check", "v1.37/acme"]) == 1
    out, _ = capsys.readouterr()
    assert out.startswith("v1.37/acme: ") and "  - metadata.platformVersion: still a placeholder" in out


def test_metadata_from_an_earlier_product_and_markdown_after_an_edit(complete, healthy, tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["conformance", str(healthy), "-o", "again", "--metadata", str(complete / PRODUCT_YAML)]) == 0
    again = tmp_path / "again"
    assert product(again)["metadata"]["vendorName"] == "Acme"
    doc = product(again)
    requirement(doc, "gpu_sharing")["notes"] = "edited"
    edit(again, doc, markdown=False)
    capsys.readouterr()
    assert main(["conformance", "--markdown", "again"]) == 0
    assert (again / PRODUCT_MD).read_text() == render_markdown(doc)
    assert main(["conformance", "--check", str(complete)]) == 0
    assert capsys.readouterr().out.endswith("passes the rules\n")


def test_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["conformance", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "PRODUCT.yaml" in text and "--evidence-prefix" in text and "exit codes" in text


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuproof: error: "), err
    return lines[0]


@pytest.mark.parametrize("case", ["missing", "not a run", "a file", "empty run", "version", "output is a file",
                                  "output under a file", "meta", "metadata file", "no run"])
def test_bad_input_is_one_line_and_exit_2(healthy, tmp_path, capsys, case):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "notes.txt").write_text("x")
    (tmp_path / "file.txt").write_text("x")
    bare = RunDir(tmp_path / "bare")            # run.json only: a run that recorded nothing
    bare.close()
    out = str(tmp_path / "out")
    argv, expected = {
        "missing": ([str(tmp_path / "nope"), "-o", out], "not found"),
        "not a run": ([str(tmp_path / "plain"), "-o", out], "is not a gpuproof run folder"),
        "a file": ([str(tmp_path / "file.txt"), "-o", out], "is not a run folder (it is a file"),
        "empty run": ([str(tmp_path / "bare"), "-o", out], "recorded no checks"),
        "version": (["--version", "1.36", str(healthy), "-o", out], "--version 1.36: gpuproof has no"),
        "output is a file": ([str(healthy), "-o", str(tmp_path / "file.txt")], "is a file, not a folder"),
        "output under a file": ([str(healthy), "-o", str(tmp_path / "file.txt" / "sub")], "cannot create the folder"),
        "meta": ([str(healthy), "-o", out, "--meta", "vendor"], "--meta 'vendor': give KEY=VALUE"),
        "metadata file": ([str(healthy), "-o", out, "--metadata", str(tmp_path / "nope.yaml")], "cannot be read"),
        "no run": (["-o", out], "give a run folder and -o DIR"),
    }[case]
    assert main(["conformance", *argv]) == 2
    assert expected in _one_error(capsys)
    if case not in ("output is a file", "output under a file"):
        assert not (tmp_path / "out" / PRODUCT_YAML).exists()

"""The suites' JUnit cases carry the upstream tests' names, and gpuproof conformance reads them (issue #38 item 5).

Each requirement gpuproof tests is anchored at the JUnit cases named after the upstream Go tests
(``TestSecureAcceleratorAccess/PositiveAccessTest``, ``TestAcceleratorDriverRuntimeManagement/...``,
``TestAcceleratorPerformanceMetrics/...``, ``TestAIServiceMetrics``). The cases' ids are made as pytest's junitxml
writes them (``classname::name`` from each test's node id, ``mangle_test_address``) for every test of the suite
modules, so a renamed test or anchor turns this red. The driver and monitoring suites then run in-process on
recorded inputs (tests/test_driver_checks.py's VKS node and probe output, tests/test_monitoring.py's recorded DCGM
exporter outputs), each test with its own Checker as pytest gives it, their records and outcomes (passed, failed,
skipped) written to a run folder's checks.jsonl and junit.xml; gpuproof conformance makes the evidence folder of it.
Pure: no cluster.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
from _pytest.junitxml import mangle_test_address
from test_conformance import product, requirement, write_junit
from test_driver_checks import FANOUT, LIE, NODE_40C, _node, probe_result
from test_monitoring import FAULTS as DCGM_FAULTS
from test_monitoring import L4_HOST, L4_NODE, _healthy, cluster
from test_real_gpu_checks import INLINE, suite

from gpuproof.plugin import monitoring_checks as mc
from gpuproof.plugin.fixtures import Checker, GpuproofWarning
from gpuproof.report.conformance import CHECKLISTS, anchor_matches, check_product, write_evidence
from gpuproof.results import RunDir

NODE = "gpu-0"
DRIVER_CLS = "suites.test_driver.TestAcceleratorDriverRuntimeManagement"
METRICS_CLS = "suites.test_monitoring.TestAcceleratorPerformanceMetrics"
ACCESS_CLS = "suites.test_access.TestSecureAcceleratorAccess"
OPERATORS_CLS = "suites.test_operators.TestRobustCRDControllerOperation"
# upstream anchor -> the suites' JUnit cases it names on node gpu-0, as pytest writes them
UPSTREAM = {
    **{f"TestSecureAcceleratorAccess/{sub}": [f"{ACCESS_CLS}::test_{sub}[{NODE}]"]
       for sub in ("PositiveAccessTest", "NegativeIsolationTest", "MultiContainerIsolationTest")},
    **{f"TestAcceleratorDriverRuntimeManagement/{sub}": [f"{DRIVER_CLS}::test_{sub}[{NODE}]"]
       for sub in ("VerifiableMechanismExposed", "DriverAndRuntimeCompatibility")},
    **{f"TestAcceleratorPerformanceMetrics/{sub}": [f"{METRICS_CLS}::test_{sub}[{NODE}]"]
       for sub in ("MetricsEndpointReachable", "PerAcceleratorUtilizationMetric", "PerAcceleratorMemoryMetric")},
    "TestAIServiceMetrics": [
        "suites.test_monitoring.TestAIServiceMetrics::test_inference_server_metrics_reach_prometheus"],
    **{f"TestGangScheduling/{sub}": [f"suites.test_gang.TestGangScheduling::test_{sub}"]
       for sub in ("Positive", "Negative")},
    **{f"TestRobustCRDControllerOperation/{sub}": [f"{OPERATORS_CLS}::test_{sub}"]
       for sub in ("OperatorPodsRunning", "CRDRegistered", "WebhookOperational", "WebhookRejectsInvalidCR",
                   "ControllerReconcilesCR")},
}
EXPORTER_TESTS = ("test_MetricsEndpointReachable", "test_PerAcceleratorUtilizationMetric",
                  "test_PerAcceleratorMemoryMetric", "test_exporter_names_the_node_on_its_series")


def junit_ids(module, file: str, node: str = NODE) -> dict:
    """JUnit id (``classname::name``, as pytest's junitxml writes it) -> the test, for every test of a suite module
    (its ``test_*`` functions and the ``test_*`` methods of its ``Test*`` classes), on one node."""
    out = {}

    def add(parts: list[str], fn) -> None:
        params = f"[{node}]" if "gpu_node" in inspect.signature(fn).parameters else ""
        names = mangle_test_address(f"suites/{file}::" + "::".join(parts) + params)
        out[".".join(names[:-1]) + "::" + names[-1]] = fn

    for name, obj in vars(module).items():
        if name.startswith("test_") and inspect.isfunction(obj):
            add([name], obj)
        elif name.startswith("Test") and inspect.isclass(obj):
            for meth in (m for m in vars(obj) if m.startswith("test_")):
                add([name, meth], getattr(obj(), meth))
    return out


def test_every_upstream_anchor_names_its_suites_cases_as_pytest_writes_them():
    ids = [i for f in ("access", "driver", "monitoring", "gang", "operators")
           for i in junit_ids(suite(f), f"test_{f}.py")]
    anchors = {a for reqs in CHECKLISTS.values() for r in reqs for p in r.parts for a in p.junit
               if not a.startswith("suites.")}
    assert anchors == set(UPSTREAM)
    for anchor, cases in UPSTREAM.items():
        assert [i for i in ids if anchor_matches(anchor, i)] == cases, anchor
    guards = {a: [i for i in ids if anchor_matches(a, i)] for r in CHECKLISTS["1.37"] for a in r.guard}
    assert guards["TestAcceleratorDriverRuntimeManagement"] == [
        c for a, cs in UPSTREAM.items() if a.startswith("TestAcceleratorDriverRuntimeManagement/") for c in cs]
    assert guards["TestAcceleratorPerformanceMetrics"] == [
        c for a, cs in UPSTREAM.items() if a.startswith("TestAcceleratorPerformanceMetrics/") for c in cs]
    # gpuproof's further access check is under the upstream name (its failure fails the requirement)
    assert f"{ACCESS_CLS}::test_EnvVarIsolationTest[{NODE}]" in guards["TestSecureAcceleratorAccess"]
    # the monitoring suite's own checks (host label, Prometheus' series, the numbers moving) answer to none
    own = [i for i in ids if i.startswith("suites.test_monitoring::")]
    assert [i.split("::")[1].split("[")[0] for i in own] == [
        "test_exporter_names_the_node_on_its_series", "test_prometheus_has_each_gpus_series_with_its_pod",
        "test_exporter_follows_the_work"]
    assert not [i for i in own for a in [*anchors, *guards] if anchor_matches(a, i)]


# ---------------------------------------------------------------------------- the suites' own cases, judged


class Run:
    """A run folder the suites' tests write to, as `gpuproof run` leaves it: checks.jsonl and junit.xml."""

    def __init__(self, root: Path):
        self.dir = RunDir.create(root, run_id="20261128-100000-abc123", target="kubeconfig:/kc#prod",
                                 cluster="prod-gpu", kubernetes_version="v1.37.1")
        self.cases: list[tuple[str, str, str, str]] = []

    def test(self, case_id: str, fn, feature: str, node, **fixtures) -> str:
        """One test as pytest runs it: its own Checker, its outcome from how it ends; the outcome."""
        checker = Checker(self.dir, feature, node, {node.name: node})
        given = {**fixtures, "check": checker, "gpu_node": node}
        try:
            fn(**{k: given[k] for k in inspect.signature(fn).parameters if k in given})
            checker.finish()
            outcome, message = "passed", ""
        except pytest.skip.Exception as exc:
            outcome, message = "skipped", str(exc)
        except pytest.fail.Exception as exc:
            outcome, message = "failed", str(exc)
        classname, _, name = case_id.partition("::")
        self.cases.append((classname, name, outcome, message))
        return outcome

    def done(self) -> Path:
        self.dir.close()
        write_junit(self.dir.path / "junit.xml", self.cases)
        return self.dir.path


def run_driver(run: Run, monkeypatch, node, result) -> dict:
    """The driver suite's tests on the node, the probe pod's output given; outcome by test name."""
    module = suite("driver")
    monkeypatch.setattr(module, "probe_on", lambda *a, **kw: [result])
    return {case.split("::")[1].split("[")[0]: run.test(case, fn, module.FEATURE, node, run=None, fanout=FANOUT,
                                                         target=SimpleNamespace(cluster=None), needs_real_gpus=None,
                                                         request=SimpleNamespace(node=None))
            for case, fn in junit_ids(module, "test_driver.py", node.name).items()}


def run_exporter(run: Run, node, api) -> dict:
    """The monitoring suite's exporter tests on the node, the pod proxy serving a recorded output; outcome by test."""
    module = suite("monitoring")
    exporters = mc.require_exporters(api)
    request = SimpleNamespace(node=None, getfixturevalue={"fanout": INLINE}.get)
    return {case.split("::")[1].split("[")[0]: run.test(case, fn, module.FEATURE, node, exporters=exporters,
                                                         target=SimpleNamespace(cluster=api), request=request,
                                                         needs_real_gpus=None)
            for case, fn in junit_ids(module, "test_monitoring.py", node.name).items()
            if case.split("::")[1].split("[")[0] in EXPORTER_TESTS}


def evidence(run_path: Path, where: Path, rid: str) -> tuple[dict, list[str]]:
    """The requirement as the evidence folder ``where``/ev has it (links file://ev/...), and the rules' problems."""
    ev = write_evidence(run_path, where / "ev", prefix="ev")
    return requirement(product(where / "ev"), rid), ev.problems


def driver_anchors(prefix: str = "ev") -> list[str]:
    return [f"file://{prefix}/junit.xml#TestAcceleratorDriverRuntimeManagement/{s}"
            for s in ("VerifiableMechanismExposed", "DriverAndRuntimeCompatibility")]


def metrics_anchors(prefix: str = "ev") -> list[str]:
    return [f"file://{prefix}/junit.xml#TestAcceleratorPerformanceMetrics/{s}"
            for s in ("MetricsEndpointReachable", "PerAcceleratorUtilizationMetric", "PerAcceleratorMemoryMetric")]


def test_the_driver_suites_cases_make_driver_runtime_management_implemented(tmp_path, monkeypatch):
    run = Run(tmp_path / "r")
    assert run_driver(run, monkeypatch, _node(), probe_result()) == {
        "test_VerifiableMechanismExposed": "passed", "test_DriverAndRuntimeCompatibility": "passed"}
    assert [c[:2] for c in run.cases] == [(DRIVER_CLS, f"test_VerifiableMechanismExposed[{NODE_40C}]"),
                                          (DRIVER_CLS, f"test_DriverAndRuntimeCompatibility[{NODE_40C}]")]
    drm, problems = evidence(run.done(), tmp_path / "out", "driver_runtime_management")
    assert drm["status"] == "Implemented", drm["notes"]
    assert drm["evidence"] == [*driver_anchors(), "file://ev/checks.log"]
    assert "VerifiableMechanismExposed passed (1 check passed on 1 target, 1 test passed); " \
           "DriverAndRuntimeCompatibility passed (2 checks passed on 1 target, 1 test passed)" in drm["notes"]
    assert not [p for p in problems if "driver_runtime_management" in p or "evidence" in p]


def test_a_run_whose_driver_check_failed_says_not_implemented(tmp_path, monkeypatch):
    """A node whose GFD driver label lies: DriverAndRuntimeCompatibility fails, and so does the requirement, naming
    the node, the label and the version NVML gives the pod; both cases are its evidence."""
    run = Run(tmp_path / "r")
    outcomes = run_driver(run, monkeypatch, _node({"nvidia.com/cuda.driver-version.full": "535.104.05"}),
                          probe_result())
    assert outcomes == {"test_VerifiableMechanismExposed": "passed", "test_DriverAndRuntimeCompatibility": "failed"}
    path = run.done()
    assert LIE in (path / "checks.jsonl").read_text()        # the record names the label and NVML's version in the pod
    drm, problems = evidence(path, tmp_path / "out", "driver_runtime_management")
    assert drm["status"] == "Not Implemented"
    assert drm["notes"].startswith("FAILED in gpuproof run 20261128-100000-abc123 (prod-gpu, Kubernetes v1.37.1)")
    assert f"DriverAndRuntimeCompatibility FAILED: {NODE_40C}: driver version in pod" in drm["notes"]
    assert f"{DRIVER_CLS}::test_DriverAndRuntimeCompatibility[{NODE_40C}]: {NODE_40C}: " in drm["notes"]
    assert "Not Implemented until the failure is fixed" in drm["notes"]
    assert drm["evidence"] == [*driver_anchors(), "file://ev/checks.log"]
    # a SHOULD may be Not Implemented; its anchors name cases of the junit.xml
    assert not [p for p in problems if "driver_runtime_management" in p]


def test_a_node_advertising_no_driver_leaves_driver_runtime_management_open(tmp_path, monkeypatch):
    run = Run(tmp_path / "r")
    with pytest.warns(GpuproofWarning, match="advertises neither its driver version"):
        outcomes = run_driver(run, monkeypatch, _node(drop=("nvidia.com/cuda.",), slices=False), probe_result())
    assert outcomes == {"test_VerifiableMechanismExposed": "skipped", "test_DriverAndRuntimeCompatibility": "skipped"}
    drm, _ = evidence(run.done(), tmp_path / "out", "driver_runtime_management")
    assert drm["status"] == "" and drm["evidence"] == []
    assert f"VerifiableMechanismExposed did not run ({NODE_40C} advertises no driver version; warning: " \
           f"{NODE_40C}: {NODE_40C} advertises neither" in drm["notes"]


def test_the_exporter_tests_judge_accelerator_metrics(tmp_path):
    run = Run(tmp_path / "ok")
    api = cluster(*_healthy(L4_NODE), "derived-4.9.0-dcgm47-names-busy.prom")
    assert set(run_exporter(run, L4_NODE, api).values()) == {"passed"}
    assert len(api.asked) == 1                      # one read of the node's /metrics for its four tests
    am, problems = evidence(run.done(), tmp_path / "ok-out", "accelerator_metrics")
    assert am["status"] == "Implemented", am["notes"]
    assert am["evidence"] == [*metrics_anchors(), "file://ev/checks.log"]
    assert "MetricsEndpointReachable passed (3 checks passed on 1 target, 1 test passed)" in am["notes"]
    assert not [p for p in problems if "accelerator_metrics" in p]


@pytest.mark.parametrize("case, outcomes, failed", [
    # labels empty: no GPU's series found (and no host): both per-GPU subtests fail
    ("labels-empty", ("passed", "failed", "failed", "failed"), "PerAcceleratorUtilizationMetric"),
    # no Ready exporter on the node: the endpoint fails, nothing else is judged
    ("exporter-not-ready", ("failed", "skipped", "skipped", "skipped"), "MetricsEndpointReachable"),
    # the exporter pod's name as the host label: gpuproof's own check, under no upstream name
    ("host-is-the-pod-name", ("passed", "passed", "passed", "failed"), None),
])
def test_a_failed_exporter_check_fails_accelerator_metrics_only_under_the_upstream_names(tmp_path, case, outcomes,
                                                                                         failed):
    node, (daemonsets, pods), served, _ = DCGM_FAULTS[case]
    run = Run(tmp_path / "r")
    assert tuple(run_exporter(run, node, cluster(daemonsets, pods, served)).values()) == outcomes
    am, problems = evidence(run.done(), tmp_path / "out", "accelerator_metrics")
    must = "spec.observability.accelerator_metrics: a MUST needs status Implemented, it is 'Not Implemented'"
    if failed:
        assert am["status"] == "Not Implemented", am["notes"]
        assert f"{failed} FAILED: {L4_HOST}: " in am["notes"] and f"{METRICS_CLS}::test_{failed}[{L4_HOST}]: " \
            in am["notes"] and must in problems
    else:
        assert am["status"] == "Implemented", am["notes"]


def test_the_anchors_exist_in_a_generated_product(tmp_path, monkeypatch):
    """One run of the access, driver and monitoring suites' upstream-named tests: every requirement they judge is
    Implemented, its evidence the cases' anchors and the log, and the rules find each anchor in the junit.xml."""
    run = Run(tmp_path / "reports")
    run_driver(run, monkeypatch, _node(), probe_result())
    run_exporter(run, L4_NODE, cluster(*_healthy(L4_NODE), "kops-l4-gpu-operator-idle.prom"))
    access, monitoring = suite("access"), suite("monitoring")
    for case in junit_ids(access, "test_access.py", NODE_40C):
        sub = case.split("::test_")[1].split("[")[0]
        run.test(case, lambda check, sub=sub: check.true(access.CHECKS[sub], True, "", "", target=NODE_40C),
                 "access", _node())
    (case, _), = [(c, f) for c, f in junit_ids(monitoring, "test_monitoring.py").items()
                  if c.startswith("suites.test_monitoring.TestAIServiceMetrics::")]
    run.test(case, lambda check: check.true("ai-service-metrics", True, "5", "5", target=NODE_40C), "monitoring",
             _node())
    out = tmp_path / "v1.37" / "acme"
    ev = write_evidence(run.done(), out, prefix="v1.37/acme")
    doc = product(out)
    anchors = {r: [e.split("#", 1)[1] for e in requirement(doc, r)["evidence"] if "#" in e]
               for r in ("secure_accelerator_access", "driver_runtime_management", "accelerator_metrics",
                         "ai_service_metrics")}
    assert anchors == {
        "secure_accelerator_access": [a for a in UPSTREAM if a.startswith("TestSecureAcceleratorAccess/")],
        "driver_runtime_management": [a for a in UPSTREAM if a.startswith("TestAcceleratorDriverRuntimeManagement/")],
        "accelerator_metrics": [a for a in UPSTREAM if a.startswith("TestAcceleratorPerformanceMetrics/")],
        "ai_service_metrics": ["TestAIServiceMetrics"]}
    assert {r: requirement(doc, r)["status"] for r in anchors} == dict.fromkeys(anchors, "Implemented")
    assert all(requirement(doc, r)["evidence"][-1] == "file://v1.37/acme/checks.log" for r in anchors)
    assert not [p for p in ev.problems if "evidence" in p or "PRODUCT.md" in p]
    assert check_product(out, root=tmp_path) == ev.problems
    untested = {r.id for r in CHECKLISTS["1.37"] if r.level == "MUST"} - set(anchors)
    assert {p.split(":")[0].rsplit(".", 1)[1] for p in ev.problems if p.startswith("spec.")} == untested

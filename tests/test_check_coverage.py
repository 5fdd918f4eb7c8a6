"""Every check the suites can fail has a test in which it fails.

The checks are read from ``suites/*.py``: each ``check.true(...)`` / ``check.equal(...)`` records a
pass or a fail under its first argument. The failing tests are the fault tables of gpuproof's own
tests (a cluster, or a suite run, with the fault; each row names the check, the node, the expected
and the actual value it must record). A new check without a row turns this test red; so does a row
for a check no suite records any more.

A check that cannot fail on the embedded cluster today is listed in ``WAITING`` with the reason and
the issue whose fleet will carry its fault test; once a table makes it fail, it must leave the list.

``python tests/test_check_coverage.py`` prints the count (CI's closing note).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITES = REPO / "suites"
JUDGING = ("true", "equal")          # Checker methods whose verdict can be "fail"

# check names a suite builds at run time: (suite file, the call's first argument) -> every name it takes
BUILT = {
    ("test_dra.py", "f'dra-cel-{key}'"): {"dra-cel-product", "dra-cel-memory", "dra-cel-compute"},
    ("test_mig.py", "name"): {"one-mig-device-per-pod", "mig-devices-distinct"},     # suite.mig_device_checks
    ("test_driver.py", "name"): {"driver-version-in-pod", "cuda-driver-version-in-pod"},        # test_driver.CHECKS
    ("test_access.py", "name"): {"access-granted-one-gpu", "access-ungranted-none", "access-envvar-none",
                                 "access-sibling-none"},                                       # test_access.CHECKS
    ("test_census.py", "v.check"): {"census-result", "census-matmul-pool", "census-matmul-datasheet",   # census.CHECKS
                                    "census-copy-pool", "census-copy-datasheet", "census-allreduce-pool"},
    ("test_fabric.py", "finding.check"): {"fabric-pair-result", "fabric-node", "fabric-link", "fabric-transport",
                                          "fabric-floor"},                              # fabric_checks.CHECKS
    ("test_monitoring.py", "f.check"): {"dcgm-metrics-parse", "dcgm-gpu-utilization", "dcgm-gpu-memory",
                                        "dcgm-host-label",                            # monitoring.CHECKS
                                        "prometheus-gpu-series", "prometheus-pod-label",      # and PROMETHEUS_CHECKS
                                        "ai-service-metrics",                                 # and SERVICE_CHECKS
                                        "dcgm-pod-attribution", "dcgm-utilization-moves"},    # and WORK_CHECKS
}

KUBELET_NODES = ("issue #28: real kubelet nodes over NVIDIA's mock NVML (the embedded cluster's kwok nodes run no "
                 "container)")
WAITING = {
    "dra-probe-uuid": f"{KUBELET_NODES}: passes on lab's DRA kubelet node (tests/test_bundle_lab.py); failing "
                      "needs a DRA driver that hands the pod another GPU than the claim's, not made yet",
    "dra-freed-claim-reused": "a claim that stays allocated after its pod is gone: kube-controller-manager's "
                              "resource-claim controller both makes the suite's claims and frees them, so the "
                              "embedded cluster cannot break one without the other (issue #28's kubelet nodes: "
                              "a DRA driver that never unprepares)",
}


def recordable_checks() -> dict[str, str]:
    """check name -> the suite file that can record a failure for it."""
    out = {}
    for path in sorted(SUITES.glob("test_*.py")):
        for call in ast.walk(ast.parse(path.read_text(), str(path))):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and isinstance(call.func.value, ast.Name) and call.func.value.id == "check"
                    and call.func.attr in JUDGING and call.args):
                continue
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names = {first.value}
            else:
                key = (path.name, ast.unparse(first))
                assert key in BUILT, f"{path.name}:{call.lineno}: a check named by {key[1]}: add it to BUILT"
                names = BUILT[key]
            out.update((n, path.name) for n in names)
    return out


def fault_tables() -> dict[str, dict]:
    """test id -> its table: case -> row whose last item lists (check, target, expected, actual, ...)."""
    sys.path.insert(0, str(Path(__file__).parent))
    import test_access_checks
    import test_access_kubelet
    import test_bench_checks
    import test_census_checks
    import test_dra
    import test_driver_checks
    import test_fabric_checks
    import test_gang
    import test_gang_kueue
    import test_kubelet_faults
    import test_monitoring
    import test_monitoring_prometheus
    import test_monitoring_service_prometheus
    import test_platform_kubelet
    import test_real_gpu_checks
    import test_real_shapes
    import test_suite_faults
    import test_suite_faults_more
    import test_topology

    return {
        "tests/test_suite_faults.py::test_check_fails_on_its_fault": test_suite_faults.CASES,
        "tests/test_suite_faults.py::test_check_fails_when_the_control_plane_lacks_the_feature":
            test_suite_faults.CONTROL_PLANE_CASES,
        "tests/test_suite_faults_more.py::test_check_fails_with_cluster_objects": test_suite_faults_more.OBJECT_CASES,
        "tests/test_suite_faults_more.py::test_check_fails_without_dynamic_resources":
            test_suite_faults_more.NO_DRA_CASES,
        "tests/test_dra.py::test_dra_check_fails_on_its_fault": test_dra.DRA_FAULTS,
        "tests/test_driver_checks.py::test_driver_check_fails_on_its_fault": test_driver_checks.FAULTS,
        "tests/test_access_checks.py::test_access_check_fails_on_its_fault": test_access_checks.FAULTS,
        "tests/test_access_kubelet.py::test_access_suite_on_kubelet_nodes_and_the_toolkits_own_fault":
            test_access_kubelet.FAULTS,
        "tests/test_census_checks.py::test_census_check_fails_on_its_fault": test_census_checks.FAULTS,
        "tests/test_fabric_checks.py::test_fabric_check_fails_on_its_fault": test_fabric_checks.CASES,
        "tests/test_gang.py::test_gang_check_fails_on_its_fault": test_gang.FAULTS,
        "tests/test_gang_kueue.py::test_kueue_holds_the_oversized_gang_and_stopped_lets_its_pods_bind":
            test_gang_kueue.FAULTS,
        "tests/test_bench_checks.py::test_bench_check_fails_on_its_fault": test_bench_checks.RUNS,
        "tests/test_real_gpu_checks.py::test_real_gpu_check_fails_on_its_fault": test_real_gpu_checks.RUNS,
        "tests/test_real_shapes.py::test_each_fault_fails_its_check_by_name": test_real_shapes.FAULTS,
        "tests/test_topology.py::test_a_fragmented_set_fails_naming_node_expected_actual": test_topology.FAULTS,
        "tests/test_kubelet_faults.py::test_the_node_fault_fails_its_check_and_the_healthy_node_passes":
            test_kubelet_faults.FAULTS,
        "tests/test_monitoring.py::test_monitoring_check_fails_on_its_fault": test_monitoring.FAULTS,
        "tests/test_monitoring.py::test_work_check_fails_on_its_fault": test_monitoring.WORK_FAULTS,
        "tests/test_monitoring_prometheus.py::test_the_suites_prometheus_check_fails_on_its_fault":
            test_monitoring_prometheus.FAULTS,
        "tests/test_monitoring_service_prometheus.py::test_the_suites_service_check_fails_on_its_fault":
            test_monitoring_service_prometheus.SUITE_FAULTS,
        "tests/test_platform_kubelet.py::test_the_operators_pass_as_installed_and_fail_on_their_faults":
            test_platform_kubelet.FAULTS,
    }


def failing_tests() -> dict[str, list[str]]:
    """check name -> the test cases in which it fails."""
    out: dict[str, list[str]] = {}
    for test, table in fault_tables().items():
        for case, row in table.items():
            for expectation in row[-1]:
                out.setdefault(expectation[0], []).append(f"{test}[{case}]")
    return out


def coverage() -> tuple[dict[str, str], dict[str, list[str]]]:
    return recordable_checks(), failing_tests()


def test_the_suites_record_about_ninety_checks():
    checks = recordable_checks()
    assert len(checks) >= 85, sorted(checks)
    assert {"capacity-matches-count", "dra-cel-memory", "mig-devices-distinct", "foreign-pods-untouched"} <= set(checks)


def test_every_check_fails_in_some_test():
    checks, failing = coverage()
    untested = sorted(set(checks) - set(failing) - set(WAITING))
    assert untested == [], ("checks no test makes fail; add a fault case (tests/test_suite_faults*.py) or, if the "
                            "embedded cluster cannot make the fault, a WAITING entry with the issue that will: "
                            + ", ".join(f"{c} ({checks[c]})" for c in untested))


def test_waiting_checks_still_wait():
    checks, failing = coverage()
    assert sorted(set(WAITING) - set(checks)) == [], "WAITING names checks no suite records"
    done = {c: failing[c] for c in WAITING if c in failing}
    assert done == {}, f"these now fail in a test: drop them from WAITING: {done}"


def test_fault_tables_name_real_checks():
    checks, failing = coverage()
    stale = {c: tests for c, tests in failing.items() if c not in checks}
    assert stale == {}, f"fault cases expect checks no suite records: {stale}"


def main() -> int:
    checks, failing = coverage()
    tested = sorted(c for c in checks if c in failing)
    untested = sorted(set(checks) - set(failing) - set(WAITING))
    print(f"[ci] checks with a failing test: {len(tested)}/{len(checks)}; waiting for a fleet that can make the "
          f"fault: {len(WAITING)} ({', '.join(sorted(WAITING))}); untested: {len(untested)}"
          + (f" ({', '.join(untested)})" if untested else ""))
    return 1 if untested else 0


if __name__ == "__main__":
    sys.exit(main())

"""Every acceptance check fails on a cluster that has the fault it looks for.

Each case takes the healthy mixed fleet, breaks one thing (a node's capacity, a label,
a taint, a control-plane feature), runs the suite exactly as a user would (a pytest
subprocess against the embedded cluster's kubeconfig) and asserts that:

- the suite exits 1,
- the run's checks.jsonl holds a failed record for that check on that node, with the
  expected and actual values,
- the failure message a person reads names the node, the expected and the actual value.

The healthy fleet passes every suite (first test), so each failure is the fault's doing.
"""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from gpuproof.fleet import resolve_fleet_path

pytestmark = pytest.mark.sim

L4_POOL = "g6.4xlarge"           # the l4-shared pool's instance type = its pool name in discovery
REFUSES = f"--shared-requests-refused={L4_POOL}"


def mixed() -> dict:
    return yaml.safe_load(resolve_fleet_path("mixed").read_text())


def pool(fleet: dict, name: str) -> dict:
    return next(p for p in fleet["pools"] if p["name"] == name)


def with_fault(pool_name: str, **fault) -> dict:
    fleet = mixed()
    fleet["name"] = f"fault-{pool_name}"
    pool(fleet, pool_name).setdefault("faults", []).append(fault)
    return fleet


def untainted_a100() -> dict:
    fleet = mixed()
    pool(fleet, "a100")["taints"] = []
    return fleet


def l4_without_fail_requests() -> dict:
    fleet = mixed()
    pool(fleet, "l4-shared")["timeSlicing"] = {"replicas": 4}
    return fleet


def renamed_l4_with_zero_shared() -> dict:
    fleet = mixed()
    pool(fleet, "l4-shared")["timeSlicing"] = {"replicas": 4, "renameByDefault": True}
    pool(fleet, "l4-shared")["faults"] = [{"setCapacity": {"nvidia.com/gpu.shared": "0"},
                                          "setAllocatable": {"nvidia.com/gpu.shared": "0"}}]
    return fleet


H100_PROFILES = "['1g.10gb', '1g.20gb', '2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb']"
ANY = None          # the failed record must exist; its expected/actual are not compared

# id: (fleet, suite files, extra args, [(check, target, expected, actual), ...] that must fail)
CASES = {
    "capacity-differs-from-count": (
        with_fault("a100", node=1, setCapacity={"nvidia.com/gpu": "4"}), ["test_advertisement.py"], [],
        [("capacity-matches-count", "a100-1", "8", "4")]),
    "allocatable-missing": (
        with_fault("a100", node=0, dropAllocatable=["nvidia.com/gpu"]), ["test_advertisement.py"], [],
        [("allocatable-matches-count", "a100-0", "8", "")]),
    "mixed-products-in-pool": (
        with_fault("a100", node=1, setLabels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
        ["test_labels.py"], [], [("pool-uniform", "a100-1", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-40GB")]),
    "untainted-gpu-node-strict": (
        untainted_a100(), ["test_taints.py"], ["--strict-taints", "-k", "is_tainted"],
        [("gpu-node-tainted", "a100-0", "a NoSchedule or NoExecute taint (e.g. nvidia.com/gpu=present:NoSchedule)",
          "no taints")]),
    "product-label-missing": (
        with_fault("l4-shared", dropLabels=["nvidia.com/gpu.product"]), ["test_labels.py"], [],
        [("label-present", "l4-shared-0", "nvidia.com/gpu.product (a product name)", "")]),
    "replicas-label-disagrees-with-capacity": (
        with_fault("l4-shared", setLabels={"nvidia.com/gpu.replicas": "2"}), ["test_advertisement.py"], [],
        [("capacity-matches-count", "l4-shared-0", "2", "4")]),
    "shared-capacity-below-replicas": (
        with_fault("l4-shared", setCapacity={"nvidia.com/gpu": "2"}, setAllocatable={"nvidia.com/gpu": "2"}),
        ["test_timeslicing.py"], [REFUSES, "-k", "co_run or capacity"],
        [("co-running-peak", "l4-shared-0", "4", "2"), ("shared-allocatable", "l4-shared-0", "4", "2")]),
    "shared-suffix-missing": (
        with_fault("l4-shared", setLabels={"nvidia.com/gpu.product": "NVIDIA-L4"}),
        ["test_timeslicing.py", "test_labels.py"], [REFUSES, "-k", "product or suffix"],
        [("shared-product-suffix", "l4-shared-0", "product ending in -SHARED", "NVIDIA-L4"),
         ("shared-suffix", "l4-shared-0", "a product ending in -SHARED (time-sliced, not renamed)", "NVIDIA-L4")]),
    "request-for-two-not-refused": (
        l4_without_fail_requests(), ["test_timeslicing.py"], [REFUSES, "-k", "two"],
        [("shared-request-gt1-refused", "l4-shared-0", "Failed: UnexpectedAdmissionError (failRequestsGreaterThanOne)",
          "running on l4-shared-0")]),
    "request-for-two-refused-unexpectedly": (
        mixed(), ["test_timeslicing.py"], ["--shared-requests-refused=none-of-them", "-k", "two"],
        [("shared-request-gt1-allowed", "l4-shared-0", "running on l4-shared-0", ANY)]),
    "one-more-pod-admitted": (
        with_fault("l4-shared", setCapacity={"nvidia.com/gpu": "5"}, setAllocatable={"nvidia.com/gpu": "5"}),
        ["test_timeslicing.py"], [REFUSES, "-k", "co_run"],
        [("one-more-waits", "l4-shared-0", "Pending: Insufficient nvidia.com/gpu", "running on l4-shared-0")]),
    "mig-count-label-disagrees": (
        with_fault("h100-mig", setLabels={"nvidia.com/mig-1g.10gb.count": "21"}), ["test_mig.py"], [],
        [("mig-capacity-matches-count", "h100-mig-0", "21", "24"),
         ("mig-allocatable-matches-count", "h100-mig-0", "21", "24")]),
    "mig-wrong-profile-name": (
        with_fault("h100-mig", dropCapacity=["nvidia.com/mig-1g.10gb"], dropAllocatable=["nvidia.com/mig-1g.10gb"],
                   setCapacity={"nvidia.com/mig-1g.5gb": "24"}, setAllocatable={"nvidia.com/mig-1g.5gb": "24"}),
        ["test_mig.py", "test_advertisement.py"], [],
        [("mig-profile-known", "h100-mig-0", f"a NVIDIA-H100-80GB-HBM3 profile: {H100_PROFILES}",
          "nvidia.com/mig-1g.5gb"),
         ("mig-profile-valid", "h100-mig-0", f"one of {H100_PROFILES}", "nvidia.com/mig-1g.5gb")]),
    "mig-node-advertises-no-mig": (
        with_fault("h100-mig", dropCapacity=["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"],
                   dropAllocatable=["nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb"]),
        ["test_advertisement.py"], ["-k", "strategy"],
        [("mig-resources-present", "h100-mig-0", "nvidia.com/mig-<profile> resources", ANY)]),
    "mig-profile-not-allocatable": (
        with_fault("h100-mig", setAllocatable={"nvidia.com/mig-2g.20gb": "0"}), ["test_mig.py"], ["-k", "land_only"],
        [("mig-placement", "profile/2g.20gb", "running on one of ['h100-mig-0']", ANY)]),
    "bogus-mig-profile-advertised": (
        # two slices: the placement loop takes one itself, the "absent" profile pod must find none
        with_fault("h100-mig", setCapacity={"nvidia.com/mig-7g.999gb": "2"},
                   setAllocatable={"nvidia.com/mig-7g.999gb": "2"}), ["test_mig.py"], ["-k", "land_only"],
        [("mig-absent-profile-waits", "cluster", "Pending: no node has nvidia.com/mig-7g.999gb",
          "running on h100-mig-0")]),
    "mixed-mig-node-advertises-whole-gpus": (
        with_fault("h100-mig", setCapacity={"nvidia.com/gpu": "8"}, setAllocatable={"nvidia.com/gpu": "8"}),
        ["test_advertisement.py"], [], [("no-whole-gpus-under-mixed-mig", "h100-mig-0", "0", "8")]),
    "non-mig-node-advertises-mig": (
        with_fault("a100", node=0, setCapacity={"nvidia.com/mig-1g.10gb": "7"}),
        ["test_advertisement.py"], [], [("no-mig-resources", "a100-0", "[]", '["nvidia.com/mig-1g.10gb"]')]),
    "unshared-node-advertises-shared": (
        with_fault("a100", node=0, setCapacity={"nvidia.com/gpu.shared": "8"}),
        ["test_advertisement.py"], [], [("no-shared-resource", "a100-0", "", "8")]),
    "renamed-node-advertises-no-shared": (
        renamed_l4_with_zero_shared(), ["test_advertisement.py"], [],
        [("shared-resource-name", "l4-shared-0", "GPUs advertised as nvidia.com/gpu", ANY)]),
    "mig-single-product-suffix-missing": (
        with_fault("a100-mig-single", setLabels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}),
        ["test_mig.py", "test_labels.py"], [],
        [("mig-single-product", "a100-mig-single-0", "<product>-MIG-<profile of that product>",
          "NVIDIA-A100-SXM4-40GB"),
         ("mig-single-suffix", "a100-mig-single-0", "a product with -MIG-<profile>", "NVIDIA-A100-SXM4-40GB")]),
    "mig-single-count-disagrees": (
        with_fault("a100-mig-single", setAllocatable={"nvidia.com/gpu": "7"}), ["test_mig.py"], [],
        [("mig-single-count", "a100-mig-single-0", "14", "7")]),
    "driver-label-malformed": (
        with_fault("a100", node=0, setLabels={"nvidia.com/cuda.driver-version.full": "550.x"}),
        ["test_labels.py"], [], [("label-well-formed", "a100-0", "a driver version such as 550.54.15", "550.x")]),
    "driver-label-parts-disagree": (
        with_fault("a100", node=0, setLabels={"nvidia.com/cuda.driver-version.minor": "99"}),
        ["test_labels.py"], [], [("driver-version-consistent", "a100-0", "550.54", "550.99")]),
    "gpu-node-full": (   # advertised but unusable: no allocatable GPUs left on the L4 node
        with_fault("l4-shared", setAllocatable={"nvidia.com/gpu": "0"}),
        ["test_taints.py", "test_affinity.py"], ["-k", "tolerating or selector or required"],
        [("tolerating-gpu-pod-lands", "l4-shared-0", "running on l4-shared-0", ANY),
         ("node-selector-product", "product/NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED", ANY),
         ("required-affinity-product", "product/NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED", ANY)]),
}


def test_healthy_mixed_fleet_passes_every_suite(embedded, tmp_path):
    res = embedded.run_suite("suites", "-m", "not bench", REFUSES, report_dir=tmp_path, run_id="healthy")
    assert res.code == 0, res
    assert res.failed_checks() == []
    verdicts = {c["verdict"] for c in res.checks}
    assert verdicts == {"pass", "skip"} or verdicts == {"pass"}, res.checks


@pytest.mark.parametrize("case", list(CASES))
def test_check_fails_on_its_fault(embedded, tmp_path, case):
    fleet, suites, extra, expectations = CASES[case]
    with embedded.fleet_loaded(copy.deepcopy(fleet)):
        res = embedded.run_suite(*[f"suites/{s}" for s in suites], *extra, report_dir=tmp_path, run_id=case)
    assert res.code == 1, res
    for check, node, expected, actual in expectations:
        failed = [c for c in res.failed_checks(check) if c["target"] == node]
        assert failed, f"no failed {check} record for {node}; failures: " + json.dumps(res.failed_checks(), indent=1)
        rec = failed[0]
        if expected is not None:
            assert rec["expected"] == expected, rec
        if actual is not None:
            assert rec["actual"] == actual, rec
        # what a person reads: node, expected and actual in the pytest failure message
        want_expected = f"expected {_shown(expected)}" if expected is not None else "expected "
        want_actual = f"actual {_shown(actual)}" if actual is not None else "actual "
        assert any(ln.startswith(f"{node}:") and want_expected in ln and want_actual in ln
                   for ln in res.output.splitlines()), res.output[-3000:]


def _shown(value: str) -> str:
    """How the failure message prints a recorded value: missing, numbers and lists bare, strings quoted."""
    if value in ("", "(missing)"):
        return "(missing)"
    try:
        parsed = json.loads(value)
    except ValueError:
        return repr(value)
    # the checks' numbers are whole; a "550.54" is a version string, printed quoted
    return str(parsed) if isinstance(parsed, (int, list, dict)) and not isinstance(parsed, bool) else repr(value)


def test_untainted_node_is_only_a_warning_by_default(embedded, tmp_path):
    with embedded.fleet_loaded(untainted_a100()):
        res = embedded.run_suite("suites/test_taints.py", "-k", "is_tainted", report_dir=tmp_path, run_id="warn")
    assert res.code == 0, res
    warned = [c for c in res.checks if c["verdict"] == "warn"]
    assert {c["target"] for c in warned} == {"a100-0", "a100-1"}
    assert "GPU node has no NoSchedule/NoExecute taint" in res.output


# ---------------------------------------------------------------- control-plane faults

CONTROL_PLANE_CASES = {
    # the API server does not enforce quotas / limit ranges
    "quota-not-enforced": ({"disableAdmissionPlugins": ["ResourceQuota"]}, "test_quota.py", "resource_quota",
                           "quota-refuses-over", "accepted"),
    "limitrange-not-enforced": ({"disableAdmissionPlugins": ["LimitRanger"]}, "test_quota.py", "limit_range",
                                "limitrange-refuses-over", "accepted"),
    # the scheduler cannot preempt
    "no-preemption": ({"disableSchedulerPlugins": ["DefaultPreemption"]}, "test_preemption.py", "",
                      "preemptor-lands", "unschedulable"),
    # the scheduler ignores taints
    "taints-ignored": ({"disableSchedulerPlugins": ["TaintToleration"]}, "test_taints.py", "without_toleration",
                       "untolerating-pod-kept-off", "running on"),
    # the scheduler ignores node affinity
    "affinity-ignored": ({"disableSchedulerPlugins": ["NodeAffinity"]}, "test_affinity.py", "memory",
                         "memory-gt-none", "running on"),
}


@pytest.mark.parametrize("case", list(CONTROL_PLANE_CASES))
def test_check_fails_when_the_control_plane_lacks_the_feature(tmp_path, case):
    from gpuproof.fleet import parse_fleet
    from gpuproof.sim.controlplane import SimCluster, find_free_base

    from conftest import EmbeddedCluster

    control_plane, suite, keyword, check, actual_prefix = CONTROL_PLANE_CASES[case]
    fleet = mixed()
    fleet["controlPlane"] = control_plane
    sim = SimCluster(tmp_path / "sim", base_port=find_free_base(), private=True)
    sim.up(parse_fleet(fleet, source=f"test:{case}"))
    try:
        res = EmbeddedCluster(sim).run_suite(f"suites/{suite}", *(["-k", keyword] if keyword else []),
                                             report_dir=tmp_path / "reports", run_id=case)
    finally:
        sim.down()
    assert res.code == 1, res
    failed = res.failed_checks(check)
    assert failed, json.dumps(res.failed_checks(), indent=1)
    assert failed[0]["actual"].startswith(actual_prefix), failed[0]
    assert f"actual '{actual_prefix}" in res.output or f'actual "{actual_prefix}' in res.output, res.output[-3000:]

"""Checks failing on faults a fleet file cannot describe.

- cluster objects: an admission policy that refuses GPU pods (quota and limit-range checks), a
  DeviceClass selecting the other device type (DRA), and the two situations the preemption suite's
  guards exist for (tests/plugin_preemption_faults.py);
- a control plane whose scheduler does not allocate DRA claims (the DRA suite's scheduling checks).

Each case runs the suites as a user does and asserts, as tests/test_suite_faults.py does, the failed
record (target, expected, actual) and the message a person reads.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpuproof.discovery import dra
from gpuproof.bench.base import wait_until
from gpuproof.cluster.api import RUN_LABEL, watch_until
from gpuproof.sim.fleet_file import resolve_fleet_path
from test_suite_faults import assert_failed, mixed, run_on_control_plane

pytestmark = pytest.mark.sim

ADMISSION = ("admissionregistration.k8s.io", "v1")
POLICY = "fault-no-gpu-pods"
REFUSED = (f"refused (HTTP 422): pods \"{{pod}}\" is forbidden: ValidatingAdmissionPolicy '{POLICY}' with binding "
           f"'{POLICY}' denied request: this namespace takes no GPU pods")


def dra_fleet() -> dict:
    return yaml.safe_load(resolve_fleet_path("dra").read_text())


# ---------------------------------------------------------------------------- faults made with cluster objects


@contextlib.contextmanager
def policy_refusing_gpu_pods(cluster, run_id: str):
    """A ValidatingAdmissionPolicy (as a policy engine would install) refusing GPU pods in the run's namespaces."""
    custom = cluster.client.custom
    policy = {"apiVersion": "/".join(ADMISSION), "kind": "ValidatingAdmissionPolicy", "metadata": {"name": POLICY},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE"], "resources": ["pods"]}]},
                       "validations": [{"expression": "!object.spec.containers.exists(c, has(c.resources.limits) "
                                                      "&& 'nvidia.com/gpu' in c.resources.limits)",
                                        "message": "this namespace takes no GPU pods"}]}}
    binding = {"apiVersion": "/".join(ADMISSION), "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": POLICY},
               "spec": {"policyName": POLICY, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {RUN_LABEL: run_id}}}}}
    custom.create_cluster_custom_object(*ADMISSION, "validatingadmissionpolicies", policy)
    custom.create_cluster_custom_object(*ADMISSION, "validatingadmissionpolicybindings", binding)
    probe_ns = f"fault-probe-{run_id}"[:63]
    cluster.client.core.create_namespace({"metadata": {"name": probe_ns, "labels": {RUN_LABEL: run_id}}})
    try:
        # the API server enforces a new policy once its informers have it: probe with a dry-run GPU pod
        gpu_pod = {"metadata": {"name": "probe"}, "spec": {"containers": [
            {"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        wait_until(lambda: _refused(cluster.client.core, probe_ns, gpu_pod), 60, f"policy {POLICY} to be enforced")
        yield []
    finally:
        with contextlib.suppress(ApiException):
            cluster.client.core.delete_namespace(probe_ns)
        for plural in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(*ADMISSION, plural, POLICY)


def _refused(core, namespace: str, pod: dict) -> bool:
    try:
        core.create_namespaced_pod(namespace, pod, dry_run="All")
    except ApiException as exc:
        return POLICY in (exc.body or "")
    return False


@contextlib.contextmanager
def gpu_class_selecting_mig(cluster, run_id: str):
    """NVIDIA's gpu.nvidia.com DeviceClass edited to select MIG devices (the fleet's next load restores it)."""
    selector = f"device.driver == '{dra.DRIVER}' && device.attributes['{dra.DRIVER}'].type == 'mig'"
    cluster.client.custom.patch_cluster_custom_object(dra.GROUP, dra.VERSION, "deviceclasses", dra.GPU_CLASS,
                                                      {"spec": {"selectors": [{"cel": {"expression": selector}}]}})
    yield []


@contextlib.contextmanager
def foreign_victim_and_never_policy_dropped(cluster, run_id: str):
    """tests/plugin_preemption_faults.py in the suite's session; what it made is gone before the next test."""
    from plugin_preemption_faults import NS, PRIORITY

    try:
        yield ["-p", "tests.plugin_preemption_faults"]
    finally:
        core = cluster.client.core
        with contextlib.suppress(ApiException):
            core.delete_namespace(NS)
        with contextlib.suppress(ApiException):
            cluster.client.scheduling.delete_priority_class(PRIORITY)
        watch_until(core.list_namespace, lambda c: NS not in c, 120, f"namespace {NS} to be deleted")


# id: (fleet, the fault (a context manager giving extra pytest args), suite args, [(check, target, expected, actual)])
OBJECT_CASES = {
    "policy-refuses-gpu-pods": (
        mixed(), policy_refusing_gpu_pods, ["suites/test_quota.py"],
        [("quota-admits-within", "namespace/gpuproof-policy-refuses-gpu-pods-quota", '["accepted", "accepted"]',
          json.dumps([REFUSED.format(pod="gpu-0"), REFUSED.format(pod="gpu-1")])),
         ("quota-refuses-over", "namespace/gpuproof-policy-refuses-gpu-pods-quota", "refused: exceeded quota",
          REFUSED.format(pod="gpu-2")),
         ("limitrange-admits-max", "namespace/gpuproof-policy-refuses-gpu-pods-limits", "accepted",
          REFUSED.format(pod="one"))]),
    "gpu-deviceclass-selects-mig": (
        dra_fleet(), gpu_class_selecting_mig, ["suites/test_dra.py", "-k", "classes"],
        [("dra-deviceclass-selector", "deviceclass/gpu.nvidia.com", "gpu", "mig"),
         ("dra-deviceclass", "type/gpu", "a DeviceClass selecting gpu.nvidia.com devices of type 'gpu' "
          "(NVIDIA's chart: gpu.nvidia.com)", "none among ['gpu.nvidia.com', 'mig.nvidia.com']")]),
    "foreign-pod-preempted-never-pod-preempts": (
        mixed(), foreign_victim_and_never_policy_dropped, ["suites/test_preemption.py"],
        [("foreign-pods-untouched", "cluster", "[]", '["fault-foreign/foreign-0"]'),
         ("never-policy-no-victims", "l4-shared-0", "[]",
          re.compile(r'\["gpuproof-foreign-pod-preempted-never-pod-preempts/low-[123]"\]'))]),
}


@pytest.mark.parametrize("case", list(OBJECT_CASES))
def test_check_fails_with_cluster_objects(embedded, tmp_path, case):
    fleet, fault, args, expectations = OBJECT_CASES[case]
    with embedded.fleet_loaded(copy.deepcopy(fleet)), fault(embedded, case) as extra:
        res = embedded.run_suite(*args, *extra, report_dir=tmp_path, run_id=case)
    assert_failed(res, expectations)


# ---------------------------------------------------------------------------- a scheduler that allocates no claim

DRA_NODE = "(h100-dra-0|h100-dra-1|a100-mig-dra-0|l40s-both-0|l4-device-plugin-0|cpu-0)"
NO_CLAIM = (r"claim from [-a-z0-9]+: not allocated \(none made for the pod yet\)|claim [-a-z0-9]+: not allocated|"
            r"no claims")     # bound before the claim controller made its claim, or after


def placed_unallocated() -> re.Pattern:
    """Running on whichever node the scheduler chose, its claims never allocated."""
    return re.compile(f"running on {DRA_NODE}; ({NO_CLAIM})")


NO_DRA_CASES = {
    "dynamic-resources-off": (
        {"disableSchedulerPlugins": ["DynamicResources"]}, ["suites/test_dra.py"],
        [("dra-claim-allocated", "product/NVIDIA-H100-80GB-HBM3",
          "Running, 1 NVIDIA H100 80GB HBM3 allocated on the pod's node", placed_unallocated()),
         ("dra-unsatisfiable-waits", "cluster", "Pending, the scheduler saying it cannot allocate the claim",
          re.compile(f"running on {DRA_NODE}")),
         ("dra-mig-absent-waits", "cluster", "Pending: no node publishes that profile",
          re.compile(f"running on {DRA_NODE}")),
         ("dra-exhaust", "l40s-both-0", "4 Running (the node's free devices), 1 Pending",
          "5 Running, 0 Pending (" + "; ".join(["running on l40s-both-0"] * 5) + ")"),
         ("dra-cel-product", "selector/product", "Running on a device with productName == NVIDIA H100 80GB HBM3",
          placed_unallocated()),
         ("dra-cel-memory", "selector/memory", "Running on a device with memory >= 81559Mi", placed_unallocated()),
         ("dra-cel-compute", "selector/compute", "Running on a device with cudaComputeCapability >= 9.0.0",
          placed_unallocated()),
         ("dra-shared-claim", "cluster", "both pods Running on one node, one device, reserved for both",
          re.compile(f"running on {DRA_NODE}; running on {DRA_NODE}; claim shared-gpu: not allocated; "
                     r"reserved for \[\]")),
         ("dra-template-distinct", "cluster", "4 pods Running on 4 distinct devices", "4 Running, devices []"),
         ("dra-match-attribute", "cluster", "Running with 2 devices on its node, one gpu.nvidia.com/productName",
          placed_unallocated())]),
}


@pytest.mark.parametrize("case", list(NO_DRA_CASES))
def test_check_fails_without_dynamic_resources(tmp_path, case):
    control_plane, args, expectations = NO_DRA_CASES[case]
    assert_failed(run_on_control_plane(dra_fleet(), control_plane, args, tmp_path, case), expectations)

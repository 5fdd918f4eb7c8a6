"""Every acceptance check fails on a cluster that has the fault it looks for.

Each case takes the healthy mixed fleet, breaks one thing (a node's capacity, a label,
a taint, a control-plane feature), runs the suite exactly as a user would (a pytest
subprocess against the embedded cluster's kubeconfig) and asserts that:

- the suite exits 1,
- the run's checks.jsonl holds a failed record for that check on that node (or pool, product,
  namespace, cluster), with exactly the expected and actual values of the table; where the actual
  value holds what cannot be known in advance (which node the scheduler picked when it ignored a
  rule, the age of a timestamp) the table gives a pattern the whole value must match,
- the failure message a person reads names the node, the expected and the actual value.

The healthy fleets pass every suite by name (tests/healthy_runs.py: the checks that must pass,
the skips allowed and why), so each failure is the fault's doing. tests/test_check_coverage.py
holds every check the suites record to a row of a table here (or of tests/test_suite_faults_more.py,
tests/test_dra.py, tests/test_real_gpu_checks.py).
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from gpuproof.sim.fleet_file import resolve_fleet_path
from healthy_runs import MANAGED, MIXED, assert_healthy

pytestmark = pytest.mark.sim

L4_POOL = "g6.4xlarge"           # the l4-shared pool's instance type = its pool name in discovery
REFUSES = f"--shared-requests-refused={L4_POOL}"


def mixed() -> dict:
    return yaml.safe_load(resolve_fleet_path("mixed").read_text())


def pool(fleet: dict, name: str) -> dict:
    return next(p for p in fleet["pools"] if p["name"] == name)


def managed() -> dict:
    return yaml.safe_load(resolve_fleet_path("managed").read_text())


def with_fault(pool_name: str, base=mixed, **fault) -> dict:
    return with_faults(base, (pool_name, fault))


def with_faults(base=mixed, *faults: tuple[str, dict]) -> dict:
    """The fleet with each (pool, fault) applied: several faults a run judges apart, in one fleet."""
    fleet = base()
    fleet["name"] = "fault-" + "-".join(sorted({p for p, _ in faults}))
    for pool_name, fault in faults:
        pool(fleet, pool_name).setdefault("faults", []).append(fault)
    return fleet


def managed_fault(pool_name: str, **fault) -> dict:
    return with_fault(pool_name, base=managed, **fault)


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


def cpu_only() -> dict:
    return {"name": "cpu-only", "pools": [{"name": "cpu", "count": 2}]}


H100_PROFILES = "['1g.10gb', '1g.20gb', '2g.20gb', '3g.40gb', '4g.40gb', '7g.80gb']"
ANY_NODE = "(a100-0|a100-1|a100-mig-single-0|h100-mig-0|l4-shared-0|cpu-0)"


NOT_HELPFUL = "6 Preemption is not helpful for scheduling"
OTHER_NODES = "5 node(s) didn't match Pod's node affinity/selector"


def unschedulable(*reasons: str, preemption: str | None = NOT_HELPFUL) -> str:
    """What the suites record for a pod no node of the mixed fleet (6 nodes) takes: the scheduler's message
    (``preemption=None``: a scheduler that cannot preempt says nothing about it)."""
    return (f"unschedulable: 0/6 nodes are available: {', '.join(reasons)}. no new claims to deallocate"
            + (f", preemption: 0/6 nodes are available: {preemption}." if preemption else ""))


def running_anywhere() -> re.Pattern:
    """'running on <a node>' where the scheduler, ignoring the rule under test, could put the pod anywhere."""
    return re.compile(f"running on {ANY_NODE}")

# id: (fleet, suite files, extra args, [(check, target, expected, actual), ...] that must fail)
CASES = {
    "capacity-differs-from-count": (     # and, on the other node, GFD's count label gone
        with_faults(mixed, ("a100", {"node": 1, "setCapacity": {"nvidia.com/gpu": "4"}}),
                    ("a100", {"node": 0, "dropLabels": ["nvidia.com/gpu.count"]})), ["test_advertisement.py"], [],
        [("capacity-matches-count", "a100-1", "8", "4"),
         ("count-label-present", "a100-0", "nvidia.com/gpu.count label", "")]),
    "no-gpu-nodes": (cpu_only(), ["test_discovery.py"], [],
                     [("gpu-nodes-present", "cluster", "at least 1 GPU node", "0 GPU nodes among 2")]),
    "pod-limit-below-free-gpus": (       # the nodes' pod limits, not their GPUs, decide where pods go
        with_faults(mixed, ("a100", {"setAllocatable": {"pods": "0"}}),
                    ("l4-shared", {"setAllocatable": {"pods": "2"}}),
                    ("a100-mig-single", {"setAllocatable": {"pods": "2"}})),
        ["test_affinity.py"], ["-k", "preferred or memory"],
        [("preferred-while-room", "product/NVIDIA-L4-SHARED", '["NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED", '
          '"NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED"]', '["NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED", '
          '"NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"]'),
         ("preferred-falls-back", "product/NVIDIA-L4-SHARED", "another GPU product once the preferred one is full",
          unschedulable("2 Insufficient nvidia.com/gpu", "4 Too many pods", preemption=(
              "2 Preemption is not helpful for scheduling, 4 No preemption victims found for incoming pod"))),
         ("memory-gt", "cluster", "a node with nvidia.com/gpu.memory > 81559",
          unschedulable("2 Too many pods", "4 node(s) didn't match Pod's node affinity/selector", preemption=(
              "2 No preemption victims found for incoming pod, 4 Preemption is not helpful for scheduling")))]),
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
        [("shared-request-gt1-allowed", "l4-shared-0", "running on l4-shared-0",
          'failed: UnexpectedAdmissionError: Allocate failed due to rpc error: code = Unknown desc = invalid '
          'allocation request for "nvidia.com/gpu": invalid request: maximum request size for shared resources is '
          '1; found 2, which is unexpected')]),
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
        [("mig-resources-present", "h100-mig-0", "nvidia.com/mig-<profile> resources",
          '["cpu", "ephemeral-storage", "memory", "pods"]')]),
    "mig-profile-not-allocatable": (
        with_fault("h100-mig", setAllocatable={"nvidia.com/mig-2g.20gb": "0"}), ["test_mig.py"], ["-k", "land_only"],
        [("mig-placement", "profile/2g.20gb", "running on one of ['h100-mig-0']",
          unschedulable("6 Insufficient nvidia.com/mig-2g.20gb"))]),
    "bogus-mig-profile-advertised": (
        # two slices: the placement loop takes one itself, the "absent" profile pod must find none
        with_fault("h100-mig", setCapacity={"nvidia.com/mig-7g.999gb": "2"},
                   setAllocatable={"nvidia.com/mig-7g.999gb": "2"}), ["test_mig.py"], ["-k", "land_only"],
        [("mig-absent-profile-waits", "cluster", "Pending: no node has nvidia.com/mig-7g.999gb",
          "running on h100-mig-0")]),
    "mixed-mig-node-advertises-whole-gpus": (
        with_fault("h100-mig", setCapacity={"nvidia.com/gpu": "8"}, setAllocatable={"nvidia.com/gpu": "8"}),
        ["test_advertisement.py"], [], [("no-whole-gpus-under-mixed-mig", "h100-mig-0", "0", "8")]),
    "non-mig-node-advertises-mig": (     # MIG resources make it a mixed-strategy node, with whole GPUs left
        with_fault("a100", node=0, setCapacity={"nvidia.com/mig-1g.10gb": "7"}),
        ["test_advertisement.py"], [], [("no-whole-gpus-under-mixed-mig", "a100-0", "0", "8")]),
    "unshared-node-advertises-shared": (
        with_fault("a100", node=0, setCapacity={"nvidia.com/gpu.shared": "8"}),
        ["test_advertisement.py"], [], [("no-shared-resource", "a100-0", "", "8")]),
    "renamed-node-advertises-no-shared": (
        renamed_l4_with_zero_shared(), ["test_advertisement.py"], [],
        [("shared-resource-name", "l4-shared-0", "GPUs advertised as nvidia.com/gpu",
          '{"nvidia.com/gpu.shared": "0"}')]),
    "mig-single-profile-not-of-the-product": (
        with_fault("a100-mig-single", setLabels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.99gb"}),
        ["test_mig.py"], [],
        [("mig-single-product", "a100-mig-single-0", "<product>-MIG-<profile of that product>",
          "NVIDIA-A100-SXM4-40GB-MIG-1g.99gb")]),
    "mig-single-invalid": (      # GFD's name for GPUs whose MIG devices differ under the single strategy
        with_fault("a100-mig-single", setLabels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-INVALID"}),
        ["test_labels.py"], ["-k", "suffix"],
        [("mig-single-valid", "a100-mig-single-0", "one MIG profile on every MIG-enabled GPU, or MIG off (a plain "
          "product)", "NVIDIA-A100-SXM4-40GB-MIG-INVALID")]),
    "gfd-labels-missing-on-one-node": (      # GFD could not start there; the device plugin still advertises
        with_fault("a100", node=1, dropLabels=["nvidia.com/gpu.present", "nvidia.com/gpu.product",
                                               "nvidia.com/gpu.count"]),
        ["test_labels.py"], ["-k", "gfd_labelled"],
        [("gfd-labels-on-gpu-node", "a100-1", "GPU Feature Discovery's labels (nvidia.com/gpu.product, gpu.count, "
          "...): 1 other node(s) of pool p4de.24xlarge have them",
          "no GPU labels, while it advertises {'nvidia.com/gpu': '8'}")]),
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
        [("tolerating-gpu-pod-lands", "l4-shared-0", "running on l4-shared-0",
          unschedulable("1 Insufficient nvidia.com/gpu", "5 node(s) didn't satisfy plugin(s) [NodeAffinity]")),
         ("node-selector-product", "product/NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED",
          unschedulable("1 Insufficient nvidia.com/gpu", OTHER_NODES)),
         ("required-affinity-product", "product/NVIDIA-L4-SHARED", "NVIDIA-L4-SHARED",
          unschedulable("1 Insufficient nvidia.com/gpu", OTHER_NODES))]),
    # ---- node state (issue 9): a dead kubelet, a cordon, pressure, taints an upgrade or drain left behind
    "node-not-ready": (
        with_fault("a100", node=1, ready=False), ["test_nodes.py"], ["-k", "ready"],
        [("node-ready", "a100-1", "Ready=True",
                                                        "Ready=False (KubeletNotReady: simulated by gpuproof's "
                                                        "fleet fault (Ready=False))")]),
    "node-cordoned": (
        with_fault("a100", node=0, unschedulable=True), ["test_nodes.py"], ["-k", "cordoned"],
        [("node-schedulable", "a100-0", "schedulable", "cordoned (spec.unschedulable)")]),
    "node-memory-pressure": (
        with_fault("l4-shared", conditions={"MemoryPressure": "True"}), ["test_nodes.py"], ["-k", "pressure"],
        [("node-no-pressure", "l4-shared-0", "MemoryPressure=False", "MemoryPressure=True (KubeletMemoryPressure)")]),
    "stray-taint-on-one-node": (
        with_fault("a100", node=1, addTaints=["maintenance=true:NoSchedule"]), ["test_nodes.py"], ["-k", "taints"],
        [("node-taints-expected", "a100-1", "only the GPU taint and taints every node of pool p4de.24xlarge carries",
          "maintenance=true:NoSchedule (on 1 of 2 nodes of the pool)")]),
    "lifecycle-taint-left-behind": (
        with_fault("a100", node=0, addTaints=["node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"]),
        ["test_nodes.py"], ["-k", "taints"],
        [("node-taints-expected", "a100-0", "no node-lifecycle, autoscaler or disruption taint",
          "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute")]),
    # ---- NVIDIA stack state
    "mig-manager-failed": (
        with_fault("h100-mig", setLabels={"nvidia.com/mig.config": "all-1g.10gb",
                                          "nvidia.com/mig.config.state": "failed"}), ["test_stack.py"], [],
        [("mig-config-state", "h100-mig-0", "success", "failed"),
         ("mig-config-matches", "h100-mig-0", '["1g.10gb"]', '["1g.10gb", "2g.20gb"]')]),
    "operator-component-paused": (
        with_fault("a100", node=0, setLabels={"nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}),
        ["test_stack.py"], [],
        [("operator-component-state", "a100-0", "one of ['false', 'pre-installed', 'true']",
          "paused-for-mig-change")]),
    "driver-upgrade-failed": (
        with_fault("a100", node=1, setLabels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}),
        ["test_stack.py"], [], [("driver-upgrade-state", "a100-1", "upgrade-done", "upgrade-failed")]),
    "gfd-labels-stale": (
        with_fault("l4-shared", setLabels={"nvidia.com/gfd.timestamp": "1700000000"}), ["test_stack.py"], [],
        [("gfd-fresh", "l4-shared-0", "written within the last 3600 s", re.compile(r"\d+ s ago"))]),
    # ---- labels that cannot be true for the product they name
    "memory-implausible": (
        with_fault("a100", node=0, setLabels={"nvidia.com/gpu.memory": "40960"}), ["test_plausibility.py"], [],
        [("memory-plausible", "a100-0", "81920 MiB +-7% (NVIDIA-A100-SXM4-80GB)", "40960 MiB")]),
    "family-implausible": (
        with_fault("a100", node=0, setLabels={"nvidia.com/gpu.family": "hopper"}), ["test_plausibility.py"], [],
        [("family-plausible", "a100-0", "ampere", "hopper")]),
    "compute-implausible": (
        with_fault("l4-shared", setLabels={"nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}),
        ["test_plausibility.py"], [], [("compute-plausible", "l4-shared-0", "8.9", "9.0")]),
    "gpu-missing-from-node": (   # consistent labels and capacity, but a p4de.24xlarge has 8 GPUs
        with_fault("a100", node=1, setLabels={"nvidia.com/gpu.count": "7"}, setCapacity={"nvidia.com/gpu": "7"},
                   setAllocatable={"nvidia.com/gpu": "7"}), ["test_plausibility.py"], [],
        [("count-fits-instance", "a100-1", "8", "7")]),
    "product-wrong-for-instance": (
        with_fault("l4-shared", setLabels={"nvidia.com/gpu.product": "NVIDIA-A10G-SHARED"}),
        ["test_plausibility.py"], [], [("product-fits-instance", "l4-shared-0", "NVIDIA-L4", "NVIDIA-A10G")]),
    "mig-slice-memory-implausible": (
        with_fault("h100-mig", setLabels={"nvidia.com/mig-1g.10gb.memory": "4864"}), ["test_plausibility.py"], [],
        [("mig-memory-plausible", "h100-mig-0", "about 10 GB", "4864 MiB")]),
    "mig-count-implausible": (
        with_fault("h100-mig", setLabels={"nvidia.com/mig-1g.10gb.count": "60"},
                   setCapacity={"nvidia.com/mig-1g.10gb": "60"}, setAllocatable={"nvidia.com/mig-1g.10gb": "60"}),
        ["test_plausibility.py"], [],
        [("mig-count-plausible", "h100-mig-0", "at most 7 per GPU x 8 GPUs", "60"),
         ("mig-slices-plausible", "h100-mig-0", "at most 7 compute slices x 8 GPUs", "92")]),
    # ---- managed offerings' own label schemes, broken
    "gke-plugin-advertises-too-few": (
        managed_fault("gke-a100", setCapacity={"nvidia.com/gpu": "1"}, setAllocatable={"nvidia.com/gpu": "1"}),
        ["test_advertisement.py"], [], [("capacity-matches-count", "gke-a100-0", "2", "1")]),
    "gke-time-sharing-capacity-wrong": (
        managed_fault("gke-l4-shared", setCapacity={"nvidia.com/gpu": "1"}, setAllocatable={"nvidia.com/gpu": "1"}),
        ["test_timeslicing.py"], ["-k", "capacity"], [("shared-allocatable", "gke-l4-shared-0", "3", "1")]),
    "gke-mig-partitions-missing": (
        managed_fault("gke-a100-mig", setAllocatable={"nvidia.com/gpu": "3"}), ["test_mig.py"], [],
        [("mig-single-count", "gke-a100-mig-0", "7", "3")]),
    "gke-accelerator-wrong-for-machine": (
        managed_fault("gke-a100", setLabels={"cloud.google.com/gke-accelerator": "nvidia-l4"}),
        ["test_plausibility.py"], [], [("product-fits-instance", "gke-a100-0", "NVIDIA-A100-SXM4-40GB", "NVIDIA-L4")]),
    "eks-gpu-missing": (
        managed_fault("eks-a10g", setCapacity={"nvidia.com/gpu": "3"}, setAllocatable={"nvidia.com/gpu": "3"}),
        ["test_advertisement.py"], [], [("capacity-matches-count", "eks-a10g-0", "4", "3")]),
    "eks-device-plugin-gone": (
        managed_fault("eks-a10g", dropCapacity=["nvidia.com/gpu"], dropAllocatable=["nvidia.com/gpu"]),
        ["test_advertisement.py"], [], [("capacity-matches-count", "eks-a10g-0", "4", "")]),
    "karpenter-count-label-disagrees": (
        managed_fault("karpenter-h100", setLabels={"karpenter.k8s.aws/instance-gpu-count": "4"}),
        ["test_plausibility.py"], [], [("count-fits-instance", "karpenter-h100-0", "8", "4")]),
    "aks-device-plugin-gone": (
        managed_fault("aks-a100", dropCapacity=["nvidia.com/gpu"], dropAllocatable=["nvidia.com/gpu"]),
        ["test_advertisement.py"], [], [("capacity-matches-count", "aks-a100-0", "1", "")]),
    "openshift-mig-manager-failed": (
        managed_fault("ocp-h100-mig", setLabels={"nvidia.com/mig.config.state": "failed"}), ["test_stack.py"], [],
        [("mig-config-state", "ocp-h100-mig-0", "success", "failed")]),
    "openshift-mig-layout-not-applied": (
        managed_fault("ocp-h100-mig", setLabels={"nvidia.com/mig.config": "all-2g.20gb"}), ["test_stack.py"], [],
        [("mig-config-matches", "ocp-h100-mig-0", '["2g.20gb"]', '["1g.10gb"]')]),
    "openshift-operator-pod-missing": (
        managed_fault("ocp-a100", setLabels={"gpuproof.dev/sim-no-pod.dcgm-exporter": "true"}), ["test_stack.py"], [],
        [("operator-pod-ready", "ocp-a100-0", "a Ready nvidia-dcgm-exporter pod", "none")]),
    "openshift-driver-upgrade-failed": (
        managed_fault("ocp-a100", setLabels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}),
        ["test_stack.py"], [], [("driver-upgrade-state", "ocp-a100-0", "upgrade-done", "upgrade-failed")]),
}


def test_healthy_managed_shapes_pass_every_suite(embedded, tmp_path):
    """GKE, EKS (plain and Karpenter), AKS and OpenShift node shapes: nothing GFD-only is demanded of them."""
    with embedded.fleet_loaded(managed()):
        res = embedded.run_suite("suites", "-m", "not bench", report_dir=tmp_path, run_id="managed")
    assert_healthy(res, MANAGED)
    schemes = {c["actual"] for c in res.checks if c["check"] == "inventory"}
    for scheme in ("gfd", "gke", "karpenter", "instance-type"):
        assert f'"scheme": "{scheme}"' in " ".join(schemes), schemes


def test_dead_node_is_reported_not_timed_out_on(embedded, tmp_path):
    """A NotReady node fails the nodes suite by name and is left out of every placement check."""
    with embedded.fleet_loaded(with_fault("a100", node=1, ready=False)):
        res = embedded.run_suite("suites", "-m", "not bench", REFUSES, report_dir=tmp_path, run_id="dead-node")
    assert res.code == 1, res
    failed = {(c["check"], c["target"]) for c in res.failed_checks()}
    assert ("node-ready", "a100-1") in failed, failed
    assert {t for _, t in failed} == {"a100-1"}, failed
    assert {c for c, _ in failed} <= {"node-ready", "node-taints-expected"}, failed


def test_healthy_mixed_fleet_passes_every_suite(embedded, tmp_path):
    res = embedded.run_suite("suites", "-m", "not bench", REFUSES, report_dir=tmp_path, run_id="healthy")
    assert_healthy(res, MIXED)


def assert_failed(res, expectations) -> None:
    """The run exited 1, recorded each (check, target, expected, actual) as failed, and said so by name."""
    assert res.code == 1, res
    for check, target, expected, actual in expectations:
        failed = [c for c in res.failed_checks(check) if c["target"] == target]
        assert failed, f"no failed {check} record for {target}; failures: " + json.dumps(res.failed_checks(), indent=1)
        rec = failed[0]
        assert rec["expected"] == expected, rec
        assert actual.fullmatch(rec["actual"]) if isinstance(actual, re.Pattern) else rec["actual"] == actual, rec
        # what a person reads: the target, the expected and the actual value in the pytest failure message
        said = f"expected {_shown(rec['expected'])}, actual {_shown(rec['actual'])}"
        assert any(ln.startswith(f"{target}: ") and said in ln for ln in res.output.splitlines()), \
            f"no line '{target}: ... {said}' in:\n{res.output[-3000:]}"


@pytest.mark.parametrize("case", list(CASES))
def test_check_fails_on_its_fault(embedded, tmp_path, case):
    fleet, suites, extra, expectations = CASES[case]
    with embedded.fleet_loaded(copy.deepcopy(fleet)):
        res = embedded.run_suite(*[f"suites/{s}" for s in suites], *extra, report_dir=tmp_path, run_id=case)
    assert_failed(res, expectations)


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

# id: (control plane settings, suite files and pytest args, [(check, target, expected, actual)] that must fail)
CONTROL_PLANE_CASES = {
    # the API server does not enforce quotas / limit ranges
    "quota-not-enforced": (
        {"disableAdmissionPlugins": ["ResourceQuota"]}, ["suites/test_quota.py", "-k", "resource_quota"],
        [("quota-refuses-over", "namespace/gpuproof-quota-not-enforced-quota", "refused: exceeded quota",
          "accepted")]),
    "limitrange-not-enforced": (
        {"disableAdmissionPlugins": ["LimitRanger"]}, ["suites/test_quota.py", "-k", "limit_range"],
        [("limitrange-refuses-over", "namespace/gpuproof-limitrange-not-enforced-limits",
          "refused: maximum nvidia.com/gpu usage per Container is 1", "accepted")]),
    # the scheduler cannot preempt: the preemptor waits, no victim
    "no-preemption": (
        {"disableSchedulerPlugins": ["DefaultPreemption"]}, ["suites/test_preemption.py"],
        [("preemptor-lands", "l4-shared-0", "running on l4-shared-0", unschedulable(
            "1 Insufficient nvidia.com/gpu", "5 node(s) didn't satisfy plugin(s) [NodeAffinity]", preemption=None)),
         ("just-enough-victims", "l4-shared-0", "1", "0")]),
    # the scheduler ignores taints
    "taints-ignored": (
        {"disableSchedulerPlugins": ["TaintToleration"]}, ["suites/test_taints.py", "-k", "without_toleration"],
        [("untolerating-pod-kept-off", node, "Pending: the scheduler refuses the node for an untolerated taint",
          f"running on {node}") for node in ("a100-0", "l4-shared-0")]),
    # the scheduler ignores node affinity: pods go anywhere, the one that may not preempt too
    "affinity-ignored": (
        {"disableSchedulerPlugins": ["NodeAffinity"]},
        ["suites/test_affinity.py", "suites/test_preemption.py", "-k", "memory or preemption"],
        [("memory-gt-none", "cluster", "Pending: no GPU has more than 81920 MiB", running_anywhere()),
         ("never-policy-waits", "l4-shared-0", "Pending (preemptionPolicy: Never)", running_anywhere())]),
}


def run_on_control_plane(fleet: dict, control_plane: dict, args: list[str], tmp_path, run_id: str):
    """The suites run on an embedded cluster of their own, whose control plane has these settings."""
    from conftest import private_cluster

    fleet["controlPlane"] = control_plane
    with private_cluster(fleet, tmp_path / "sim", f"test:{run_id}") as cluster:
        return cluster.run_suite(*args, report_dir=tmp_path / "reports", run_id=run_id)


@pytest.mark.parametrize("case", list(CONTROL_PLANE_CASES))
def test_check_fails_when_the_control_plane_lacks_the_feature(tmp_path, case):
    control_plane, args, expectations = CONTROL_PLANE_CASES[case]
    assert_failed(run_on_control_plane(mixed(), control_plane, [*args, REFUSES], tmp_path, case), expectations)

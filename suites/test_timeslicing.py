"""Time-slicing: one GPU shared by several pods.

On time-sliced nodes allocatable = gpu.count x gpu.replicas (as ``nvidia.com/gpu.shared``
when renamed) and the product label ends in ``-SHARED``; that many one-GPU pods run on
the node at the same moment and one more waits; with ``failRequestsGreaterThanOne`` a
request for 2 is refused. On real GPUs every pod on one GPU sees the same GPU UUID.
"""

import pytest

from gpuproof.cluster.churn import ForeignPods, fill_done, taken_away
from gpuproof.cluster.conditions import wait_for
from gpuproof.discovery.nodes import GPU_SHARED
from gpuproof.plugin.checks import for_nodes
from gpuproof.plugin.fanout import NodeSkip
from gpuproof.plugin.checks import (TOLERATE_ALL, free_on, name_on, pod, pod_outcome, pod_settled, probe_on,
                                    settled, shared_gpu_check, used_on)

FEATURE = "timeslicing"
pytestmark = [pytest.mark.device_plugin,     # DRA-only nodes: see test_dra.py
              pytest.mark.conformance("gpu_sharing", name="time-slicing", checks=("*",), require=("co-running",))]
MAX_PODS = 64


def time_sliced(n):
    """time-sliced nodes"""
    return n.time_sliced


@for_nodes(time_sliced)
def test_shared_capacity_and_product(gpu_node, check):
    n = gpu_node
    renamed = n.shared_renamed          # a gpu.shared left at 0 is not advertised
    resource = GPU_SHARED if renamed else "nvidia.com/gpu"
    expected = (n.count_label or 0) * n.replicas
    check.equal("shared-allocatable", expected, n.allocatable_of(resource),
                what=f"allocatable {resource} vs {n.count_source}={n.count_label} x replicas={n.replicas}")
    if not renamed and n.gfd:
        check.true("shared-product-suffix", n.product.endswith("-SHARED"), expected="product ending in -SHARED",
                   actual=n.product, what="nvidia.com/gpu.product of a time-sliced node")


@pytest.mark.places_pods
@for_nodes(time_sliced)
@pytest.mark.creates("Pod", "share-{node}-<i>", "{free}", requests="1 {resource}", note="one per free slot, at most 64")
@pytest.mark.creates("Pod", "share-extra-{node}", requests="1 {resource}", note="one more: stays Pending")
def test_replicas_co_run_and_one_more_waits(gpu_pool, run, scratch, target, check):
    node = gpu_pool.nodes[0]
    resource = node.gpu_resource
    churn = ForeignPods(target.cluster, run.run_id, [node.name])
    # what the labels promise, less what other pods already hold
    slots = (node.count_label or 0) * node.replicas - used_on(target.cluster, node.name, resource)
    if not 1 <= slots <= MAX_PODS:
        check.skip("co-running", f"{node.name} has {slots} free {resource} (checked for 1-{MAX_PODS})")
    names = [name_on(node.name, "share", i) for i in range(slots)]      # names of its own: checks.name_on
    peak = {"running": 0}

    filled = fill_done(names, settled)

    def all_settled(cache):
        running = sum(1 for n in names if n in cache and cache[n].status.phase == "Running"
                      and cache[n].spec.node_name == node.name)
        peak["running"] = max(peak["running"], running)
        return filled(cache)

    for name in names:
        scratch.create(pod(name, {resource: 1}, node=node.name, tolerations=TOLERATE_ALL))
    how, got = run.wait_pods(all_settled, target.timeouts.pods_settled,
                             f"{slots} pods sharing {node.name}'s GPUs to run or be refused")
    if how == "taken":
        check.skip("co-running", taken_away(churn, node.name, got))
    check.equal("co-running-peak", slots, peak["running"], target=node.name,
                what=f"one-{resource} pods Running on the node at the same moment "
                     f"(gpu.count={node.count_label} x replicas={node.replicas})", churn=churn)
    extra_name = name_on(node.name, "share-extra")
    scratch.create(pod(extra_name, {resource: 1}, node=node.name, tolerations=TOLERATE_ALL))
    extra = wait_for(run, extra_name, pod_settled, target.timeouts.pod_placed)
    check.true("one-more-waits", pod_outcome(extra).startswith("unschedulable"),
               expected=f"Pending: Insufficient {resource}", actual=pod_outcome(extra),
               what=f"pod {slots + 1} on a node with {slots} shared slots", target=node.name, churn=churn)


@pytest.mark.places_pods
@for_nodes(time_sliced)
@pytest.mark.creates("Pod", "share-two-{node}", requests="2 {resource}")
def test_request_for_two_shared_gpus(gpu_pool, run, scratch, target, check):
    node = gpu_pool.nodes[0]
    refused = target.shared_requests_refused(node)
    if refused is None:
        check.skip("shared-request-gt1", "unknown whether this pool's device plugin sets failRequestsGreaterThanOne"
                   " (tell gpuproof with --shared-requests-refused POOLS)")
    resource = node.gpu_resource
    churn = ForeignPods(target.cluster, run.run_id, [node.name])
    if free_on(target.cluster, node, resource) < 2:
        check.skip("shared-request-gt1", f"{node.name} has fewer than 2 free {resource}")
    name = name_on(node.name, "share-two")
    scratch.create(pod(name, {resource: 2}, node=node.name, tolerations=TOLERATE_ALL))
    p = wait_for(run, name, pod_settled.named("to run or be refused"), target.timeouts.pod_placed)
    outcome = pod_outcome(p)
    if refused:
        check.true("shared-request-gt1-refused", outcome.startswith("failed: UnexpectedAdmissionError"),
                   expected="Failed: UnexpectedAdmissionError (failRequestsGreaterThanOne)", actual=outcome,
                   what=f"a pod asking 2 {resource}", target=node.name, churn=churn)
    else:
        check.equal("shared-request-gt1-allowed", f"running on {node.name}", outcome,
                    what=f"a pod asking 2 {resource} (failRequestsGreaterThanOne not set)", target=node.name,
                    churn=churn)


def share_probe(run, target, node, lane):
    """A pool's single-GPU node filled with probe pods, one per free replica, by the fan-out beside other pools'."""
    if (node.count_label or 0) != 1:
        raise NodeSkip("same-gpu-uuid", f"{node.name} has {node.count_label} GPUs; checked on single-GPU nodes")
    pods = min(node.replicas, free_on(target.cluster, node, node.gpu_resource))
    return probe_on(run, target, node, pods, {node.gpu_resource: 1}, prefix="share-probe", lane=lane)


@for_nodes(time_sliced)
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "share-probe-{node}-<i>", "{free}, at most replicas", requests="1 {resource}", note="probe")
def test_pods_on_one_gpu_see_the_same_uuid(gpu_pool, run, target, check, needs_real_gpus, fanout, request):
    node = gpu_pool.nodes[0]
    try:
        results = fanout.result(request.node, node, lambda n, lane: share_probe(run, target, n, lane),
                                name="time-slicing share probe")
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    ok, expected, actual, what = shared_gpu_check(results)   # NVML UUIDs, never NVIDIA_VISIBLE_DEVICES
    check.true("same-gpu-uuid", ok, expected, actual, what=what, target=node.name)

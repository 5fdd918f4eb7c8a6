"""Topology-aware allocation: the GPUs one pod gets share NVLink.

On each real GPU node with 2 or more whole GPUs, one probe pod asks for 2 GPUs; the probe reads the
NVLink links among the GPUs it sees (NVML) and the set must be NVLink-connected, directly or through
NVSwitch (the rule: gpuproof/discovery/topology.py). 2, not 4: 2 is the size every NVLink topology can hand out
linked (a bridged pair of PCIe cards, any edge of a hybrid cube mesh, any pair on NVSwitch); a node of
bridged pairs has no linked set of 4, so a 4-GPU pod would fail the node's shape, not its allocator.
PCIe-only nodes (T4, L4, L40S) skip, saying so; with GPUs held by other pods a fragmented set only warns.
"""

import pytest

from gpuproof.plugin.checks import for_nodes
from gpuproof.plugin.checks import free_on, probe_on
from gpuproof.plugin.fanout import NodeSkip
from gpuproof.discovery.topology import nvlink_set
from gpuproof.vocab import GPU

FEATURE = "topology"
SET_SIZE = 2


def whole_gpus(n):
    """nodes with 2 or more whole GPUs (not time-sliced, not MIG)"""
    return n.mig_strategy == "none" and not n.time_sliced and (n.allocatable_of(GPU) or 0) >= SET_SIZE


def nvlink_probe(run, target, node, lane):
    """One node's 2-GPU probe pod, run by the fan-out beside the other nodes' (free GPUs counted first)."""
    free = free_on(target.cluster, node, GPU)
    if free < SET_SIZE:
        raise NodeSkip("nvlink-set", f"{node.name} has {free} free {GPU}: a set needs {SET_SIZE}")
    result, = probe_on(run, target, node, 1, {GPU: SET_SIZE}, prefix="nvlink-probe", lane=lane)
    return result, free


@pytest.mark.gpu
@pytest.mark.places_pods
@for_nodes(whole_gpus)
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "nvlink-probe-{node}-0", requests=f"{SET_SIZE} {GPU}", note="probe")
def test_the_gpus_of_a_pod_share_nvlink(needs_real_gpus, gpu_node, run, target, fanout, request, check):
    node = gpu_node
    try:
        result, free = fanout.result(request.node, node, lambda n, lane: nvlink_probe(run, target, n, lane),
                                     name="topology")
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    v = nvlink_set(result, node.name, held_by_others=node.allocatable_of(GPU) - free)
    if v.verdict == "skip":
        check.skip("nvlink-set", v.message)
    elif v.verdict == "warn":
        check.warn("nvlink-set", v.detail, v.expected, v.actual)
    else:
        check.true("nvlink-set", v.verdict == "pass", v.expected, v.actual, what="the GPUs of one pod",
                   target=node.name)

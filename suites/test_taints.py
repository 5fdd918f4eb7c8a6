"""Taints: GPU nodes keep non-GPU pods away, and GPU pods that tolerate the taint still land.

An untainted GPU node is a warning by default (``--strict-taints`` makes it a failure):
without a taint, ordinary pods can fill a GPU node's CPU and memory.
"""

import pytest

from gpuproof.cluster.churn import ForeignPods
from gpuproof.cluster.conditions import wait_for
from gpuproof.plugin.checks import (free_on, name_on, one_device, pod, pod_outcome, pod_settled, tolerations_for,
                                    used_on)

placed_or_refused = pod_settled.named("to be placed or refused by the scheduler")

FEATURE = "taints"


def test_gpu_node_is_tainted(gpu_node, check, request):
    taints = [t for t in gpu_node.taints if t.get("effect") in ("NoSchedule", "NoExecute")]
    if taints:
        check.record("gpu-node-tainted", "pass", expected="a NoSchedule or NoExecute taint",
                     actual=gpu_node.taint_strings())
    elif request.config.getoption("--strict-taints"):
        check.true("gpu-node-tainted", False, expected="a NoSchedule or NoExecute taint (e.g. "
                   "nvidia.com/gpu=present:NoSchedule)", actual="no taints", what="GPU node taints")
    else:
        check.warn("gpu-node-tainted", "GPU node has no NoSchedule/NoExecute taint, so any pod can land on it "
                   "(use --strict-taints to fail on this)", expected="a NoSchedule taint", actual="no taints")


def _first_tainted(pool):
    return next((n for n in pool.nodes if any(t.get("effect") == "NoSchedule" for t in n.taints)), None)


@pytest.mark.places_pods
@pytest.mark.creates("Pod", "no-toleration-{node}", on=_first_tainted, note="no tolerations")
def test_pod_without_toleration_is_kept_off(gpu_pool, scratch, run, target, check):
    node = _first_tainted(gpu_pool)
    if node is None:
        check.skip("untolerating-pod-kept-off", f"pool {gpu_pool.name} has no node with a NoSchedule taint")
    name = name_on(node.name, "no-toleration")
    scratch.create(pod(name, node=node.name))
    p = wait_for(run, name, placed_or_refused, target.timeouts.pod_placed)
    outcome = pod_outcome(p)
    check.true("untolerating-pod-kept-off", outcome.startswith("unschedulable") and "taint" in outcome,
               expected="Pending: the scheduler refuses the node for an untolerated taint", actual=outcome,
               what="a pod without tolerations pinned to the tainted GPU node", target=node.name)


@pytest.mark.places_pods
@pytest.mark.creates("Pod", "tolerating-{node}", on=lambda pool: _first_tainted(pool) or pool.nodes[0],
                      requests="{device}", note="tolerates the node's taints")
def test_tolerating_gpu_pod_lands(gpu_pool, scratch, run, target, check):
    node = _first_tainted(gpu_pool) or gpu_pool.nodes[0]
    churn = ForeignPods(target.cluster, run.run_id, [node.name])
    (resource, _), = one_device(node).items()
    if free_on(target.cluster, node, resource) < 1 and used_on(target.cluster, node.name, resource) > 0:
        check.skip("tolerating-gpu-pod-lands", f"{node.name} has no free {resource}: other pods hold them all")
    name = name_on(node.name, "tolerating")
    scratch.create(pod(name, one_device(node), node=node.name, tolerations=tolerations_for(node)))
    p = wait_for(run, name, placed_or_refused, target.timeouts.pod_placed)
    check.equal("tolerating-gpu-pod-lands", f"running on {node.name}", pod_outcome(p),
                what=f"a pod asking {one_device(node)} that tolerates {node.taint_strings()}", target=node.name,
                churn=churn)

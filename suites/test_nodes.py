"""Node state: every GPU node can take GPU work.

Each GPU node is Ready, not cordoned, free of pressure conditions, and carries no
NoSchedule/NoExecute taint besides the GPU taint (key ``nvidia.com/gpu`` exactly) and the taints
its whole pool shares. A taint on part of a pool fails whatever its key: a health system's
``nvidia.com/gpu-health`` on one node looks like the GPU taint, and is not it.
Node-lifecycle taints (``node.kubernetes.io/*``) and autoscaler or disruption taints always
fail: they are what a failed upgrade or drain leaves behind. Nodes that cannot take pods are
left out of the placement checks of the other suites, so they fail here, once, by name.
"""

from gpuproof.discovery.nodes import PRESSURE_CONDITIONS

FEATURE = "nodes"

# taints that say the node is going away or broken, whatever the pool
BAD_TAINT_PREFIXES = ("node.kubernetes.io/", "node.cloudprovider.kubernetes.io/", "ToBeDeletedByClusterAutoscaler",
                      "DeletionCandidateOfClusterAutoscaler", "karpenter.sh/disrupted", "karpenter.sh/disruption",
                      "cloud.google.com/impending-node-termination")


GPU_TAINT_KEY = "nvidia.com/gpu"      # the taint GPU nodes carry (GKE, EKS, AKS and NVIDIA's guides name it so)


def test_node_ready(gpu_node, check):
    cond = gpu_node.conditions.get("Ready") or {}
    actual = f"Ready={gpu_node.condition('Ready')}" + (f" ({cond['reason']}: {cond['message']})".rstrip(": ")
                                                     if cond.get("reason") else "")
    check.true("node-ready", gpu_node.ready, expected="Ready=True", actual=actual, what="node condition Ready")


def test_node_not_cordoned(gpu_node, check):
    check.true("node-schedulable", not gpu_node.unschedulable, expected="schedulable",
               actual="cordoned (spec.unschedulable)" if gpu_node.unschedulable else "schedulable",
               what="node (a cordoned node takes no new pod)")


def test_node_has_no_pressure(gpu_node, check):
    for kind in PRESSURE_CONDITIONS:
        status = gpu_node.condition(kind)
        reason = (gpu_node.conditions.get(kind) or {}).get("reason", "")
        check.true("node-no-pressure", status != "True", expected=f"{kind}=False",
                   actual=f"{kind}={status}" + (f" ({reason})" if reason else ""), what=f"node condition {kind}")


def test_node_taints_expected(gpu_node, discovery, check):
    pool = discovery.pools.get(gpu_node.pool, [gpu_node])
    for taint, text in zip(gpu_node.taints, gpu_node.taint_strings()):
        if taint["effect"] not in ("NoSchedule", "NoExecute"):
            continue
        if taint["key"].startswith(BAD_TAINT_PREFIXES):
            check.true("node-taints-expected", False, expected="no node-lifecycle, autoscaler or disruption taint",
                       actual=text, what="taint")
            continue
        shared = discovery.taint_counts(gpu_node.pool).get(text, 1) if gpu_node.pool in discovery.pools else 1
        ok = taint["key"] == GPU_TAINT_KEY or shared == len(pool)
        check.true("node-taints-expected", ok, expected=f"only the GPU taint and taints every node of pool "
                   f"{gpu_node.pool} carries", actual=f"{text} (on {shared} of {len(pool)} nodes of the pool)",
                   what="taint")

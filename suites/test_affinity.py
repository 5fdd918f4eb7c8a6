"""Affinity: pods choose GPUs by product and memory through node labels.

nodeSelector and required affinity on the product label (``nvidia.com/gpu.product``, or the
managed offering's own: GKE's accelerator, Karpenter's instance-gpu-name, the instance type)
land on that product;
preferred affinity picks the preferred product while it has room and falls back when
it has none; ``Gt`` on ``nvidia.com/gpu.memory`` keeps small GPUs out.
"""

import pytest

from gpuproof.cluster.churn import ForeignPods, fill_done, taken_away
from gpuproof.discovery.nodes import BYTES_FROM
from gpuproof.plugin.checks import TOLERATE_ALL, free_on, one_device, pod, pod_outcome, settled, used_on

FEATURE = "affinity"
MEMORY = "nvidia.com/gpu.memory"
pytestmark = pytest.mark.places_pods


def _product_nodes(discovery, product):
    return [n for n in discovery.placeable if n.product == product]


def _selector(nodes, check, name, run, target):
    """The product's node labels, and a churn guard over every node they select (skip when all are full)."""
    selector = nodes[0].product_selector
    if not selector:
        check.skip(name, f"no label names the GPU product of {nodes[0].name}")
    chosen = [n for n in nodes if all(n.labels.get(k) == v for k, v in selector.items())]
    churn = ForeignPods(target.cluster, run.run_id, [n.name for n in chosen])
    (resource, _), = one_device(nodes[0]).items()
    if not any(free_on(target.cluster, n, resource) for n in chosen) and \
            any(used_on(target.cluster, n.name, resource) for n in chosen):
        check.skip(name, f"every node labelled {_shown(selector)} has all its {resource} taken by other pods")
    return selector, churn


def _match(selector: dict) -> list[dict]:
    return [{"key": k, "operator": "In", "values": [v]} for k, v in sorted(selector.items())]


def _shown(selector: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def _land(run, scratch, target, name, manifest, taken=None):
    """The pod once placed or refused. ``taken(names)``, for a pod that takes a GPU: called (a check's skip) when
    the pod is taken away while it waits (preempted by other people's pods, or deleted), instead of waiting out the
    deadline into a failure (issue #41 item 5)."""
    scratch.create(manifest)
    how, got = run.wait_pods(fill_done([name], settled), target.timeouts.pod_placed,
                             f"pod {run.namespace}/{name} to be placed or refused by the scheduler")
    if how == "taken":
        if taken is not None:
            taken(got)
        raise AssertionError(f"pod {run.namespace}/{name} was taken away before the scheduler placed it")
    return got[name]


@pytest.mark.creates("Pod", "selector-{slug}", requests="{device}", note="nodeSelector on the product's labels")
def test_node_selector_by_product(gpu_product, discovery, run, scratch, target, check):
    nodes = _product_nodes(discovery, gpu_product)
    selector, churn = _selector(nodes, check, "node-selector-product", run, target)
    name = "selector-" + gpu_product.lower().replace(".", "-")[:50]
    p = _land(run, scratch, target, name, pod(name, one_device(nodes[0]), node_selector=selector,
                                              tolerations=TOLERATE_ALL),
              lambda t: check.skip("node-selector-product", taken_away(churn, _shown(selector), t)))
    landed = discovery.node(p.spec.node_name).product if p.spec.node_name in {n.name for n in
                                                                              discovery.gpu_nodes} else None
    check.equal("node-selector-product", gpu_product, landed if p.status.phase == "Running" else pod_outcome(p),
                what=f"product of the node a nodeSelector {_shown(selector)} pod landed on",
                target=f"product/{gpu_product}", churn=churn)


@pytest.mark.creates("Pod", "required-{slug}", requests="{device}", note="required affinity on the product's labels")
def test_required_affinity_by_product(gpu_product, discovery, run, scratch, target, check):
    nodes = _product_nodes(discovery, gpu_product)
    selector, churn = _selector(nodes, check, "required-affinity-product", run, target)
    name = "required-" + gpu_product.lower().replace(".", "-")[:50]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": _match(selector)}]}}}
    p = _land(run, scratch, target, name, pod(name, one_device(nodes[0]), affinity=affinity,
                                              tolerations=TOLERATE_ALL),
              lambda t: check.skip("required-affinity-product", taken_away(churn, _shown(selector), t)))
    landed = discovery.node(p.spec.node_name).product if p.status.phase == "Running" else pod_outcome(p)
    check.equal("required-affinity-product", gpu_product, landed,
                what=f"product of the node a required-affinity ({_shown(selector)}) pod landed on",
                target=f"product/{gpu_product}", churn=churn)


@pytest.mark.creates("Pod", "preferred-<i>", "free GPUs of the preferred product + 1 (at most 17)", on="any",
                      requests="1 nvidia.com/gpu", note="prefer the GPU product with the fewest free GPUs")
def test_preferred_affinity_fills_then_falls_back(discovery, run, scratch, target, check):
    # products whose nodes take plain one-GPU pods; prefer the one with the fewest free slots
    whole = [n for n in discovery.placeable if n.gpu_resource == "nvidia.com/gpu" and n.mig_strategy != "mixed"
             and n.product_selector]
    churn = ForeignPods(target.cluster, run.run_id, [n.name for n in whole])
    free = {}
    for n in whole:
        free[n.product] = free.get(n.product, 0) + free_on(target.cluster, n, "nvidia.com/gpu")
    choices = sorted((f, p) for p, f in free.items() if 0 < f <= 16)
    others = [p for p, f in free.items() if f > 0]
    if not choices or len(others) < 2:
        check.skip("preferred-affinity", "needs two GPU products with free GPUs, one with at most 16 free")
    slots, preferred = choices[0]
    selector = next(n.product_selector for n in whole if n.product == preferred)
    slots = sum(free_on(target.cluster, n, "nvidia.com/gpu") for n in whole
                if all(n.labels.get(k) == v for k, v in selector.items()))
    if not 0 < slots <= 16:
        check.skip("preferred-affinity", f"nodes labelled {_shown(selector)} have {slots} free GPUs (checked for 1-16)")
    affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": _match(selector)}}]}}
    placed = []
    for i in range(slots + 1):
        name = f"preferred-{i}"
        p = _land(run, scratch, target, name, pod(name, {"nvidia.com/gpu": 1}, affinity=affinity,
                                                  tolerations=TOLERATE_ALL),
                  lambda t: check.skip("preferred-affinity", taken_away(churn, _shown(selector), t)))
        node = p.spec.node_name if p.status.phase == "Running" else None
        placed.append(discovery.node(node).product if node in {n.name for n in discovery.gpu_nodes}
                      else pod_outcome(p))
    target_name = f"product/{preferred}"
    check.equal("preferred-while-room", [preferred] * slots, placed[:slots],
                what=f"products chosen for the first {slots} pods preferring {preferred} (it has {slots} free)",
                target=target_name, churn=churn)
    check.true("preferred-falls-back", placed[slots] != preferred and not str(placed[slots]).startswith(
               ("unschedulable", "Pending")), expected="another GPU product once the preferred one is full",
               actual=placed[slots], what=f"pod {slots + 1} preferring the full {preferred}", target=target_name,
               churn=churn)


@pytest.mark.creates("Pod", "memory-gt", on="any", note="nvidia.com/gpu.memory Gt the second-largest value")
@pytest.mark.creates("Pod", "memory-gt-none", on="any", note="nvidia.com/gpu.memory Gt the largest: stays Pending")
def test_memory_greater_than(discovery, run, scratch, target, check):
    # the pods ask no GPU: every GPU node pods can land on counts, DRA-only ones too
    # GFD v0.6 wrote bytes there: those nodes are kept out of the comparison, and out of the pods' way (Lt)
    mem = {n.name: n.memory_mib for n in discovery.gpu_nodes
           if n.memory_mib and not n.memory_in_bytes and not n.unfit_for_placement}
    if len(set(mem.values())) < 2:
        check.skip("memory-gt", "needs GPU nodes with at least two different nvidia.com/gpu.memory values")
    threshold = sorted(set(mem.values()))[-2]          # only the largest-memory GPUs are above it
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": MEMORY, "operator": "Gt", "values": [str(threshold)]},
                              {"key": MEMORY, "operator": "Lt", "values": [str(BYTES_FROM)]}]}]}}}
    p = _land(run, scratch, target, "memory-gt", pod("memory-gt", affinity=affinity, tolerations=TOLERATE_ALL))
    got = mem.get(p.spec.node_name) if p.status.phase == "Running" else pod_outcome(p)
    check.true("memory-gt", isinstance(got, int) and got > threshold, expected=f"a node with {MEMORY} > {threshold}",
               actual=f"{p.spec.node_name}: {got}" if isinstance(got, int) else got,
               what=f"node picked for {MEMORY} Gt {threshold}",
               target="cluster")
    top = max(mem.values())
    affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"] = [str(top)]
    p = _land(run, scratch, target, "memory-gt-none", pod("memory-gt-none", affinity=affinity,
                                                          tolerations=TOLERATE_ALL))
    check.true("memory-gt-none", pod_outcome(p).startswith("unschedulable"),
               expected=f"Pending: no GPU has more than {top} MiB", actual=pod_outcome(p),
               what=f"pod asking {MEMORY} Gt {top}", target="cluster")

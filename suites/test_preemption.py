"""Priority and preemption on GPUs.

The suite's own PriorityClasses have NEGATIVE values, so on a real cluster only the
suite's pods can ever be preemption victims; a node is chosen only where no pod of
anyone else has a priority below the preemptor's. Fill the node's free GPUs with
low-priority pods; a higher-priority pod preempts exactly one and lands; a pod with
``preemptionPolicy: Never`` stays Pending; no pod outside the run is touched.

Victims are the pods the scheduler records as preempted for the run's pod (its ``Preempted``
events name the preemptor), never pods that merely went away: other people's pods come and go.
A verdict reached while other people's pods changed on the node is a skip with that reason.
"""

import pytest

from gpuproof.cluster.churn import ForeignPods, preemption_victims
from gpuproof.cluster.conditions import PodCondition, wait_events_naming, wait_for
from gpuproof.plugin.checks import TOLERATE_ALL, free_on, pod, pod_outcome, pod_settled, settled

FEATURE = "preemption"
LOW, HIGH = -100, -10        # below every default priority (0)
MAX_FILL = 16

# the preemptor running, or refused with no node nominated for it (the scheduler found nothing to preempt)
preempted_and_ran = PodCondition("to preempt and run", lambda x: x.status.phase == "Running" or "unschedulable"
                                 in pod_outcome(x) and not x.status.nominated_node_name)


def _priority_class(run, suffix, value, never=False):
    name = f"gpuproof-{run.run_id}-{suffix}"
    spec = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name},
            "value": value, "globalDefault": False,
            "description": "gpuproof acceptance run (negative: only gpuproof's own pods can be preempted)"}
    if never:
        spec["preemptionPolicy"] = "Never"
    run.apply(spec)
    return name


def _pick_node(discovery, cluster, run):
    """The GPU node with the fewest free GPUs (>= 1) where no foreign pod could be a victim."""
    all_pods = cluster.core.list_pod_for_all_namespaces().items
    low_foreign = {p.spec.node_name for p in all_pods
                   if p.metadata.namespace != run.namespace and (p.spec.priority or 0) < HIGH}
    best = None
    for n in discovery.placeable:
        if n.mig_strategy == "mixed" or n.name in low_foreign:
            continue
        free = free_on(cluster, n, n.gpu_resource)
        if 1 <= free <= MAX_FILL and (best is None or free < best[1]):
            best = (n, free)
    return best


def _victims(run, target, preemptor, fill: int) -> set[str]:
    """namespace/name of the pods the scheduler preempted for ``preemptor`` (its Preempted events)."""
    from gpuproof.cluster.api import WaitTimeout
    from gpuproof.errors import ApiUnreachable

    uid = preemptor.metadata.uid
    try:       # the scheduler records events asynchronously: give them a moment to arrive
        wait_events_naming(target.cluster.core, "Preempted", uid, target.timeouts.event,
                           f"Preempted events naming {preemptor.metadata.name}")
    except WaitTimeout as exc:
        if isinstance(exc, ApiUnreachable):     # cut by the API server, not ended by time: nothing to judge on
            raise
    return preemption_victims(target.cluster, uid)


@pytest.mark.creates("PriorityClass", "gpuproof-{run}-low", value=LOW)
@pytest.mark.creates("PriorityClass", "gpuproof-{run}-high", value=HIGH)
@pytest.mark.creates("PriorityClass", "gpuproof-{run}-never", value=HIGH, policy="Never")
@pytest.mark.creates("Pod", "low-<i>", "{free}", on=_pick_node, requests="1 {resource}", priority="gpuproof-{run}-low",
                      note="one per free GPU of the node")
@pytest.mark.creates("Pod", "preemptor", on=_pick_node, requests="1 {resource}", priority="gpuproof-{run}-high")
@pytest.mark.creates("Pod", "no-preempt", on=_pick_node, requests="1 {resource}", priority="gpuproof-{run}-never")
def test_preemption_evicts_just_enough_and_never_foreign(discovery, run, scratch, target, check):
    cluster = target.cluster
    picked = _pick_node(discovery, cluster, run)
    if picked is None:
        check.skip("preemption", f"no GPU node with 1-{MAX_FILL} free GPUs and no other pod below priority {HIGH}")
    node, free = picked
    churn = ForeignPods(cluster, run.run_id, [node.name])
    res = node.gpu_resource
    low = _priority_class(run, "low", LOW)
    high = _priority_class(run, "high", HIGH)
    never = _priority_class(run, "never", HIGH, never=True)
    fill = [f"low-{i}" for i in range(free)]
    for name in fill:
        scratch.create(pod(name, {res: 1}, node=node.name, tolerations=TOLERATE_ALL, priority_class=low))
    seen: set[str] = set()

    def placed_or_lost(c: dict):
        # a fill pod seen and then gone (or going) was taken away meanwhile: another preemptor's victim, or deleted
        seen.update(n for n in fill if n in c)
        lost = [n for n in sorted(seen) if n not in c or c[n].metadata.deletion_timestamp]
        return ("lost", lost) if lost else all(n in c and settled(c[n]) for n in fill) and ("placed", c)

    how, running = run.wait_pods(placed_or_lost, target.timeouts.pods_settled,
                                 f"{free} low-priority pods to be placed on {node.name}")
    if how == "lost":
        check.skip("preemption", churn.changed() or f"{node.name} did not take {free} low-priority pods "
                   f"({', '.join(running)} taken away while the node filled: preempted by other pods or deleted)")
    if not all(running[n].status.phase == "Running" for n in fill):
        moved = churn.changed()
        check.skip("preemption", moved or f"{node.name} did not take {free} low-priority pods "
                   f"({', '.join(sorted(pod_outcome(running[n]) for n in fill))[:300]})")

    scratch.create(pod("preemptor", {res: 1}, node=node.name, tolerations=TOLERATE_ALL, priority_class=high))
    p = wait_for(run, "preemptor", preempted_and_ran, target.timeouts.preemption)
    check.equal("preemptor-lands", f"running on {node.name}", pod_outcome(p),
                what=f"a priority {HIGH} pod asking 1 {res} on the full node", target=node.name, churn=churn)
    victims = _victims(run, target, p, free) if p.status.phase == "Running" else set()
    mine = {v for v in victims if v.startswith(f"{run.namespace}/")}
    check.equal("just-enough-victims", 1, len(mine), what=f"low-priority pods the scheduler preempted to free "
                f"1 {res} ({', '.join(sorted(mine)) or 'none'})", target=node.name, churn=churn)

    scratch.create(pod("no-preempt", {res: 1}, node=node.name, tolerations=TOLERATE_ALL, priority_class=never))
    q = wait_for(run, "no-preempt", pod_settled, target.timeouts.pod_placed)
    check.true("never-policy-waits", pod_outcome(q).startswith("unschedulable"),
               expected="Pending (preemptionPolicy: Never)", actual=pod_outcome(q),
               what="a priority pod that may not preempt, on the full node", target=node.name, churn=churn)
    # a Never pod that preempted after all is Running or nominated; the scheduler's events may still be on the way
    never_victims = _victims(run, target, q, 0) if q.status.phase == "Running" or q.status.nominated_node_name \
        else preemption_victims(cluster, q.metadata.uid)
    check.equal("never-policy-no-victims", [], sorted(never_victims),
                what="pods preempted for the preemptionPolicy: Never pod", target=node.name)

    foreign = sorted(v for v in victims | never_victims if not v.startswith(f"{run.namespace}/"))
    check.equal("foreign-pods-untouched", [], foreign,
                what="pods outside the run that the scheduler preempted for the run's pods", target="cluster")

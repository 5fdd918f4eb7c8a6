"""Named timeouts for the suites' waits, as the Kubernetes e2e framework names its own (``TimeoutContext``:
PodStart, PodDelete, ...): a wait says which kind of thing it waits for, and every one of them is scaled by
``--timeout-scale`` (a slow cluster, a busy CI machine) in one place. ``target.timeouts.<name>`` in a suite.

The figures are upper bounds for a healthy cluster, never expectations: a wait ends as soon as what it waits for
is seen, and says what it waited for when it does not."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Timeouts:
    scale: float = 1.0
    event_s: float = 15           # an event the control plane records at once (the scheduler's Preempted)
    pod_placed_s: float = 90      # one pod bound to a node or refused by the scheduler (MIG, DRA and taint pods too)
    pod_running_s: float = 90     # one pod Running once placed (no image to pull: the pause image, or lent)
    pods_settled_s: float = 120   # a set of pods filling a node's free GPUs, each placed or refused
    preemption_s: float = 120     # a preemptor to evict its victims, be bound and run
    quota_ready_s: float = 60     # a ResourceQuota's status to be computed by kube-controller-manager
    claim_scheduled_s: float = 300   # a pod with ResourceClaims to be allocated and scheduled (DRA)
    pod_done_s: float = 900       # a workload pod to run to its end, its image pull included
    run_setup_s: float = 60       # the run's namespace, labels and lease
    cleanup_s: float = 120        # the run's namespaces to be gone at the end

    def __getattr__(self, name: str) -> float:
        """``timeouts.pod_placed``: the scaled figure of ``pod_placed_s``."""
        if name.endswith("_s") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self, f"{name}_s") * self.scale

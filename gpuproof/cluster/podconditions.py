"""The named conditions on one pod (:class:`PodCondition`: a test with the words of what it waits for), below
everything that waits on them: :class:`~gpuproof.cluster.api.Run`'s own waits use them, and
:mod:`gpuproof.cluster.conditions` (the suites' vocabulary of waits) gives them out with its waits."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

FINISHED = ("Succeeded", "Failed")


@dataclasses.dataclass(frozen=True)
class PodCondition:
    """A condition on one pod and what it says (``what``, e.g. "to be Running": the end of "waiting for pod X ...").

    ``test`` sees the pod, or None where a shared watch has not seen it (or saw it go); only :data:`pod_gone` holds
    for None."""

    what: str
    test: Callable[[Any], bool]

    def __call__(self, pod) -> bool:
        return self.test(pod)

    def named(self, what: str) -> PodCondition:
        """The same condition saying more of why it is waited for."""
        return dataclasses.replace(self, what=what)


def _phase(pod) -> str | None:
    return pod.status.phase if pod is not None and pod.status else None


def is_ready(pod) -> bool:
    """The pod's Ready condition is True."""
    for cond in (pod.status.conditions or []) if pod is not None and pod.status else []:
        if cond.type == "Ready":
            return cond.status == "True"
    return False


pod_scheduled = PodCondition("to be scheduled", lambda p: p is not None and bool(p.spec.node_name))
pod_running = PodCondition("to be Running", lambda p: _phase(p) == "Running")
pod_ready = PodCondition("to be Ready", is_ready)
pod_done = PodCondition("to finish (Succeeded or Failed)", lambda p: _phase(p) in FINISHED)
pod_started = PodCondition("to be Running (or finished)", lambda p: _phase(p) in ("Running", *FINISHED))
pod_gone = PodCondition("to be deleted", lambda p: p is None)

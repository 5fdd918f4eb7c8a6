"""A pytest plugin for one fault test of the preemption suite (``-p tests.plugin_preemption_faults``).

It makes, at the moments that matter, the two faults the suite's guards exist for, and leaves the
verdicts to the real kube-scheduler:

- just before the suite creates its preemptor, a pod of someone else with a priority below every pod
  of the run takes the place of one of the run's low-priority pods on the full node (a pod that came
  after the suite picked the node): the scheduler preempts it for the preemptor;
- the suite's ``preemptionPolicy: Never`` PriorityClass is created without that policy, as a cluster
  whose admission drops the field would: the "Never" pod preempts one of the run's pods.

Everything it creates carries the name ``fault-foreign`` and is deleted when the session ends.
"""

from __future__ import annotations

import contextlib

from kubernetes.client.exceptions import ApiException

from gpuproof.cluster import api as cluster_mod
from gpuproof.plugin import checks as suite_mod
from gpuproof.cluster.api import watch_until

NS = "fault-foreign"
PRIORITY = "fault-foreign-lowest"
FOREIGN_POD = "foreign-0"
_state: dict = {}


def _pinned_node(manifest: dict) -> str:
    terms = manifest["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return next(f["values"][0] for t in terms["nodeSelectorTerms"] for f in t.get("matchFields", [])
                if f["operator"] == "In")


def _swap_in_a_foreign_pod(scratch, manifest: dict) -> None:
    """Replace the run's low-0 on the preemptor's node with someone else's pod of the lowest priority."""
    run = scratch.run
    core, node = run.cluster.core, _pinned_node(manifest)
    (resource, amount), = manifest["spec"]["containers"][0]["resources"]["limits"].items()
    _state["cluster"] = run.cluster
    with contextlib.suppress(ApiException):
        core.create_namespace({"metadata": {"name": NS}})
    with contextlib.suppress(ApiException):
        run.cluster.scheduling.create_priority_class({"metadata": {"name": PRIORITY}, "value": -1000})
    scratch.delete_pod("low-0")
    core.create_namespaced_pod(NS, {"metadata": {"name": FOREIGN_POD}, "spec": {
        "nodeName": node, "priorityClassName": PRIORITY, "tolerations": [{"operator": "Exists"}],
        "terminationGracePeriodSeconds": 0, "containers": [{
            "name": "c", "image": suite_mod.PAUSE_IMAGE, "resources": {"limits": {resource: amount}}}]}})
    watch_until(core.list_namespaced_pod, lambda c: FOREIGN_POD in c and c[FOREIGN_POD].status.phase == "Running",
                60, f"pod {NS}/{FOREIGN_POD} to run on {node}", namespace=NS)


_create = suite_mod.Scratch.create
_apply = cluster_mod.Run.apply


def _scratch_create(self, manifest: dict):
    if manifest.get("kind") == "Pod" and manifest["metadata"]["name"] == "preemptor":
        _swap_in_a_foreign_pod(self, manifest)
    return _create(self, manifest)


def _run_apply(self, manifest: dict, namespace: str | None = None):
    if manifest.get("kind") == "PriorityClass" and manifest["metadata"]["name"].endswith("-never"):
        manifest = {k: v for k, v in manifest.items() if k != "preemptionPolicy"}
    return _apply(self, manifest, namespace)


suite_mod.Scratch.create = _scratch_create
cluster_mod.Run.apply = _run_apply


def pytest_sessionfinish(session, exitstatus) -> None:
    cluster = _state.get("cluster")
    if cluster is None:
        return
    with contextlib.suppress(ApiException):
        cluster.core.delete_namespace(NS)
    with contextlib.suppress(ApiException):
        cluster.scheduling.delete_priority_class(PRIORITY)

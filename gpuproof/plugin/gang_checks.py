"""The gang suite's workings (``suites/test_gang.py``): the cluster's gang scheduler, a gang submitted to it, and
what is seen of the gang's pods.

A gang is a batch/v1 Job with ``parallelism`` = ``completions`` (upstream ``TestGangScheduling``'s design), each pod
asking one ``nvidia.com/gpu`` and tolerating the GPU nodes' taints, running ``sleep 5`` in the image the cluster lends
gpuproof's workloads, else a small image (``$GPUPROOF_SLEEP_IMAGE``, default busybox). How it becomes a gang depends
on the scheduler (:class:`Gang`):

- Kubernetes' Workload API: a ``scheduling.k8s.io/v1alpha1`` Workload of the Job's name, one pod group ``gang``
  with ``policy.gang.minCount`` = the gang's size, and the Job's pod template's ``spec.workloadRef`` naming it
  (Kubernetes 1.35: the scheduler's GangScheduling plugin holds the pods at Permit until minCount of them fit);
- Kueue: the Job's label ``kueue.x-k8s.io/queue-name`` names a LocalQueue the run makes in its namespace
  (``gpuproof-gang``), pointing at a ClusterQueue of the cluster (gpuproof.discovery.gang); Kueue's webhook
  suspends the Job and Kueue admits it whole, or not at all.

The free GPUs are the cluster's own figure: the allocatable ``nvidia.com/gpu`` of the GPU nodes pods can land on,
less what their unfinished pods hold. Every wait watches, with a deadline, and says what it waits for; the negative
gang's window is a watch of its pods for that long, each pod that was bound in it kept with its node.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..cluster.api import watch_until
from ..cluster.placement import tolerate
from ..discovery import gang as found_gang
from ..errors import ApiUnreachable, ClusterError, WaitTimeout
from ..vocab import GPU

GANG_LABEL = "gpuproof.dev/gang"         # on the gang's pods: the Job's name
POSITIVE_SIZE = 2                        # upstream's positive gang: 2 pods
DEADLINE_S = 120.0                       # upstream: the positive gang bound and complete within 2 minutes
RUN_S = 5                                # each pod's sleep (upstream: busybox, sleep 5)
LOCAL_QUEUE = "gpuproof-gang"            # the run's Kueue LocalQueue
POD_GROUP = "gang"                       # the Workload's one pod group
SLEEP_IMAGE_ENV = "GPUPROOF_SLEEP_IMAGE"
SLEEP_IMAGE = "busybox:1.36"
WORKLOAD_GROUP, WORKLOAD_VERSION = "scheduling.k8s.io", "v1alpha1"


@dataclasses.dataclass
class Gang:
    """The gang scheduler under test, and the GPU nodes a gang's pods may land on."""

    found: found_gang.Found
    nodes: list                          # GpuNodes offering nvidia.com/gpu to pods
    tolerations: list[dict]
    cluster_queue: dict | None = None    # Kueue: the ClusterQueue the run's LocalQueue points at
    all_queues: list[dict] = dataclasses.field(default_factory=list)
    queue_state: str = ""                # Kueue: how the LocalQueue was last seen, where Kueue never made it Active

    @property
    def kueue(self) -> bool:
        return self.found.name == found_gang.KUEUE

    @property
    def node_names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def job_labels(self) -> dict[str, str]:
        return {found_gang.KUEUE_QUEUE_LABEL: LOCAL_QUEUE} if self.kueue else {}

    def quota(self) -> int | None:
        """Kueue: the most GPUs the ClusterQueue can admit at once (its cohort's included); else None."""
        if self.cluster_queue is None:
            return None
        return found_gang.admissible(self.cluster_queue, self.all_queues, GPU)

    def where(self) -> str:
        """The scheduler, and the queue the gang goes to, as a failure names them."""
        if self.cluster_queue is not None:
            return f"{self.found.title}, LocalQueue {LOCAL_QUEUE} -> ClusterQueue " \
                   f"{self.cluster_queue['metadata']['name']}" + (f" (never Active: {self.queue_state})"
                                                                  if self.queue_state else "")
        return self.found.title


def gpu_nodes(discovery) -> list:
    """GPU nodes a gang's pods can land on: placeable, offering ``nvidia.com/gpu`` to pods."""
    return [n for n in discovery.placeable if n.gpu_resource == GPU and (n.allocatable_of(GPU) or 0) > 0]


def free_gpus(cluster, nodes: list) -> dict[str, int]:
    """node -> its allocatable nvidia.com/gpu less what its unfinished pods hold (one list of the cluster's pods)."""
    held: dict[str, int] = {}
    wanted = {n.name for n in nodes}
    pods = cluster.core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed")
    for p in pods.items:
        if p.spec.node_name not in wanted:
            continue
        for c in p.spec.containers:
            res = c.resources
            asked = ((res.limits or {}).get(GPU) or (res.requests or {}).get(GPU) or 0) if res else 0
            held[p.spec.node_name] = held.get(p.spec.node_name, 0) + int(asked)
    return {n.name: max(0, (n.allocatable_of(GPU) or 0) - held.get(n.name, 0)) for n in nodes}


def find(target, run, discovery, config) -> Gang | str:
    """The gang scheduler to test (:class:`Gang`), or why the suite skips. Kueue: the run's LocalQueue is made here,
    and waited for until Kueue has it Active (one it never makes Active is named in every verdict, not skipped)."""
    cluster = target.cluster
    found, why = found_gang.choose(found_gang.find(found_gang.served(cluster)), config.getoption("gang_scheduler"))
    if found is None:
        return why
    if found.name in (found_gang.VOLCANO, found_gang.KAI):
        return (f"found {found}, for which gpuproof has no gang backend yet (it tests Kueue and Kubernetes' Workload "
                f"API); --gang-scheduler names another one the cluster has")
    if not found_gang.version_supported(found):
        return f"found {found}, an API version gpuproof does not write"
    nodes = gpu_nodes(discovery)
    if not nodes:
        return f"no GPU node offers {GPU} to pods (the gang's pods ask one each)"
    tolerations = tolerate(t for n in nodes for t in n.taints)
    gang = Gang(found, nodes, tolerations)
    if gang.kueue:
        group, version = found.version.split("/")
        try:
            cqs = cluster.custom.list_cluster_custom_object(group, version, "clusterqueues")["items"]
        except ApiException as exc:
            return f"Kueue found, but its ClusterQueues could not be listed (HTTP {exc.status} {exc.reason})"
        labels = {**run.labels, "kubernetes.io/metadata.name": run.namespace}
        cq, why = found_gang.pick_cluster_queue(cqs, labels, GPU, config.getoption("gang_queue"))
        if cq is None:
            return why
        gang.cluster_queue, gang.all_queues = cq, cqs
        gang.queue_state = make_local_queue(run, found.version, cq["metadata"]["name"], target.timeouts.quota_ready)
    return gang


def create_custom(run, api_version: str, plural: str, manifest: dict) -> dict:
    """Create a namespaced object of a group the client has no typed API for, stamped with the run's labels."""
    group, version = api_version.split("/")
    body = run.stamp({**manifest, "apiVersion": api_version})
    try:
        return run.cluster.custom.create_namespaced_custom_object(group, version, run.namespace, plural, body)
    except ApiException as exc:
        raise ClusterError(f"could not create {manifest['kind']} {run.namespace}/{manifest['metadata']['name']}: "
                           f"HTTP {exc.status} {exc.reason}: {' '.join(str(exc.body or '').split())[:300]}") from None


def make_local_queue(run, api_version: str, cluster_queue: str, timeout: float) -> str:
    """The run's LocalQueue pointing at ``cluster_queue``, waited for until Kueue reports it Active: '', or how it
    was last seen when Kueue did not within ``timeout`` (its controller stopped: the gangs then show what that does,
    under its webhook or without one)."""
    create_custom(run, api_version, "localqueues", {"kind": "LocalQueue", "metadata": {"name": LOCAL_QUEUE},
                                                    "spec": {"clusterQueue": cluster_queue}})
    group, version = api_version.split("/")

    def active(cache: dict) -> bool:
        lq = cache.get(LOCAL_QUEUE) or {}
        return any(c.get("type") == "Active" and c.get("status") == "True"
                   for c in (lq.get("status") or {}).get("conditions") or [])

    def describe(cache: dict) -> str:
        conds = ((cache.get(LOCAL_QUEUE) or {}).get("status") or {}).get("conditions") or []
        return "; ".join(f"{c.get('type')}={c.get('status')} ({c.get('reason')}: {c.get('message')})"
                         for c in conds) or "no conditions yet (is Kueue's controller running?)"

    seen: dict = {}

    def active_seen(cache: dict) -> bool:
        seen.update(cache)
        return active(cache)

    try:
        watch_until(run.cluster.custom.list_namespaced_custom_object, active_seen, timeout,
                    f"Kueue to report LocalQueue {run.namespace}/{LOCAL_QUEUE} (-> ClusterQueue {cluster_queue}) "
                    "Active", describe=describe, group=group, version=version, namespace=run.namespace,
                    plural="localqueues")
    except WaitTimeout as exc:
        if isinstance(exc, ApiUnreachable):
            raise
        return describe(seen)
    return ""


def container(run) -> dict:
    """The gang pods' one container: sleep RUN_S in the image the cluster lends gpuproof's workloads, else a small
    one; one nvidia.com/gpu and nothing else asked (a ClusterQueue need cover no other resource)."""
    lent = getattr(run, "workload_image", None)
    c: dict[str, Any] = {"name": "main", "resources": {"limits": {GPU: "1"}}}
    if lent is not None:
        _, mounts = lent.volumes()
        c.update(image=lent.name, command=["python", "-c", f"import time; time.sleep({RUN_S})"], volumeMounts=mounts,
                 env=[{"name": k, "value": v} for k, v in lent.env])
        if lent.pull_policy:
            c["imagePullPolicy"] = lent.pull_policy
    else:
        c.update(image=os.environ.get(SLEEP_IMAGE_ENV) or SLEEP_IMAGE, command=["sleep", str(RUN_S)])
    return c


def job_manifest(gang: Gang, run, name: str, size: int) -> dict:
    """The gang: a Job of ``size`` pods at once, one GPU each."""
    spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                            "automountServiceAccountToken": False, "enableServiceLinks": False,
                            "containers": [container(run)], "tolerations": gang.tolerations}
    lent = getattr(run, "workload_image", None)
    if lent is not None:
        spec["volumes"] = lent.volumes()[0]
    if gang.found.name == found_gang.WORKLOAD_API:
        spec["workloadRef"] = {"name": name, "podGroup": POD_GROUP}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": gang.job_labels()},
            "spec": {"parallelism": size, "completions": size, "backoffLimit": 0,
                     "template": {"metadata": {"labels": {GANG_LABEL: name}}, "spec": spec}}}


def workload_manifest(name: str, size: int) -> dict:
    """Kubernetes' Workload for the Job ``name``: one pod group, all ``size`` pods or none."""
    return {"kind": "Workload", "metadata": {"name": name},
            "spec": {"controllerRef": {"apiGroup": "batch", "kind": "Job", "name": name},
                     "podGroups": [{"name": POD_GROUP, "policy": {"gang": {"minCount": size}}}]}}


def submit(gang: Gang, run, name: str, size: int) -> None:
    """Create the gang (its Workload first, where the Workload API makes it one)."""
    if gang.found.name == found_gang.WORKLOAD_API:
        create_custom(run, gang.found.version, "workloads", workload_manifest(name, size))
    run.apply(job_manifest(gang, run, name, size))


def remove(gang: Gang, run, name: str, timeout: float) -> None:
    """Delete the gang's Job (and Workload) and wait until its pods are gone, so that the next gang finds its GPUs."""
    cluster = run.cluster
    with contextlib.suppress(ApiException):
        cluster.batch.delete_namespaced_job(name, run.namespace, propagation_policy="Background",
                                            grace_period_seconds=0)
    if gang.found.name == found_gang.WORKLOAD_API:
        with contextlib.suppress(ApiException):
            cluster.custom.delete_namespaced_custom_object(WORKLOAD_GROUP, WORKLOAD_VERSION, run.namespace,
                                                           "workloads", name)
    watch_until(cluster.core.list_namespaced_pod, lambda c: not c, timeout, f"the pods of gang {name} to be gone",
                describe=lambda c: f"{len(c)} left: {', '.join(sorted(c)[:5])}", namespace=run.namespace,
                label_selector=f"{GANG_LABEL}={name}")


# ---------------------------------------------------------------------------- what is seen of a gang's pods


def bound(pods: dict) -> dict[str, str]:
    """pod -> node, for the pods bound to a node (Running, finished or not)."""
    return {n: p.spec.node_name for n, p in sorted(pods.items()) if p.spec.node_name}


def describe(pods: dict) -> str:
    """'<pod> on <node>' for the bound pods, '<pod>: <why it waits>' for the others."""
    out = []
    for name, p in sorted(pods.items()):
        if p.spec.node_name:
            waiting = sorted({c.state.waiting.reason for c in p.status.container_statuses or []
                              if c.state and c.state.waiting and c.state.waiting.reason})
            out.append(f"{name} on {p.spec.node_name} ({', '.join([p.status.phase, *waiting])})")
            continue
        why = next((c.message for c in p.status.conditions or [] if c.type == "PodScheduled" and c.message), "")
        out.append(f"{name}: {p.status.phase}" + (f", {' '.join(why.split())[:160]}" if why else ""))
    return "; ".join(out)


def watch_bound(run, name: str, size: int, timeout: float) -> dict:
    """The gang's pods once ``size`` of them are bound, or as last seen when ``timeout`` ran out."""
    seen: dict = {}

    def all_bound(cache: dict):
        seen.clear()
        seen.update(cache)
        return dict(cache) if len(bound(cache)) >= size else None

    try:
        return watch_until(run.cluster.core.list_namespaced_pod, all_bound, timeout,
                           f"the {size} pods of gang {name} to be bound", describe=describe,
                           namespace=run.namespace, label_selector=f"{GANG_LABEL}={name}")
    except WaitTimeout as exc:
        if isinstance(exc, ApiUnreachable):
            raise
        return dict(seen)


def watch_job_done(run, name: str, timeout: float) -> dict:
    """The Job's state (gpuproof.discovery.gang.job_state) once it is Complete or Failed, or when ``timeout`` ran
    out."""
    seen: dict = {}

    def finished(cache: dict):
        if name in cache:
            seen.update(found_gang.job_state(cache[name]))
            return seen if {"Complete", "Failed"} & set(seen["conditions"]) else None
        return None

    try:
        watch_until(run.cluster.batch.list_namespaced_job, finished, max(timeout, 1.0),
                    f"Job {run.namespace}/{name} to complete", namespace=run.namespace,
                    field_selector=f"metadata.name={name}")
    except WaitTimeout as exc:
        if isinstance(exc, ApiUnreachable):
            raise
    return seen


def observe_held(run, name: str, window: float) -> dict[str, str]:
    """Watch the gang's pods for ``window`` seconds: pod -> node of every pod bound to a node at any time in it
    (a pod bound and gone again still counts)."""
    ever: dict[str, str] = {}
    end = time.monotonic() + window

    def window_over(cache: dict):
        ever.update(bound(cache))
        return time.monotonic() >= end

    watch_until(run.cluster.core.list_namespaced_pod, window_over, window + 30.0,
                f"the {window:g} s in which no pod of gang {name} may be bound", tick=1.0,
                namespace=run.namespace, label_selector=f"{GANG_LABEL}={name}")
    return ever


def pods_of(run, name: str) -> dict:
    """The gang's pods now, by name."""
    found = run.cluster.core.list_namespaced_pod(run.namespace, label_selector=f"{GANG_LABEL}={name}").items
    return {p.metadata.name: p for p in found}


def read_job(run, name: str) -> dict:
    return found_gang.job_state(run.cluster.batch.read_namespaced_job(name, run.namespace))


def deadline(target) -> float:
    """The positive gang's deadline (upstream: 2 minutes), scaled by --timeout-scale."""
    return DEADLINE_S * target.timeouts.scale

"""Building blocks for the scheduling suites: pod manifests, pinning, free GPUs, scratch pods."""

from __future__ import annotations

import contextlib
import os
from typing import Any

from kubernetes.client.exceptions import ApiException

from .discovery import GpuNode

PAUSE_IMAGE = os.environ.get("GPUPROOF_PAUSE_IMAGE", "registry.k8s.io/pause:3.10")
TOLERATE_ALL = [{"operator": "Exists"}]


def tolerations_for(node: GpuNode) -> list[dict]:
    """Tolerate exactly the node's own taints (so only the thing under test decides placement)."""
    seen, out = set(), []
    for t in node.taints:
        if t["key"] not in seen:
            seen.add(t["key"])
            out.append({"key": t["key"], "operator": "Exists"})
    return out


def pin_to(node_name: str) -> dict:
    """Required node affinity on the hostname: the scheduler still decides (unlike spec.nodeName)."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}


def pod(name: str, limits: dict | None = None, *, node: str | None = None, tolerations: list | None = None,
        priority_class: str | None = None, node_selector: dict | None = None, affinity: dict | None = None,
        labels: dict | None = None, image: str = PAUSE_IMAGE, command: list | None = None,
        restart_policy: str = "Never") -> dict:
    container: dict[str, Any] = {"name": "main", "image": image,
                                 "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}
    if limits:
        container["resources"]["limits"] = {k: str(v) for k, v in limits.items()}
    if command:
        container["command"] = command
    spec: dict[str, Any] = {"containers": [container], "restartPolicy": restart_policy,
                            "terminationGracePeriodSeconds": 0, "automountServiceAccountToken": False}
    if tolerations:
        spec["tolerations"] = tolerations
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node_selector:
        spec["nodeSelector"] = node_selector
    if node:
        affinity = {**(affinity or {}), **pin_to(node)}
    if affinity:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def one_device(node: GpuNode) -> dict[str, int]:
    """Limits for a pod that takes one schedulable device of this node (GPU, shared GPU or MIG slice)."""
    if node.mig_strategy == "mixed" and node.mig_resources:
        profile = max(node.mig_resources, key=lambda p: node.mig_resources[p])
        return {f"nvidia.com/mig-{profile}": 1}
    return {node.gpu_resource: 1}


def used_on(cluster, node_name: str, resource: str) -> int:
    """How much of an extended resource the node's non-finished pods already hold."""
    pods = cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
    total = 0
    for p in pods:
        if p.status.phase in ("Succeeded", "Failed"):
            continue
        for c in p.spec.containers:
            lim = (c.resources.limits or {}) if c.resources else {}
            req = (c.resources.requests or {}) if c.resources else {}
            total += int(lim.get(resource) or req.get(resource) or 0)
    return total


def free_on(cluster, node: GpuNode, resource: str) -> int:
    return max(0, (node.allocatable_of(resource) or 0) - used_on(cluster, node.name, resource))


class Scratch:
    """Pods one test creates; deleted (and waited for) when the test ends so capacity is free again."""

    def __init__(self, run, timeout: float = 120.0):
        self.run = run
        self.names: list[str] = []
        self.timeout = timeout

    def create(self, manifest: dict):
        obj = self.run.apply(manifest)
        self.names.append(manifest["metadata"]["name"])
        return obj

    def try_create(self, manifest: dict) -> ApiException | None:
        obj, err = self.run.try_apply(manifest)
        if err is None:
            self.names.append(manifest["metadata"]["name"])
        return err

    def close(self) -> None:
        if not self.names:
            return
        for name in self.names:
            with contextlib.suppress(ApiException):
                self.run.cluster.core.delete_namespaced_pod(name, self.run.namespace, grace_period_seconds=0)
        gone = set(self.names)
        self.run.wait_pods(lambda c: not (gone & set(c)) or None, self.timeout,
                           f"the test's {len(gone)} pods to be deleted")
        self.names.clear()


def pod_outcome(pod) -> str:
    """'running on X', 'unschedulable: ...', 'failed: reason', or the phase."""
    if pod.status.phase == "Running":
        return f"running on {pod.spec.node_name}"
    if pod.status.phase == "Failed":
        return f"failed: {pod.status.reason}: {pod.status.message}"
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return f"unschedulable: {cond.message}"
    return f"{pod.status.phase} on {pod.spec.node_name or '(no node)'}"


def settled(pod) -> bool:
    """Running, finished, or refused by the scheduler: the scheduler has made up its mind."""
    return pod.status.phase in ("Running", "Succeeded", "Failed") or pod_outcome(pod).startswith("unschedulable")


def probe_on(run, target, node: GpuNode, count: int, limits: dict, args: tuple = (), prefix: str = "probe"
             ) -> list[dict]:
    """Run ``count`` probe pods (workloads/probe.py) pinned to ``node`` at once; return their JSON results."""
    from . import workloads

    cm = workloads.configmap(labels=run.labels, namespace=run.namespace)
    obj, err = run.try_apply(cm)
    if err is not None and err.status != 409:          # 409: shipped already in this run
        raise err
    names = [f"{prefix}-{node.name}-{i}"[:63] for i in range(count)]
    (resource, amount), = limits.items()
    for name in names:
        run.apply(workloads.workload_pod(name, "probe.py", args, labels=run.labels, namespace=run.namespace,
                                         gpus=amount, resource=resource, node=node.name))
    run.wait_pods(lambda c: all(n in c and c[n].status.phase in ("Succeeded", "Failed") for n in names) or None,
                  target.timeout(900), f"{count} probe pods on {node.name} to finish (image pull included)")
    return [workloads.parse_result(run.pod_logs(n), what=f"probe pod {n}") for n in names]


def visible_device_ids(result: dict) -> list[str]:
    """What the device plugin handed the container: NVIDIA_VISIBLE_DEVICES, else the CUDA device UUIDs."""
    env = result.get("env") or {}
    ids = env.get("NVIDIA_VISIBLE_DEVICES") or env.get("CUDA_VISIBLE_DEVICES")
    if ids and ids not in ("all", "void", "none"):
        return [i.strip() for i in ids.split(",") if i.strip()]
    return [d.get("uuid") or "" for d in result.get("torch_devices", [])]

"""Building blocks for the scheduling suites: pod manifests, pinning, free GPUs, scratch pods."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from ..cluster.conditions import PodCondition, pod_done, pod_gone, wait_all, wait_claims_gone
from ..cluster.placement import pin_to, place, pod_manifest, tolerate  # noqa: F401  (pin_to: the suites' name for it)
from ..discovery.nodes import GpuNode
from ..images import PAUSE_IMAGE
from ..vocab import name_on  # noqa: F401  (the suites' name for it)

TOLERATE_ALL = [{"operator": "Exists"}]


def tolerations_for(node: GpuNode) -> list[dict]:
    """Tolerate exactly the node's own taints (so only the thing under test decides placement)."""
    return tolerate(node.taints)


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
    if priority_class:
        spec["priorityClassName"] = priority_class
    place(spec, node=node, tolerations=tolerations, node_selector=node_selector, affinity=affinity)
    return pod_manifest({"name": name, "labels": labels or {}}, spec)


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


def keep_off(manifest: dict, nodes: list[str]) -> dict:
    """Add ``metadata.name NotIn nodes`` to every required node-affinity term of a pod manifest.

    The suites tolerate every taint, so without this a pod could be bound to a dead node
    (its not-ready taint tolerated too) and wait there for a kubelet that never comes.
    """
    if not nodes:
        return manifest
    affinity = manifest["spec"].setdefault("affinity", {}).setdefault("nodeAffinity", {})
    required = affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", []) or [{}]
    for term in terms:
        term.setdefault("matchFields", []).append({"key": "metadata.name", "operator": "NotIn", "values": nodes})
    required["nodeSelectorTerms"] = terms
    return manifest


class Scratch:
    """Pods one test creates; deleted (and waited for) when the test ends so capacity is free again.

    Every pod is kept off ``avoid`` (GPU nodes unfit for placement: not Ready, cordoned, lifecycle taint).
    """

    def __init__(self, run, timeout: float = 120.0, avoid: list[str] | None = None):
        self.run = run
        self.names: list[str] = []
        self.claims: list[tuple[str, str]] = []     # (kind, name) of ResourceClaims and templates made here
        self.uses_claims = False                    # some object here made or used a claim: wait for them at close
        self.timeout = timeout
        self.avoid = sorted(avoid or [])

    def create(self, manifest: dict):
        if manifest.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"):
            obj = self.run.apply(manifest)
            self.claims.append((manifest["kind"], manifest["metadata"]["name"]))
            self.uses_claims = True
            return obj
        obj = self.run.apply(keep_off(manifest, self.avoid))
        self.names.append(manifest["metadata"]["name"])
        self.uses_claims |= bool(manifest["spec"].get("resourceClaims"))
        return obj

    def delete_pod(self, name: str) -> None:
        """Delete one of the test's pods now and wait until it is gone (its claims then free their devices)."""
        self._delete_pods([name])

    def try_create(self, manifest: dict) -> ApiException | None:
        obj, err = self.run.try_apply(keep_off(manifest, self.avoid))
        if err is None:
            self.names.append(manifest["metadata"]["name"])
        return err

    def close(self) -> None:
        if self.names:
            self._delete_pods(self.names)
            self.names.clear()
        if self.uses_claims:
            self._delete_claims()

    def _delete_claims(self) -> None:
        """Delete the test's claims and templates; wait until no claim is left in the run namespace, so the
        next test finds every device free (claims from templates go with their pods)."""
        run, res = self.run, self.run.cluster.resource
        for kind, name in self.claims:
            with contextlib.suppress(ApiException):
                if kind == "ResourceClaim":
                    res.delete_namespaced_resource_claim(name, run.namespace)
                else:
                    res.delete_namespaced_resource_claim_template(name, run.namespace)
        self.claims.clear()
        self.uses_claims = False
        wait_claims_gone(run, self.timeout, who=f"the test's ResourceClaims in {run.namespace}")

    def _delete_pods(self, names: list[str]) -> None:
        # pods with claims end gracefully (1 s): forced away, a pod's claim is freed for the scheduler before its
        # kubelet has unprepared it, and the next pod given that device waits for the kubelet's next sync (~1 min)
        grace = 1 if self.uses_claims else 0
        for name in names:
            with contextlib.suppress(ApiException):
                self.run.cluster.core.delete_namespaced_pod(name, self.run.namespace, grace_period_seconds=grace)
        n = len(set(names))
        wait_all(self.run, names, pod_gone, self.timeout, who=f"the test's {n} pods" if n > 1 else None)


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


# the named wait on it: wait_for(run, name, pod_settled, target.timeouts.pod_placed)
pod_settled = PodCondition("to be placed or refused", lambda p: p is not None and settled(p))


def probe_on(run, target, node: GpuNode, count: int, limits: dict, args: tuple = (), prefix: str = "probe",
             lane=None) -> list[dict]:
    """Run ``count`` probe pods (workloads/probe.py) pinned to ``node`` at once; return their JSON results.

    With a fan-out's ``lane`` the pods carry its label, hold ``count`` of its pod slots, are waited on through its
    shared watch, and are deleted (and gone) before this returns."""
    from ..bench import workloads
    from ..bench.base import ensure_configmap
    from .bench_checks import image

    ensure_configmap(run)                       # once per run
    names = [name_on(node.name, prefix, i) for i in range(count)]
    (resource, amount), = limits.items()
    labels = {**run.labels, **(lane.labels if lane is not None else {})}
    if lane is None:
        for name in names:
            run.apply(workloads.workload_pod(name, "probe.py", args, labels=labels, namespace=run.namespace,
                                             gpus=amount, resource=resource, node=node.name, image=image(run)))
        wait_all(run, names, pod_done.named("to finish (image pull included)"), target.timeouts.pod_done,
                 who=f"{count} probe pods on {node.name}")
        return [workloads.pod_result(run, n, what=f"probe pod {n}") for n in names]
    from ..bench.base import applied

    pods = [workloads.workload_pod(name, "probe.py", args, labels=labels, namespace=run.namespace, gpus=amount,
                                   resource=resource, node=node.name, image=image(run)) for name in names]
    with lane.pods(count), applied(run, pods, lane=lane):     # deleted, and gone, before this returns
        for name in names:
            lane.wait_done(name, target.timeouts.pod_done)
        return [workloads.pod_result(run, n, what=f"probe pod {n}") for n in names]


def normalize_uuid(uuid, kind: str = "GPU") -> str:
    """'GPU-<hex>' / 'MIG-<hex>' as NVML writes them; torch's bare '<hex>' gets ``kind``'s prefix."""
    from ..bench.workloads import import_workload

    return import_workload("probe").normalize_uuid(uuid, kind)


def nvml_device_ids(result: dict) -> list[str]:
    """The devices a probe pod can use, as NVML UUIDs: 'GPU-...' per GPU, 'MIG-...' per MIG device.

    From the probe's ``nvml_uuids`` (or its NVML inventory). Never NVIDIA_VISIBLE_DEVICES:
    on a real host it held an index ('0'), and with the CDI strategy it holds nothing.
    """
    if "nvml_uuids" in result:
        ids = result.get("nvml_uuids") or []
    else:
        ids = []
        for dev in (result.get("nvml") or {}).get("devices") or []:
            if dev.get("mig_mode"):
                ids += [normalize_uuid(m.get("uuid"), "MIG") for m in dev.get("mig_devices") or []]
            else:
                ids.append(normalize_uuid(dev.get("uuid"), "GPU"))
    return [u for u in (normalize_uuid(i) for i in ids) if u]


def _pod(result: dict, i: int) -> str:
    return result.get("host") or f"pod {i}"


def _no_devices(results: list[dict]) -> list[str]:
    """'<pod>: reason' for each probe result that reports no NVML device."""
    out = []
    for i, r in enumerate(results):
        if not nvml_device_ids(r):
            nvml = r.get("nvml") or {}
            why = nvml.get("reason") if nvml.get("available") is False else "NVML lists no GPU or MIG device"
            out.append(f"{_pod(r, i)}: {why}")
    return out


def shared_gpu_check(results: list[dict]) -> tuple[bool, object, object, str]:
    """Pods time-sharing one GPU: (ok, expected, actual, what) for 'every pod sees the same one GPU'."""
    missing = _no_devices(results)
    ids = sorted({u for r in results for u in nvml_device_ids(r)})
    what = f"distinct GPUs (NVML UUIDs) seen by {len(results)} pods sharing one GPU ({', '.join(ids) or 'none'})"
    if missing:
        return False, "one GPU UUID seen by every pod", f"no NVML devices in {'; '.join(missing)}", \
            f"{what}; pods reporting no NVML devices"
    ok = len(ids) == 1 and all(len(nvml_device_ids(r)) == 1 for r in results)
    return ok, 1, len(ids), what


def mig_device_checks(results: list[dict]) -> dict[str, tuple[bool, object, object, str]]:
    """MIG pods: {'one-mig-device-per-pod': ..., 'mig-devices-distinct': ...} as (ok, expected, actual, what)."""
    n = len(results)
    per_pod = [[u for u in nvml_device_ids(r) if u.startswith("MIG-")] for r in results]
    missing = _no_devices(results)
    what = f"MIG devices (NVML UUIDs) visible in each of {n} pods"
    if missing:
        one = (False, [1] * n, [len(p) for p in per_pod], f"{what}; no NVML devices in {'; '.join(missing)}")
    else:
        others = [f"{_pod(r, i)}: {[u for u in nvml_device_ids(r) if not u.startswith('MIG-')]}"
                  for i, r in enumerate(results) if any(not u.startswith("MIG-") for u in nvml_device_ids(r))]
        one = ([len(p) for p in per_pod] == [1] * n, [1] * n, [len(p) for p in per_pod],
               what + (f"; whole GPUs visible too: {'; '.join(others)}" if others else ""))
    flat = [u for p in per_pod for u in p]
    dupes = sorted({u for u in flat if flat.count(u) > 1})
    distinct = (bool(flat) and not dupes, len(flat) or "at least one", len(set(flat)),
                f"distinct MIG devices across pods ({', '.join(flat) or 'none reported'})"
                + (f"; seen by more than one pod: {', '.join(dupes)}" if dupes else ""))
    return {"one-mig-device-per-pod": one, "mig-devices-distinct": distinct}


class Pool:
    def __init__(self, name: str, nodes: list):
        self.name, self.nodes = name, nodes

    def __repr__(self) -> str:
        return f"Pool({self.name}, {len(self.nodes)} nodes)"


GPU_NODES_MARKER = "gpu_nodes"


def for_nodes(predicate):
    """Decorator: parametrize ``gpu_node``/``gpu_pool`` only over nodes where predicate(node) holds: the registered
    marker ``@pytest.mark.gpu_nodes(predicate)`` (spelled ``.with_args``, as a lone callable would be taken for the
    test itself). The predicate's docstring says which nodes, and shows in the skip reason when none match.
    """
    return getattr(pytest.mark, GPU_NODES_MARKER).with_args(predicate)


def node_predicate(item_or_definition):
    """The predicate of a test's ``gpu_nodes`` marker (None: every GPU node of its kind)."""
    marker = item_or_definition.get_closest_marker(GPU_NODES_MARKER)
    return marker.args[0] if marker is not None and marker.args else None

"""Where gpuproof's pods go, one policy for the suites' pods and the benchmarks' (issue #40: the bench pods were
pinned by the ``kubernetes.io/hostname`` label and tolerated only ``nvidia.com/gpu``, so a GPU node tainted with a
key of its own, AKS's ``sku=gpu:NoSchedule`` for one, never took them):

- a pod meant for one node is pinned to it by required node affinity on ``metadata.name`` (the scheduler still
  decides, unlike ``spec.nodeName``; a hostname label may differ from the node's name);
- it tolerates exactly the taints of the node(s) it is meant for, so only the thing under test decides placement.
  (A few suite checks pin a pod to a node they chose and tolerate everything, ``plugin.checks.TOLERATE_ALL``, where
  the node's taints are not what they judge; the nodes they choose are never cordoned: the suites leave those out
  first, since a blanket toleration would pass a cordon, ``node.kubernetes.io/unschedulable``, too.)

Every pod gpuproof makes, a suite's (``plugin.checks.pod``), a probe's or a benchmark's (``bench.workloads``,
``bench.loadpods``), is one :func:`pod_manifest` whose spec the policy placed with :func:`place`.
"""

from __future__ import annotations

from typing import Iterable


def pin_to(node_name: str) -> dict:
    """Required node affinity on the node's name."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}]}}}


def place(spec: dict, *, node: str | None = None, tolerations: list[dict] | None = None,
          node_selector: dict | None = None, affinity: dict | None = None) -> dict:
    """The placement policy on a pod spec (changed in place, and returned): pinned to ``node`` (:func:`pin_to`, merged
    into ``affinity``), the ``tolerations`` given (those of the node(s) meant, :func:`tolerate`) and a node selector.
    """
    if tolerations:
        spec["tolerations"] = list(tolerations)
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if node:
        affinity = {**(affinity or {}), **pin_to(node)}
    if affinity:
        spec["affinity"] = affinity
    return spec


def pod_manifest(metadata: dict, spec: dict) -> dict:
    """The Pod object of every pod gpuproof makes."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def pinned_node(pod_spec: dict) -> str | None:
    """The node a pod spec is pinned to by :func:`pin_to` (or by the ``kubernetes.io/hostname`` label), else None."""
    terms = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    for term in terms:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In" and field.get("values"):
                return field["values"][0]
    return (pod_spec.get("nodeSelector") or {}).get("kubernetes.io/hostname")


def tolerate(taints: Iterable[dict]) -> list[dict]:
    """A toleration for each key among ``taints`` (a node's ``spec.taints``, as dicts), each key once."""
    seen, out = set(), []
    for t in taints:
        key = t.get("key")
        if key and key not in seen:
            seen.add(key)
            out.append({"key": key, "operator": "Exists"})
    return out

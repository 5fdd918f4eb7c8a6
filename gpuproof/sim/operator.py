"""The GPU operator's DaemonSets, for the embedded cluster's operator-managed (OpenShift-shape) pools.

For every component a node is labelled with (``nvidia.com/gpu.deploy.<component>=true``), a
DaemonSet in namespace ``gpu-operator`` puts a pod of that component's name on the node; the
real DaemonSet controller and scheduler place them, kwok runs them (a pause container). The
pods carry the operator's ``app`` labels, so the stack suite finds them as it would on a real
cluster. A node labelled ``gpuproof.dev/sim-no-pod.<component>`` gets no pod of that component.
"""

from __future__ import annotations

import contextlib

from kubernetes.client.exceptions import ApiException

from ..vocab import OPERATOR_COMPONENT_APPS
from .fleet import NO_OPERATOR_POD, kwok_managed

NAMESPACE = "gpu-operator"
DEPLOY = "nvidia.com/gpu.deploy.{component}"
PAUSE = "registry.k8s.io/pause:3.10"


def expected_pods(nodes: list[dict]) -> dict[str, set[str]]:
    """component -> nodes that get its pod (kwok-managed nodes only: the others play dead kubelets)."""
    out: dict[str, set[str]] = {}
    for node in nodes:
        labels = node["metadata"]["labels"]
        for component in OPERATOR_COMPONENT_APPS:
            if labels.get(DEPLOY.format(component=component)) == "true":
                out.setdefault(component, set())
                if kwok_managed(node) and \
                        NO_OPERATOR_POD.format(component=component) not in labels:
                    out[component].add(node["metadata"]["name"])
    return out


def daemonset(component: str) -> dict:
    app = OPERATOR_COMPONENT_APPS[component]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": DEPLOY.format(component=component), "operator": "In", "values": ["true"]},
                              {"key": NO_OPERATOR_POD.format(component=component), "operator": "DoesNotExist"}]}]}}}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": app, "namespace": NAMESPACE, "labels": {"app": app}},
            "spec": {"selector": {"matchLabels": {"app": app}},
                     "template": {"metadata": {"labels": {"app": app}},
                                  "spec": {"affinity": affinity, "tolerations": [{"operator": "Exists"}],
                                           "terminationGracePeriodSeconds": 0,
                                           "containers": [{"name": component, "image": PAUSE}]}}}}


def apply(client, nodes: list[dict], timeout: float, progress=lambda msg: None) -> None:
    """Replace the previous fleet's operator pods with those its Node objects call for; wait until Ready."""
    from ..cluster.api import watch_until

    core, apps = client.core, client.apps
    with contextlib.suppress(ApiException):
        for ds in apps.list_namespaced_daemon_set(NAMESPACE).items:
            apps.delete_namespaced_daemon_set(ds.metadata.name, NAMESPACE, propagation_policy="Background")
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    wanted = expected_pods(nodes)
    if not wanted:
        return
    with contextlib.suppress(ApiException):      # 409: there from an earlier fleet
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    for component in wanted:
        apps.create_namespaced_daemon_set(NAMESPACE, daemonset(component))
    pairs = {(OPERATOR_COMPONENT_APPS[c], n) for c, nodes in wanted.items() for n in nodes}
    progress(f"GPU operator stand-ins: waiting for {len(pairs)} component pods")

    def ready(cache: dict) -> bool:
        seen = {((p.metadata.labels or {}).get("app"), p.spec.node_name) for p in cache.values()
                if p.metadata.deletion_timestamp is None and any(
                    c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))}
        return pairs <= seen

    def describe(cache: dict) -> str:
        pods = {((p.metadata.labels or {}).get("app"), p.spec.node_name): p for p in cache.values()
                if p.metadata.deletion_timestamp is None}
        late = sorted(pairs - {k for k, p in pods.items()
                               if any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))})
        shown = [f"{app} on {node}: {pods[(app, node)].status.phase if (app, node) in pods else 'no pod'}"
                 for app, node in late[:5]]
        return f"{len(late)} not Ready ({', '.join(shown)}{', ...' if len(late) > 5 else ''})"

    watch_until(core.list_namespaced_pod, ready, timeout, f"{len(pairs)} GPU operator component pods to be Ready",
                describe=describe, namespace=NAMESPACE)

"""NVIDIA stack state: what the GPU operator, the MIG manager and GFD say about each node.

- MIG manager: ``nvidia.com/mig.config.state`` is ``success``, and an ``all-<profile>`` or
  ``all-disabled`` config is what the node advertises;
- GPU operator: every ``nvidia.com/gpu.deploy.<component>`` is ``true``, ``false``,
  ``pre-installed`` or empty (a component the operator does not deploy on the node;
  ``paused-for-...`` is a change that never finished), the driver upgrade
  state is ``upgrade-done``, and on real clusters each deployed component has a Ready pod on the node;
- GFD: ``nvidia.com/gfd.timestamp`` is recent (``--gfd-max-age``), so the labels are current.

Nodes without these labels (no operator, no MIG manager, GFD run without timestamps) are
skipped with a reason: a cluster may run the stack without them.
"""

import re
import time

from gpuproof.discovery.nodes import OPERATOR_COMPONENT_APPS
from gpuproof.plugin.checks import for_nodes

FEATURE = "stack"

MIG_STATE = "nvidia.com/mig.config.state"
MIG_CONFIG = "nvidia.com/mig.config"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
GFD_TIMESTAMP = "nvidia.com/gfd.timestamp"
DEPLOY = re.compile(r"^nvidia\.com/gpu\.deploy\.(.+)$")
DEPLOY_OK = {"true", "false", "pre-installed"}
NOT_DEPLOYED = ""            # gpu.deploy.<component>= (empty): the operator does not deploy it on this node


def _deploy_labels(node) -> dict[str, str]:
    return {m.group(1): v for k, v in node.labels.items() if (m := DEPLOY.match(k))}


@for_nodes(lambda n: MIG_STATE in n.labels or MIG_CONFIG in n.labels)
def test_mig_manager_applied_config(gpu_node, check):
    """nodes managed by the MIG manager"""
    n = gpu_node
    state = n.label(MIG_STATE)
    check.equal("mig-config-state", "success", state, what=f"{MIG_STATE} (MIG manager applying {MIG_CONFIG}="
                f"{n.label(MIG_CONFIG)!r})")
    config = n.label(MIG_CONFIG) or ""
    if config == "all-disabled":
        advertised = sorted(n.mig_resources) + ([n.single_mig_profile] if n.single_mig_profile else [])
        check.equal("mig-config-matches", [], advertised,
                    what=f"MIG devices advertised under {MIG_CONFIG}=all-disabled")
    elif m := re.match(r"^all-(\d+g\.\d+gb)$", config):
        profile = m.group(1)
        advertised = sorted(p for p, c in n.mig_resources.items() if c > 0) or \
            ([n.single_mig_profile] if n.single_mig_profile else [])
        check.equal("mig-config-matches", [profile], advertised,
                    what=f"MIG profiles advertised under {MIG_CONFIG}={config}")


@for_nodes(lambda n: any(DEPLOY.match(k) for k in n.labels) or UPGRADE_STATE in n.labels)
def test_gpu_operator_states(gpu_node, check):
    """nodes managed by the NVIDIA GPU operator"""
    for component, value in sorted(_deploy_labels(gpu_node).items()):
        check.true("operator-component-state", value in DEPLOY_OK or value == NOT_DEPLOYED,
                   expected=f"one of {sorted(DEPLOY_OK)}",
                   actual=value, what=f"nvidia.com/gpu.deploy.{component}")
    if UPGRADE_STATE in gpu_node.labels:
        check.equal("driver-upgrade-state", "upgrade-done", gpu_node.label(UPGRADE_STATE),
                    what=f"{UPGRADE_STATE} (the operator's driver upgrade)")


@for_nodes(lambda n: GFD_TIMESTAMP in n.labels)
def test_gfd_labels_fresh(gpu_node, check, request):
    """nodes whose GFD writes timestamps"""
    max_age = request.config.getoption("--gfd-max-age")
    raw = gpu_node.label(GFD_TIMESTAMP)
    try:
        age = time.time() - int(raw)
    except ValueError:
        check.true("gfd-fresh", False, expected="a Unix time in seconds", actual=raw, what=GFD_TIMESTAMP)
        return
    check.true("gfd-fresh", -300 <= age <= max_age, expected=f"written within the last {max_age:.0f} s",
               actual=f"{age:.0f} s ago", what=f"{GFD_TIMESTAMP} (is GFD still running on the node?)")


@for_nodes(lambda n: any(v == "true" for v in _deploy_labels(n).values()))
def test_operator_component_pods_ready(gpu_node, target, check):
    """nodes where the GPU operator deploys components"""
    pods = target.cluster.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={gpu_node.name}").items
    for component, value in sorted(_deploy_labels(gpu_node).items()):
        app = OPERATOR_COMPONENT_APPS.get(component)
        if value != "true" or app is None:
            continue
        mine = [p for p in pods if (p.metadata.labels or {}).get("app") == app or p.metadata.name.startswith(app)]
        ready = [p for p in mine if any(c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))]
        check.true("operator-pod-ready", bool(ready), expected=f"a Ready {app} pod",
                   actual=[f"{p.metadata.namespace}/{p.metadata.name}: {p.status.phase}" for p in mine] or "none",
                   what=f"GPU operator component {component} on the node")

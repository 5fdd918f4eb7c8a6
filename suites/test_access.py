"""Secure accelerator access: a container reaches the GPUs it was granted, and a container without a grant none.

Kubernetes AI Conformance's ``secure_accelerator_access`` (MUST; upstream ``TestSecureAcceleratorAccess``). On every
real GPU node that offers GPUs, all nodes at once (the fan-out), each test one pod per node, the pods in the image
gpuproof's workloads run in, each container running ``workloads/access.py`` (its ``/dev/nvidia[0-9]*`` device files
and the GPUs NVML lists there; judged by gpuproof.discovery.access):

- ``PositiveAccessTest`` (``access-granted-one-gpu``): a pod granted 1 GPU reaches exactly 1, the one allocated
  (NVML's count and UUID, one device file);
- ``NegativeIsolationTest`` (``access-ungranted-none``): a pod without a grant, pinned to the same node, reaches none;
- ``EnvVarIsolationTest`` (``access-envvar-none``): the same pod with ``NVIDIA_VISIBLE_DEVICES=all`` and
  ``NVIDIA_DRIVER_CAPABILITIES=all`` in its env reaches none (a runtime that honours the variable from unprivileged
  pods hands it every GPU: NVIDIA's ``accept-nvidia-visible-devices-envvar-when-unprivileged``);
- ``MultiContainerIsolationTest`` (``access-sibling-none``): in a pod of two containers, only the first granted, the
  second reaches none.

The grant is the node's extended resource (``nvidia.com/gpu``, or a MIG resource where only those are advertised);
on nodes whose GPUs only NVIDIA's DRA driver offers it is a claim from the ResourceClaimTemplate ``access-one``
(one device of class ``gpu.nvidia.com``), and the allocated GPU is the claim's device (its ``uuid`` attribute).
Each test's pods, and their claims, are gone (deallocated) before the next test starts. A failure names the node,
the pod and container, what it was granted and the GPUs it reached (UUIDs and device files).
The JUnit cases are ``TestSecureAcceleratorAccess::test_<upstream subtest>[<node>]``: gpuproof conformance reads them
as ``TestSecureAcceleratorAccess/<subtest>`` (gpuproof/report/conformance.py).
"""

from __future__ import annotations

import pytest

from gpuproof.cluster.conditions import pod_scheduled, wait_claims_gone, wait_for
from gpuproof.discovery import access, dra
from gpuproof.plugin.checks import TOLERATE_ALL, for_nodes, free_on, name_on
from gpuproof.plugin.fanout import NodeSkip

FEATURE = "access"
TEMPLATE = "access-one"
CHECKS = {"PositiveAccessTest": "access-granted-one-gpu", "NegativeIsolationTest": "access-ungranted-none",
          "EnvVarIsolationTest": "access-envvar-none", "MultiContainerIsolationTest": "access-sibling-none"}
ALL_GPUS = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}
# test -> (pod name prefix, its containers: (name, granted, extra env))
PODS = {
    "PositiveAccessTest": ("access-pos", [("granted", True, {})]),
    "NegativeIsolationTest": ("access-neg", [("ungranted", False, {})]),
    "EnvVarIsolationTest": ("access-env", [("ungranted-env-all", False, ALL_GPUS)]),
    "MultiContainerIsolationTest": ("access-two", [("granted", True, {}), ("ungranted", False, {})]),
}


def resource(node) -> str | None:
    """The extended resource a one-GPU pod asks for on the node (a MIG device where only those are advertised)."""
    if node.allocatable_of(node.gpu_resource):
        return node.gpu_resource
    return next((f"nvidia.com/mig-{p}" for p in sorted(node.mig_resources)), None)


def grants(node) -> bool:
    """GPU nodes that grant GPUs to pods (an extended resource, or NVIDIA's DRA driver's devices)"""
    return resource(node) is not None or bool(node.dra)


def grant_of(node) -> str:
    r = resource(node)
    return f"1 {r}" if r else f"a claim from ResourceClaimTemplate {TEMPLATE} (1 device of {dra.GPU_CLASS})"


def manifest(run, node, test: str, labels: dict) -> dict:
    """The test's pod on the node: its containers run access.py, the granted ones with the grant."""
    from gpuproof.bench import workloads
    from gpuproof.plugin.bench_checks import image

    prefix, containers = PODS[test]
    name = name_on(node.name, prefix)
    r = resource(node)
    pod = None
    for cname, granted, env in containers:
        p = workloads.workload_pod(name, "access.py", ["--name", cname], labels=labels, namespace=run.namespace,
                                   gpus=1 if granted and r else 0, resource=r or "nvidia.com/gpu", node=node.name,
                                   image=image(run), env=env, tolerations=TOLERATE_ALL, deadline_s=600)
        c = p["spec"]["containers"][0]
        c["name"] = cname
        if granted and not r:                       # the GPU comes by the claim, to this container only
            c.setdefault("resources", {})["claims"] = [{"name": "gpu"}]
            p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
        if pod is None:
            pod = p
        else:
            pod["spec"]["containers"].append(c)
    return pod


def free_gpus(target, node) -> int:
    """How many of the node's GPUs no other pod holds (its extended resource, or its DRA devices no claim holds)."""
    r = resource(node)
    if r:
        return free_on(target.cluster, node, r)
    taken = dra.allocated_devices(target.cluster)
    return sum(1 for d in node.dra_devices or [] if d.type == "gpu" and (d.pool, d.name) not in taken)


def claim_uuids(run, pod, discovery) -> tuple[list[str] | None, list[str], str]:
    """(UUIDs of the devices the pod's claims were allocated, the claims' names, why no UUIDs)."""
    devices = {(d.pool, d.name): d for d in discovery.dra_devices or []}
    try:
        claims = dra.claims_of_pod(run, pod)
    except Exception as exc:              # noqa: BLE001  (the claim went with its pod: said in the verdict)
        return None, [], f"its claims could not be read ({exc})"
    names = [c["metadata"]["name"] for c in claims]
    got = [devices.get((pool, dev)) for c in claims for _, pool, dev in dra.allocated(c)]
    if not got:
        return None, names, "its claim was not allocated"
    if any(d is None or not d.uuid for d in got):
        return None, names, "the allocated device has no uuid attribute in its ResourceSlice"
    return sorted(d.uuid for d in got), names, ""


def node_work(run, target, discovery, test: str):
    """One node's pod for ``test``, run by the fan-out beside the other nodes': its containers' results, what the
    granted container was allocated, and the pod's name; the pod and its claims are gone when it returns."""
    def work(node, lane):
        from gpuproof.bench import workloads
        from gpuproof.bench.base import applied, ensure_configmap

        granting = any(g for _, g, _ in PODS[test][1])
        if granting and free_gpus(target, node) < 1:      # only free GPUs are taken: other people's pods hold them
            raise NodeSkip(CHECKS[test], f"{node.name} has no free GPU: other pods hold them all")
        ensure_configmap(run)
        claimed = resource(node) is None and granting
        if claimed:
            _, err = run.try_apply(dra.claim_template(TEMPLATE, [dra.request("gpu", dra.GPU_CLASS, 1)]))
            if err is not None and getattr(err, "status", None) != 409:
                raise err
        m = manifest(run, node, test, {**run.labels, **lane.labels})
        name = m["metadata"]["name"]
        allocated, claims, why = None, [], ""
        with lane.pods(1), applied(run, [m], lane=lane):
            if claimed:          # the scheduler allocates the claim before it binds; it goes when the pod ends
                pod = wait_for(lane.job.watch(), name, pod_scheduled, target.timeouts.claim_scheduled, lane.stop)
                allocated, claims, why = claim_uuids(run, pod, discovery)
            lane.wait_done(name, target.timeouts.pod_done)
            results = {c: workloads.pod_result(run, name, what=f"access pod {name} container {c}", container=c)
                       for c, _, _ in PODS[test][1]}
        wait_claims_gone(run, target.timeouts.pod_done, claims)    # the next test then finds the node's devices free
        return {"pod": name, "results": results, "allocated": allocated, "why": why}
    return work


def outcome(test: str, node, run, target, discovery, fanout, request) -> dict:
    return fanout.result(request.node, node, node_work(run, target, discovery, test), name=f"access {test}")


def judge(test: str, node, out: dict, check) -> None:
    """Record the test's check for one node from its pod's results (pure: the unit tests call it)."""
    name = CHECKS[test]
    for cname, granted, env in PODS[test][1]:
        result = out["results"][cname]
        where = f"pod {out['pod']} container {cname} on {node.name}"
        if granted:
            allocated = out.get("allocated")
            if allocated is None and resource(node):
                allocated = access.allocated_by_plugin(result)
            ok, expected, actual = access.granted_one(result, allocated)
            if allocated is None and out.get("why"):
                actual += f" (allocation unknown: {out['why']})"
            check.true(name, ok, expected, actual, what=f"{where}, granted {grant_of(node)}", target=node.name)
        else:
            ok, expected, actual = access.sees_none(result)
            extra = " with " + ", ".join(f"{k}={v}" for k, v in env.items()) if env else ""
            check.true(name, ok, expected, actual, what=f"{where}, granted nothing{extra}", target=node.name)


def _run(test: str, gpu_node, run, target, discovery, check, fanout, request) -> None:
    try:
        out = outcome(test, gpu_node, run, target, discovery, fanout, request)
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    judge(test, gpu_node, out, check)


# no places_pods mark: it would leave DRA-only nodes out (needs_real_gpus leaves out the nodes unfit for pods)
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("ResourceClaimTemplate", TEMPLATE, note="DRA-only nodes")
@pytest.mark.conformance("secure_accelerator_access", guard=True)    # EnvVarIsolationTest failing fails it too
class TestSecureAcceleratorAccess:
    """Named after the upstream test, so its JUnit cases read TestSecureAcceleratorAccess/<subtest>."""

    @pytest.mark.conformance("secure_accelerator_access", checks=(CHECKS["PositiveAccessTest"],))
    @for_nodes(grants)
    @pytest.mark.creates("Pod", "access-pos-{node}", requests="1 GPU, or a claim from access-one", note="access.py")
    def test_PositiveAccessTest(self, gpu_node, run, target, discovery, check, needs_real_gpus, fanout, request):
        """GPU nodes that grant GPUs to pods (an extended resource, or NVIDIA's DRA driver's devices)"""
        _run("PositiveAccessTest", gpu_node, run, target, discovery, check, fanout, request)

    @pytest.mark.conformance("secure_accelerator_access", checks=(CHECKS["NegativeIsolationTest"],))
    @for_nodes(grants)
    @pytest.mark.creates("Pod", "access-neg-{node}", requests="none", note="access.py, pinned to the node")
    def test_NegativeIsolationTest(self, gpu_node, run, target, discovery, check, needs_real_gpus, fanout, request):
        _run("NegativeIsolationTest", gpu_node, run, target, discovery, check, fanout, request)

    @for_nodes(grants)
    @pytest.mark.creates("Pod", "access-env-{node}", requests="none", note="NVIDIA_VISIBLE_DEVICES=all in its env")
    def test_EnvVarIsolationTest(self, gpu_node, run, target, discovery, check, needs_real_gpus, fanout, request):
        _run("EnvVarIsolationTest", gpu_node, run, target, discovery, check, fanout, request)

    @pytest.mark.conformance("secure_accelerator_access", checks=(CHECKS["MultiContainerIsolationTest"],))
    @for_nodes(grants)
    @pytest.mark.creates("Pod", "access-two-{node}", requests="1 GPU (or a claim) for its first container only",
                         note="two containers")
    def test_MultiContainerIsolationTest(self, gpu_node, run, target, discovery, check, needs_real_gpus, fanout,
                                         request):
        _run("MultiContainerIsolationTest", gpu_node, run, target, discovery, check, fanout, request)

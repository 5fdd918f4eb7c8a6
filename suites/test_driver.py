"""Driver and runtime: the driver a pod granted a GPU really gets is the one its node advertises.

Kubernetes AI Conformance's ``driver_runtime_management`` (upstream ``TestAcceleratorDriverRuntimeManagement``): a
node advertises its driver version and CUDA driver version through GPU Feature Discovery's labels
(``nvidia.com/cuda.driver-version.*``, ``nvidia.com/cuda.runtime-version.*``, older GFD's ``cuda.driver.*`` and
``cuda.runtime.*``) or NVIDIA's DRA driver's device attributes (``driverVersion``, ``cudaDriverVersion``). A probe
pod granted one GPU of the node (workloads/probe.py) reports what NVML says in the container; each label and
attribute must equal it at the precision both share (``580.65.6`` equals ``580.65.06``). A failure names the
node, the label or attribute, its value and the in-pod value (gpuproof.discovery.driver).

- ``driver-version-advertised``: the node advertises a driver version at all (a warning where it does not: the
  upstream test warns too);
- ``driver-version-in-pod``, ``cuda-driver-version-in-pod``: NVML in the pod agrees with every source.

Nodes whose GPUs only DRA offers are probed with a one-GPU claim instead of the extended resource. Every node's
probe runs at once (the fan-out, gpuproof/plugin/fanout.py), at most ``--parallel`` pods in flight.

The JUnit cases are named after the upstream subtests, as suites/test_access.py's are:
``TestAcceleratorDriverRuntimeManagement::test_VerifiableMechanismExposed[<node>]`` (``driver-version-advertised``)
and ``...::test_DriverAndRuntimeCompatibility[<node>]`` (the probe pod: ``driver-version-in-pod``,
``cuda-driver-version-in-pod``); gpuproof conformance reads them as ``TestAcceleratorDriverRuntimeManagement/<subtest>``
(gpuproof/report/conformance.py). Upstream's VerifiableMechanismExposed also asks for the node's container runtime
version; gpuproof does not check that.
"""

import pytest

from gpuproof.cluster.conditions import wait_claims_gone
from gpuproof.discovery import dra, driver
from gpuproof.plugin.checks import TOLERATE_ALL, for_nodes, name_on, probe_on
from gpuproof.plugin.fanout import NodeSkip

FEATURE = "driver"
CHECKS = {"driver": "driver-version-in-pod", "cuda": "cuda-driver-version-in-pod"}


def _resource(node) -> str | None:
    """The extended resource a one-GPU pod asks for on the node (a MIG device where only those are advertised)."""
    if node.allocatable_of(node.gpu_resource):
        return node.gpu_resource
    return next((f"nvidia.com/mig-{p}" for p in sorted(node.mig_resources)), None)


def _claim_probe(run, target, node, lane) -> dict:
    """A probe pod on a DRA node with a one-GPU claim, in the fan-out's lane; its JSON result. The pod is gone, and
    its claim deallocated, when this returns."""
    from gpuproof.bench import workloads
    from gpuproof.bench.base import applied, ensure_configmap
    from gpuproof.plugin.bench_checks import image

    ensure_configmap(run)
    _, err = run.try_apply(dra.claim_template("driver-probe-one", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    if err is not None and getattr(err, "status", None) != 409:       # one template for every DRA node
        raise err
    name = name_on(node.name, "driver-probe")
    manifest = workloads.workload_pod(name, "probe.py", labels={**run.labels, **lane.labels}, namespace=run.namespace,
                                      gpus=0, node=node.name, image=image(run))
    manifest["spec"]["tolerations"] = TOLERATE_ALL     # gpus=0 adds no GPU toleration: the GPU comes by the claim
    with lane.pods(1), applied(run, [dra.use_claims(manifest, template="driver-probe-one")], lane=lane):
        pod = lane.wait_done(name, target.timeouts.pod_done)
        claims = [s.resource_claim_name for s in (pod.status.resource_claim_statuses or []) if s.resource_claim_name]
        result = workloads.pod_result(run, name, what=f"probe pod {name}")
    if claims:          # its claim goes with the pod: the node's device is free again for the next check
        wait_claims_gone(run, target.timeouts.pod_done, claims, who=f"claim {', '.join(claims)} of {name}")
    return result


def driver_probe(run, target, node, lane) -> dict:
    """One node's probe, run by the fan-out beside the other nodes': granted a GPU by the extended resource, or by a
    claim where only DRA offers the node's GPUs."""
    if not any(driver.advertised(node, kind) for kind in CHECKS):
        raise NodeSkip(CHECKS["driver"], f"{node.name} advertises no driver version")
    resource = _resource(node)
    if resource is not None:
        result, = probe_on(run, target, node, 1, {resource: 1}, prefix="driver-probe", lane=lane)
        return result
    if node.dra:
        return _claim_probe(run, target, node, lane)
    raise NodeSkip(CHECKS["driver"], f"{node.name} offers no GPU a pod can be granted (no extended resource, no DRA "
                   "device)")


def judge(node, result: dict, check) -> None:
    """Record the checks for one node from its probe pod's result (pure: the unit tests call it)."""
    nvml = (result or {}).get("nvml") or {}
    for kind, name in CHECKS.items():
        c = driver.compare(node, nvml, kind)
        if c.skip:
            check.record(name, "skip", message=c.skip, target=node.name)
            continue
        check.true(name, c.ok, expected=f"the {driver.WHAT[kind]} NVML reports in a pod granted a GPU, as "
                   f"{'; '.join(c.compared)} advertise", actual="; ".join(c.bad) or c.in_pod,
                   what=f"{driver.WHAT[kind]} in pod {result.get('host') or '(probe)'} vs the node's",
                   target=node.name)


def described(node) -> bool:
    """GPU nodes GFD labels or NVIDIA's DRA driver describes"""
    return bool(node.gfd or node.dra)


def _unadvertised(node, sources: dict) -> str:
    """Why the node's driver cannot be judged ('' when it advertises a version)."""
    return "" if any(sources.values()) else f"{node.name} advertises no driver version"


@for_nodes(described)
@pytest.mark.conformance("driver_runtime_management", guard=True)
class TestAcceleratorDriverRuntimeManagement:
    """Named after the upstream test, so its JUnit cases read TestAcceleratorDriverRuntimeManagement/<subtest>."""

    # a node that advertises nothing only warns (as upstream's subtest does): no mechanism shown, no pass
    @pytest.mark.conformance("driver_runtime_management", checks=("driver-version-advertised",),
                             require=("driver-version-advertised",))
    def test_VerifiableMechanismExposed(self, gpu_node, check, needs_real_gpus):
        """The node advertises its driver version (GFD cuda.* labels or DRA driverVersion); a warning where it does
        not, as upstream's subtest warns, and the test skips: a warning alone shows nothing."""
        n = gpu_node
        sources = {kind: driver.advertised(n, kind) for kind in CHECKS}
        why = _unadvertised(n, sources)
        if why:
            check.warn("driver-version-advertised", f"{n.name} advertises neither its driver version nor its CUDA "
                       "driver version (no nvidia.com/cuda.* label, no DRA driverVersion): nothing to verify a "
                       "pod's driver against", expected="GFD cuda.* labels or DRA driverVersion", actual=None)
            raise pytest.skip.Exception(why, _use_item_location=True)   # reported at the test, no second record
        check.record("driver-version-advertised", "pass", expected="GFD cuda.* labels or DRA driverVersion",
                     actual="; ".join(f"{s.source}={s.value}" for kind in CHECKS for s in sources[kind]))

    @pytest.mark.conformance("driver_runtime_management", checks=(CHECKS["driver"], CHECKS["cuda"]),
                             require=(CHECKS["driver"],))
    @pytest.mark.creates("ConfigMap", "gpuproof-workloads")
    @pytest.mark.creates("Pod", "driver-probe-{node}-0", requests="1 GPU (device plugin)", note="probe")
    @pytest.mark.creates("ResourceClaimTemplate", "driver-probe-one", note="DRA-only nodes")
    @pytest.mark.creates("Pod", "driver-probe-{node}", requests="a claim from driver-probe-one", note="DRA-only nodes")
    def test_DriverAndRuntimeCompatibility(self, gpu_node, run, target, check, needs_real_gpus, fanout, request):
        """A probe pod granted one GPU of the node: the driver and CUDA driver versions NVML reports there equal
        every version the node advertises."""
        n = gpu_node
        why = _unadvertised(n, {kind: driver.advertised(n, kind) for kind in CHECKS})
        if why:
            check.skip(CHECKS["driver"], why)
        try:
            result = fanout.result(request.node, n, lambda node, lane: driver_probe(run, target, node, lane),
                                   name="driver probe")
        except NodeSkip as skip:
            check.skip(skip.check, skip.reason)
        judge(n, result, check)

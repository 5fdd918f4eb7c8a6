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

Nodes whose GPUs only DRA offers are probed with a one-GPU claim instead of the extended resource.
"""

import pytest

from gpuproof.discovery import dra, driver
from gpuproof.plugin.checks import TOLERATE_ALL, for_nodes, probe_on

FEATURE = "driver"
CHECKS = {"driver": "driver-version-in-pod", "cuda": "cuda-driver-version-in-pod"}


def _resource(node) -> str | None:
    """The extended resource a one-GPU pod asks for on the node (a MIG device where only those are advertised)."""
    if node.allocatable_of(node.gpu_resource):
        return node.gpu_resource
    return next((f"nvidia.com/mig-{p}" for p in sorted(node.mig_resources)), None)


def _claim_probe(run, target, node) -> dict:
    """A probe pod on a DRA node with a one-GPU claim; its JSON result."""
    from gpuproof.bench import workloads
    from gpuproof.bench.base import ensure_configmap
    from gpuproof.plugin.bench_checks import image

    ensure_configmap(run)
    run.apply(dra.claim_template("driver-probe-one", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    name = f"driver-probe-{node.name}"[:63]
    manifest = workloads.workload_pod(name, "probe.py", labels=run.labels, namespace=run.namespace, gpus=0,
                                      node=node.name, image=image(run))
    manifest["spec"]["tolerations"] = TOLERATE_ALL     # gpus=0 adds no GPU toleration: the GPU comes by the claim
    run.apply(dra.use_claims(manifest, template="driver-probe-one"))
    run.wait_pod(name, lambda x: x.status.phase in ("Succeeded", "Failed"), target.timeouts.pod_done,
                 "to finish (image pull included)")
    return workloads.pod_result(run, name, what=f"probe pod {name}")


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


@for_nodes(lambda n: n.gfd or n.dra)
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "driver-probe-{node}-0", requests="1 GPU (device plugin)", note="probe")
@pytest.mark.creates("ResourceClaimTemplate", "driver-probe-one", note="DRA-only nodes")
@pytest.mark.creates("Pod", "driver-probe-{node}", requests="a claim from driver-probe-one", note="DRA-only nodes")
def test_pod_gets_the_advertised_driver(gpu_node, run, target, check, needs_real_gpus):
    """GPU nodes GFD labels or NVIDIA's DRA driver describes"""
    n = gpu_node
    sources = {kind: driver.advertised(n, kind) for kind in CHECKS}
    if not any(sources.values()):
        check.warn("driver-version-advertised", f"{n.name} advertises neither its driver version nor its CUDA "
                   "driver version (no nvidia.com/cuda.* label, no DRA driverVersion): nothing to verify a pod's "
                   "driver against", expected="GFD cuda.* labels or DRA driverVersion", actual=None)
        check.skip(CHECKS["driver"], f"{n.name} advertises no driver version")
    check.record("driver-version-advertised", "pass", expected="GFD cuda.* labels or DRA driverVersion",
                 actual="; ".join(f"{s.source}={s.value}" for kind in CHECKS for s in sources[kind]))
    resource = _resource(n)
    if resource is not None:
        result, = probe_on(run, target, n, 1, {resource: 1}, prefix="driver-probe")
    elif n.dra:
        result = _claim_probe(run, target, n)
    else:
        check.skip(CHECKS["driver"], f"{n.name} offers no GPU a pod can be granted (no extended resource, no DRA "
                   "device)")
    judge(n, result, check)

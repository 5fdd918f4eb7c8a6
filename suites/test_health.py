"""GPU health in a pod on every GPU node (workloads/health.py).

On every real GPU node, all nodes at once (the fan-out), over every GPU NVML lists whatever CUDA sees (the items
that need CUDA, the load and the copies, say so where it is missing): the GPU answers NVML (a lost GPU, or one
fallen off the bus, fails), XIDs, ECC errors, SRAM ECC, retired pages / remapped rows, clock-event reasons during a
matmul burst, PCIe generation and width under load, NVLink links, NVLink errors during the run, NVLink fabric
health, persistence mode, power limit, host<->GPU and GPU<->GPU copy bandwidth, and ``dcgmi diag`` when the image
has DCGM. Each item of the workload becomes a check record: a failed item fails the test
naming the node, the threshold (expected) and the reading (actual); warnings are
recorded as warnings; what a node cannot report is recorded as skipped, with why.

Thresholds: the table in workloads/README.md; extra workload flags come from
``GPUPROOF_HEALTH_ARGS`` (e.g. ``--dcgm-level 2 --copy-min-gbps 20``). On the embedded
cluster (kwok nodes: pods never run) it skips, saying so; ``gpuproof bench --local health``
runs the workload on this host.
Records (benchmark ``health``): ``verdict`` per item, the item's value when numeric.
"""

import pytest

from gpuproof.bench import get
from gpuproof.plugin import bench_checks
from gpuproof.bench.health import extra_args_from_env, record_checks
from gpuproof.errors import ApiUnreachable, GpuproofError
from gpuproof.plugin.checks import free_on, tolerations_for
from gpuproof.plugin.fanout import NodeSkip

FEATURE = "health"


def health_pod(run, target, discovery, node, lane):
    """One node's health pod (every free GPU of the node), run by the fan-out beside the other nodes'."""
    resource, gpus = bench_checks.node_gpus(discovery, node.name, all_gpus=True)
    free = free_on(target.cluster, node, resource)
    if free < 1:
        raise NodeSkip("health", f"{node.name} has no free {resource}: every GPU is held by other pods")
    bench = get("health")
    params = bench.params({"extra_args": extra_args_from_env()}, device=bench_checks.device(run))
    with lane.pods(1):
        try:
            result = bench.run_in_cluster(run, params, product=node.product, node=node.name, gpus=min(gpus, free),
                                          resource=resource, image=bench_checks.image(run),
                                          timeout=target.timeout(bench.timeout_s), lane=lane,
                                          tolerations=tolerations_for(node))
        except ApiUnreachable:      # the API server or the node gone: not judged (the plugin), no pod error
            raise
        except GpuproofError as exc:
            return {"pod_error": str(exc), "asked": f"{resource} x {min(gpus, free)}"}
    return result


@pytest.mark.gpu
@pytest.mark.places_pods
@pytest.mark.creates(benchmark="health", per="node", all_gpus=True, note="at most the node's free GPUs")
def test_health_per_node(needs_real_gpus, gpu_node, run, run_dir, target, discovery, fanout, request, check):
    """One pod per GPU node with every free GPU of the node (one slice / replica when shared); every node's pod
    starts at once (at most --parallel in flight), each node judged in its own test."""
    node = gpu_node
    try:
        result = fanout.result(request.node, node, lambda n, lane: health_pod(run, target, discovery, n, lane),
                               name="health")
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    if "pod_error" in result:
        lines = result["pod_error"].splitlines()  # the first line says how the pod ended; then its log's last lines
        check.true("health-pod", False, "the health pod finishes with a JSON result",
                   " | ".join(lines[:1] + lines[-4:] if len(lines) > 5 else lines),
                   what=f"health workload pod ({result['asked']})")
        return
    if not result.get("items"):          # it stopped before reading anything (no GPU, no NVML, bad flags)
        check.true("health-pod", False, "the health pod reads the node's GPUs",
                   result.get("error") or "a result without items", what=f"health workload pod on {node.name}")
        return
    bench = get("health")
    records = bench.to_records(result, node=node.name, product=node.product)
    for r in records:
        r.parameters.setdefault("run_mode", "cluster")
    run_dir.add_metrics(records)
    record_checks(check, result)

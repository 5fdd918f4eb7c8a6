"""Per-GPU performance census on every GPU node: the slow GPU named among its peers (workloads/census.py).

One pod per GPU node, every node at once (the fan-out, ``--parallel``), measures for seconds on each GPU NVML
lists a short matmul (bf16 from compute capability 8.0) and a device-to-device copy, and on nodes with 2 or more
GPUs an intra-node all-reduce. Each GPU is judged against the median of its pool's GPUs (same product, same number
of GPUs in the pod) and against the product's datasheet; each node's all-reduce against its pool's nodes. A slow
GPU fails naming node, GPU index and UUID, its figure and its pool's median. Floors: ``GPUPROOF_CENSUS_FLOORS``
(default ``pool=85,matmul=50,copy=50``, percent, and ``pool=50`` on the CPU path, where pods measured at once
share one machine's cores; gpuproof/bench/census.py says why).

On the embedded cluster's kubelet nodes the census takes its CPU path over NVIDIA's mock NVML (no datasheet
figure: those checks skip, saying so); its kwok nodes run no pod, and skip.
Records (benchmark ``census``): per GPU ``matmul_tflops`` and ``d2d_copy_gbps``, per node ``allreduce_busbw_gbps``.
"""

import pytest

from gpuproof.bench import census, get
from gpuproof.errors import ApiUnreachable, GpuproofError
from gpuproof.plugin import bench_checks
from gpuproof.plugin.checks import free_on, tolerations_for
from gpuproof.plugin.fanout import NodeSkip

FEATURE = "census"


def census_pod(run, target, discovery, node, lane):
    """One node's census pod over every free GPU of the node, run by the fan-out beside the other nodes'.
    Returns (the pool the node is judged in, its result)."""
    resource, gpus = bench_checks.node_gpus(discovery, node.name, all_gpus=True)
    free = free_on(target.cluster, node, resource)
    if free < 1:
        raise NodeSkip("census-result", f"{node.name} has no free {resource}: every GPU is held by other pods")
    asked = min(gpus, free)
    pool = census.pool_key(node.product, asked)            # a node with GPUs held by others is a shape of its own
    bench = get("census")
    params = bench.params({}, device=bench_checks.device(run))
    with lane.pods(1):
        try:
            return pool, bench.run_in_cluster(run, params, product=node.product, node=node.name, gpus=asked,
                                              resource=resource, image=bench_checks.image(run),
                                              timeout=target.timeout(bench.timeout_s), lane=lane,
                                              tolerations=tolerations_for(node))
        except ApiUnreachable:      # the API server or the node gone: not judged (the plugin), no pod error
            raise
        except GpuproofError as exc:
            return pool, {"pod_error": " | ".join(str(exc).splitlines()[:1] + str(exc).splitlines()[-3:])}


@pytest.mark.gpu
@pytest.mark.places_pods
@pytest.mark.creates(benchmark="census", per="node", all_gpus=True, note="at most the node's free GPUs")
def test_census_per_node(needs_real_gpus, gpu_node, run, run_dir, target, discovery, fanout, request, check):
    node = gpu_node
    try:
        pool, result = fanout.result(request.node, node,
                                     lambda n, lane: census_pod(run, target, discovery, n, lane), name="census")
    except NodeSkip as skip:
        check.skip(skip.check, skip.reason)
    if result.get("gpus"):
        run_dir.add_metrics(get("census").to_records(result, node=node.name, product=node.product))
    # the pool's results, as they arrive (a node's figure means something only beside its peers')
    peers = fanout.peers(request.node, lambda n: True)
    results = {name: r for name, (p, r) in peers.items() if p == pool}
    results[node.name] = result
    floors = census.floors_from_env(device=bench_checks.device(run))
    verdicts = judged(results, pool, floors).get(node.name, [])
    slow = [v for v in verdicts if v.verdict == "fail" and v.value is not None]
    if slow:
        verdicts = measured_again(node, pool, results, floors, slow, fanout, request, run_dir, check,
                                  lambda n, lane: census_pod(run, target, discovery, n, lane)) or verdicts
    record_verdicts(check, verdicts)


def measured_again(node, pool, results, floors, slow, fanout, request, run_dir, check, work) -> list | None:
    """A node with a figure below its floor is measured once more, alone, before it fails: another tenant's burst
    (or, on the CPU path, a neighbour pod's) passes, a slow GPU stays slow. The node's verdicts from the second
    figures against the same peers, and a warning naming the first figures when the second passed; None when the
    second measurement gave no figures (the first verdicts stand)."""
    try:
        again_pool, again = fanout.again(request.node, node)
    except (NodeSkip, GpuproofError):
        return None
    if again_pool != pool or not again.get("gpus"):
        return None
    run_dir.add_metrics(get("census").to_records(again, node=node.name, product=node.product))
    verdicts = [v for v in census.judge({**results, node.name: again}, {name: pool for name in results}, floors)
                if v.node == node.name]
    still = {(v.check, v.gpu) for v in verdicts if v.verdict == "fail"}
    passed = [v for v in slow if (v.check, v.gpu) not in still]
    if passed:
        check.warn("census-measured-again", "below the floor at first, within it measured again: " + "; ".join(
            f"{v.detail.split(':')[0]}: {v.actual}" for v in passed), expected="figures within the floors",
            actual="; ".join(v.actual for v in passed), target=node.name)
    return verdicts


_JUDGED: dict = {}


def judged(results: dict, pool: str, floors) -> dict:
    """node -> its verdicts, the pool judged once for the same results (every node's item asks with its whole pool's
    results; judging the pool again in each item cost 0.4 s an item at 1,000 nodes: benchmarks/SCALE.md)."""
    key = (pool, floors, tuple(sorted((name, id(r)) for name, r in results.items())))
    if _JUDGED.get("key") != key:
        by: dict = {}
        for v in census.judge(results, {name: pool for name in results}, floors):
            by.setdefault(v.node, []).append(v)
        _JUDGED.clear()
        _JUDGED.update(key=key, by=by, results=results)      # the results kept: their ids stay theirs
    return _JUDGED["by"]


def record_verdicts(check, verdicts) -> None:
    """Each census verdict as a check on its node: a failed one names node, GPU, UUID, figure and what it is held
    against (the floor as expected, the figure as actual); a skipped one says why."""
    for v in verdicts:
        if v.verdict == "skip":
            check.record(v.check, "skip", v.expected, v.actual, v.message, target=v.node)
        else:
            check.true(v.check, v.verdict == "pass", v.expected, v.actual, what=v.detail, target=v.node)

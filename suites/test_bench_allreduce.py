"""Benchmark: all-reduce bandwidth (nccl-tests algbw / busbw / #wrong).

- NCCL over every GPU of one node per product (torchrun in one pod; skipped
  on single-GPU nodes: with one rank no data moves), and, where a product has two nodes or
  more, across nodes (indexed Job + headless Service; at most
  $GPUPROOF_ALLREDUCE_MAX_NODES nodes, default 4), with per-node bus bandwidth and the
  straggler nodes named: below $GPUPROOF_STRAGGLER_PCT % (default 80) of the median node.
"""

import os

import pytest

from gpuproof.bench import get
from gpuproof.plugin import bench_checks

pytestmark = pytest.mark.bench

STRAGGLER_PCT_ENV = "GPUPROOF_STRAGGLER_PCT"
ONE_RANK = "1 rank: no data moves between GPUs, so an all-reduce has no bandwidth to measure"


@pytest.mark.gpu
@pytest.mark.creates(benchmark="allreduce", all_gpus=True, note="products with 2 GPUs or more a node")
def test_allreduce_single_node_per_product(target, run, run_dir, gpu_products, discovery, check):
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    multi, single = {}, []
    for product, nodes in sorted(gpu_products.items()):
        if nodes and bench_checks.node_gpus(discovery, sorted(nodes)[0], all_gpus=True)[1] >= 2:
            multi[product] = nodes
        elif nodes:
            single.append(f"{product} ({sorted(nodes)[0]}: one GPU a pod can get)")
    if not multi:
        pytest.skip(f"{ONE_RANK}: {', '.join(single)}")
    results = bench_checks.run_per_product("allreduce", run, run_dir, multi, discovery, all_gpus=True)
    for product, node, ok, actual in bench_checks.outcomes(results, multi):
        check.true("allreduce-result", ok, bench_checks.RESULT_OK + " (no wrong element)", actual,
                   what=f"all-reduce over every GPU of one {product} node", target=node)


@pytest.mark.gpu
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Job", "bench-ar-multi-<product>", "per product with 2+ nodes", on="any",
                      requests="all GPUs of each node", note="indexed: one pod on each of up to 4 nodes")
@pytest.mark.creates("Service", "bench-ar-multi-<product>", "per product with 2+ nodes", note="headless")
def test_allreduce_multi_node_per_product(target, run, run_dir, gpu_products, discovery, check):
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    whole = {p: n for p, n in gpu_products.items()
             if all(bench_checks.node_gpus(discovery, x)[0] == "nvidia.com/gpu" for x in n)}  # not shared, not MIG
    multi = {p: n for p, n in whole.items() if len(n) >= 2}
    if not multi:
        pytest.skip("no GPU product has two nodes or more with whole (unshared, non-MIG) GPUs")
    bench = get("allreduce")
    pct = float(os.environ.get(STRAGGLER_PCT_ENV) or 0) or None
    for product, nodes in sorted(multi.items()):
        nnodes = bench_checks.multinode_count(nodes)
        gpus = min(bench_checks.node_gpus(discovery, n, all_gpus=True)[1] for n in nodes)
        what = f"all-reduce across {nnodes} {product} nodes"
        try:
            params = bench_checks.bench_params(bench, run, {"straggler_pct": pct})
            result = bench.run_multinode(run, params, product=product,
                                         nnodes=nnodes, gpus_per_node=gpus, image=bench_checks.image(run),
                                         tolerations=bench_checks.node_tolerations(discovery, *nodes))
        except Exception as exc:  # noqa: BLE001  one product failing must not hide the others
            check.true("allreduce-multinode-result", False, bench_checks.RESULT_OK, str(exc), what=what,
                       target=sorted(nodes)[0])
            continue
        run_dir.add_metrics(bench_checks.mark(bench.to_records(result, node=f"{nnodes} nodes", product=product), run))
        check.true("allreduce-multinode-result", bool(result.get("ok")), bench_checks.RESULT_OK + " (no wrong element)",
                   "ok" if result.get("ok") else f"{result.get('wrong_total')} wrong elements / {result.get('error')}",
                   what=what, target=sorted(nodes)[0])
        for n in result.get("nodes") or []:
            if "straggler" in n:
                check.true("allreduce-straggler", not n["straggler"], "bus bandwidth near its peers' median",
                           n.get("straggler_reason") or "near the median", what=f"{what}: {n['node']}",
                           target=n["node"])

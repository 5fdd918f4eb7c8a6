"""Benchmark: all-reduce bandwidth within one node (nccl-tests algbw / busbw / #wrong).

NCCL over every GPU of one node per product (torchrun in one pod; skipped on single-GPU nodes: with one rank no data
moves). Between nodes, every node and pair: the fabric suite (suites/test_fabric.py).
"""

import pytest

from gpuproof.plugin import bench_checks

pytestmark = pytest.mark.bench

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

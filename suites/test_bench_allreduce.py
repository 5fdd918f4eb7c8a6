"""Benchmark: all-reduce bandwidth (nccl-tests algbw / busbw / #wrong).

- embedded cluster: gloo on this host's CPU, world size 2, a few small sizes;
- real cluster: NCCL over every GPU of one node per product (torchrun in one pod), and,
  where a product has two nodes or more, across nodes (indexed Job + headless Service;
  at most $GPUPROOF_ALLREDUCE_MAX_NODES nodes, default 4).
"""

import pytest

from gpuproof.bench import get, suite

pytestmark = pytest.mark.bench

def test_allreduce_local_cpu(target, run_dir):
    suite.require_simulated(target, "allreduce")
    result, records = suite.run_local_cpu("allreduce", run_dir)
    assert result["ok"], result
    assert result["world_size"] == 2 and result["wrong_total"] == 0
    assert any(r.metric == "avg_busbw_gbps" for r in records)


@pytest.mark.gpu
def test_allreduce_single_node_per_product(target, run, run_dir, gpu_products, discovery):
    suite.require_real_gpus(target, discovery, gpu_products)
    results = suite.run_per_product("allreduce", run, run_dir, gpu_products, discovery, all_gpus=True)
    bad = suite.failures(results)
    assert not bad, "\n".join(bad)


@pytest.mark.gpu
def test_allreduce_multi_node_per_product(target, run, run_dir, gpu_products, discovery):
    suite.require_real_gpus(target, discovery, gpu_products)
    whole = {p: n for p, n in gpu_products.items()
             if all(suite.node_gpus(discovery, x)[0] == "nvidia.com/gpu" for x in n)}  # not shared, not MIG
    multi = {p: n for p, n in whole.items() if len(n) >= 2}
    if not multi:
        pytest.skip("no GPU product has two nodes or more with whole (unshared, non-MIG) GPUs")
    bench = get("allreduce")
    bad = []
    for product, nodes in sorted(multi.items()):
        nnodes = suite.multinode_count(nodes)
        gpus = min(suite.node_gpus(discovery, n, all_gpus=True)[1] for n in nodes)
        try:
            result = bench.run_multinode(run, bench.params({}, device="cuda"), product=product,
                                         nnodes=nnodes, gpus_per_node=gpus, image=suite.image())
        except Exception as exc:  # one product failing must not hide the others
            bad.append(f"{product}: {exc}")
            continue
        records = bench.to_records(result, node=f"{nnodes} nodes", product=product)
        run_dir.add_metrics(records)
        if not result.get("ok"):
            bad.append(f"{product}: {result.get('wrong_total')} wrong elements / {result.get('error')}")
    assert not bad, "\n".join(bad)

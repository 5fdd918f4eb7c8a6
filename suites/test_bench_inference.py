"""Benchmark: inference latency under stepped load, with a p99 SLO verdict and goodput.

- embedded cluster: the server and the locust load generator on this host's CPU, on
  127.0.0.1, a few seconds at low rates;
- real cluster: the server as a Deployment + Service on one GPU of each product, the
  load generator as a pod in the cluster.

The suite records the verdict; it fails only when the load test could not run (the
SLO verdict is a measurement, kept in the records as slo_verdict_pass).
"""

import pytest

from gpuproof.bench import suite

pytestmark = pytest.mark.bench

def test_inference_local_cpu(target, run_dir):
    suite.require_simulated(target, "inference")
    result, records = suite.run_local_cpu("inference", run_dir)
    load = result["load"]
    assert load["overall"]["requests"] > 0 and load["overall"]["errors"] == 0, load["overall"]
    assert any(r.metric == "p99_ms" for r in records)


@pytest.mark.gpu
def test_inference_per_product(target, run, run_dir, gpu_products, discovery):
    suite.require_real_gpus(target, discovery, gpu_products)
    results = suite.run_per_product("inference", run, run_dir, gpu_products, discovery)
    broken = [f"{p}: {r}" for p, r in results.items() if isinstance(r, str)]
    assert not broken, "\n".join(broken)

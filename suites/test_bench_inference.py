"""Benchmark: LLM serving under load: TTFT, TPOT, output tokens/s, goodput, and a capacity
search that says what bound it (device, server, client or offered-range).

- the server as a Deployment + Service on one GPU of each product (sized from the GPU's
  memory), the load generator as a pod in the cluster;
- ``GPUPROOF_INFERENCE_URL`` (and optionally ``GPUPROOF_INFERENCE_MODEL``): the load
  generator, a pod in the cluster, drives that OpenAI-compatible endpoint instead (vLLM,
  TGI, SGLang, NIM, ...). From this host: ``gpuproof bench --local inference --url URL``.

On the embedded cluster (its pods do not run) every test here skips, saying why.

The suite records the capacity and its bound; it fails only when the load test could not
run (the SLO outcome is a measurement, kept in the records).
"""

import os

import pytest

from gpuproof.bench import get
from gpuproof.plugin import bench_checks
from gpuproof.plugin.target import REAL_GPU_REASON

pytestmark = pytest.mark.bench

URL_ENV = "GPUPROOF_INFERENCE_URL"
MODEL_ENV = "GPUPROOF_INFERENCE_MODEL"


def _endpoint() -> dict:
    url = os.environ.get(URL_ENV)
    return {"url": url, "model": os.environ.get(MODEL_ENV) or None} if url else {}


@pytest.mark.gpu
@pytest.mark.creates(benchmark="inference", prefix="infer")
def test_inference_per_product(target, run, run_dir, gpu_products, discovery, check):
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    if _endpoint():
        pytest.skip(f"{URL_ENV} is set: the user's endpoint is benchmarked instead (test_inference_endpoint)")
    results = bench_checks.run_per_product("inference", run, run_dir, gpu_products, discovery)
    for product, node, _ok, actual in bench_checks.outcomes(results, gpu_products):
        ran = not isinstance(results[product], str)       # the SLO outcome is a measurement, not a verdict
        check.true("inference-load-ran", ran, "the load test ran", actual if not ran else "ran",
                   what=f"inference on {product}", target=node)


@pytest.mark.creates("ConfigMap", "gpuproof-workloads", env=URL_ENV)
@pytest.mark.creates("Pod", "bench-infer-endpoint-load", on="any", env=URL_ENV, note="load generator")
def test_inference_endpoint(target, run, run_dir, check):
    """The user's endpoint from a load generator pod in the cluster (real clusters only)."""
    endpoint = _endpoint()
    if not endpoint:
        pytest.skip(f"{URL_ENV} is not set")
    if bench_checks.is_simulated(target):
        pytest.skip(f"{REAL_GPU_REASON}: its pods do not run; `gpuproof bench --local inference --url URL` drives "
                    f"the endpoint from this host")
    bench = get("inference")
    params = bench.params(endpoint, device=bench_checks.device(run))
    result = bench.run_in_cluster(run, params, product="endpoint", node=None, image=bench_checks.image(run))
    records = bench.to_records(result, node="endpoint", product=endpoint["model"] or "endpoint")
    for r in records:
        r.parameters.setdefault("run_mode", "cluster")
    run_dir.add_metrics(records)
    steps = result["load"]["steps"]
    check.true("inference-endpoint-load-ran", bool(steps), "load steps against the endpoint",
               f"{len(steps)} steps" if steps else (result["load"].get("error") or "no step ran"),
               what=f"the load generator against {endpoint['url']}", target="endpoint")

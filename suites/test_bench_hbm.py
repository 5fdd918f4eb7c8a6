"""Benchmark: memory bandwidth (HBM), once per GPU product.

Records (benchmark ``hbm``): bandwidth_gbps, median_ms, ratio_to_peak (datasheet HBM bandwidth of
the product), sm_clock_mhz_mean, throttled_fraction, check_ok per kernel (copy, read);
utilization per phase. HBM bandwidth decides LLM decode speed and tells an H100
(3.35 TB/s) from an H200 (4.8 TB/s).
"""

import pytest

from gpuproof.plugin import bench_checks

pytestmark = pytest.mark.bench


@pytest.mark.gpu
@pytest.mark.creates(benchmark="hbm")
def test_hbm_per_product(target, run, run_dir, gpu_products, discovery, check):
    """One pod per GPU product (first node of each), stock PyTorch image, 1 GiB buffers."""
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    results = bench_checks.run_per_product("hbm", run, run_dir, gpu_products, discovery)
    for product, node, ok, actual in bench_checks.outcomes(results, gpu_products):
        check.true("hbm-result", ok, bench_checks.RESULT_OK, actual, what=f"hbm on {product}", target=node)

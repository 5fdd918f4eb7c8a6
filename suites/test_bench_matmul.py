"""Benchmark: dense matmul TFLOPS per dtype, once per GPU product.

Records (benchmark ``matmul``): tflops, median_ms, ratio_to_peak, ratio_to_peak_at_clock
(TFLOPS / (peak x mean SM clock / max SM clock), GPUs with NVML clocks only),
sm_clock_mhz_mean, throttled_fraction per dtype and size; check_rel_err per dtype;
utilization per phase.
"""

import pytest

from gpuproof.plugin import bench_checks

pytestmark = pytest.mark.bench


@pytest.mark.gpu
@pytest.mark.creates(benchmark="matmul")
def test_matmul_per_product(target, run, run_dir, gpu_products, discovery, check):
    """One pod per GPU product (first node of each), stock PyTorch image, all supported dtypes."""
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    results = bench_checks.run_per_product("matmul", run, run_dir, gpu_products, discovery)
    for product, node, ok, actual in bench_checks.outcomes(results, gpu_products):
        check.true("matmul-result", ok, bench_checks.RESULT_OK, actual, what=f"matmul on {product}", target=node)

"""Benchmark: dense matmul TFLOPS per dtype, once per GPU product (or locally on the CPU).

Records (benchmark ``matmul``): tflops, median_ms, ratio_to_peak, ratio_to_peak_at_clock
(TFLOPS / (peak x mean SM clock / max SM clock), GPUs with NVML clocks only),
sm_clock_mhz_mean, throttled_fraction per dtype and size; check_rel_err per dtype;
utilization per phase.
"""

import pytest

from gpuproof.bench import suite

pytestmark = pytest.mark.bench

def test_matmul_local_cpu(target, run_dir):
    """On the embedded cluster: the same workload on this host's CPU, small sizes."""
    suite.require_simulated(target, "matmul")
    result, records = suite.run_local_cpu("matmul", run_dir)
    assert result["ok"], result
    assert result["checks"] and all(c["ok"] for c in result["checks"]), result["checks"]
    tflops = [r for r in records if r.metric == "tflops"]
    assert tflops and all(r.value > 0 and r.node == "local" for r in tflops)
    # no clocks on the CPU: no efficiency at clock, and each row says why
    assert not any(r.metric == "ratio_to_peak_at_clock" for r in records)
    assert all(row["ratio_to_peak_at_clock"] is None and row["ratio_to_peak_at_clock_note"]
               for row in result["results"])


@pytest.mark.gpu
@pytest.mark.creates(benchmark="matmul")
def test_matmul_per_product(target, run, run_dir, gpu_products, discovery):
    """One pod per GPU product (first node of each), stock PyTorch image, all supported dtypes."""
    suite.require_real_gpus(target, discovery, gpu_products)
    results = suite.run_per_product("matmul", run, run_dir, gpu_products, discovery)
    bad = suite.failures(results)
    assert not bad, "\n".join(bad)

"""Benchmark: memory bandwidth (HBM), once per GPU product (or host memory locally on the CPU).

Records (benchmark ``hbm``): bandwidth_gbps, median_ms, ratio_to_peak (datasheet HBM bandwidth of
the product), sm_clock_mhz_mean, throttled_fraction, check_ok per kernel (copy, read);
utilization per phase. HBM bandwidth decides LLM decode speed and tells an H100
(3.35 TB/s) from an H200 (4.8 TB/s).
"""

import pytest

from gpuproof.bench import suite

pytestmark = pytest.mark.bench


def test_hbm_local_cpu(target, run_dir):
    """On the embedded cluster: the same workload on this host's CPU (host memory bandwidth), small buffers."""
    suite.require_simulated(target, "hbm")
    result, records = suite.run_local_cpu("hbm", run_dir)
    assert result["ok"], result
    assert result["memory"] == "host" and {r["kernel"] for r in result["results"]} == {"copy", "read"}
    gbps = [r for r in records if r.metric == "bandwidth_gbps"]
    assert len(gbps) == 2 and all(r.value > 0 and r.node == "local" for r in gbps)


@pytest.mark.gpu
@pytest.mark.creates(benchmark="hbm")
def test_hbm_per_product(target, run, run_dir, gpu_products, discovery):
    """One pod per GPU product (first node of each), stock PyTorch image, 1 GiB buffers."""
    suite.require_real_gpus(target, discovery, gpu_products)
    results = suite.run_per_product("hbm", run, run_dir, gpu_products, discovery)
    bad = suite.failures(results)
    assert not bad, "\n".join(bad)

"""Benchmark: the in-pod GPU probe, once per GPU product.

Records (benchmark ``probe``): cuda_devices, nvml_devices, nvml_visible_devices (with the
NVML UUIDs), kernel_check_ok, memory_total_mib per device, kernel_check_ms.
"""

import pytest

from gpuproof.plugin import bench_checks

pytestmark = pytest.mark.bench


@pytest.mark.gpu
@pytest.mark.creates(benchmark="probe", all_gpus=True)
def test_probe_per_product(target, run, run_dir, gpu_products, discovery, check):
    """A pod with all GPUs of the first node of each product: every GPU visible and computing right."""
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    results = {}
    for product, nodes in sorted(gpu_products.items()):
        gpus = bench_checks.node_gpus(discovery, sorted(nodes)[0], all_gpus=True)[1]
        results.update(bench_checks.run_per_product("probe", run, run_dir, {product: nodes}, discovery,
                                             params={"expect_gpus": gpus}, all_gpus=True))
    for product, node, ok, actual in bench_checks.outcomes(results, gpu_products):
        check.true("probe-result", ok, bench_checks.RESULT_OK, actual, what=f"the probe on {product}", target=node)

"""The formulas behind the figures, against values worked out by hand."""

import math

import pytest

from gpuproof.bench.workloads import import_workload

matmul = import_workload("matmul")
allreduce = import_workload("allreduce")
common = import_workload("workload_common")


# ---------------------------------------------------------------- matmul: TFLOPS = 2MNK / t


def test_tflops_4096_cubed_in_one_ms():
    # 2 * 4096^3 = 137,438,953,472 FLOP in 1e-3 s = 137.438953472 TFLOPS
    assert matmul.tflops(4096, 4096, 4096, 1e-3) == pytest.approx(137.438953472, rel=1e-12)


def test_tflops_rectangular():
    # 2 * 8192 * 1024 * 4096 = 68,719,476,736 FLOP in 2 ms = 34.359738368 TFLOPS
    assert matmul.tflops(8192, 1024, 4096, 2e-3) == pytest.approx(34.359738368, rel=1e-12)


def test_efficiency_at_clock_by_hand():
    # 680 TFLOPS bf16 on an H100 SXM (peak 989) at a mean 1500 of 1980 MHz:
    # peak at that clock = 989 * 1500 / 1980 = 749.2424...; 680 / 749.2424 = 0.907583...
    assert matmul.efficiency_at_clock(680.0, 989.0, 1500.0, 1980.0) == pytest.approx(680 / (989 * 1500 / 1980))
    assert matmul.efficiency_at_clock(680.0, 989.0, 1500.0, 1980.0) == pytest.approx(0.907583, abs=1e-6)
    # at the maximum clock it is the plain ratio to peak
    assert matmul.efficiency_at_clock(494.5, 989.0, 1980.0, 1980.0) == pytest.approx(0.5)
    for missing in [(680.0, None, 1500.0, 1980.0), (680.0, 989.0, None, 1980.0), (680.0, 989.0, 1500.0, None)]:
        assert matmul.efficiency_at_clock(*missing) is None


def test_efficiency_attached_from_the_sampler_summary():
    rows = [{"dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "tflops": 680.0, "peak_tflops": 989.0},
            {"dtype": "fp32", "m": 512, "n": 512, "k": 512, "tflops": 0.05, "peak_tflops": None}]
    summary = {"available": True, "devices": [{"gpu": 0, "max_sm_clock_mhz": 1980}], "phases": {
        "matmul:bf16:8192x8192x8192": {"gpus": {"0": {"sm_clock_mhz": {"mean": 1500.0, "p95": 1600.0},
                                                      "clock_event_reasons": ["sw_power_cap"],
                                                      "throttled_fraction": 1.0}}}}}
    matmul._attach_clocks(rows, summary)
    bf16, fp32 = rows
    assert bf16["sm_clock_mhz_mean"] == 1500.0 and bf16["sm_clock_mhz_max"] == 1980.0
    assert bf16["ratio_to_peak_at_clock"] == pytest.approx(680 / (989 * 1500 / 1980))
    assert bf16["clock_event_reasons"] == ["sw_power_cap"]
    assert fp32["ratio_to_peak_at_clock"] is None and "no datasheet peak" in fp32["ratio_to_peak_at_clock_note"]
    cpu = [{"dtype": "fp32", "m": 64, "n": 64, "k": 64, "tflops": 0.01, "peak_tflops": 10.0}]
    matmul._attach_clocks(cpu, {"available": False, "reason": "NVML unavailable: no library", "phases": {}})
    assert cpu[0]["ratio_to_peak_at_clock"] is None
    assert cpu[0]["ratio_to_peak_at_clock_note"] == "SM clocks unknown: NVML unavailable: no library"


def test_tflops_rejects_zero_time():
    with pytest.raises(ValueError):
        matmul.tflops(1, 1, 1, 0.0)


# ---------------------------------------------------------------- all-reduce: nccl-tests algbw / busbw


def test_allreduce_8_ranks_1gib_10ms():
    size, t = 2**30, 10e-3
    # algbw = 1,073,741,824 B / 0.01 s / 1e9 = 107.3741824 GB/s
    assert allreduce.algbw_gbps(size, t) == pytest.approx(107.3741824, rel=1e-12)
    # busbw = algbw * 2 * 7 / 8 = 187.9048192 GB/s
    assert allreduce.busbw_gbps(size, t, 8) == pytest.approx(187.9048192, rel=1e-12)


def test_busbw_factors_match_nccl_tests():
    f = allreduce.BUSBW_FACTORS
    assert f["all_reduce"](2) == 1.0
    assert f["all_reduce"](4) == 1.5
    assert f["all_gather"](8) == 7 / 8
    assert f["reduce_scatter"](4) == 3 / 4
    assert f["broadcast"](16) == 1.0
    # all_gather's S is count x typesize x n; busbw = algbw * (n-1)/n
    assert allreduce.busbw_gbps(800e6, 1.0, 8, "all_gather") == pytest.approx(0.7)


def test_world_size_one_has_zero_busbw():
    assert allreduce.busbw_gbps(1024, 1e-6, 1) == 0.0
    assert allreduce.algbw_gbps(1024, 1e-6) == pytest.approx(1.024)


def test_expected_sum_table():
    # ranks 0..4, b=0: 0+1+2+0+1 = 4; b=1: 1+2+0+1+2 = 6; b=2: 2+0+1+2+0 = 5
    assert allreduce.expected_sum_table(5) == [4, 6, 5]
    assert allreduce.expected_sum_table(1) == [0, 1, 2]


# ---------------------------------------------------------------- datasheet peaks


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA-H100-80GB-HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100 40GB"),
    ("NVIDIA A100 MIG 1g.10gb", None),           # no size: no product (the peaks are the same; its memory is not)
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA-L4-SHARED", "L4"),
    ("NVIDIA L4", "L4"),
    ("Tesla-T4", "T4"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
    ("Tesla V100-PCIE-16GB", "V100 PCIe"),
    ("NVIDIA H100 NVL", None),
    ("NVIDIA GeForce RTX 4090", None),
])
def test_peak_key(name, key):
    assert matmul.peak_key(name) == key


def test_peak_table_values():
    assert matmul.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert matmul.peak_tflops("NVIDIA H100 PCIe", "fp8") == 1513.0
    assert matmul.peak_tflops("NVIDIA A100-SXM4-40GB", "tf32") == 156.0
    assert matmul.peak_tflops("NVIDIA A100-SXM4-40GB", "fp8") is None
    assert matmul.peak_tflops("Tesla T4", "fp16") == 65.0
    assert matmul.peak_tflops("unknown", "fp32") is None
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100 80GB PCIe", "NVIDIA L40S",
                 "NVIDIA L4", "Tesla T4", "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-16GB"):
        assert matmul.peak_tflops(name, "fp32") > 0, name


# ---------------------------------------------------------------- parsing and statistics


def test_parse_shapes():
    assert matmul.parse_shapes("64, 8x16x32") == [(64, 64, 64), (8, 16, 32)]
    with pytest.raises(ValueError):
        matmul.parse_shapes("8x16")
    with pytest.raises(ValueError):
        matmul.parse_shapes("0")


def test_parse_bytes_and_sweep():
    assert common.parse_bytes("8") == 8
    assert common.parse_bytes("64K") == 65536
    assert common.parse_bytes("1MiB") == 2**20
    assert common.parse_bytes("1G") == 2**30
    assert common.parse_bytes("1GB") == 10**9
    with pytest.raises(ValueError):
        common.parse_bytes("1Q")
    sweep = common.geometric_sizes(8, 2**30)
    assert sweep[0] == 8 and sweep[-1] == 2**30 and len(sweep) == 28


def test_percentile_is_exact_linear_interpolation():
    xs = [float(x) for x in range(1, 101)]  # 1..100
    assert common.percentile(xs, 50) == pytest.approx(50.5)
    assert common.percentile(xs, 99) == pytest.approx(99.01)
    assert common.percentile(xs, 0) == 1.0 and common.percentile(xs, 100) == 100.0
    assert common.percentile([3.0], 99) == 3.0
    assert common.percentile([], 50) is None
    # no bucketing: 1.234 ms stays 1.234 ms
    assert common.percentile([0.001234] * 10, 99) == 0.001234
    assert math.isclose(common.median([4.0, 1.0, 3.0, 2.0]), 2.5)

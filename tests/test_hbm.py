"""HBM / memory bandwidth: the byte count, the datasheet ratio, the CPU run, records, compare and baselines."""

import json
import subprocess
import sys

import pytest

from gpuproof.bench import get, names
from gpuproof.report.baseline import check_run, load_baseline, make_baseline, parse_rules, save_baseline
from gpuproof.report.compare import compare_runs
from gpuproof.report.data import load_run
from gpuproof.results import RunDir
from gpuproof.bench.workloads import import_workload, workloads_dir

hbm = import_workload("hbm")
matmul = import_workload("matmul")


# ---------------------------------------------------------------- formulas


def test_bytes_moved_by_hand():
    # copy of a 1 GiB buffer: reads 1,073,741,824 B and writes as many = 2,147,483,648 B
    assert hbm.bytes_moved("copy", 2**30) == 2_147_483_648
    # sum of a 1 GiB float32 buffer: reads 1,073,741,824 B, writes one 4-byte element
    assert hbm.bytes_moved("read", 2**30) == 1_073_741_828
    with pytest.raises(ValueError):
        hbm.bytes_moved("triad", 8)


def test_gbps_by_hand():
    # 2 GiB moved in 1 ms = 2,147,483,648 / 1e-3 / 1e9 = 2147.483648 GB/s
    assert hbm.gbps(hbm.bytes_moved("copy", 2**30), 1e-3) == pytest.approx(2147.483648, rel=1e-12)
    with pytest.raises(ValueError):
        hbm.gbps(1, 0.0)


def test_ratio_to_datasheet_by_product_name():
    # 2147.48 GB/s on an H100 SXM (3.35 TB/s): 2147.483648 / 3350 = 0.641040...
    peak, ratio = hbm.ratio_to_peak(2147.483648, "NVIDIA H100 80GB HBM3")
    assert peak == 3350.0 and ratio == pytest.approx(2147.483648 / 3350.0, rel=1e-12)
    assert hbm.ratio_to_peak(4000.0, "NVIDIA H200")[1] == pytest.approx(4000 / 4800)
    assert hbm.ratio_to_peak(10.0, "x86_64") == (None, None)
    assert hbm.ratio_to_peak(10.0, None) == (None, None)


@pytest.mark.parametrize("name, key, tbps", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 3.35),
    ("NVIDIA-H100-80GB-HBM3", "H100 SXM", 3.35),
    ("NVIDIA H100 PCIe", "H100 PCIe", 2.0),
    ("NVIDIA H200", "H200", 4.8),
    ("NVIDIA B200", "B200", 8.0),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB", 2.04),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 1.56),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "A100 40GB", 1.56),
    ("NVIDIA L40S", "L40S", 0.864),
    ("NVIDIA-L4-SHARED", "L4", 0.30),
    ("Tesla-T4", "T4", 0.32),
    ("NVIDIA H100 NVL", None, None),
    ("Tesla V100-SXM2-32GB", None, None),   # in the TFLOPS table, not in the HBM table
    ("NVIDIA A100", None, None),            # memory size unknown: 1.56 or 2.04 TB/s
])
def test_hbm_peak_table(name, key, tbps):
    assert matmul.hbm_key(name) == key
    assert matmul.peak_hbm_tbps(name) == tbps


# ---------------------------------------------------------------- the workload on the CPU


def run_hbm(*args):
    cmd = [sys.executable, str(workloads_dir() / "hbm.py"), "--device", "cpu", "--threads", "1",
           "--size", "4M", "--iters", "3", "--warmup", "1", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.fixture(scope="module")
def cpu_result():
    code, result, _ = run_hbm("--product", "NVIDIA H100 80GB HBM3")
    assert code == 0, result
    return result


def test_cpu_run_schema(cpu_result):
    r = cpu_result
    assert r["workload"] == "hbm" and r["ok"] and r["device"] == "cpu" and r["memory"] == "host"
    rows = {row["kernel"]: row for row in r["results"]}
    assert set(rows) == {"copy", "read"}
    for kernel, row in rows.items():
        assert row["size_bytes"] == 4 * 2**20 and row["iters"] == 3 and row["check_ok"] is True
        assert row["bytes_moved"] == hbm.bytes_moved(kernel, 4 * 2**20)
        assert row["gbps"] == pytest.approx(row["bytes_moved"] / (row["median_ms"] / 1e3) / 1e9)
        assert row["gbps_best"] == pytest.approx(row["bytes_moved"] / (row["min_ms"] / 1e3) / 1e9)
        assert row["min_ms"] <= row["median_ms"] and row["gbps"] > 0
        for field in ("sm_clock_mhz_mean", "clock_event_reasons", "throttled_fraction", "peak_gbps", "ratio_to_peak"):
            assert field in row
        assert row["sm_clock_mhz_mean"] is None  # no NVML on the CPU ...
    assert r["clocks_note"].startswith("no SM clocks")  # ... and the result says so
    assert r["utilization"]["available"] is False and "sampler_cost" in r["utilization"]


def test_cpu_run_ratio_with_a_named_product(cpu_result):
    assert cpu_result["peak_key"] == "H100 SXM"
    for row in cpu_result["results"]:
        assert row["peak_gbps"] == 3350.0 and row["ratio_to_peak"] == pytest.approx(row["gbps"] / 3350.0)


@pytest.mark.server  # tier: workloads/hbm.py as a process
def test_cpu_run_without_product_has_no_ratio_and_says_why():
    code, r, _ = run_hbm("--kernels", "read")
    assert code == 0 and [row["kernel"] for row in r["results"]] == ["read"]
    assert r["results"][0]["ratio_to_peak"] is None and r["product"] is None
    assert "--product" in r["ratio_note"]


@pytest.mark.server  # tier: workloads/hbm.py as a process
def test_bad_arguments_exit_2():
    code, r, _ = run_hbm("--kernels", "triad")
    assert code == 2 and r["ok"] is False and "triad" in r["error"]


# ---------------------------------------------------------------- registry, records, compare, baselines


def test_registered_and_part_of_all():
    assert "hbm" in names()
    b = get("hbm")
    assert b.params(device="cpu")["size"] == "256M" and b.params(device="cuda")["size"] == "1G"
    args = b.workload_args(b.params({"product": "NVIDIA H200"}, device="cpu"))
    assert args[args.index("--product") + 1] == "NVIDIA H200"


def test_records(cpu_result):
    recs = get("hbm").to_records(cpu_result, node="gpu-1", product="NVIDIA-H100-80GB-HBM3")
    by = {(r.metric, r.parameters.get("kernel")): r for r in recs}
    bw = by[("bandwidth_gbps", "copy")]
    assert (bw.benchmark, bw.unit, bw.node, bw.product) == ("hbm", "GB/s", "gpu-1", "NVIDIA-H100-80GB-HBM3")
    assert bw.parameters["memory"] == "host" and bw.parameters["size_bytes"] == 4 * 2**20
    assert by[("ratio_to_peak", "read")].parameters["peak_gbps"] == 3350.0
    assert ("sm_clock_mhz_mean", "copy") not in by  # unknown on the CPU: no record


def _hbm_run(root, run_id, factor):
    run = RunDir.create(root, run_id=run_id, cluster="local", target="local")
    for kernel, value in (("copy", 3000.0), ("read", 3100.0)):
        result = {"device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "memory": "hbm", "peak_key": "H100 SXM",
                  "results": [{"kernel": kernel, "size_bytes": 2**30, "iters": 20, "gbps": value * factor,
                               "median_ms": 1.0, "ratio_to_peak": value * factor / 3350, "peak_gbps": 3350.0,
                               "check_ok": True}]}
        run.add_metrics(get("hbm").to_records(result, node="n1", product="NVIDIA-H100-80GB-HBM3"))
    run.finalize("passed")
    return run.path


def test_compare_and_baseline_treat_hbm_like_the_others(tmp_path):
    before, after = _hbm_run(tmp_path, "before", 1.0), _hbm_run(tmp_path, "after", 0.9)
    cmp = compare_runs([load_run(before), load_run(after)])
    rows = {(m.metric, json.loads(m.parameters)["kernel"]): m for m in cmp.metrics if m.benchmark == "hbm"}
    assert rows[("bandwidth_gbps", "copy")].delta(1) == pytest.approx(-0.10)
    assert rows[("bandwidth_gbps", "copy")].assessment(1) == "worse"      # higher is better: by its name
    assert rows[("ratio_to_peak", "read")].assessment(1) == "worse"
    assert rows[("median_ms", "copy")].assessment(1) == ""                # unchanged
    save_baseline(make_baseline([load_run(before)]), tmp_path / "baseline.json")
    baseline = load_baseline(tmp_path / "baseline.json")
    rules = parse_rules([{"metric": "hbm/bandwidth_gbps", "tolerance": 0.05, "direction": "higher_is_better"}])
    report = check_run(load_run(after), baseline, rules)
    assert len(report.regressions) == 2 and report.count("ok") == 0   # both kernels 10% down
    assert check_run(load_run(before), baseline, rules).regressions == []

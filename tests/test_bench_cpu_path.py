"""The benchmarks' CPU path through ``run_and_record`` (what `gpuproof bench --local` runs), at the
small CI sizes: results and the records they leave in a run folder.

These checks were local CPU stand-ins in the acceptance suites (issue #23), where they added rows for a
product 'cpu' on node 'local' to every embedded run's report. hbm, inference and health have theirs in
tests/test_hbm.py, tests/test_workloads_inference.py and tests/test_health.py.
"""

from __future__ import annotations

import pytest

from gpuproof.bench import get, run_and_record
from gpuproof.results import RunDir

pytestmark = pytest.mark.server  # tier: each test runs a workload as a process

pytest.importorskip("torch", reason="the workloads run on this host with gpuproof's 'bench' extra")


def run_cpu(name: str, tmp_path):
    bench = get(name)
    run_dir = RunDir.create(tmp_path, "cpu", target="local", cluster="local")
    result, records = run_and_record(name, run_dir, bench.params(bench.ci_params, device="cpu"))
    assert all(r.node == "local" for r in records)
    return result, records


def test_probe(tmp_path):
    result, records = run_cpu("probe", tmp_path)
    assert result["ok"], result.get("problems")
    assert any(r.metric == "kernel_check_ok" and r.value == 1.0 for r in records)
    # identity comes from NVML (none on the CPU), never from NVIDIA_VISIBLE_DEVICES
    assert result["nvml_uuids"] == [] and any(r.metric == "nvml_visible_devices" for r in records)


def test_matmul(tmp_path):
    result, records = run_cpu("matmul", tmp_path)
    assert result["ok"], result
    assert result["checks"] and all(c["ok"] for c in result["checks"]), result["checks"]
    tflops = [r for r in records if r.metric == "tflops"]
    assert tflops and all(r.value > 0 for r in tflops)
    # no clocks on the CPU: no efficiency at clock, and each row says why
    assert not any(r.metric == "ratio_to_peak_at_clock" for r in records)
    assert all(row["ratio_to_peak_at_clock"] is None and row["ratio_to_peak_at_clock_note"]
               for row in result["results"])


def test_allreduce_two_ranks(tmp_path):
    result, records = run_cpu("allreduce", tmp_path)
    assert result["ok"], result
    assert result["world_size"] == 2 and result["wrong_total"] == 0
    assert any(r.metric == "avg_busbw_gbps" for r in records)

"""``--quick-bench``: the benchmarks at their smallest sizes (``ci_params``), records marked ``sizes: quick``."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from gpuproof.bench import census, get
from gpuproof.bench.base import CPU_PEER_PCT
from gpuproof.cli.options import add_selection_options, selection_argv
from gpuproof.plugin import bench_checks
from gpuproof.results import MetricRecord


def argv(*cli: str) -> list[str]:
    p = argparse.ArgumentParser()
    add_selection_options(p)
    return selection_argv(p.parse_args(list(cli)))


def test_quick_bench_runs_the_benchmarks_and_tells_the_plugin():
    assert argv("--quick-bench") == ["--gpuproof-quick-bench"]                  # benchmarks included, not "not bench"
    assert argv("--only-bench", "--quick-bench") == ["-m", "bench", "--gpuproof-quick-bench"]
    assert argv() == ["-m", "not bench"] and argv("--bench") == []


def run_on(device: str, quick: bool):
    image = SimpleNamespace(device=device)
    return SimpleNamespace(workload_image=image if device == "cpu" else None, quick_bench=quick)


def test_quick_sizes_on_the_cpu_and_on_a_gpu():
    bench = get("allreduce")
    full = bench_checks.bench_params(bench, run_on("cpu", quick=False))
    assert full["max_bytes"] == bench.cpu_defaults["max_bytes"] and full["sizes"] is None
    # stragglers at the CPU's peer floor (the census's too), the workload's own 80% on a GPU (unset: its default)
    assert full["straggler_pct"] == CPU_PEER_PCT == census.CPU_POOL_PCT
    assert bench_checks.bench_params(bench, run_on("cuda", quick=False))["straggler_pct"] is None
    quick = bench_checks.bench_params(bench, run_on("cpu", quick=True), {"straggler_pct": 70})
    assert {k: quick[k] for k in bench.ci_params} == bench.ci_params and quick["straggler_pct"] == 70
    # a GPU node keeps its own thread and process counts; only the sizes shrink
    gpu = bench_checks.bench_params(bench, run_on("cuda", quick=True))
    assert gpu["device"] == "cuda" and gpu["sizes"] == bench.ci_params["sizes"]
    assert gpu["nproc"] == bench.defaults["nproc"] and gpu["threads"] == bench.defaults["threads"]


def test_quick_records_say_so_and_full_ones_do_not():
    def records():
        return [MetricRecord("matmul", "tflops", 1.0, "TFLOPS", parameters={"size": 128})]

    (quick,) = bench_checks.mark(records(), run_on("cpu", quick=True))
    assert quick.parameters == {"size": 128, "run_mode": "cluster", "sizes": "quick"}
    (full,) = bench_checks.mark(records(), run_on("cpu", quick=False))
    assert full.parameters == {"size": 128, "run_mode": "cluster"}

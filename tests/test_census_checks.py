"""Every census check failing on its fault, through the suite's own test function (suites/test_census.py).

The census pods' output is the real workload's (tests/test_census.py runs it over NVIDIA's mock NVML of two A100s,
once plain and once with ``--product`` naming an H100 so it fills in that datasheet's figures); each node of a
fleet gets a copy, and the fault changes one figure of one node. The suite's function runs with a real Checker and
the fan-out's outcomes given; each case asserts the record (check, node, expected, actual) and the message a person
reads. The kubelet test that makes a slow node real (the kernel's CPU quota) is tests/test_slow_node.py.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
from test_census import TINY, cpu_result, mock_a100, software  # noqa: F401  (fixtures)
from test_real_gpu_checks import _shown, node, suite

from gpuproof.bench.census import pool_key
from gpuproof.bench.workloads import workloads_dir
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir

A100 = "NVIDIA-A100-SXM4-80GB"
H100_NAME = "NVIDIA H100 80GB HBM3"


def gpu_node(name: str, product: str = A100, count: int = 2):
    return node(name, {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(count)},
                {"nvidia.com/gpu": str(count)}).nodes[0]


@pytest.fixture(scope="module")
def h100_sheet(software, mock_a100):     # noqa: F811
    """The census over the same mock, told its GPUs are H100s: CPU figures beside an H100's datasheet."""
    config, _, _ = mock_a100
    env = {**software.mock_env(config), "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(workloads_dir() / "census.py"), *TINY, "--product", H100_NAME],
                          capture_output=True, text=True, timeout=120, env=env)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def scaled(result: dict, factor: float, gpu: int | None = None, metrics=("matmul_tflops", "d2d_copy_gbps")) -> dict:
    r = copy.deepcopy(result)
    for g in r["gpus"]:
        if gpu is None or g["index"] == gpu:
            for m in metrics:
                g[m] *= factor
    return r


def slow_allreduce(result: dict) -> dict:
    r = copy.deepcopy(result)
    r["allreduce"]["busbw_gbps"] *= 0.5
    return r


# id: (how to make the faulty node's result from the real one, the faulty node, which run's output, [(check, node)])
FAULTS = {
    "one-gpu-slow-matmul": (lambda r: scaled(r, 0.6, 1, ("matmul_tflops",)), "plain",
                            [("census-matmul-pool", "a100-2")]),
    "one-gpu-slow-copy": (lambda r: scaled(r, 0.5, 0, ("d2d_copy_gbps",)), "plain", [("census-copy-pool", "a100-2")]),
    "slow-all-reduce": (slow_allreduce, "plain", [("census-allreduce-pool", "a100-2")]),
    "no-result": (lambda r: {"pod_error": "census pod gpuproof-x/bench-census-a100-2 on a100-2 printed no JSON "
                                          "result (exit code 137 (OOMKilled))"}, "plain",
                  [("census-result", "a100-2")]),
    # the whole pool far below an H100's datasheet (CPU figures): every GPU of every node fails it
    "under-the-datasheet": (lambda r: r, "h100", [("census-matmul-datasheet", "a100-2"),
                                                  ("census-copy-datasheet", "a100-2")]),
}


def run_census(tmp_path, results: dict[str, dict], name: str):
    """The suite's test on node ``name`` among ``results`` (node -> census output): (checker, its records)."""
    module = suite("census")
    nodes = {n: gpu_node(n) for n in results}
    pool = pool_key(A100, 2)
    outcomes = {n: (pool, r) for n, r in results.items()}
    fan = SimpleNamespace(result=lambda item, n, work, **kw: outcomes[n.name],
                          peers=lambda item, same: {n: o for n, o in outcomes.items() if same(nodes[n])},
                          again=lambda item, n: outcomes[n.name])    # measured again: a slow GPU stays slow
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, nodes[name], known_nodes=nodes)
    module.test_census_per_node(needs_real_gpus=None, gpu_node=nodes[name], run=None, run_dir=run_dir,
                                target=SimpleNamespace(cluster=None), discovery=None, fanout=fan,
                                request=SimpleNamespace(node=None), check=checker)
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def fleet_of(result: dict, fault, bad: str = "a100-2") -> dict[str, dict]:
    """Three nodes of the run's output, every GPU with GPU 0's figures (its own index and UUID): two CPU figures of
    one run can differ by more than a floor, and the fault, not the CPU's noise, must be what fails."""
    even = copy.deepcopy(result)
    for g in even["gpus"]:
        g.update({k: result["gpus"][0][k] for k in ("matmul_tflops", "d2d_copy_gbps")})
    out = {f"a100-{i}": copy.deepcopy(even) for i in range(3)}
    out[bad] = fault(out[bad])
    return out


@pytest.mark.server     # tier: its figures come from the workload's run
def test_healthy_nodes_pass_every_census_check(tmp_path, cpu_result):       # noqa: F811
    results = fleet_of(cpu_result[1], lambda r: r)
    for name in results:
        checker, records = run_census(tmp_path / name, results, name)
        assert checker.failures == [], checker.failures
        assert {(r["check"], r["verdict"]) for r in records} == {
            ("census-matmul-pool", "pass"), ("census-copy-pool", "pass"), ("census-allreduce-pool", "pass"),
            ("census-matmul-datasheet", "skip"), ("census-copy-datasheet", "skip")}


@pytest.mark.server
@pytest.mark.parametrize("case", list(FAULTS))
def test_census_check_fails_on_its_fault(tmp_path, cpu_result, h100_sheet, case):     # noqa: F811
    fault, which, expectations = FAULTS[case]
    results = fleet_of(cpu_result[1] if which == "plain" else h100_sheet, fault)
    checker, records = run_census(tmp_path, results, "a100-2")
    with pytest.raises(pytest.fail.Exception) as failed:
        checker.finish()
    message = str(failed.value)
    for check, target in expectations:
        rec = next((r for r in records if r["check"] == check and r["target"] == target and r["verdict"] == "fail"),
                   None)
        assert rec is not None, records
        line = next((ln for ln in message.splitlines() if rec["message"] == ln), None)
        assert line is not None and line.startswith(f"{target}: "), message
        assert f"expected {_shown(rec['expected'])}, actual {_shown(rec['actual'])}" in line, line
        if check != "census-result":     # a GPU's check names its index, UUID, figure and what it is measured against
            assert rec["expected"].startswith(">= ") and "%" in rec["expected"], rec
            if "allreduce" not in check:
                gpu = next(g for g in results[target]["gpus"] if f"GPU {g['index']} ({g['uuid']})" in line)
                assert gpu is not None
            assert ("pool's median" in line) == check.endswith("-pool"), line
        else:
            assert "OOMKilled" in line
    # the healthy peers of a pool fault still pass
    if which == "plain":
        _, peer_records = run_census(tmp_path / "peer", results, "a100-0")
        assert all(r["verdict"] != "fail" for r in peer_records), peer_records


def test_the_coverage_count_knows_every_census_check():
    import test_check_coverage

    from gpuproof.bench.census import CHECKS

    assert test_check_coverage.BUILT[("test_census.py", "v.check")] == set(CHECKS)
    assert {c for row in FAULTS.values() for c, _ in row[-1]} == set(CHECKS)

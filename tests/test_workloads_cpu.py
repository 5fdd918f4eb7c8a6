"""Every workload on the CPU at small sizes, through the entry point users and pods call:
``python workloads/<x>.py ...`` printing one JSON object as the last line of stdout."""

import json
import os
import subprocess
import sys

import pytest

from gpuproof.bench.workloads import WORKLOADS_DIR

pytestmark = pytest.mark.server  # tier: each test runs a workload as a process

SCRIPTS = ["probe", "matmul", "allreduce", "inference_server", "loadgen", "nvml_sampler"]


def run(script, *args, timeout=120, expect=0):
    proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / f"{script}.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert len(lines) == 1, f"stdout must be one JSON line, got {len(lines)}:\n{proc.stdout[-2000:]}"
    return json.loads(lines[0])


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / f"{script}.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage:") and len(proc.stdout) > 300


def test_probe_cpu():
    # --expect-gpus 1 on a CPU run: the kernel check passes, the GPU count check fails (exit 1)
    r = run("probe", "--device", "cpu", "--threads", "1", "--expect-gpus", "1", expect=1)
    assert r["workload"] == "probe" and r["torch"] and r["torch_devices"] == []
    assert "CUDA_VISIBLE_DEVICES" in r["env"] and "NVIDIA_VISIBLE_DEVICES" in r["env"]
    assert r["kernel_checks"] == [dict(r["kernel_checks"][0], device="cpu", wrong=0, ok=True)]
    assert "available" in r["nvml"]
    assert r["ok"] is False and r["problems"] == ["expected 1 GPUs, NVML shows 0"]   # no CUDA: NVML counts


@pytest.mark.parametrize("mib,ok", [(16, True), (2**30, False)], ids=["fits", "1-pib-refused"])
def test_probe_alloc_reports_success_and_refusal(mib, ok):
    """The MIG suite asks each pod to allocate past its slice; the probe must report a refusal, not crash."""
    r = run("probe", "--device", "cpu", "--threads", "1", "--alloc-mib", mib)
    assert r["alloc"] == {"mib": mib, "ok": ok}
    assert (r["allocs"][0]["error"] is None) == ok


def test_matmul_cpu():
    r = run("matmul", "--device", "cpu", "--threads", "1", "--dtypes", "fp32,bf16,tf32",
            "--sizes", "64,32x48x80", "--iters", "5", "--warmup", "1", "--check-size", "64")
    assert r["ok"] is True and r["device"] == "cpu"
    assert [(x["dtype"], x["m"], x["n"], x["k"]) for x in r["results"]] == [
        ("fp32", 64, 64, 64), ("fp32", 32, 48, 80), ("bf16", 64, 64, 64), ("bf16", 32, 48, 80)]
    for x in r["results"]:
        assert x["tflops"] == pytest.approx(2 * x["m"] * x["n"] * x["k"] / (x["median_ms"] / 1e3) / 1e12)
        assert x["ratio_to_peak"] is None and x["peak_tflops"] is None  # no datasheet peak on the CPU
        assert x["iters"] == 5 and x["buffers"] >= 1
    assert {c["dtype"]: c["ok"] for c in r["checks"]} == {"fp32": True, "bf16": True}
    assert r["skipped"][0]["dtype"] == "tf32" and "CUDA" in r["skipped"][0]["reason"]
    # no NVML on the CPU: the sampler says why and records nothing
    assert (r["utilization"]["available"], r["utilization"]["n_samples"]) == (False, 0) and r["utilization"]["reason"]


def test_matmul_bad_dtype_is_a_usage_error():
    r = run("matmul", "--device", "cpu", "--dtypes", "fp7", expect=2)
    assert r["ok"] is False and "fp7" in r["error"]


def test_allreduce_world_size_1():
    r = run("allreduce", "--device", "cpu", "--threads", "1", "--min-bytes", "8", "--max-bytes", "64",
            "--iters", "3", "--warmup", "1")
    assert r["ok"] is True and r["world_size"] == 1 and r["backend"] == "gloo"
    assert [x["size_bytes"] for x in r["results"]] == [8, 16, 32, 64]
    assert [x["count"] for x in r["results"]] == [2, 4, 8, 16]
    # one rank: no data moves, so no bandwidth at all (issue #14), and the result says why
    assert all(x["busbw_gbps"] is None and x["algbw_gbps"] is None and x["wrong"] == 0 for x in r["results"])
    assert r["avg_busbw_gbps"] is None and r["no_bandwidth_reason"].startswith("1 rank: no data moves")


def test_allreduce_world_size_2_gloo():
    r = run("allreduce", "--device", "cpu", "--threads", "1", "--nproc", "2", "--sizes", "8,1K,4K",
            "--iters", "3", "--warmup", "1", timeout=180)
    assert r["ok"] is True and r["world_size"] == 2 and r["wrong_total"] == 0
    rows = r["results"]
    assert [x["size_bytes"] for x in rows] == [8, 1024, 4096]
    for x in rows:
        assert x["algbw_gbps"] == pytest.approx(x["size_bytes"] / (x["time_us"] / 1e6) / 1e9)
        assert x["busbw_gbps"] == pytest.approx(x["algbw_gbps"])  # 2(n-1)/n = 1 for n = 2
        assert (x["type"], x["redop"], x["wrong"]) == ("float32", "sum", 0)
    assert r["avg_busbw_gbps"] == pytest.approx(sum(x["busbw_gbps"] for x in rows) / 3)

"""benchmarks/gpu_run.sh, the one script a lent GPU machine runs (benchmarks/RESULTS.md, "GPU run"),
dry-run on the CPU: a step runs under its limit and says its exit code, one that outlives its limit is
stopped and says 124, and the records come back packed."""

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.server  # tier: runs benchmarks/gpu_run.sh and its workloads

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_run_script_runs_its_steps_each_under_a_limit(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "GPU_RUN_DEVICE": "cpu", "GPU_RUN_STEPS": "probe inference",
           "GPU_RUN_INFERENCE_S": "1", "GPU_RUN_REPORTS": str(tmp_path / "reports")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_run.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (tmp_path / "out" / "log").read_text()
    assert "probe rc=0" in log and "probe: ok" in log, log[-2000:]
    assert "inference rc=124" in log, log[-2000:]      # stopped at its 1 s limit, and said so
    assert "smi" not in proc.stdout                     # only the steps asked for
    with tarfile.open(tmp_path / "out" / "reports.tgz") as tar:
        assert "gpu-probe/bench-probe.json" in tar.getnames()


def test_the_gpu_host_steps_install_the_bundle_and_refuse_gpu_host_on_the_cpu(tmp_path, monkeypatch):
    """Issue #42 item 4's steps, dry-run: the bundle goes into a clean cache (a bundle of stand-ins: what it holds
    is tests/test_bundle.py's and tests/test_bundle_lab.py's), and gpu-host, on a machine without a GPU, is refused
    in one line in the log; the log and the records come back packed."""
    from gpuproof.sim import bundle
    from test_bundle import fill_cache

    monkeypatch.setenv("GPUPROOF_CACHE", str(tmp_path / "maker"))
    fill_cache()
    made = tmp_path / "gpuproof-bundle.tar.xz"
    bundle.make(made)
    env = {**os.environ, "PYTHON": sys.executable, "GPU_RUN_DEVICE": "cpu", "GPU_RUN_STEPS": "bundle gpu-host",
           "GPU_RUN_BUNDLE": str(made), "GPUPROOF_CACHE": str(tmp_path / "clean"),
           "GPUPROOF_HOST_DRIVER_ROOT": str(tmp_path / "no-driver"), "GPU_RUN_REPORTS": str(tmp_path / "reports")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_run.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    log = (tmp_path / "out" / "log").read_text()
    assert "bundle rc=0" in log and "installed" in log, log[-2000:]
    assert (tmp_path / "clean" / "controlplane").is_dir()
    assert "gpu-host rc=2" in log, log[-2000:]
    assert "gpuproof: error: fleet gpu-host: this machine has no NVIDIA GPU" in log, log[-2000:]
    assert "Traceback" not in log and (tmp_path / "out" / "reports.tgz").exists()
    env["GPU_RUN_BUNDLE"] = str(tmp_path / "nowhere.tar.xz")
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_run.sh"), str(tmp_path / "out2")], env=env,
                          capture_output=True, text=True, timeout=240)
    assert "bundle rc=1" in (tmp_path / "out2" / "log").read_text()

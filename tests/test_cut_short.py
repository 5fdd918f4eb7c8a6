"""A run whose API server dies under it ends with its report (issue #41 item 1).

The case issue #41 reports: the API server killed during the run's cleanup ended the run as `internal error:
MaxRetryError` with exit 70, and no summary.md, report.html or parquet, though every verdict was in checks.jsonl.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import private_cluster
from gpuproof.cluster.api import RUN_LABEL, watch_until

pytestmark = pytest.mark.sim

MINIMAL = Path(__file__).parents[1] / "gpuproof" / "sim" / "fleets" / "minimal.yaml"


def test_the_api_server_killed_during_cleanup_cuts_the_run_short_with_its_report(tmp_path):
    fleet = yaml.safe_load(MINIMAL.read_text())
    with private_cluster(fleet, tmp_path / "sim", str(MINIMAL)) as cluster:
        reports = tmp_path / "reports"
        proc = subprocess.Popen([sys.executable, "-m", "gpuproof", "run", "--kubeconfig", cluster.kubeconfig,
                                 "--report-dir", str(reports), "--run-id", "cut", "-k", "taints", "--",
                                 "--timeout-scale=0.25"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            # the run's cleanup has begun once its namespace is being deleted: the API server dies then
            watch_until(cluster.client.core.list_namespace,
                        lambda c: any(ns.metadata.deletion_timestamp for ns in c.values()), 240,
                        "the run's namespace to be deleted (its cleanup)", label_selector=f"{RUN_LABEL}=cut")
            pid = json.loads(cluster.sim.state_file.read_text())["pids"]["kube-apiserver"]
            os.kill(pid, signal.SIGKILL)
            out, _ = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 75, out[-4000:]
    assert "internal error" not in out and "Traceback" not in out, out[-4000:]
    said = [line for line in out.splitlines() if line.startswith("gpuproof: run cut cut short:")]
    assert len(said) == 1 and "the API server stopped answering during the run's cleanup" in said[0] \
        and "gpuproof clean" in said[0], out[-3000:]
    run = reports / "cut"
    for name in ("summary.md", "report.html", "checks.parquet", "junit.xml"):
        assert (run / name).exists(), name
    checks = [json.loads(line) for line in (run / "checks.jsonl").read_text().splitlines()]
    assert checks and not [c for c in checks if c["verdict"] == "fail"], checks      # every verdict kept, none false
    assert "cut short: the API server stopped answering" in json.loads((run / "run.json").read_text())["outcome"]

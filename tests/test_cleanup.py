"""Nothing a run creates survives it: not after a failure, not after Ctrl-C or SIGTERM.

A run that was SIGKILLed leaves its labelled objects; ``gpuproof clean`` removes them
and nothing else.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from gpuproof.cluster.api import RUN_LABEL, run_labels, watch_until

pytestmark = pytest.mark.sim

SUITE = textwrap.dedent('''
    from gpuproof.plugin.checks import pod

    def test_creates_then_fails(run):
        run.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                   "metadata": {"name": f"gpuproof-{run.run_id}-low"}, "value": -100})
        run.apply(pod("victim", {"nvidia.com/gpu": 1}, tolerations=[{"operator": "Exists"}]))
        run.create_namespace("extra")
        run.wait_running("victim", timeout=60)
        assert False, "fails midway on purpose"

    def test_hangs(run):
        run.apply(pod("stuck", {"nvidia.com/gpu": 999}))
        run.wait_running("stuck", timeout=600)      # never: interrupted by the test
''')


def _suite_cmd(embedded, tmp_path, run_id: str, keyword: str) -> list[str]:
    (tmp_path / "test_leftovers.py").write_text(SUITE)
    return [sys.executable, "-m", "pytest", str(tmp_path / "test_leftovers.py"), "-p", "gpuproof.pytest_plugin",
            "-p", "no:cacheprovider", f"--rootdir={tmp_path}", f"--kubeconfig={embedded.kubeconfig}",
            f"--report-dir={tmp_path / 'reports'}", f"--run-id={run_id}", "-k", keyword, "-q"]


def _leftovers(embedded, run_id: str) -> dict:
    return embedded.client.leftover_runs().get(run_id, {})


def test_failed_session_leaves_nothing(embedded, tmp_path):
    proc = subprocess.run(_suite_cmd(embedded, tmp_path, "fail-midway", "fails"), capture_output=True, text=True,
                          cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "fails midway on purpose" in proc.stdout
    assert _leftovers(embedded, "fail-midway") == {}
    assert (tmp_path / "reports" / "fail-midway" / "run.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_session_leaves_nothing(embedded, tmp_path, sig):
    run_id = f"interrupt-{sig.name.lower()}"
    proc = subprocess.Popen(_suite_cmd(embedded, tmp_path, run_id, "hangs"), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        # wait until the run has created its pod, then interrupt
        watch_until(embedded.client.core.list_namespaced_pod, lambda c: "stuck" in c, 60,
                    "the interrupted run's pod to exist", namespace=f"gpuproof-{run_id}")
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert _leftovers(embedded, run_id) == {}, out
    assert f"deleting run namespace gpuproof-{run_id}" in out
    # the run's records say how it ended (how fast it ends under load: benchmarks/interrupt_load.py, issue #52)
    meta = json.loads((tmp_path / "reports" / run_id / "run.json").read_text())
    assert meta["outcome"] == "interrupted", meta


def test_gpuproof_clean_removes_only_labelled_leftovers(embedded, tmp_path):
    from kubernetes import client as k8s

    core, sched = embedded.client.core, embedded.client.scheduling
    labels = run_labels("killed-run")
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="gpuproof-killed-run", labels=labels)))
    sched.create_priority_class(k8s.V1PriorityClass(metadata=k8s.V1ObjectMeta(name="gpuproof-killed-run-low",
                                                                              labels=labels), value=-100))
    # look-alikes without our run label: never touched
    core.create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name="gpuproof-not-ours")))
    try:
        dry = subprocess.run([sys.executable, "-m", "gpuproof.cli", "clean", f"--kubeconfig={embedded.kubeconfig}",
                              "--dry-run"], capture_output=True, text=True, timeout=120)
        assert dry.returncode == 0 and "run killed-run" in dry.stdout and "nothing deleted" in dry.stdout
        assert "killed-run" in embedded.client.leftover_runs()
        done = subprocess.run([sys.executable, "-m", "gpuproof.cli", "clean", f"--kubeconfig={embedded.kubeconfig}"],
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stderr
        assert "killed-run" not in embedded.client.leftover_runs()
        assert core.read_namespace("gpuproof-not-ours").status.phase == "Active"
        assert RUN_LABEL not in (core.read_namespace("gpuproof-not-ours").metadata.labels or {})
    finally:
        core.delete_namespace("gpuproof-not-ours")


def test_unreachable_cluster_is_a_clear_error(tmp_path):
    kc = tmp_path / "kubeconfig"
    kc.write_text(textwrap.dedent("""\
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
        users: [{name: u, user: {token: x}}]
        contexts: [{name: c, context: {cluster: c, user: u}}]
        current-context: c
        """))
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", "clean", f"--kubeconfig={kc}"],
                          capture_output=True, text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 2
    assert "cannot reach cluster c at https://127.0.0.1:9" in proc.stderr
    assert "Traceback" not in proc.stderr

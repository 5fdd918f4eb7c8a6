"""The monitoring suite's cluster path for real (issue #39): on a private embedded cluster with a kubelet GPU node, a
DaemonSet named like the GPU operator's exporter runs ``python -m http.server`` serving a recorded exporter output
(``tests/data/dcgm/kops-l4-gpu-operator-idle.prom``, verbatim, from a ConfigMap), and ``suites/test_monitoring.py``
runs as pytest runs it: it finds the DaemonSet, sees its pod Ready on the node, reads ``/metrics`` through the API
server's pod proxy, and judges it. No exporter is written: real software serves recorded data.

The recorded output is an L4 node's (one GPU, host ``i-030791dc5a37cd257``); the kubelet node has one GPU of its own
under another name, so every check passes but the host label, which fails naming the node and the recorded host.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuproof.sim import kubelet

NEEDS = kubelet.missing()
REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "dcgm"
RECORDED = "kops-l4-gpu-operator-idle.prom"
RECORDED_HOST = "i-030791dc5a37cd257"
FLEET = {"name": "mon", "pools": [{"name": "a100", "count": 1, "backend": "kubelet",
                                   "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 1}}]}
NAMESPACE = "gpu-operator"


def serving_daemonset(image) -> dict:
    """The GPU operator's exporter name and labels, with http.server for the exporter: the recorded output at
    /metrics, port 9400, Ready once it answers there. On the node's network, as the GPU operator can run its
    exporter (``hostNetwork``): the embedded cluster's API server, a process of this host, reaches its kubelet
    nodes' addresses but has no route into their pod networks."""
    volumes, mounts = image.volumes()
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-dcgm-exporter", "namespace": NAMESPACE, "labels": {"app": "nvidia-dcgm-exporter"}},
        "spec": {"selector": {"matchLabels": {"app": "nvidia-dcgm-exporter"}}, "template": {
            "metadata": {"labels": {"app": "nvidia-dcgm-exporter"}},
            "spec": {"tolerations": [{"operator": "Exists"}], "automountServiceAccountToken": False,
                     "hostNetwork": True,       # the pod's IP is its node's, which the API server reaches
                     "volumes": [*volumes, {"name": "recorded", "configMap": {"name": "recorded-output"}}],
                     "containers": [{
                         "name": "nvidia-dcgm-exporter", "image": image.name, "imagePullPolicy": "Never",
                         "command": ["python", "-m", "http.server", "9400", "--directory", "/recorded"],
                         "env": [{"name": k, "value": v} for k, v in image.env],
                         "ports": [{"containerPort": 9400, "name": "metrics"}],
                         "readinessProbe": {"httpGet": {"path": "/metrics", "port": 9400}, "periodSeconds": 1},
                         "volumeMounts": [*mounts, {"name": "recorded", "mountPath": "/recorded"}]}]}}}}


@pytest.mark.kubelet
@pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
def test_the_suite_reads_a_served_recorded_output_through_the_pod_proxy(tmp_path):
    from conftest import private_cluster
    from gpuproof.cluster.api import watch_until

    with private_cluster(FLEET, tmp_path / "s", "mon.yaml") as c:
        client, image = c.client, kubelet.lent_image(c.sim.dir)
        node, = [n.metadata.name for n in client.core.list_node().items
                 if "nvidia.com/gpu.product" in (n.metadata.labels or {})]
        client.core.create_namespace({"metadata": {"name": NAMESPACE}})
        client.core.create_namespaced_config_map(NAMESPACE, {"metadata": {"name": "recorded-output"},
                                                             "data": {"metrics": (DATA / RECORDED).read_text()}})
        client.apps.create_namespaced_daemon_set(NAMESPACE, serving_daemonset(image))
        watch_until(client.core.list_namespaced_pod,
                    lambda pods: any(p.status.phase == "Running" and any(
                        x.type == "Ready" and x.status == "True" for x in p.status.conditions or [])
                        for p in pods.values()),
                    180, "the serving DaemonSet's pod to be Ready on the kubelet node", namespace=NAMESPACE)
        cmd = [sys.executable, "-m", "pytest", "suites/test_monitoring.py", f"--kubeconfig={c.kubeconfig}",
               f"--report-dir={tmp_path}", "--run-id=mon", "-p", "no:cacheprovider", "-q",
               "-o", "addopts=-ra --strict-markers", f"--rootdir={REPO}"]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    records = [json.loads(line) for line in (tmp_path / "mon" / "checks.jsonl").read_text().splitlines()]
    verdicts = {(r["check"], r["verdict"]) for r in records}
    assert proc.returncode == 1, out
    assert {("dcgm-exporter-ready", "pass"), ("dcgm-metrics-read", "pass"), ("dcgm-metrics-parse", "pass"),
            ("dcgm-gpu-utilization", "pass"), ("dcgm-gpu-memory", "pass")} <= verdicts, json.dumps(records, indent=1)
    host, work = sorted((r for r in records if r["verdict"] == "fail"), key=lambda r: r["check"])
    assert (host["check"], host["target"], host["actual"]) == ("dcgm-host-label", node, repr(RECORDED_HOST)), host
    assert host["message"] in out
    # the work check ran its pod on the node and read the exporter before and while it ran; a served file never
    # carries the pod, so it fails naming the node and the GPU it saw
    assert (work["check"], work["target"]) == ("dcgm-pod-attribution", node), work
    assert work["actual"].startswith("0 GPUs: GPU 0 (GPU-c2f76b33-7953-256e-8f33-1343419b1a1c) no pod"), work
    assert ("dcgm-metrics-read", "pass") in verdicts
    version, = [r for r in records if r["check"] == "dcgm-exporter-version"]
    assert "names classic; host label Hostname" in version["actual"] and "driver 580.105.08" in version["actual"]

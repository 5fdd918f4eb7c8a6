"""The fan-out's edges on real kubelet nodes (issue #36): the embedded cluster reached through its kubeconfig runs its
pods in the image its kubelet nodes lend (as ``--fleet`` does, ``gpuproof plan`` included), and an image the kubelet
cannot pull ends the wait after a bounded number of its tries, naming the image, the node, the kubelet's reason and
how to point gpuproof at a mirror."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from conftest import private_cluster

from gpuproof.sim import kubelet

NEEDS = kubelet.missing()
pytestmark = [pytest.mark.kubelet, pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")]

FLEET = {"name": "edges", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]}, "pools": [
    {"name": "a100", "count": 2, "backend": "kubelet", "instanceType": "a2-highgpu-2g",
     "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}}]}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A private embedded cluster of two kubelet GPU nodes, as `gpuproof sim up` leaves one: (its folder, client)."""
    with private_cluster(FLEET, tmp_path_factory.mktemp("edges") / "s", "edges.yaml") as c:
        yield c.sim, c.client


def gpuproof(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuproof", *args], capture_output=True, text=True, timeout=timeout)


def test_the_embedded_cluster_through_its_kubeconfig_lends_its_image(cluster, tmp_path):
    sim, _ = cluster
    lent = sim.workload_image()
    assert lent is not None and lent.pull_policy == "Never"
    plan = gpuproof("plan", "--kubeconfig", str(sim.kubeconfig), "-k", "health", "--format", "json", timeout=300)
    assert plan.returncode == 0, plan.stderr[-3000:]
    images = {o["image"] for c in json.loads(plan.stdout)["checks"] for o in c["creates"] if o.get("image")}
    assert images == {lent.name}, images
    reports = tmp_path / "reports"
    proc = gpuproof("run", "--kubeconfig", str(sim.kubeconfig), "--report-dir", str(reports), "-k", "health",
                    "--", "--no-lease")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "health: 2 nodes at once" in out and "2 passed" in out, out[-3000:]


def test_an_image_that_cannot_be_pulled_ends_the_wait_naming_image_node_and_mirror(cluster):
    from gpuproof.cluster.api import Run
    from gpuproof.errors import WaitTimeout
    from gpuproof.plugin.checks import TOLERATE_ALL, pod

    _, client = cluster
    run = Run(client, f"pull-{int(time.time())}")
    run.create()
    image = "registry.gpuproof.invalid/none/pytorch:0.0"
    try:
        manifest = pod("no-image", node="a100-1", tolerations=TOLERATE_ALL, image=image)
        manifest["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
        run.apply(manifest)
        t0 = time.monotonic()
        with pytest.raises(WaitTimeout) as err:
            run.wait_pod_done("no-image", timeout=600)
        took = time.monotonic() - t0
    finally:
        run.cleanup(wait=False)
    text = str(err.value)
    for words in (image, "a100-1", "failed to pull 3 times", "GPUPROOF_IMAGE=<mirror>/<image>"):
        assert words in text, text
    assert "ErrImagePull" in text or "ImagePullBackOff" in text, text
    assert took < 300, f"the kubelet's three tries took {took:.0f}s"     # its back-off: 10 s, 20 s, 40 s ...

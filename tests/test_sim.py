"""The embedded cluster: a real control plane whose scheduler places pods on kwok GPU nodes."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from gpuproof.errors import ControlPlaneError
from gpuproof.sim.fleet_file import load_fleet
from gpuproof.sim.controlplane import PORTS, SimCluster, find_free_base

pytestmark = pytest.mark.sim

TOLERATE_GPU = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def pod(name: str, limits: dict | None = None, tolerate: bool = True, **spec) -> dict:
    container = {"name": "main", "image": "registry.invalid/none:1"}
    if limits:
        container["resources"] = {"limits": limits}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], **({"tolerations": TOLERATE_GPU} if tolerate else {}), **spec}}


def test_gpu_pod_is_scheduled_on_a_gpu_node_and_runs(run_in):
    run_in.apply(pod("one-gpu", {"nvidia.com/gpu": "1"}))
    p = run_in.wait_running("one-gpu", timeout=60)
    assert p.spec.node_name in {"a100-0", "a100-1", "a100-mig-single-0", "l4-shared-0"}


def test_pod_asking_too_many_gpus_stays_pending_with_insufficient_event(run_in):
    most = max(int(n["status"]["capacity"].get("nvidia.com/gpu", 0)) for n in load_fleet("mixed").node_objects())
    run_in.apply(pod("too-many", {"nvidia.com/gpu": str(most + 1)}))
    ev = run_in.wait_event("too-many", "FailedScheduling", timeout=60)
    assert "Insufficient nvidia.com/gpu" in ev.message
    assert run_in.pod("too-many").status.phase == "Pending"
    assert run_in.pod("too-many").spec.node_name is None


def test_mig_pod_lands_only_on_the_mig_node(run_in):
    for i in range(3):
        run_in.apply(pod(f"mig-{i}", {"nvidia.com/mig-1g.10gb": "1"}))
    for i in range(3):
        assert run_in.wait_running(f"mig-{i}").spec.node_name == "h100-mig-0"


def test_untolerating_pod_never_lands_on_tainted_gpu_nodes(run_in):
    run_in.apply(pod("plain", tolerate=False))
    assert run_in.wait_running("plain").spec.node_name == "cpu-0"


def test_job_pods_complete(run_in):
    run_in.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job"},
                  "spec": {"backoffLimit": 0, "template": {"spec": {
                      "restartPolicy": "Never", "tolerations": TOLERATE_GPU,
                      "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})
    done = run_in.wait_pods(lambda c: [p for p in c.values() if p.status.phase == "Succeeded"] or None,
                            timeout=60, what="the Job's pod to succeed")
    assert done[0].metadata.labels["gpuproof.dev/run"] == run_in.run_id


@pytest.mark.parametrize("pool", ["a100", "h100-mig", "a100-mig-single", "l4-shared", "cpu"])
def test_api_nodes_carry_exactly_the_fleet_advertisement(embedded, pool):
    """What the API serves (after kwok initialised the nodes) is exactly what the fleet asked for."""
    fleet = load_fleet("mixed")
    names = fleet.pool(pool).node_names()
    expected = {n["metadata"]["name"]: n for n in fleet.node_objects() if n["metadata"]["name"] in names}
    for name, want in expected.items():
        got = embedded.client.api.sanitize_for_serialization(embedded.client.core.read_node(name))
        assert got["status"]["capacity"] == want["status"]["capacity"]
        assert got["status"]["allocatable"] == want["status"]["allocatable"]
        # GFD stamps the time it ran: present on both, equal only when both runs fell in one second
        assert ("nvidia.com/gfd.timestamp" in got["metadata"]["labels"]) == (pool != "cpu")
        assert _stable(got["metadata"]["labels"]) == _stable(want["metadata"]["labels"])
        assert got["spec"].get("taints", []) == want["spec"]["taints"]


def _stable(labels: dict) -> dict:
    return {k: v for k, v in labels.items() if k != "nvidia.com/gfd.timestamp"}


def _values(resources: dict) -> dict:
    from kubernetes.utils import parse_quantity

    return {k: parse_quantity(v) for k, v in resources.items()}


def test_up_twice_is_harmless(embedded):
    before = embedded.sim.load_state().pids
    embedded.sim.up(load_fleet("mixed"))
    assert embedded.sim.load_state().pids == before
    assert embedded.sim.status()["running"]


def test_port_in_use_is_a_clear_error(tmp_path):
    base = find_free_base()
    with socket.socket() as s:
        s.bind(("127.0.0.1", base + PORTS["etcd"]))
        s.listen()
        with pytest.raises(ControlPlaneError, match=rf"port {base + 1} \(etcd\) on 127.0.0.1 is in use"):
            SimCluster(tmp_path / "s", base_port=base).up(load_fleet("minimal"))
    assert not (tmp_path / "s" / "state.json").exists()


def test_dead_leftover_is_cleaned_up_and_restarted(tmp_path):
    sim = SimCluster(tmp_path / "s", base_port=find_free_base())
    sim.up(load_fleet("minimal"))
    try:
        import os
        import signal

        import time

        st = sim.load_state()
        os.kill(st.pids["kube-apiserver"], signal.SIGKILL)
        deadline = time.monotonic() + 30          # the kill is asynchronous: wait until it shows
        while sim.status()["components"]["kube-apiserver"] != "dead" and time.monotonic() < deadline:
            time.sleep(0.05)
        status = sim.status()
        assert not status["running"] and status["components"]["kube-apiserver"] == "dead"
        sim.up(load_fleet("minimal"))
        assert sim.status()["running"]
        assert sim.load_state().pids["kube-apiserver"] != st.pids["kube-apiserver"]
    finally:
        sim.down()
    assert not (tmp_path / "s").exists()


def test_malformed_fleet_starts_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - name: a\n    gpu: {product: NVIDIA-L4, count: lots}\n")
    state = tmp_path / "state"
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", "sim", "up", "--fleet", str(bad),
                           "--state-dir", str(state), "--port", "auto"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "pools[0].gpu.count: must be a whole number" in proc.stderr
    assert str(bad) in proc.stderr
    assert not state.exists()


def test_private_cluster_dies_with_its_owner_even_on_sigkill(tmp_path):
    """A test session's private cluster must not outlive it, even when the session is SIGKILLed."""
    import json
    import os
    import signal
    import time

    script = tmp_path / "owner.py"
    script.write_text(
        "import json, sys, threading\n"
        "from gpuproof.sim.controlplane import SimCluster, find_free_base\n"
        f"sim = SimCluster({str(tmp_path / 's')!r}, base_port=find_free_base(), private=True)\n"
        "sim.up(None)\n"
        "print(json.dumps(sim.load_state().pids), flush=True)\n"
        "threading.Event().wait()\n")
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    pids = json.loads(owner.stdout.readline())
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30
    alive = set(pids.values())
    while alive and time.monotonic() < deadline:      # the kernel delivers SIGKILL at once; allow for reaping
        alive = {p for p in alive if os.path.exists(f"/proc/{p}") and
                 open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"}
        time.sleep(0.1)
    assert alive == set(), f"control-plane processes outlived their SIGKILLed owner: {alive}"

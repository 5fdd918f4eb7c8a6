"""Kubelet nodes (``backend: kubelet``, issue #28): real kubelets and containerd on the embedded cluster,
with NVIDIA's device plugin and GFD as DaemonSets over NVIDIA's mock NVML and NFD's master labelling the
nodes; a pod sees only the GPUs it was allocated; and nothing left on the host after ``down`` or after
the owner is SIGKILLed."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuproof.errors import FleetError
from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim import kubelet

NEEDS = kubelet.missing()
needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS)

FLEET = {"name": "kl", "pools": [
    {"name": "shared", "count": 1, "backend": "kubelet", "instanceType": "g6.4xlarge",
     "gpu": {"product": "NVIDIA-L4", "count": 1}, "taints": ["nvidia.com/gpu=present:NoSchedule"],
     "timeSlicing": {"replicas": 4, "failRequestsGreaterThanOne": True}},
    {"name": "a100", "count": 1, "backend": "kubelet", "instanceType": "a2-highgpu-2g",
     "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}, "taints": ["nvidia.com/gpu=present:NoSchedule"]},
    {"name": "cpu", "count": 1}]}


def host_leftovers(cluster: str) -> list[str]:
    """What a cluster's kubelet nodes could leave on the host, by its id: links, netns, rules, cgroups, mounts."""
    found = [f"link {p.name}" for p in Path("/sys/class/net").iterdir() if p.name.startswith(f"gpk{cluster}")]
    found += [f"netns {p.name}" for p in Path("/run/netns").glob(f"gpk{cluster}-*")]
    rules = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True).stdout
    found += [f"iptables {r}" for r in rules.splitlines() if f"gpuproof-{cluster}" in r]
    found += [f"cgroup {p}" for p in Path("/sys/fs/cgroup").glob(f"*/gpuproof-{cluster}")]
    found += [f"mount {m.split()[4]}" for m in Path("/proc/self/mountinfo").read_text().splitlines()
              if f"gpk{cluster}" in m or "/kubelet/" in m.split()[4]]
    return found


def test_kubelet_pool_refusals():
    for extra, says in (({"mig": {"strategy": "mixed", "profiles": {"1g.5gb": 7}}}, "MIG pools stay on kwok"),
                        ({"offer": "both"}, "one way"),
                        ({"labelScheme": "gke", "instanceType": "a2-highgpu-1g"}, "labelScheme gfd")):
        pool = {"name": "p", "backend": "kubelet", "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 1}, **extra}
        with pytest.raises(FleetError, match=says):
            parse_fleet({"name": "x", "pools": [pool]}, source="x.yaml")
    with pytest.raises(FleetError, match="backend: 'vm' is not one of kwok, kubelet"):
        parse_fleet({"name": "x", "pools": [{"name": "p", "backend": "vm"}]}, source="x.yaml")


def test_kubelet_pools_get_no_rendered_nodes():
    fleet = parse_fleet({"name": "x", "pools": [{"name": "k", "count": 2, "backend": "kubelet"},
                                                {"name": "cpu", "count": 1}]}, source="x.yaml")
    assert [n["metadata"]["name"] for n in fleet.node_objects()] == ["cpu-0"]
    assert [(n.name, n.index) for n, _ in kubelet.fleet_nodes(fleet)] == [("k-0", 0), ("k-1", 1)]


@pytest.mark.sim
def test_without_root_kubelet_pools_are_left_out_in_one_line(tmp_path, monkeypatch):
    from gpuproof.cluster.api import connect
    from gpuproof.sim.controlplane import SimCluster, find_free_base

    monkeypatch.setattr(kubelet, "missing", lambda: "kubelet nodes need root (network and mount namespaces)")
    lines: list[str] = []
    sim = SimCluster(tmp_path / "s", base_port=find_free_base(), private=True)
    try:
        sim.up(parse_fleet({"name": "k", "pools": [{"name": "k", "backend": "kubelet"}, {"name": "cpu"}]},
                           source="k.yaml"), progress=lines.append)
        nodes = [n.metadata.name for n in connect(kubeconfig=str(sim.kubeconfig)).core.list_node().items]
    finally:
        sim.down()
    assert nodes == ["cpu-0"]
    assert [ln for ln in lines if "left out" in ln] == ["kubelet pools k left out: kubelet nodes need root (network "
                                                         "and mount namespaces)"]


@pytest.mark.sim
@pytest.mark.kubelet  # tier: a private cluster with kubelet nodes
@needs_kubelet
def test_nvidia_pods_advertise_label_and_refuse_two_shared_gpus(tmp_path):
    from gpuproof.cluster.api import connect, watch_until
    from gpuproof.sim.controlplane import SimCluster, find_free_base

    sim = SimCluster(tmp_path / "s", base_port=find_free_base(), private=True)
    try:
        sim.up(parse_fleet(FLEET, source="kl.yaml"))
        cluster = kubelet._load(sim.dir).cluster
        client = connect(kubeconfig=str(sim.kubeconfig))
        node = client.core.read_node("shared-0")
        assert node.status.allocatable.get("nvidia.com/gpu") == "4", \
            f"shared-0: expected nvidia.com/gpu 4 (1 GPU x 4 replicas), got {node.status.allocatable}"
        labels = node.metadata.labels
        assert labels.get("node.kubernetes.io/instance-type") == "g6.4xlarge"
        gfd = {k: labels.get(k) for k in ("nvidia.com/gpu.product", "nvidia.com/gpu.replicas",
                                           "nvidia.com/gpu.sharing-strategy", "nvidia.com/gpu.machine")}
        assert gfd == {"nvidia.com/gpu.product": "NVIDIA-L4-SHARED", "nvidia.com/gpu.replicas": "4",
                       "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.machine": "g6.4xlarge"}, \
            f"shared-0: GFD's labels, got {gfd}"
        # written by NFD's master from GFD's NodeFeature object: it lists every label it owns
        owned = set(node.metadata.annotations.get("nfd.node.kubernetes.io/feature-labels", "").split(","))
        nvidia = {k for k in labels if k.startswith("nvidia.com/")}
        assert nvidia <= owned, \
            f"shared-0: nvidia.com labels not from NFD: {sorted(labels)} vs {sorted(owned)}"
        plugin = [p for p in client.core.list_namespaced_pod(kubelet.PLUGIN_NAMESPACE).items
                  if p.spec.node_name == "shared-0"]
        assert sorted(p.status.phase for p in plugin) == ["Running", "Running"], "device plugin and GFD pods"
        image = plugin[0].spec.containers[0].image
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "two"}, "spec": {
            "nodeName": "shared-0", "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": "gpuproof.local/pause:3.10", "imagePullPolicy": "Never",
                            "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}
        client.core.create_namespaced_pod("default", pod)
        watch_until(client.core.list_namespaced_pod, lambda c: "two" in c and c["two"].status.phase == "Failed",
                    60, "the request for 2 shared GPUs to be refused", namespace="default")
        status = client.core.read_namespaced_pod("two", "default").status
        assert status.reason == "UnexpectedAdmissionError", status
        assert "maximum request size for shared resources is 1; found 2" in status.message, status.message
        # a pod allocated 1 of a100-0's 2 GPUs: the device plugin's device spec gives it only /dev/nvidia<N>, so
        # NVIDIA's mock NVML shows it one GPU; GFD one-shot in that pod says how many it sees
        one = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "one"}, "spec": {
            "nodeName": "a100-0", "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}],
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                            "command": ["/usr/bin/gpu-feature-discovery", "--oneshot", "--no-timestamp",
                                        "--use-node-feature-api=false", "--output-file="],
                            "env": [{"name": "MOCK_NVML_CONFIG", "value": "/etc/gpuproof/mock-nvml.yaml"}],
                            "volumeMounts": [{"name": "n", "mountPath": "/etc/gpuproof", "readOnly": True}],
                            "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "volumes": [{"name": "n", "hostPath": {"path": "/var/lib/gpuproof"}}]}}
        client.core.create_namespaced_pod("default", one)
        watch_until(client.core.list_namespaced_pod,
                    lambda c: "one" in c and c["one"].status.phase in ("Succeeded", "Failed"), 90,
                    "GFD in a pod with 1 GPU to finish", namespace="default")
        log = client.core.read_namespaced_pod_log("one", "default", _preload_content=False).data.decode()
        assert "nvidia.com/gpu.count=1" in log.splitlines(), f"a100-0: expected gpu.count=1 in the pod, got:\n{log}"
        assert client.core.read_node("a100-0").metadata.labels.get("nvidia.com/gpu.count") == "2"
    finally:
        sim.down()
    assert host_leftovers(cluster) == []


@pytest.mark.sim
@pytest.mark.kubelet  # tier: a private cluster with kubelet nodes
@needs_kubelet
def test_sigkilled_owner_leaves_nothing(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(
        "import json, sys, threading\n"
        "from gpuproof.sim.fleet_file import parse_fleet\n"
        "from gpuproof.sim import kubelet\n"
        "from gpuproof.sim.controlplane import SimCluster, find_free_base\n"
        f"sim = SimCluster({str(tmp_path / 's')!r}, base_port=find_free_base(), private=True)\n"
        "sim.up(parse_fleet({'name': 'k', 'pools': [{'name': 'k', 'backend': 'kubelet'}]}, source='k.yaml'))\n"
        "print(json.dumps(kubelet._load(sim.dir).cluster), flush=True)\n"
        "threading.Event().wait()\n")
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    cluster = json.loads(owner.stdout.readline())
    assert host_leftovers(cluster), "the kubelet node made nothing on the host"
    owner.send_signal(signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 60
    left = host_leftovers(cluster)
    while left and time.monotonic() < deadline:       # the reaper cleans up once it sees the owner gone
        time.sleep(0.2)
        left = host_leftovers(cluster)
    assert left == [], f"left on the host after the owner was SIGKILLed: {left}"
    running = [p.name for p in Path("/proc").glob("[0-9]*") if _in_cgroup(p, f"gpuproof-{cluster}")]
    assert not running, f"processes still running in the removed cgroup gpuproof-{cluster}: {running}"


def _in_cgroup(proc: Path, name: str) -> bool:
    """Whether the process runs in that cgroup: an exited one its parent has not yet waited for (a zombie, state Z)
    still names the cgroup it left, though it runs nothing and the cgroup could be removed."""
    try:
        if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return False
        return name in (proc / "cgroup").read_text()
    except (OSError, IndexError):
        return False

"""NVIDIA's DRA driver on kubelet nodes (issue #28): its ``gpu-kubelet-plugin`` runs as the chart's DaemonSet,
registers with the node's kubelet, publishes the node's ResourceSlice over NVIDIA's mock NVML and prepares
claims as CDI specs, which the node's containerd 1.7 applies: a pod with a claim for one GPU gets exactly
that GPU's ``/dev/nvidia<N>``, and the mock shows it that GPU alone.

The NVML UUID seen from inside a claim's pod is the suite's ``dra-probe-uuid`` check
(``suites/test_dra.py::test_container_sees_exactly_its_devices``), which runs on the ``lab`` fleet's
``a100-dra`` node through the workloads image; here NVIDIA's GFD, one-shot in the claim's pod, says how
many GPUs the mock shows it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuproof.errors import FleetError
from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim import kubelet
from gpuproof.sim.kubelet import dra as kubelet_dra
from gpuproof.sim.kubelet import runtime as node_runtime
from gpuproof.sim.kubelet.runtime import NodeRuntime

NEEDS = kubelet.missing()
needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS)

NODE = "a100-dra-0"
PRODUCT = "NVIDIA A100-SXM4-40GB"
FLEET = {"name": "kd", "pools": [
    {"name": "a100-dra", "count": 1, "backend": "kubelet", "offer": "dra", "instanceType": "a2-highgpu-2g",
     "gpu": {"product": PRODUCT.replace(" ", "-"), "count": 2}, "taints": ["nvidia.com/gpu=present:NoSchedule"]}]}


def test_kubelet_pools_offer_dra_one_way():
    fleet = parse_fleet(FLEET, source="kd.yaml")
    (node, _), = kubelet.fleet_nodes(fleet)
    assert node.dra and node.labels[kubelet.DRA_NODE_LABEL] == "true"
    both = {**FLEET["pools"][0], "offer": "both"}
    with pytest.raises(FleetError, match="one way"):
        parse_fleet({"name": "x", "pools": [both]}, source="x.yaml")


def test_driver_root_and_cdi_runtime_as_the_chart_and_containerd_want_them():
    ds = kubelet_dra.daemonset("img")
    spec = ds["spec"]["template"]["spec"]
    (ctr,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    mounts = {m["mountPath"]: m for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    # the driver root on the node is where the node's /dev/nvidia<N> are: the CDI specs name those host paths
    assert env["NVIDIA_DRIVER_ROOT"] == kubelet.DEV_ROOT == volumes["driver-root"]
    assert mounts["/driver-root"]["mountPropagation"] == "HostToContainer"
    assert mounts[kubelet_dra.PLUGINS_DIR]["mountPropagation"] == "Bidirectional"
    assert env["CDI_ROOT"] == kubelet_dra.CDI_ROOT == volumes["cdi"]
    assert volumes["plugins-registry"] == "/var/lib/kubelet/plugins_registry"
    runtime = NodeRuntime(Path("/c"), Path("/r"), Path("/p"))
    config = kubelet.containerd_config(Path("/cni"), "pause", runtime, **kubelet_dra.containerd_settings())
    assert 'enable_cdi = true\n  cdi_spec_dirs = ["/var/run/cdi"]' in config
    assert 'runtime_path = "/c/containerd-shim-runc-v2"' in config
    assert 'bin_dir = "/p"' in config
    assert "enable_cdi" not in kubelet.containerd_config(Path("/cni"), "pause", runtime)


# ---------------------------------------------------------------------------- on a cluster


@pytest.fixture(scope="module")
def dra_cluster(tmp_path_factory):
    from conftest import private_cluster

    with private_cluster(FLEET, tmp_path_factory.mktemp("kd") / "s", "kd.yaml") as c:
        yield c.sim, c.client


def _node_dir(sim) -> Path:
    return kubelet.state_dir(sim.dir) / NODE


def _mock_devices(sim) -> list[dict]:
    """The GPUs of the node's mock NVML config: what NVIDIA's software there is told the node has."""
    return yaml.safe_load((_node_dir(sim) / "var-lib" / kubelet.NODE_FILES / "mock-nvml.yaml").read_text())["devices"]


def _slice_devices(client) -> list[dict]:
    from gpuproof.discovery.dra import GROUP, VERSION

    slices = client.custom.list_cluster_custom_object(GROUP, VERSION, "resourceslices",
                                                      field_selector=f"spec.nodeName={NODE}")["items"]
    return [d for s in slices for d in s["spec"]["devices"]]


def _container_devs(sim, pod: str, container: str) -> list[str]:
    """The ``/dev/nvidia*`` in a running container, read through the node's containerd (``ctr``, in the node's
    mount namespace) and the container's root in ``/proc``."""
    pid = json.loads((kubelet.state_dir(sim.dir) / "state.json").read_text())["pids"][f"{NODE}/containerd"]
    ctr = ["nsenter", f"--mount=/proc/{pid}/ns/mnt", str(node_runtime.locate().ctr),
           "--address", "/run/containerd/containerd.sock",
           "-n", "k8s.io"]
    run = lambda *a: subprocess.run([*ctr, *a], capture_output=True, text=True, check=True).stdout  # noqa: E731
    cid = run("containers", "ls", "-q", f'labels."io.kubernetes.pod.name"=={pod},'
                                        f'labels."io.kubernetes.container.name"=={container}').split()
    assert len(cid) == 1, f"{NODE}: expected one container {container} of pod {pod} in containerd, got {cid}"
    task = {line.split()[0]: line.split()[1] for line in run("tasks", "ls").splitlines()[1:]}
    return sorted(d for d in Path(f"/proc/{task[cid[0]]}/root/dev").iterdir() if d.name.startswith("nvidia"))


@pytest.mark.sim
@needs_kubelet
def test_the_driver_pod_publishes_the_nodes_slice(dra_cluster):
    from gpuproof.vocab import SLICES_BY

    sim, client = dra_cluster
    pods = client.core.list_namespaced_pod(kubelet_dra.NAMESPACE, field_selector=f"spec.nodeName={NODE}").items
    assert [(p.metadata.labels.get(f"{kubelet_dra.NAME}-component"), p.status.phase) for p in pods] == \
        [("kubelet-plugin", "Running")], f"{NODE}: expected the driver's kubelet-plugin pod Running"
    # it registered with the node's kubelet (the kubelet's plugin watcher found its socket)
    registry = _node_dir(sim) / "var-lib" / "kubelet" / "plugins_registry"
    assert sorted(p.name for p in registry.iterdir()) == ["gpu.nvidia.com-reg.sock"], f"{NODE}: {registry}"
    devices = _slice_devices(client)
    assert sorted(d["name"] for d in devices) == ["gpu-0", "gpu-1"], f"{NODE}: {devices}"
    assert {d["attributes"]["productName"]["string"] for d in devices} == {PRODUCT}
    assert sorted(d["attributes"]["uuid"]["string"] for d in devices) == sorted(g["uuid"] for g in _mock_devices(sim))
    by = client.core.read_node(NODE).metadata.annotations[SLICES_BY]
    assert f"DaemonSet {kubelet_dra.NAMESPACE}/{kubelet_dra.DAEMONSET}" in by, by


@pytest.mark.sim
@needs_kubelet
def test_a_claim_for_one_gpu_gets_that_gpu_only(dra_cluster):
    from gpuproof.discovery import dra
    from gpuproof.cluster.api import watch_until
    from gpuproof.sim import images, nvidia

    sim, client = dra_cluster
    client.custom.create_namespaced_custom_object(dra.GROUP, dra.VERSION, "default", "resourceclaimtemplates",
                                                  dra.claim_template("one", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    image = images.nvidia_image(nvidia.locate(build_missing=False))[1]
    # GFD one-shot (NVIDIA's own reading of NVML) in the pod: how many GPUs the mock shows it
    gfd, volumes = kubelet.with_node_files({
        "name": "gfd", "image": image, "imagePullPolicy": "Never",
        "command": ["/usr/bin/gpu-feature-discovery", "--oneshot", "--no-timestamp", "--use-node-feature-api=false",
                    "--output-file="]}, [])
    pod = dra.use_claims({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "one"}, "spec": {
        "restartPolicy": "Never", "tolerations": [{"operator": "Exists"}], "volumes": volumes,
        "initContainers": [gfd], "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                                                 "imagePullPolicy": "Never"}]}}, template="one")
    for c in pod["spec"]["initContainers"]:         # use_claims gives the claim to the main containers
        c.setdefault("resources", {})["claims"] = pod["spec"]["containers"][0]["resources"]["claims"]
    client.core.create_namespaced_pod("default", pod)
    p = watch_until(client.core.list_namespaced_pod,
                    lambda c: "one" in c and c["one"].status.phase in ("Running", "Failed") and c["one"], 120,
                    "a pod with a claim for one GPU to run", namespace="default",
                    describe=lambda c: f"{c['one'].status if 'one' in c else 'no pod'}; events: " + "; ".join(
                        e.message or "" for e in client.core.list_namespaced_event("default").items))
    assert p.status.phase == "Running" and p.spec.node_name == NODE, f"{NODE}: {p.status}"
    claim, = [c for c in client.custom.list_namespaced_custom_object(dra.GROUP, dra.VERSION, "default",
                                                                      "resourceclaims")["items"]]
    (_, _, device), = dra.allocated(claim)
    uuid = {d["name"]: d["attributes"]["uuid"]["string"] for d in _slice_devices(client)}[device]
    minor = {g["uuid"]: g["minor_number"] for g in _mock_devices(sim)}[uuid]
    seen = [d.name for d in _container_devs(sim, "one", "c")]
    assert seen == [f"nvidia{minor}"], f"{NODE}: claim allocated {device} ({uuid}, minor {minor}); " \
                                       f"expected /dev/nvidia{minor} alone in the container, got {seen}"
    log = client.core.read_namespaced_pod_log("one", "default", container="gfd", _preload_content=False).data.decode()
    assert "nvidia.com/gpu.count=1" in log.splitlines(), f"{NODE}: expected gpu.count=1 in the claim's pod:\n{log}"

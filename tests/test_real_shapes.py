"""GPU nodes shaped as real clusters publish them get the right verdict (issue 22).

The shapes (``tests/shapes/healthy/``) are Node objects and ResourceSlices as GKE, EKS, OpenShift,
MicroK8s and kubeadm-on-cloud clusters show them: older GPU Feature Discovery releases (versions as
``cuda.driver.*``, no ``gpu.replicas`` or ``gpu.sharing-strategy``, ``gpu.memory`` in bytes), extended
resources the kubelet keeps at 0 after a MIG or sharing change, MIG devices advertised without MIG
labels, components the GPU operator does not deploy (``gpu.deploy.<component>=""``), and NVIDIA's DRA
driver after a restart (an older generation of its pool still published).

- Discovery reads each shape right (no cluster needed).
- On the embedded cluster, a node of every healthy shape passes the whole suite; each fault (a health
  taint on one node of a pool, a torn DRA pool, DRA devices that cannot be what the instance type holds,
  a MIG resource left at 0 while its label counts 7, a GFD label missing under both its names) fails
  the check it names, with node, expected and actual.
- On a cluster with a real (not kwok) GPU node among kwok ones, the checks that need real GPUs run on
  the real node only, and a pod its kubelet never takes up ends the check within a minute, saying so;
  the nodes left out are listed in coverage.jsonl and in the summary's coverage table.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path

import pytest
import yaml

from gpuproof.discovery import dra
from gpuproof.sim import slices as sim_slices
from gpuproof.discovery.nodes import KWOK_ANNOTATION, discover
from gpuproof.plugin.checks import one_device

SHAPES = Path(__file__).parent / "shapes" / "healthy"
GKE_GFD_06 = "gke-a100-gfd-v0.6"
MICROK8S_GFD_04 = "microk8s-v100-gfd-v0.4"
KUBEADM_LEFTOVER = "kubeadm-h100-timesliced-mig-leftover"
OPENSHIFT_RENAMED = "openshift-a100-renamed-sharing"
MICROK8S_MIG = "microk8s-a100-mig-unlabelled"
EKS_DRA = "eks-p5-dra-driver-restarted"
HEALTHY = (GKE_GFD_06, MICROK8S_GFD_04, KUBEADM_LEFTOVER, OPENSHIFT_RENAMED, MICROK8S_MIG, EKS_DRA)


def shape(name: str) -> tuple[dict, list[dict]]:
    """(Node, its ResourceSlices) of a shape file."""
    node, *slices = yaml.safe_load_all((SHAPES / f"{name}.yaml").read_text())
    return node, slices


def variant(name: str, new_name: str, *, labels: dict | None = None, drop: tuple = (), taints: tuple = (),
            capacity: dict | None = None, pool_label: str | None = None, devices=None,
            slice_count: int | None = None) -> tuple[dict, list[dict]]:
    """A shape under another node name, with a change: labels set or dropped, taints added, capacity
    (and allocatable) set, the pool label changed, ``devices(list) -> list`` applied to its current slice
    (the older generations dropped), or its pool declared to have ``slice_count`` slices."""
    node, slices = copy.deepcopy(shape(name))
    old = node["metadata"]["name"]
    node["metadata"]["name"] = new_name
    lab = node["metadata"]["labels"]
    lab["kubernetes.io/hostname"] = new_name
    lab.update(labels or {})
    for key in drop:
        lab.pop(key, None)
    if pool_label:
        lab[next(k for k in ("eks.amazonaws.com/nodegroup", "cloud.google.com/gke-nodepool") if k in lab)] = pool_label
    node["spec"].setdefault("taints", []).extend(taints)
    for field in ("capacity", "allocatable"):
        node["status"][field].update(capacity or {})
    if devices is not None or slice_count is not None:
        slices = dra.current(slices)
    for s in slices:
        s["metadata"]["name"] = s["metadata"]["name"].replace(old, new_name)
        s["spec"]["nodeName"] = s["spec"]["pool"]["name"] = new_name
        if devices is not None:
            s["spec"]["devices"] = devices(s["spec"]["devices"])
        if slice_count is not None:
            s["spec"]["pool"].update(resourceSliceCount=slice_count, generation=3)
    return node, slices


def found(*shapes) -> dict:
    nodes = [n for n, _ in shapes]
    d = discover(nodes, slices=[s for _, ss in shapes for s in ss])
    return {n.name: n for n in d.gpu_nodes} | {"": d}


# ------------------------------------------------------------------ discovery (no cluster)


def test_older_gfd_releases_are_read():
    by = found(shape(GKE_GFD_06), shape(MICROK8S_GFD_04))
    gke, v100 = by["gke-ml-a2-pool-1f3c0a9e-k2x7"], by["dgx-station-03"]
    assert (gke.scheme, gke.driver_version, gke.cuda_version) == ("gfd", "470.82.01", "11.4")
    assert gke.memory_in_bytes and gke.memory_mib == 40536           # 42505273344 bytes
    assert (v100.driver_version, v100.cuda_version, v100.memory_mib) == ("450.80.02", "11.0", 16160)
    assert (v100.replicas, v100.sharing_strategy, v100.time_sliced) == (1, "none", False)
    assert (gke.pool, v100.pool) == ("a2-pool", "Tesla-V100-SXM2-16GB")


def test_resources_left_at_zero_are_not_advertised():
    by = found(shape(KUBEADM_LEFTOVER), shape(OPENSHIFT_RENAMED))
    h100, a100 = by["gpu-worker-h100-2"], by["ip-10-0-141-17.us-east-2.compute.internal"]
    assert (h100.mig_strategy, h100.mig_resources, h100.gpu_resource) == ("none", {}, "nvidia.com/gpu")
    assert h100.advertised("nvidia.com/mig-1g.10gb") is None and h100.advertised("nvidia.com/gpu") == 16
    assert (a100.gpu_resource, a100.shared_renamed, a100.advertised("nvidia.com/gpu")) == \
        ("nvidia.com/gpu.shared", True, None)
    assert one_device(a100) == {"nvidia.com/gpu.shared": 1}


def test_mig_resources_without_mig_labels_make_a_mixed_node():
    node = found(shape(MICROK8S_MIG))["lab-a100-01"]
    assert "nvidia.com/mig.strategy" not in node.labels and node.mig_count_labels == {}
    assert (node.mig_strategy, node.mig_resources) == ("mixed", {"1g.5gb": 7})
    assert one_device(node) == {"nvidia.com/mig-1g.5gb": 1}      # not a whole GPU it cannot give


def test_a_dra_pool_is_read_at_its_newest_generation():
    node_obj, slices = shape(EKS_DRA)
    by = found((node_obj, slices))
    node, d = by[node_obj["metadata"]["name"]], by[""]
    assert (node.scheme, node.product, node.physical_count, node.instance.name) == \
        ("dra", "NVIDIA-H100-80GB-HBM3", 8, "p5.48xlarge")
    assert len(node.dra_devices) == 8 and {x.generation for x in node.dra_devices} == {2}
    assert dra.duplicates(d.dra_devices) == []
    (pool,) = d.dra_pools
    assert (pool.generation, pool.complete, pool.slices, pool.stale) == \
        (2, True, [slices[1]["metadata"]["name"]], [slices[0]["metadata"]["name"]])
    # and before it was read by generation: every device twice, by UUID and by name in its pool
    assert len(dra.duplicates(dra.devices_of(slices[:1]) + dra.devices_of(slices[1:]))) == 2 * 8


def test_a_torn_pool_is_incomplete():
    _, d = found(variant(EKS_DRA, "torn-0", slice_count=2)).popitem()
    (pool,) = d.dra_pools
    assert (pool.node, pool.generation, pool.slice_count, len(pool.slices), pool.complete) == \
        ("torn-0", 3, 2, 1, False)


# ------------------------------------------------------------------ on the embedded cluster

CPU_ONLY = {"name": "shapes", "pools": [{"name": "cpu", "count": 1}]}


@contextlib.contextmanager
def nodes_loaded(embedded, shapes, kwok: bool = True):
    """The shapes' Node objects (kwok runs them, unless ``kwok=False``: nobody runs them) and ResourceSlices
    in the embedded cluster, with NVIDIA's DeviceClasses when any slice is there; deleted after."""
    from gpuproof.sim import operator

    client = embedded.client
    nodes = []
    for node, _ in shapes:
        node = copy.deepcopy(node)
        node["metadata"]["labels"]["nvidia.com/gfd.timestamp"] = str(int(time.time()))   # GFD relabels often
        if kwok:
            node["metadata"].setdefault("annotations", {})[KWOK_ANNOTATION] = "fake"
        nodes.append(node)
        client.core.create_node(node)
    names = [n["metadata"]["name"] for n in nodes]
    try:
        if kwok:
            client.wait_nodes_ready(names, timeout=120)
            operator.apply(client, nodes, timeout=120)
        uids = {n.metadata.name: n.metadata.uid for n in client.core.list_node().items}
        slices = [s for _, ss in shapes for s in ss]
        if slices:
            for name in dra.CLASS_TYPES:
                with contextlib.suppress(Exception):       # already there from another fleet: the same
                    client.custom.create_cluster_custom_object(dra.GROUP, dra.VERSION, "deviceclasses",
                                                               sim_slices.device_class(name))
        for s in slices:
            s = copy.deepcopy(s)
            node = s["spec"]["nodeName"]
            s["metadata"]["labels"] = {dra.SIM_LABEL: "true"}          # the next fleet load removes them
            s["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node,
                                                 "uid": uids[node], "controller": True}]
            client.custom.create_cluster_custom_object(dra.GROUP, dra.VERSION, "resourceslices", s)
        yield names
    finally:
        for name in names:
            with contextlib.suppress(Exception):
                client.core.delete_node(name, grace_period_seconds=0)


def _passed(res) -> set[tuple[str, str]]:
    return {(c["check"], c["target"]) for c in res.checks if c["verdict"] == "pass"}


@pytest.mark.sim
def test_every_healthy_shape_passes_the_whole_suite(embedded, tmp_path):
    from gpuproof.report import write_all

    shapes = [shape(name) for name in HEALTHY]
    with embedded.fleet_loaded(CPU_ONLY), nodes_loaded(embedded, shapes):
        res = embedded.run_suite("suites", "-m", "not bench", report_dir=tmp_path, run_id="shapes", timeout=900)
    assert res.code == 0, res
    assert res.failed_checks() == [], res
    gke, v100, h100 = "gke-ml-a2-pool-1f3c0a9e-k2x7", "dgx-station-03", "gpu-worker-h100-2"
    ocp, mig = "ip-10-0-141-17.us-east-2.compute.internal", "lab-a100-01"
    eks = "ip-10-0-7-21.us-west-2.compute.internal"
    passed = _passed(res)
    must = {("label-well-formed", gke), ("label-well-formed", v100), ("memory-plausible", gke),
            ("pool-uniform", "pool/a2-pool"),
            ("capacity-matches-count", h100), ("shared-resource-name", h100),
            ("capacity-matches-count", ocp), ("shared-resource-name", ocp), ("shared-allocatable", ocp),
            ("operator-component-state", ocp), ("operator-pod-ready", ocp), ("mig-config-matches", ocp),
            ("mig-resources-present", mig), ("no-whole-gpus-under-mixed-mig", mig), ("mig-profile-known", mig),
            ("mig-count-plausible", mig), ("tolerating-gpu-pod-lands", mig),
            ("product-fits-instance", eks), ("count-fits-instance", eks), ("memory-plausible", eks),
            ("dra-pool-complete", eks), ("dra-unique", "cluster"), ("dra-attributes", eks),
            ("dra-cel-product", "selector/product"), ("dra-cel-memory", "selector/memory"),
            ("dra-cel-compute", "selector/compute"), ("dra-exhaust", eks), ("dra-freed-claim-reused", eks)}
    assert sorted(must - passed) == [], res
    skipped = [c for c in res.checks if c["verdict"] == "skip"]
    assert all(c["message"] for c in skipped), skipped                # every skip says why
    # the DRA-only node is left out of the device-plugin checks, by name, with the reason
    coverage = [json.loads(line) for line in (res.run_path / "coverage.jsonl").read_text().splitlines()]
    left_out = {(r["check"], r["node"]) for r in coverage if "only through DRA" in r["reason"]}
    assert {("test_gpu_capacity_matches_count_label", eks), ("test_tolerating_gpu_pod_lands", eks)} <= left_out
    write_all(res.run_path)
    summary = (res.run_path / "summary.md").read_text()
    assert "GPU nodes left out of some checks" in summary and f"| {eks} | gpu-dra | offers its GPUs only " \
        "through DRA" in summary, summary


def _fewer(n: int):
    return lambda devices: devices[:n]


def _a100s(devices):
    for d in devices:
        d["attributes"].update(productName={"string": "NVIDIA A100-SXM4-80GB"}, architecture={"string": "Ampere"},
                               cudaComputeCapability={"version": "8.0.0"})
        d["capacity"]["memory"] = {"value": "81920Mi"}
    return devices


def _memory(value: str):
    def change(devices):
        for d in devices:
            d["capacity"]["memory"] = {"value": value}
        return devices
    return change


HEALTH_TAINT = {"key": "nvidia.com/gpu-health", "value": "unhealthy", "effect": "NoExecute"}
FAULTS = {
    # a health system's taint on one node of a pool: its key begins like the GPU taint's, and it is not it
    "health-taint": ([variant(KUBEADM_LEFTOVER, "h100-pool-0"), variant(KUBEADM_LEFTOVER, "h100-pool-1",
                                                                        taints=(HEALTH_TAINT,))],
                     [("node-taints-expected", "h100-pool-1", "only the GPU taint and taints every node of pool "
                       "a3-highgpu-4g carries", "nvidia.com/gpu-health=unhealthy:NoExecute (on 1 of 2 nodes of the "
                       "pool)")]),
    # a pool whose resourceSliceCount slices are not all there at its generation
    "torn-pool": ([variant(EKS_DRA, "dra-torn", pool_label="dra-torn", devices=_fewer(4), slice_count=2)],
                  [("dra-pool-complete", "dra-torn", "2 slice(s) at generation 3 (resourceSliceCount)",
                    "1: dra-torn-gpu.nvidia.com-r4d9m")]),
    # DRA-only nodes get the plausibility checks GFD nodes get
    "dra-product-not-the-instance-type's": (
        [variant(EKS_DRA, "dra-a100", pool_label="dra-a100", devices=_a100s)],
        [("product-fits-instance", "dra-a100", "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB")]),
    "dra-gpu-missing": ([variant(EKS_DRA, "dra-seven", pool_label="dra-seven", devices=_fewer(7))],
                        [("count-fits-instance", "dra-seven", "8", "7")]),
    "dra-memory-implausible": ([variant(EKS_DRA, "dra-small", pool_label="dra-small", devices=_memory("40960Mi"))],
                               [("memory-plausible", "dra-small", "81559 MiB +-7% (NVIDIA-H100-80GB-HBM3)",
                                 "40960 MiB")]),
    # a MIG resource at 0 is not advertised: the label that counts 7 of them is then wrong
    "mig-resource-left-at-zero": (
        [variant(MICROK8S_MIG, "mig-zero", labels={"nvidia.com/mig.strategy": "mixed",
                                                  "nvidia.com/mig-1g.5gb.count": "7"},
                 capacity={"nvidia.com/mig-1g.5gb": "0"})],
        [("mig-capacity-matches-count", "mig-zero", "7", "0")]),
    # an older GFD's label missing under both of its names
    "gfd-driver-label-missing": (
        [variant(GKE_GFD_06, "gke-old-gfd", drop=("nvidia.com/cuda.driver.major",))],
        [("label-present", "gke-old-gfd", "nvidia.com/cuda.driver-version.major or nvidia.com/cuda.driver.major "
          "(a whole number)", "")]),
}


@pytest.mark.sim
def test_each_fault_fails_its_check_by_name(embedded, tmp_path):
    """All faults in one cluster, each on its own node, judged apart."""
    from test_suite_faults import assert_failed

    shapes = [s for nodes, _ in FAULTS.values() for s in nodes]
    with embedded.fleet_loaded(CPU_ONLY), nodes_loaded(embedded, shapes):
        res = embedded.run_suite("suites/test_nodes.py", "suites/test_plausibility.py", "suites/test_labels.py",
                                 "suites/test_mig.py", "suites/test_dra.py", "-k",
                                 "taints or test_plausibility or present or count_labels or pools_whole",
                                 report_dir=tmp_path, run_id="shape-faults", timeout=900)
    assert_failed(res, [e for _, expected in FAULTS.values() for e in expected])
    # and only those: every failed record is one of the faults' nodes
    faulty = {n["metadata"]["name"] for nodes, _ in FAULTS.values() for n, _ in nodes} - {"h100-pool-0"}
    assert {c["target"] for c in res.failed_checks()} <= faulty, res.failed_checks()


@pytest.mark.sim
@contextlib.contextmanager
def heartbeat(client, node: str, every: float = 5.0):
    """The node's Lease in kube-node-lease renewed, as a kubelet that posts status but never runs a pod would: the
    node stays Ready (without it the node controller marks it NodeStatusUnknown after its grace period, and the run
    counts the node as lost: not judged, tests/test_node_lost.py)."""
    import datetime as dt
    import threading

    from kubernetes import client as k8s

    api, stop = k8s.CoordinationV1Api(client.api), threading.Event()

    def beat():
        while not stop.is_set():
            now = dt.datetime.now(dt.timezone.utc)
            body = {"metadata": {"name": node, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": now}}
            try:
                api.patch_namespaced_lease(node, "kube-node-lease", body)
            except k8s.exceptions.ApiException as exc:
                if exc.status == 404:
                    api.create_namespaced_lease("kube-node-lease", body)
            stop.wait(every)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)
        with contextlib.suppress(k8s.exceptions.ApiException):
            api.delete_namespaced_lease(node, "kube-node-lease")


def test_real_gpu_checks_run_on_real_nodes_only_and_say_quickly_when_a_pod_cannot_run(embedded, tmp_path):
    """Real and simulated is a fact of each node. A GPU node nobody runs (no kwok, no kubelet) among the mixed
    fleet's kwok nodes: the health check runs there only, its pod is never taken up by a kubelet, and the
    check fails saying so within a minute, not after the workload's deadline; the kwok nodes are listed as
    left out, with the reason."""
    real = variant(KUBEADM_LEFTOVER, "real-h100-0")
    real[0]["status"]["conditions"] = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                        "message": "kubelet is posting ready status",
                                        "lastHeartbeatTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}]
    with nodes_loaded(embedded, [real], kwok=False), heartbeat(embedded.client, "real-h100-0"):
        res = embedded.run_suite("suites/test_health.py", "suites/test_timeslicing.py", "suites/test_mig.py",
                                 "-k", "health or same_uuid or own_mig_device", report_dir=tmp_path,
                                 run_id="real-and-kwok", timeout=600)
    assert res.code == 1, res
    health = [c for c in res.checks if c["feature"] == "health"]
    assert {c["target"] for c in health} == {"real-h100-0"}, health
    (rec,) = res.failed_checks("health-pod")
    assert "is bound to node real-h100-0, whose kubelet has not taken it up in 60s" in rec["actual"], rec
    coverage = [json.loads(line) for line in (res.run_path / "coverage.jsonl").read_text().splitlines()]
    kwok_gpu_nodes = {n.name for n in discover(embedded.client.node_dicts()).gpu_nodes if n.simulated}
    left_out = {r["node"] for r in coverage if r["check"] == "test_health_per_node"
                and r["reason"].startswith("simulated (kwok)")}
    assert left_out == kwok_gpu_nodes and kwok_gpu_nodes, coverage

"""Manifests that run the workloads in a cluster (pure dicts) and the result parser."""

import json

import pytest

from gpuproof.bench import workloads as wl
from gpuproof.errors import GpuproofError

LABELS = {"app.kubernetes.io/managed-by": "gpuproof", "gpuproof.dev/run": "r1"}
NS = "gpuproof-r1"


def all_label_sets(obj: dict):
    yield obj["metadata"]["labels"]
    tmpl = obj.get("spec", {}).get("template")
    if tmpl:
        yield tmpl["metadata"]["labels"]


def pod_spec(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"] if "template" in obj.get("spec", {}) else obj["spec"]


def assert_run_labels(objs):
    for obj in objs:
        assert obj["metadata"]["namespace"] == NS
        for labels in all_label_sets(obj):
            assert LABELS.items() <= labels.items(), (obj["kind"], labels)


def test_configmap_holds_every_workload_file():
    cm = wl.configmap(labels=LABELS, namespace=NS)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == wl.CONFIGMAP_NAME
    files = {p.name for p in wl.WORKLOADS_DIR.iterdir() if p.suffix in (".py", ".md")}
    assert files <= set(cm["data"])
    for needed in ("probe.py", "matmul.py", "allreduce.py", "inference_server.py", "loadgen.py", "loadgen_server.py",
                   "loadgen_stats.py", "loadgen_senders.py", "loadgen_search.py",
                   "locustfile.py", "nvml_sampler.py", "workload_common.py"):
        assert needed in cm["data"]
    assert cm["data"]["matmul.py"] == (wl.WORKLOADS_DIR / "matmul.py").read_text()
    assert sum(len(v.encode()) for v in cm["data"].values()) < wl.MAX_CONFIGMAP_BYTES
    assert "pynvml.py" not in wl.configmap(labels=LABELS, namespace=NS, include_pynvml=False)["data"]
    assert_run_labels([cm])


def test_workloads_import_only_stdlib_torch_and_siblings():
    import ast
    import sys

    siblings = {p.stem for p in wl.WORKLOADS_DIR.glob("*.py")}
    # PyYAML only where there is one: datasheet.py reads gpuproof's catalog.yaml on a host (a pod gets catalog.json)
    allowed = set(sys.stdlib_module_names) | siblings | {"torch", "pynvml", "locust", "gevent", "yaml"}
    for p in wl.WORKLOADS_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                mods = [node.module]
            else:
                continue
            for m in mods:
                assert m.split(".")[0] in allowed, f"{p.name} imports {m}"


def test_gpu_pod():
    pod = wl.workload_pod("bench-matmul-h100", "matmul", ["--sizes", "8192"], labels=LABELS, namespace=NS,
                          gpus=1, product="NVIDIA-H100-80GB-HBM3", node="gpu-node-1")
    assert pod["kind"] == "Pod"
    spec = pod["spec"]
    c = spec["containers"][0]
    assert c["image"] == wl.DEFAULT_IMAGE
    assert c["command"] == ["python", "/gpuproof/workloads/matmul.py", "--sizes", "8192"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    # a named node: pinned by its name, as the suites' pods are (gpuproof.cluster.placement), not a hostname label
    assert "nodeSelector" not in spec
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}]
    from gpuproof.cluster.placement import pinned_node

    assert pinned_node(spec) == "gpu-node-1"             # what gpuproof plan shows as the pod's node
    assert spec["restartPolicy"] == "Never"
    assert spec["volumes"][0]["configMap"]["name"] == wl.CONFIGMAP_NAME
    assert c["volumeMounts"][0]["mountPath"] == wl.MOUNT_PATH
    assert_run_labels([pod])


def test_torchrun_pod_uses_every_gpu_and_shm():
    pod = wl.workload_pod("ar", "allreduce", ["--max-bytes", "1G"], labels=LABELS, namespace=NS, gpus=8,
                          torchrun=True, image="my/image:1")
    c = pod["spec"]["containers"][0]
    assert c["command"][:3] == ["torchrun", "--standalone", "--nproc-per-node=8"]
    assert c["image"] == "my/image:1" and c["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert any(v.get("emptyDir", {}).get("medium") == "Memory" for v in pod["spec"]["volumes"])


def test_job_variant():
    job = wl.workload_job("probe-x", "probe", [], labels=LABELS, namespace=NS)
    assert job["kind"] == "Job" and job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    assert_run_labels([job])


def test_fabric_pods_pinned_one_per_node_with_a_headless_service():
    """A fabric job (gpuproof.bench.fabric): one pod pinned to each node, rank group i of torchrun, pod 0's DNS name
    from the headless Service; the fabric resources a node advertises asked for, with IPC_LOCK."""
    from gpuproof.bench import fabric
    from gpuproof.cluster.placement import pinned_node

    pp = fabric.PodPlan(image=wl.DEFAULT_IMAGE, gpus=8, limits={"h100-1": {"rdma/ib": 1}})
    svc, *pods = fabric.fabric_pods("fab-x-1", ["h100-0", "h100-1"], ["--sizes", "1G"], pp, labels=LABELS,
                                    namespace=NS)
    assert svc["kind"] == "Service" and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert [pinned_node(p["spec"]) for p in pods] == ["h100-0", "h100-1"]
    for i, pod in enumerate(pods):
        spec = pod["spec"]
        assert spec["subdomain"] == "fab-x-1" and spec["hostname"] == f"fab-x-1-{i}"
        assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        script = spec["containers"][0]["command"][2]
        assert "--nnodes=2" in script and "--nproc-per-node=8" in script and f"--node-rank={i}" in script
        assert "--master-addr=fab-x-1-0.fab-x-1" in script and "getent hosts fab-x-1-0.fab-x-1" in script
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    limits = [p["spec"]["containers"][0]["resources"]["limits"] for p in pods]
    assert limits == [{"nvidia.com/gpu": 8}, {"nvidia.com/gpu": 8, "rdma/ib": 1}]
    assert "securityContext" not in pods[0]["spec"]["containers"][0]
    assert pods[1]["spec"]["containers"][0]["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert_run_labels([svc, *pods])


def test_a_users_pod_fragment_is_merged_into_every_fabric_pod(tmp_path, monkeypatch):
    from gpuproof.bench import fabric
    from gpuproof.errors import GpuproofError

    frag = tmp_path / "pod.yaml"
    frag.write_text("spec:\n  containers:\n  - env: [{name: NCCL_IB_HCA, value: mlx5}]\n"
                    "    resources: {limits: {rdma/ib: 1}}\n  priorityClassName: training\n")
    monkeypatch.setenv(fabric.POD_ENV, str(frag))
    pp = fabric.PodPlan(image=wl.DEFAULT_IMAGE, gpus=8, patch=fabric.pod_patch())
    _, pod, _ = fabric.fabric_pods("fab-x-2", ["a", "b"], [], pp, labels=LABELS, namespace=NS)
    c = pod["spec"]["containers"][0]
    assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in c["env"] and {"name": "NCCL_DEBUG", "value": "INFO"} in c["env"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": 8, "rdma/ib": 1}
    assert pod["spec"]["priorityClassName"] == "training"
    frag.write_text("- not a mapping\n")
    with pytest.raises(GpuproofError, match="must be a YAML mapping"):
        fabric.pod_patch()


def test_fabric_offers_and_limits_come_from_the_nodes_resources():
    from types import SimpleNamespace

    from gpuproof.bench import fabric

    efa = SimpleNamespace(allocatable={"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "cpu": "190"})
    ib = SimpleNamespace(allocatable={"nvidia.com/gpu": "8", "rdma/rdma_shared_device_a": "1k", "rdma/unused": "0"})
    plain = SimpleNamespace(allocatable={"nvidia.com/gpu": "8"})
    assert fabric.offers(efa) == ["vpc.amazonaws.com/efa: 32"] and fabric.fabric_limits(efa) == {
        "vpc.amazonaws.com/efa": "32"}
    assert fabric.offers(ib) == ["rdma/rdma_shared_device_a: 1k"]
    assert fabric.fabric_limits(ib) == {"rdma/rdma_shared_device_a": 1}
    assert fabric.offers(plain) == [] and fabric.fabric_limits(plain) == {}


def test_inference_deployment_service_and_loadgen():
    dep, svc = wl.inference_manifests("infer", labels=LABELS, namespace=NS, product="NVIDIA-L4",
                                      server_args=["--max-batch", "16"])
    c = pod_spec(dep)["containers"][0]
    assert c["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": 8000}
    assert "--host" in c["command"] and "0.0.0.0" in c["command"] and "--max-batch" in c["command"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    url = wl.service_url("infer", NS)
    assert url == "http://infer.gpuproof-r1.svc:8000"
    load = wl.loadgen_pod("infer-load", url, ["--rates", "10,20"], labels=LABELS, namespace=NS)
    lc = load["spec"]["containers"][0]
    assert lc["image"] == wl.DEFAULT_LOADGEN_IMAGE
    assert lc["command"][:4] == ["python", "/gpuproof/workloads/loadgen.py", "--url", url]
    assert "nvidia.com/gpu" not in json.dumps(lc.get("resources", {}))
    assert "tolerations" not in load["spec"]
    assert_run_labels([dep, svc, load])


def test_bad_names_are_refused():
    with pytest.raises(ValueError, match=r"^'Bad_Name' is not a valid Kubernetes name \(lower-case letters, "
                                         r"digits and '-', at most 63 characters\)$"):
        wl.workload_pod("Bad_Name", "probe", labels=LABELS, namespace=NS)


def test_parse_result_takes_the_last_json_line():
    logs = "starting\n{\"partial\": 1}\n[12:00:00] progress\n{\"ok\": true, \"x\": 2}\n"
    assert wl.parse_result(logs) == {"ok": True, "x": 2}
    with pytest.raises(GpuproofError, match="no JSON result"):
        wl.parse_result("Traceback (most recent call last):\n  boom\n")


def test_a_long_result_split_by_the_runtime_around_stderr_lines_is_read_whole():
    """containerd stores a stdout line over 16 KiB in pieces (CRI tag P, then F); the kubelet's log joins the pieces,
    but a stderr line stored between two pieces lands inside the result (seen in a CI run: the health pod's 30 KB
    result with its last progress lines inside it, 'printed no JSON result')."""
    result = {"workload": "health", "checks": [{"gpu": i, "reason": "x" * 300, "value": [1.5, 2]} for i in range(150)]}
    text = json.dumps(result, sort_keys=True)
    pieces = [text[i:i + 16384] for i in range(0, len(text), 16384)]
    assert len(pieces) >= 3
    progress = ["[05:42:47] FAIL GPU 1 (GPU-2c2f): gpu_reachable: NVML: GPU is lost", "[05:42:47] health: 52 pass"]
    logs = "[05:42:45] starting\n" + pieces[0] + progress[0] + "\n" + pieces[1] + progress[1] + "\n" + \
        "".join(pieces[2:]) + "\n"
    assert wl.parse_result(logs) == result
    two_lines = ("[05:42:45] starting\n" + pieces[0] + progress[0] + "\n" + progress[1] + "\n"
                 + "".join(pieces[1:]) + "\n")
    assert wl.parse_result(two_lines) == result
    with pytest.raises(GpuproofError, match="no JSON result"):      # cut short: never printed whole
        wl.parse_result("[05:42:45] starting\n" + pieces[0] + progress[0] + "\n")


def test_a_lent_image_brings_its_host_paths_env_and_pull_policy_to_every_workload():
    """The embedded cluster's kubelet nodes lend an image with the host's Python (gpuproof.sim.kubelet.workload_image):
    every workload object mounts its folders read-only at the same path, with its environment."""
    from gpuproof.bench.fabric import PodPlan, fabric_pods
    from gpuproof.bench.loadpods import distributed_manifests

    image = wl.Image("gpuproof.local/workloads:k", host_paths=(("/usr", "/host/usr"), ("/opt/py", "/opt/py")),
                     node_paths=(("/var/lib/gpuproof", "/etc/gpuproof"),),
                     env=(("PATH", "/opt/py/bin:/usr/bin"), ("MOCK_NVML_CONFIG", "/etc/gpuproof/mock-nvml.yaml")),
                     pull_policy="Never", device="cpu")
    assert wl.Image.from_json(json.loads(json.dumps(image.to_json()))) == image
    objs = [wl.workload_pod("p", "probe", labels=LABELS, namespace=NS, image=image),
            *fabric_pods("ar", ["a", "b"], [], PodPlan(image=image, gpus=1, device="cpu"), labels=LABELS, namespace=NS),
            *wl.inference_manifests("inf", labels=LABELS, namespace=NS, image=image),
            wl.loadgen_pod("lg", "http://inf:8000", labels=LABELS, namespace=NS, image=image),
            *distributed_manifests("dl", "http://inf:8000", [], 2, labels=LABELS, namespace=NS, image=image)]
    for obj in (o for o in objs if o["kind"] != "Service"):
        spec = pod_spec(obj)
        (c,) = spec["containers"]
        assert c["image"] == image.name and c["imagePullPolicy"] == "Never", obj["metadata"]["name"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["PATH"] == "/opt/py/bin:/usr/bin" and env["PYTHONUNBUFFERED"] == "1", env
        lent = {v["name"]: v["hostPath"] for v in spec["volumes"] if "hostPath" in v}
        mounts = {m["mountPath"]: m for m in c["volumeMounts"] if m["name"] in lent}
        assert set(mounts) == {"/host/usr", "/opt/py", "/etc/gpuproof"} and all(m["readOnly"] for m in mounts.values())
        assert {h["path"] for h in lent.values()} == {"/usr", "/opt/py", "/var/lib/gpuproof"}
    plain = wl.workload_pod("p", "probe", labels=LABELS, namespace=NS)       # a stock image: nothing lent
    assert "imagePullPolicy" not in plain["spec"]["containers"][0]
    assert not [v for v in plain["spec"]["volumes"] if "hostPath" in v]


def test_a_bench_pod_tolerates_its_nodes_own_taints():
    """AKS's GPU pools are tainted ``sku=gpu:NoSchedule`` (no nvidia.com/gpu taint): a bench pod meant for such a node
    tolerates exactly that node's taints, as the suites' pods do, and never a cordon it was not given."""
    from gpuproof.cluster.placement import tolerate

    aks = [{"key": "sku", "value": "gpu", "effect": "NoSchedule"},
           {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}]
    pod = wl.workload_pod("bench-hbm-a100", "hbm", labels=LABELS, namespace=NS, gpus=1, node="aks-gpu-0",
                          tolerations=tolerate(aks))
    assert pod["spec"]["tolerations"] == [{"key": "sku", "operator": "Exists"},
                                          {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Exists"}]
    from gpuproof.bench.fabric import PodPlan, fabric_pods

    fab = fabric_pods("fab-a100", ["aks-gpu-0", "aks-gpu-1"], [], PodPlan(image=wl.DEFAULT_IMAGE, gpus=8,
                                                                          tolerations=tolerate(aks + aks)),
                      labels=LABELS, namespace=NS)[1]
    assert fab["spec"]["tolerations"] == pod["spec"]["tolerations"]      # each key once
    untainted = wl.workload_pod("bench-hbm-l4", "hbm", labels=LABELS, namespace=NS, gpus=1, node="l4-0",
                                tolerations=tolerate([]))
    assert "tolerations" not in untainted["spec"]

"""Replay nodes (issue #36): kwok nodes whose workload pods return recordings of gpuproof's own workloads as their logs,
read by gpuproof through the API server's pods/log; the 1,000-node run's path at a size CI affords (20 nodes).

benchmarks/scale_kwok.py runs the same at 1,000 nodes (benchmarks/SCALE.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuproof.errors import FleetError
from gpuproof.sim import replay
from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim.stages import kwok_config

H100 = {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}
NODES, SLOW = 20, 7
ACCESS_CHECKS = ("access-granted-one-gpu", "access-ungranted-none", "access-envvar-none", "access-sibling-none")
FLEET = {"name": "replay20", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
         "pools": [{"name": "h100", "count": NODES, "backend": "replay", "instanceType": "p5.48xlarge",
                    "gpu": dict(H100), "faults": [{"node": SLOW, "replaySlow": True}]}]}


def test_pod_names_are_gpuproofs():
    """The simulator names the pods it serves logs for by gpuproof's own rules (it may not import them)."""
    from gpuproof.bench.base import pod_name
    from gpuproof.plugin.checks import name_on

    pods = access_suite().PODS
    for node in ("h100-0", "a-node-with-a-rather-long-name-that-runs-past-fifty-chars-7"):
        names = replay.pod_names(node)
        assert names["health"] == pod_name("health", node) and names["census"] == pod_name("census", node)
        assert names["probe"] == name_on(node, "nvlink-probe", 0)      # gpuproof.plugin.checks.probe_on's rule
        assert names["driver"] == name_on(node, "driver-probe", 0)     # suites/test_driver.py's probe_on prefix
        assert len(names["probe"]) <= 63 and names["probe"].endswith("-0")
        # the access suite's pods (its manifest: name_on(node, prefix)) and their containers, in order
        assert replay.access_pods(node) == {name_on(node, prefix): tuple(c for c, _, _ in containers)
                                            for prefix, containers in pods.values()}
        assert all(len(p) <= 63 for p in replay.access_pods(node))


def test_the_access_recordings_are_of_the_suites_containers():
    """Each kind of container the access suite's pods have is recorded, granted or not and with its own env as the
    suite starts it (the recorder may not import the suite either)."""
    from gpuproof.sim.replay_record import ACCESS_CONTAINERS, access_argv

    suite = access_suite()
    kinds = {c: (granted, env) for _, containers in suite.PODS.values() for c, granted, env in containers}
    assert kinds == ACCESS_CONTAINERS
    assert {c for cs in replay.ACCESS_PODS.values() for c in cs} == set(kinds)
    recs = replay.load()
    for kind, (granted, env) in kinds.items():
        rec, = recs.of("access", kind)
        assert access_argv(kind)[-2:] == ["--name", kind]
        result = _result(rec.path)
        assert result["container"] == kind and {k: result["env"][k] for k in env} == env, result
        assert result["env"]["NVIDIA_VISIBLE_DEVICES"] == (rec.uuids[0] if granted else env.get(
            "NVIDIA_VISIBLE_DEVICES")), result


def access_suite():
    """suites/test_access.py as a module (tests/test_access_checks.py's way)."""
    from test_access_checks import suite

    return suite()


def test_mock_uuids_are_the_mock_configs():
    from gpuproof.sim import nvidia
    from gpuproof.sim.gpunodes import mock_config

    try:
        sw = nvidia.locate(build_missing=False)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"NVIDIA's mock NVML is not built: {exc}")
    gpu = parse_fleet(FLEET).pools[0].gpu
    assert replay.mock_uuids("replay20/h100-3", 8) == \
        [d["uuid"] for d in mock_config(sw, gpu, seed="replay20/h100-3")["devices"]]


def test_replay_pool_nodes_and_kwok_config(tmp_path):
    fleet = parse_fleet(FLEET, source="replay20.yaml")
    pool = fleet.pools[0]
    node = replay.node_endpoint(pool.node_objects({i: _View() for i in range(NODES)})[0], 20005)
    assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "replay" and replay.is_replay(node)
    assert node["metadata"]["labels"][replay.NODE_LABEL] == "true"
    assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.0.0.1"}
    assert node["status"]["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 20005}}
    logs = replay.node_logs(fleet, tmp_path)
    # and the fabric pairs' (tests/test_fabric_replay.py)
    node_pods = {p for p in logs if not replay.is_fabric(p) and "/" not in p}
    assert len(node_pods) == 4 * NODES     # health, census, the topology probe and the driver suite's probe
    access = {p: cs for i in range(NODES) for p, cs in replay.access_pods(f"h100-{i}").items()}
    assert len(access) == 4 * NODES and {k for k in logs if "/" in k} == \
        {replay.log_key(p, c) for p, cs in access.items() for c in cs}
    docs = list(yaml.safe_load_all(kwok_config(fleet, logs)))
    cl = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ClusterLogs"}
    assert len(cl) == len(node_pods) + len(access) + sum(replay.is_fabric(p) for p in logs)
    assert {cl[p]["logs"][0]["containers"][0] for p in node_pods} == {"workload"}
    for pod, containers in access.items():      # a logs entry per container, each its own file
        assert cl[pod]["selector"] == {"matchNames": [pod]}
        assert [(e["containers"], e["logsFile"]) for e in cl[pod]["logs"]] == \
            [([c], str(logs[replay.log_key(pod, c)])) for c in containers]
    stage = next(d for d in docs if d["kind"] == "Stage" and d["metadata"]["name"].startswith("pod-replay-complete"))
    names = next(e["values"] for e in stage["spec"]["selector"]["matchExpressions"] if e["key"] == ".metadata.name")
    assert sorted(names) == replay.replayed(logs) and node_pods | set(access) <= set(names)
    # only identifiers change: the node's UUIDs and the pod's host name; the slow node gets the slow census
    recs = replay.load()
    uuids = replay.mock_uuids(f"replay20/h100-{SLOW}", 8)
    slow = logs[replay.pod_names(f"h100-{SLOW}")["census"]].read_text()
    source = recs.of("census", "slow")[0]
    assert all(u in slow for u in uuids) and not any(u in slow for u in source.uuids)
    assert slow.replace('"host": "bench-census-h100-7"', '"host": "vm"') == _renamed(source, uuids)
    result = json.loads(slow.splitlines()[-1].split(" F ", 1)[1])
    assert [g["uuid"] for g in result["gpus"]] == uuids and result["host"] == "bench-census-h100-7"


@pytest.mark.parametrize("node", [0, SLOW, NODES - 1])
def test_the_access_suite_judges_each_replay_nodes_containers_healthy(tmp_path, monkeypatch, node):
    """The access suite's own judgement (suites/test_access.py judge, gpuproof.discovery.access) of the logs a replay
    node serves its pods' containers: every check passes; the granted container reached one GPU, the node's own, the
    one the device plugin's NVIDIA_VISIBLE_DEVICES says it allocated; the recording's UUIDs are gone."""
    from gpuproof.discovery import access
    from gpuproof.discovery.nodes import discover
    from test_access_checks import run_suite

    fleet = parse_fleet(FLEET, source="replay20.yaml")
    logs = replay.node_logs(fleet, tmp_path / "logs")
    name = f"h100-{node}"
    uuids = replay.mock_uuids(f"replay20/{name}", 8)
    recorded = {u for r in replay.load().items if r.workload == "access" for u in r.uuids}
    obj = {"metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.count": "8",
                                                 "nvidia.com/gpu.product": H100["product"]}},
           "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                      "conditions": [{"type": "Ready", "status": "True"}]}}
    gpu_node, = discover([obj]).gpu_nodes
    pods = replay.access_pods(name)
    for k, (test, (prefix, containers)) in enumerate(access_suite().PODS.items()):
        pod = f"{prefix}-{name}"
        assert pods[pod] == tuple(c for c, _, _ in containers)
        texts = {c: logs[replay.log_key(pod, c)].read_text() for c, _, _ in containers}
        assert not any(u in t for t in texts.values() for u in recorded), pod
        results = {c: _result(logs[replay.log_key(pod, c)]) for c in texts}
        assert all(r["host"] == pod for r in results.values())
        for c, granted, _ in containers:
            if granted:
                allocated = access.allocated_by_plugin(results[c])
                assert allocated == [uuids[0]] and set(allocated) <= set(uuids), (pod, allocated)
                assert [g["uuid"] for g in results[c]["nvml"]["gpus"]] == allocated
            else:       # the mock's host view (not counted) is the node's GPUs
                assert [g["uuid"] for g in results[c]["nvml"]["gpus"]] == uuids and not results[c]["device_files"]
        checker, records = run_suite(tmp_path / str(k), monkeypatch, test, results, node=gpu_node)
        assert len(records) == len(containers) and {r["verdict"] for r in records} == {"pass"}, records
        assert not checker.failures and all(r["target"] == name for r in records)


def _result(path: Path) -> dict:
    """The workload's JSON result: the last stdout line of a CRI log."""
    line = [x for x in path.read_text().splitlines() if " stdout F {" in x][-1]
    return json.loads(line.split(" F ", 1)[1])


def _renamed(rec, uuids) -> str:
    text = rec.path.read_text()
    for old, new in zip(rec.uuids, uuids):
        text = text.replace(old, new)
    return text


class _View:
    labels: dict = {}
    resources = allocatable = {"nvidia.com/gpu": "8"}

    def annotations(self):
        return {}


@pytest.mark.parametrize("pool, field, words", [
    ({"backend": "kwok", "faults": [{"replaySlow": True}]}, "faults[0].replaySlow", "is for replay nodes"),
    ({"gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}}, "gpu", "recorded on 8x NVIDIA-H100-80GB-HBM3"),
    ({"offer": "dra"}, "backend", "no DRA"),
    ({"timeSlicing": {"replicas": 2}}, "backend", "sharing"),
])
def test_replay_pools_refused_naming_the_field(pool, field, words):
    bad = {**FLEET["pools"][0], "faults": [], **pool}
    with pytest.raises(FleetError) as err:
        parse_fleet({"name": "r", "pools": [bad]}, source="r.yaml")
    assert field in str(err.value) and words in str(err.value), str(err.value)


@pytest.mark.sim
@pytest.mark.slow
def test_the_default_run_reads_recorded_results_and_names_the_slow_node(tmp_path):
    """The whole default run against 20 replay nodes: health, census, the topology and driver probes and the access
    suite's pods run on every node (at most --parallel 8 in flight), each result read from the pod's log (each
    container's) through the API server; the census fails the one node whose recording ran under a CPU quota, by
    node, GPU index and UUID, figure and pool median, and nothing else fails: every access check passes on every
    node."""
    fleet = tmp_path / "replay20.yaml"
    fleet.write_text(yaml.safe_dump(FLEET))
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--fleet", str(fleet), "--report-dir",
                           str(reports), "--run-id", "r20", "--parallel", "8"],
                          capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    run = reports / "r20"
    assert proc.returncode == 1, out[-3000:]
    checks = _records(run / "checks.jsonl")
    failed = [c for c in checks if c["verdict"] == "fail"]
    slow = f"h100-{SLOW}"
    assert failed and all(c["target"] == slow and c["check"].startswith("census-") for c in failed), failed
    uuids = replay.mock_uuids(f"replay20/{slow}", 8)
    gpus = [c for c in failed if c["check"] == "census-matmul-pool"]
    assert len(gpus) == 8, failed
    for c in gpus:
        i = int(c["message"].split("GPU ")[1].split(" ")[0])
        assert c["message"].startswith(f"{slow}: GPU {i} ({uuids[i]}): fp32 matmul "), c["message"]
        assert f"of its pool's median 0.154 (pool NVIDIA-H100-80GB-HBM3 x8, {8 * NODES} GPUs" in c["message"]
        assert c["expected"] == ">= 85% of the pool median 0.154 TFLOPS" and c["actual"].endswith("%)"), c
    # every node's three pods ran and their logs were read: the census and health records carry each node's UUIDs,
    # the topology check passed on every node
    metrics = _records(run / "metrics.jsonl")
    for node in (f"h100-{i}" for i in range(NODES)):
        mine = replay.mock_uuids(f"replay20/{node}", 8)
        census = {json.loads(m["parameters"])["uuid"] for m in metrics
                  if m["benchmark"] == "census" and m["node"] == node and m["metric"] == "matmul_tflops"}
        assert census == set(mine), node
        assert any(m["benchmark"] == "health" and m["node"] == node for m in metrics), node
        assert any(c["check"] == "nvlink-set" and c["target"] == node and c["verdict"] == "pass" for c in checks)
        got = {c["check"]: c["verdict"] for c in checks if c["feature"] == "access" and c["target"] == node}
        assert got == dict.fromkeys(ACCESS_CHECKS, "pass"), (node, got)
        granted = next(c for c in checks if c["check"] == "access-granted-one-gpu" and c["target"] == node)
        assert f"NVML lists 1: {mine[0]}" in granted["actual"] and mine[0] in granted["expected"], granted
    fan = {json.loads(m["parameters"])["job"]: m["value"] for m in metrics
           if m["benchmark"] == "fanout" and m["metric"] == "max_pods_in_flight"}
    access_jobs = {f"access {t}" for t in ("PositiveAccessTest", "NegativeIsolationTest", "EnvVarIsolationTest",
                                           "MultiContainerIsolationTest")}
    assert set(fan) == {"census", "health", "topology", "driver probe", *access_jobs} and \
        all(v <= 8 for v in fan.values()), fan


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

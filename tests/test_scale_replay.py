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
FLEET = {"name": "replay20", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
         "pools": [{"name": "h100", "count": NODES, "backend": "replay", "instanceType": "p5.48xlarge",
                    "gpu": dict(H100), "faults": [{"node": SLOW, "replaySlow": True}]}]}


def test_pod_names_are_gpuproofs():
    """The simulator names the pods it serves logs for by gpuproof's own rules (it may not import them)."""
    from gpuproof.bench.base import pod_name
    from gpuproof.plugin.checks import name_on

    for node in ("h100-0", "a-node-with-a-rather-long-name-that-runs-past-fifty-chars-7"):
        names = replay.pod_names(node)
        assert names["health"] == pod_name("health", node) and names["census"] == pod_name("census", node)
        assert names["probe"] == name_on(node, "nvlink-probe", 0)      # gpuproof.plugin.checks.probe_on's rule
        assert names["driver"] == name_on(node, "driver-probe", 0)     # suites/test_driver.py's probe_on prefix
        assert len(names["probe"]) <= 63 and names["probe"].endswith("-0")


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
    node_pods = {p for p in logs if not replay.is_fabric(p)}      # and the fabric pairs' (tests/test_fabric_replay.py)
    assert len(node_pods) == 4 * NODES     # health, census, the topology probe and the driver suite's probe
    docs = list(yaml.safe_load_all(kwok_config(fleet, logs)))
    cl = [d for d in docs if d["kind"] == "ClusterLogs"]
    assert len(cl) == len(logs) and {d["spec"]["logs"][0]["containers"][0] for d in cl
                                     if d["metadata"]["name"] in node_pods} == {"workload"}
    stage = next(d for d in docs if d["kind"] == "Stage" and d["metadata"]["name"] == "pod-replay-complete")
    names = next(e["values"] for e in stage["spec"]["selector"]["matchExpressions"] if e["key"] == ".metadata.name")
    assert sorted(names) == replay.replayed(logs) and node_pods <= set(names)
    # only identifiers change: the node's UUIDs and the pod's host name; the slow node gets the slow census
    recs = replay.load()
    uuids = replay.mock_uuids(f"replay20/h100-{SLOW}", 8)
    slow = logs[replay.pod_names(f"h100-{SLOW}")["census"]].read_text()
    source = recs.of("census", "slow")[0]
    assert all(u in slow for u in uuids) and not any(u in slow for u in source.uuids)
    assert slow.replace('"host": "bench-census-h100-7"', '"host": "vm"') == _renamed(source, uuids)
    result = json.loads(slow.splitlines()[-1].split(" F ", 1)[1])
    assert [g["uuid"] for g in result["gpus"]] == uuids and result["host"] == "bench-census-h100-7"


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
    """The whole default run against 20 replay nodes: health, census and the topology probe run as pods on every node
    (at most --parallel 8 in flight), each result read from the pod's log through the API server; the census fails
    the one node whose recording ran under a CPU quota, by node, GPU index and UUID, figure and pool median, and
    nothing else fails."""
    fleet = tmp_path / "replay20.yaml"
    fleet.write_text(yaml.safe_dump(FLEET))
    reports = tmp_path / "reports"
    # replay nodes hold recordings of the health, census, probe and driver pods only: the access suite's pods (a
    # container's own device files and NVML) have none, and would wait out their deadline there
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--fleet", str(fleet), "--report-dir",
                           str(reports), "--run-id", "r20", "--parallel", "8", "-k", "not TestSecureAcceleratorAccess"],
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
    fan = {json.loads(m["parameters"])["job"]: m["value"] for m in metrics
           if m["benchmark"] == "fanout" and m["metric"] == "max_pods_in_flight"}
    assert set(fan) == {"census", "health", "topology", "driver probe"} and all(v <= 8 for v in fan.values()), fan


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

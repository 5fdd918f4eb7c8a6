"""A slow node among its peers (issue #36): the fleet fault ``cpuPercent`` holds a kubelet node's pods to a share of one
core through the kubelet's own kubepods cgroup (the kernel throttles them), and the fan-out and the census name it."""

from __future__ import annotations


import pytest
import yaml

from gpuproof.errors import FleetError
from gpuproof.sim import kubelet
from gpuproof.sim.fleet_file import parse_fleet

A100 = {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}


def pool(backend: str, fault: dict) -> dict:
    return {"name": "a100", "count": 3, "backend": backend, "instanceType": "a2-highgpu-2g", "gpu": dict(A100),
            "faults": [{"node": 2, **fault}]}


def test_cpu_percent_holds_one_kubelet_node():
    fleet = parse_fleet({"name": "slow", "pools": [pool("kubelet", {"cpuPercent": 20})]}, source="slow.yaml")
    p = fleet.pools[0]
    assert [p.cpu_percent(i) for i in range(3)] == [None, None, 20]


@pytest.mark.parametrize("backend, fault, field, words", [
    ("kwok", {"cpuPercent": 20}, "faults[0].cpuPercent", "is for kubelet nodes"),
    ("kubelet", {"cpuPercent": 0}, "cpuPercent", "1 to 10000"),
    ("kubelet", {"cpuPercent": "slow"}, "cpuPercent", "whole number of percent"),
    ("kubelet", {"cpuPercent": True}, "cpuPercent", "whole number of percent"),
])
def test_cpu_percent_refused_naming_the_field(backend, fault, field, words):
    with pytest.raises(FleetError) as err:
        parse_fleet({"name": "slow", "pools": [pool(backend, fault)]}, source="slow.yaml")
    assert field in str(err.value) and words in str(err.value)


def test_each_node_weighs_as_one_busy_process_not_the_cluster_as_one(tmp_path, monkeypatch):
    """The cluster's cpu group gets 1024 shares per node (cgroups.weigh): its nodes' pods are not squeezed by the
    host's other processes down to the figures of the node held back on purpose."""
    from gpuproof.sim.kubelet import cgroups
    from gpuproof.sim.kubelet.layout import State

    state = State(cluster="ab12", subnet=200, api_port=1, nodes=["a", "b", "c"])
    group = tmp_path / "cpu" / state.cgroup
    group.mkdir(parents=True)
    (group / "cpu.shares").write_text("1024")
    monkeypatch.setattr(cgroups, "CGROUP", tmp_path)
    assert cgroups.weigh(state, 3) == 3072 and (group / "cpu.shares").read_text() == "3072"
    assert cgroups.weigh(state, 1000) == cgroups.SHARES_MAX              # the kernel's largest weight
    monkeypatch.setattr(cgroups, "CGROUP", tmp_path / "none")
    assert cgroups.weigh(state, 3) == 0                                  # no cpu hierarchy: nothing to weigh


SLOW_FLEET = {"name": "slow", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
              "pools": [pool("kubelet", {"cpuPercent": 5})]}


@pytest.mark.kubelet
@pytest.mark.speed    # its healthy nodes share the cores with whatever else runs: last in the kubelet worker
@pytest.mark.skipif(bool(kubelet.missing()), reason=kubelet.missing() or "")
def test_the_census_names_the_node_the_kernel_holds_back(tmp_path):
    """Three A100 kubelet nodes, the pods of a100-2 held to 5% of a core by its kubepods cgroup: the census (every
    node at once) fails a100-2's GPUs among their pool, by node, GPU index and UUID, figure and pool median; a100-0
    and a100-1 pass every check; the fan-out's summary names a100-2 as the slowest node. (At 10% a figure of
    a100-2 came within the 50% floor once other tests squeezed the healthy nodes: tests/conftest.py's workers.)"""
    from test_kubelet_pods import gpuproof_run, records

    fleet = tmp_path / "slow.yaml"
    fleet.write_text(yaml.safe_dump(SLOW_FLEET))
    proc, run = gpuproof_run(tmp_path, "--fleet", str(fleet), "-k", "census", "--progress-after", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    checks = [r for r in records(run, "checks.jsonl") if r["check"].startswith("census-")]
    by_node = {n: [r for r in checks if r["target"] == n] for n in ("a100-0", "a100-1", "a100-2")}
    for healthy in ("a100-0", "a100-1"):
        assert by_node[healthy] and all(r["verdict"] != "fail" for r in by_node[healthy]), by_node[healthy]
    failed = [r for r in by_node["a100-2"] if r["verdict"] == "fail"]
    assert sorted(r["check"] for r in failed) == ["census-allreduce-pool", "census-copy-pool", "census-copy-pool",
                                                  "census-matmul-pool", "census-matmul-pool"], failed
    uuids = node_uuids("a100-2")
    for r in failed:
        assert r["message"].startswith("a100-2: ") and "of its pool's median" in r["message"], r["message"]
        if r["check"] != "census-allreduce-pool":        # a GPU's: its index and UUID, its figure, the median
            i = int(r["message"].split("GPU ")[1].split(" ")[0])
            assert f"GPU {i} ({uuids[i]})" in r["message"] and "pool NVIDIA-A100-SXM4-40GB x2, 6 GPUs" in r["message"]
            assert r["expected"].startswith(">= 50% of the pool median") and r["actual"].endswith("%)"), r
    assert "census: 3 nodes in" in out and "slowest a100-2" in out, out[-3000:]
    metrics = records(run, "metrics.jsonl")
    assert {m["node"] for m in metrics if m["benchmark"] == "census"} == {"a100-0", "a100-1", "a100-2"}
    wall = next(m["value"] for m in metrics if m["benchmark"] == "fanout" and m["metric"] == "wall_s")
    node_sum = next(m["value"] for m in metrics if m["benchmark"] == "fanout" and m["metric"] == "node_sum_s")
    assert wall < node_sum          # the nodes ran side by side (a record of how, not a speed claim)


def node_uuids(node: str) -> list[str]:
    """The node's GPU UUIDs as its mock NVML config says them (the config the node was started with)."""
    from gpuproof.sim import nvidia
    from gpuproof.sim.gpunodes import mock_config

    p = parse_fleet(SLOW_FLEET, source="slow.yaml").pools[0]
    return [d["uuid"] for d in mock_config(nvidia.locate(), p.gpu, seed=f"{SLOW_FLEET['name']}/{node}")["devices"]]

"""A slow node among its peers (issue #36): the fleet fault ``cpuPercent`` holds a kubelet node's pods to a share of one
core through the kubelet's own kubepods cgroup (the kernel throttles them), and the fan-out and the census name it."""

from __future__ import annotations

import pytest

from gpuproof.errors import FleetError
from gpuproof.sim.fleet_file import parse_fleet

A100 = {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}


def pool(backend: str, fault: dict) -> dict:
    return {"name": "a100", "count": 3, "backend": backend, "instanceType": "a2-highgpu-2g", "gpu": A100,
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

"""The fabric suite on real kubelet nodes (issue #50 item 5): five GPU nodes whose pods talk gloo over TCP between
the nodes' network namespaces, one node's network shaped by the kernel's tc (``netRateMbit``) and the link between two
others shaped alone (``slowLinks``: a pair the default schedule measures). The slow node is named, the slow link is
named and its two nodes are not, the other nodes and links pass."""

from __future__ import annotations

import pytest
import yaml

from gpuproof.errors import FleetError
from gpuproof.sim import kubelet
from gpuproof.sim.fleet_file import parse_fleet

SLOW_NODE, LINK = "a100-4", "a100-2<->a100-3"
FLEET = {"name": "fabric", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
         "pools": [{"name": "a100", "count": 5, "backend": "kubelet", "instanceType": "a2-highgpu-1g",
                    "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 1},
                    "faults": [{"node": 4, "netRateMbit": 20},
                               {"node": 2, "slowLinks": [{"to": 3, "rateMbit": 20}]}]}]}


def test_the_network_faults_parse_and_shape_both_ends_of_a_link():
    pool = parse_fleet(FLEET, source="fabric.yaml").pools[0]
    assert [pool.net_rate_mbit(i) for i in range(5)] == [None, None, None, None, 20]
    assert [pool.slow_links(i) for i in range(5)] == [{}, {}, {3: 20}, {2: 20}, {}]


def test_tc_shapes_the_slow_nodes_both_directions_and_the_links_two_ends(monkeypatch):
    """What shape_network asks of tc (the commands, not run): the slow node's eth0 default class and its veth's token
    bucket on the host; each end of the slow link a class and filters for the other's address and pod range."""
    from gpuproof.sim.kubelet import faults
    from gpuproof.sim.kubelet.layout import Node, State

    pool = parse_fleet(FLEET, source="fabric.yaml").pools[0]
    nodes = [Node(name, i, {}, [], 110) for i, name in enumerate(pool.node_names())]
    state = State(cluster="ab12", subnet=30, api_port=1, nodes=[n.name for n in nodes])
    calls = []
    monkeypatch.setattr(faults, "_tc", lambda st, i, *args: calls.append((i, " ".join(args))))
    done = faults.shape_network(state, [(n, pool) for n in nodes], lambda msg: None)
    assert done == {"a100-2": "its link to a100-3 at 20 Mbit/s", "a100-3": "its link to a100-2 at 20 Mbit/s",
                    "a100-4": "its network at 20 Mbit/s"}
    assert (4, "qdisc add dev eth0 root handle 1: htb default 1") in calls
    assert (None, "qdisc add dev gpkab12h4 root tbf rate 20mbit burst 64kb latency 400ms") in calls
    assert (2, "filter add dev eth0 parent 1: protocol ip u32 match ip dst 10.251.3.0/24 flowid 1:10") in calls
    assert (3, "filter add dev eth0 parent 1: protocol ip u32 match ip dst 10.250.30.12/32 flowid 1:10") in calls
    assert not [c for c in calls if c[0] in (0, 1)]


@pytest.mark.parametrize("fault, field, words", [
    ({"node": 0, "netRateMbit": 0}, "netRateMbit", "1 to 100000"),
    ({"node": 0, "slowLinks": [{"to": 0, "rateMbit": 5}]}, "slowLinks", "not it"),
    ({"node": 0, "slowLinks": [{"to": 9, "rateMbit": 5}]}, "slowLinks", "below 5"),
    ({"slowLinks": [{"to": 1, "rateMbit": 5}]}, "slowLinks", "name the fault's node"),
    ({"node": 0, "slowLinks": [{"to": 1}]}, "slowLinks[0]", "rateMbit"),
    ({"node": 0, "slowLinks": {"to": 1}}, "slowLinks", "must be a list"),
])
def test_a_bad_network_fault_is_refused_naming_the_field(fault, field, words):
    fleet = {**FLEET, "pools": [{**FLEET["pools"][0], "faults": [fault]}]}
    with pytest.raises(FleetError) as err:
        parse_fleet(fleet, source="fabric.yaml")
    assert field in str(err.value) and words in str(err.value), str(err.value)


def test_network_faults_are_for_kubelet_nodes():
    kwok = {**FLEET["pools"][0], "backend": "kwok", "faults": [{"node": 4, "netRateMbit": 20}]}
    with pytest.raises(FleetError, match="netRateMbit: is for kubelet nodes"):
        parse_fleet({**FLEET, "pools": [kwok]}, source="fabric.yaml")


@pytest.mark.kubelet
@pytest.mark.skipif(bool(kubelet.missing()), reason=kubelet.missing() or "")
def test_the_fabric_names_the_slow_node_and_the_slow_link(tmp_path, monkeypatch):
    from test_kubelet_pods import gpuproof_run, records

    fleet = tmp_path / "fabric.yaml"
    fleet.write_text(yaml.safe_dump(FLEET))
    monkeypatch.delenv("GPUPROOF_FABRIC_PAIRS", raising=False)
    proc, run = gpuproof_run(tmp_path, "--fleet", str(fleet), "--only-bench", "-k", "fabric",
                             "--progress-after", "1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    assert "network shaped by tc: a100-2: its link to a100-3 at 20 Mbit/s" in out, out[-4000:]
    checks = [r for r in records(run, "checks.jsonl") if r["check"].startswith("fabric-")]
    failed = {(r["check"], r["target"]) for r in checks if r["verdict"] == "fail"}
    assert failed == {("fabric-node", SLOW_NODE), ("fabric-link", LINK)}, [r for r in checks if r["verdict"] == "fail"]
    node = next(r for r in checks if (r["check"], r["target"]) == ("fabric-node", SLOW_NODE))
    assert "measured again with known-good" in node["actual"] and "reference" in node["actual"], node
    link = next(r for r in checks if (r["check"], r["target"]) == ("fabric-link", LINK))
    assert "each node is fast with a known-good node" in link["actual"], link
    passed = {(r["check"], r["target"]) for r in checks if r["verdict"] == "pass"}
    assert {("fabric-node", f"a100-{i}") for i in range(4)} <= passed, checks
    assert {("fabric-pair-result", p) for p in ("a100-1<->a100-2", "a100-0<->a100-3")} <= passed
    assert ("fabric-ring-result", "a100-0") in passed
    metrics = [r for r in records(run, "metrics.jsonl") if r["benchmark"] == "fabric"]
    pairs = {r["node"]: r for r in metrics if r["metric"] == "pair_busbw_gbps" and '"retest": false' in r["parameters"]}
    assert len(pairs) == 6, sorted(pairs)          # five nodes: three rounds of two pairs, two partners each
    assert all('"transport": "TCP (gloo)"' in r["parameters"] for r in pairs.values()), pairs
    (bad_nodes,) = [r for r in metrics if r["metric"] == "bad_nodes"]
    assert '"names": "a100-4"' in bad_nodes["parameters"]

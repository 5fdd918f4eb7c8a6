"""All-reduce: no bandwidth with one rank, per-node figures and straggler detection (CPU, gloo).

The multi-rank tests start 3-4 local processes of workloads/allreduce.py with simulated
nodes (``--ranks-per-node``) and slow one rank with the test-only GPUPROOF_TEST_SLOW_RANK.
"""

import json
import os
import subprocess
import sys

import pytest

from gpuproof.bench import get
from gpuproof.bench.workloads import import_workload, workloads_dir

allreduce = import_workload("allreduce")

BANDWIDTH_METRICS = {"algbw_gbps", "busbw_gbps", "avg_busbw_gbps", "max_busbw_gbps",
                     "node_intra_busbw_gbps", "node_inter_busbw_gbps"}


def run_allreduce(*args, slow_rank=None, slow_ms=40, timeout=240):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop(allreduce.SLOW_RANK_ENV, None)
    if slow_rank is not None:
        env[allreduce.SLOW_RANK_ENV] = str(slow_rank)
        env[allreduce.SLOW_MS_ENV] = str(slow_ms)
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"):
        env.pop(k, None)
    cmd = [sys.executable, str(workloads_dir() / "allreduce.py"), "--device", "cpu", "--threads", "1",
           "--sample-hz", "0", "--iters", "3", "--warmup", "1", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


# ---------------------------------------------------------------- pure functions


def test_ring_pairs():
    assert allreduce.ring_pairs(1) == []
    assert allreduce.ring_pairs(2) == [(0, 1)]
    assert allreduce.ring_pairs(3) == [(0, 1), (1, 2), (0, 2)]
    assert allreduce.ring_pairs(4) == [(0, 1), (1, 2), (2, 3), (0, 3)]


def test_find_stragglers_by_hand():
    # median of 100, 98, 60, 101 = 99; 80 % of it = 79.2: only c (60) is below
    found = allreduce.find_stragglers({"a": 100.0, "b": 98.0, "c": 60.0, "d": 101.0})
    assert list(found) == ["c"] and "below 80% of the median 99" in found["c"]
    # the threshold is a parameter: at 50 % (49.5) nobody is a straggler
    assert allreduce.find_stragglers({"a": 100.0, "b": 98.0, "c": 60.0, "d": 101.0}, pct=50) == {}
    assert allreduce.find_stragglers({"a": 1.0, "b": None}) == {}  # one figure: nothing to compare


def test_mark_stragglers_names_the_node_and_the_figure():
    rows = [{"node": "n0", "intra_busbw_gbps": 400.0, "inter_busbw_gbps": 40.0},
            {"node": "n1", "intra_busbw_gbps": 150.0, "inter_busbw_gbps": 41.0},
            {"node": "n2", "intra_busbw_gbps": 390.0, "inter_busbw_gbps": 39.0}]
    names, notes = allreduce.mark_stragglers(rows, 80.0)
    assert names == ["n1"] and notes == []
    assert rows[1]["straggler"] and "intra-node busbw" in rows[1]["straggler_reason"]
    assert not rows[0]["straggler"] and rows[0]["straggler_reason"] is None


# ---------------------------------------------------------------- one rank


@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_one_rank_records_no_bandwidth_and_says_why():
    result, err = run_allreduce("--sizes", "8,1K")
    assert result["ok"] and result["world_size"] == 1
    assert result["avg_busbw_gbps"] is None and result["max_busbw_gbps"] is None
    assert all(r["algbw_gbps"] is None and r["busbw_gbps"] is None for r in result["results"])
    assert result["no_bandwidth_reason"].startswith("1 rank: no data moves")
    assert "no bandwidth" in err
    records = get("allreduce").to_records(result, node="n", product="P")
    assert not BANDWIDTH_METRICS & {r.metric for r in records}
    why = [r for r in records if r.metric == "no_bandwidth"]
    assert len(why) == 1 and why[0].parameters["reason"] == result["no_bandwidth_reason"]
    assert any(r.metric == "time_us" for r in records)  # the call's time is still a measurement


# ---------------------------------------------------------------- several nodes (simulated)


@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_three_nodes_one_slow_rank_is_named_straggler():
    result, err = run_allreduce("--nproc", "3", "--ranks-per-node", "1", "--sizes", "4K", "--node-bytes", "64K",
                                slow_rank=2)
    assert result["ok"] and result["nnodes"] == 3
    nodes = {n["index"]: n for n in result["nodes"]}
    assert all(nodes[i]["inter_busbw_gbps"] > 0 and nodes[i]["intra_busbw_gbps"] is None for i in nodes)
    slow = nodes[2]["node"]
    assert slow.endswith("-node2")
    assert result["stragglers"] == [slow], result["nodes"]
    assert nodes[2]["straggler"] and "inter-node" in nodes[2]["straggler_reason"]
    assert "STRAGGLER" in err
    # every node's figure is reported, and each pair once per side
    assert set(nodes[0]["pairs"]) == {nodes[1]["node"], nodes[2]["node"]}
    records = get("allreduce").to_records(result, node="3 nodes", product="cpu")
    inter = {r.node: r.value for r in records if r.metric == "node_inter_busbw_gbps"}
    assert set(inter) == {n["node"] for n in result["nodes"]}
    flagged = {r.node for r in records if r.metric == "straggler" and r.value == 1.0}
    assert flagged == {slow}
    (count,) = [r for r in records if r.metric == "stragglers"]
    assert count.value == 1 and count.parameters["names"] == slow and count.node == "3 nodes"


@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_two_nodes_of_two_ranks_intra_node_straggler():
    result, _ = run_allreduce("--nproc", "4", "--ranks-per-node", "2", "--sizes", "4K", "--node-bytes", "64K",
                              slow_rank=3)
    assert result["nnodes"] == 2 and result["world_size"] == 4
    nodes = {n["index"]: n for n in result["nodes"]}
    assert nodes[0]["ranks"] == [0, 1] and nodes[1]["ranks"] == [2, 3]
    assert nodes[0]["intra_busbw_gbps"] > nodes[1]["intra_busbw_gbps"] > 0
    assert result["stragglers"] == [nodes[1]["node"]]
    assert "intra-node" in nodes[1]["straggler_reason"]
    assert any("2 nodes" in n for n in result["straggler_notes"])  # one pair: inter-node cannot tell


@pytest.mark.parametrize("bad", [["--nproc", "3", "--ranks-per-node", "2"], ["--straggler-pct", "0"]])
@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_bad_node_arguments(bad):
    p = subprocess.run([sys.executable, str(workloads_dir() / "allreduce.py"), "--device", "cpu", *bad],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and json.loads(p.stdout.strip().splitlines()[-1])["ok"] is False

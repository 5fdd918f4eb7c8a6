"""The fabric suite's pairs on replay nodes (issue #50 item 5, fleet scale): each pair's pod ``-0`` returns a recording
of the real pair workload with the pair's own node names, one link (``replaySlowLink``) the pair recorded over a link
shaped by the kernel; benchmarks/fabric_scale.py runs the same at 1,000 nodes (benchmarks/FABRIC.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuproof import vocab
from gpuproof.errors import FleetError
from gpuproof.sim import replay
from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim.stages import kwok_config

H100 = {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}
NODES, LINK = 5, (0, 4)                     # h100-0 and h100-4: a pair of the default schedule (its second round)
FLEET = {"name": "fab5", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
         "pools": [{"name": "h100", "count": NODES, "backend": "replay", "instanceType": "p5.48xlarge",
                    "gpu": dict(H100), "faults": [{"node": LINK[0], "replaySlowLink": LINK[1]}]}]}
LINK_NAME = "h100-0<->h100-4"


def _fleet(**fault):
    pool = {**FLEET["pools"][0], "faults": [fault]} if fault else FLEET["pools"][0]
    return {**FLEET, "pools": [pool]}


def test_the_recorder_runs_the_pair_as_the_suite_does():
    """The simulator may not import gpuproof.bench: the recorder's arguments are held equal to the suite's here."""
    from gpuproof.bench import fabric, fabric_plan
    from gpuproof.bench.base import flag_args
    from gpuproof.sim import replay_record

    pair, _ = fabric.params_for("cpu")
    assert replay_record.FABRIC_ARGS == flag_args(pair, fabric.FLAGS) + ["--no-per-node"]
    assert fabric_plan.pair_rounds is vocab.pair_rounds            # one schedule, re-exported
    pod = fabric.fabric_pods("fab-x", ["a", "b"], replay_record.FABRIC_ARGS,
                             fabric.PodPlan(image="img", gpus=1, device="cpu"), labels={}, namespace="ns")[1]
    command = pod["spec"]["containers"][0]["command"][-1]
    for word in replay_record.fabric_argv(0)[1:]:
        if not word.startswith(("--master-addr", "workloads/")):
            assert word in command.split(), (word, command)


@pytest.mark.parametrize("count", [2, 5, 8, 11])
def test_the_schedule_computes_only_the_rounds_it_needs(count):
    nodes = [f"n{i}" for i in range(count)]
    every = vocab.circle_rounds(sorted(nodes))
    assert vocab.pair_rounds(nodes) == every[:vocab.default_rounds(count)]
    assert vocab.pair_rounds(nodes, every_pair=True) == every and vocab.pair_rounds(nodes, rounds=1) == every[:1]


@pytest.mark.parametrize("pool, fault, field, words", [
    ({"backend": "kwok"}, {"node": 0, "replaySlowLink": 4}, "faults[0].replaySlowLink", "is for replay nodes"),
    ({}, {"replaySlowLink": 4}, "faults[0].replaySlowLink", "name the fault's node"),
    ({}, {"node": 0, "replaySlowLink": 0}, "faults[0].replaySlowLink", "and not it"),
    ({}, {"node": 0, "replaySlowLink": 9}, "faults[0].replaySlowLink", "below 5"),
    ({}, {"node": 0, "replaySlowLink": "h100-4"}, "faults[0].replaySlowLink", "index of another node"),
    ({}, {"node": 0, "replaySlowLink": 1}, "faults[0].replaySlowLink", "never pairs h100-0 with h100-1"),
])
def test_a_replay_slow_link_is_refused_naming_the_field(pool, fault, field, words):
    bad = {**FLEET["pools"][0], **pool, "faults": [fault]}
    with pytest.raises(FleetError) as err:
        parse_fleet({"name": "r", "pools": [bad]}, source="r.yaml")
    assert field in str(err.value) and words in str(err.value), str(err.value)


def test_the_refusal_names_the_partners_the_schedule_gives():
    with pytest.raises(FleetError) as err:
        parse_fleet(_fleet(node=0, replaySlowLink=1), source="r.yaml")
    partners = {b if a == "h100-0" else a for r in vocab.pair_rounds([f"h100-{i}" for i in range(NODES)])
                for a, b in r if "h100-0" in (a, b)}
    assert all(f"({p})" in str(err.value) for p in partners), str(err.value)


def _result(path: Path) -> dict:
    line = [x for x in path.read_text().splitlines() if " stdout F {" in x][-1]
    return json.loads(line.split(" F ", 1)[1])


def test_every_scheduled_pair_returns_a_recording_under_its_own_nodes(tmp_path):
    fleet = parse_fleet(FLEET, source="fab5.yaml")
    recs = replay.load()
    if not recs.of("fabric"):
        pytest.skip("no fabric recordings: python -m gpuproof.sim.replay_record --fabric")
    logs = replay.node_logs(fleet, tmp_path)
    names = fleet.pools[0].node_names()
    schedule = [p for r in vocab.pair_rounds(names) for p in r]
    slow_busbw = _result(recs.of("fabric", "slow")[0].path)["at_size"]["all_reduce"]["busbw_gbps"]
    for pair in schedule:
        pod = f"{vocab.fabric_job(pair)}-0"          # the suite's pod 0 of the pair (its nodes sorted)
        text = logs[pod].read_text()
        result = _result(logs[pod])
        assert result["node_names"] == list(pair) and result["host"] == pod, (pair, result["node_names"])
        assert not any(n in text for n in replay_record_nodes()), pod
        busbw = result["at_size"]["all_reduce"]["busbw_gbps"]
        assert (busbw == slow_busbw) == (pair == ("h100-0", "h100-4")), (pair, busbw)
    # the pairs the suite may measure again (either node of the slow link with any other): normal recordings
    again = [p for p in logs if p.endswith("-again-0")]
    assert len(again) == 2 * (NODES - 2)
    assert all(_result(logs[p])["at_size"]["all_reduce"]["busbw_gbps"] != slow_busbw for p in again)
    # kwok serves each from the fabric container and completes both pods of each pair
    docs = list(yaml.safe_load_all(kwok_config(fleet, logs)))
    by_pod = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ClusterLogs"}
    assert by_pod[f"{vocab.fabric_job(('h100-0', 'h100-4'))}-0"]["spec"]["logs"][0]["containers"] == ["fabric"]
    stage = next(d for d in docs if d["kind"] == "Stage" and d["metadata"]["name"].startswith("pod-replay-complete"))
    names = next(e["values"] for e in stage["spec"]["selector"]["matchExpressions"] if e["key"] == ".metadata.name")
    assert {f"{vocab.fabric_job(p)}-{i}" for p in schedule for i in (0, 1)} <= set(names)


def replay_record_nodes() -> tuple[str, ...]:
    from gpuproof.sim.replay_record import FABRIC_NODES

    return FABRIC_NODES


@pytest.mark.sim
def test_the_fabric_suite_names_the_slow_link_on_replay_nodes(tmp_path):
    """gpuproof's fabric pair check against 5 replay nodes: every pair's result read from its pod's log through the
    API server; the slow link fails fabric-link, each of its nodes measured again with a known-good node, and no node
    fails."""
    if not replay.load().of("fabric"):
        pytest.skip("no fabric recordings: python -m gpuproof.sim.replay_record --fabric")
    fleet = tmp_path / "fab5.yaml"
    fleet.write_text(yaml.safe_dump(FLEET))
    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--fleet", str(fleet), "--report-dir",
                           str(reports), "--run-id", "f5", "--only-bench", "-k", "fabric_pairs"],
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    checks = [json.loads(x) for x in (reports / "f5" / "checks.jsonl").read_text().splitlines()]
    failed = {(c["check"], c["target"]) for c in checks if c["verdict"] == "fail"}
    assert failed == {("fabric-link", LINK_NAME)}, [c for c in checks if c["verdict"] == "fail"]
    link = next(c for c in checks if (c["check"], c["target"]) == ("fabric-link", LINK_NAME))
    assert "0.00231 GB/s" in link["actual"] and "known-good node" in link["actual"], link
    passed = {(c["check"], c["target"]) for c in checks if c["verdict"] == "pass"}
    assert {("fabric-node", f"h100-{i}") for i in range(NODES)} <= passed, checks
    metrics = [json.loads(x) for x in (reports / "f5" / "metrics.jsonl").read_text().splitlines()]
    fab = {m["metric"]: m for m in metrics if m["benchmark"] == "fabric" and m["node"] == f"{NODES} nodes"}
    assert fab["bad_links"]["value"] == 1 and fab["bad_nodes"]["value"] == 0, fab
    retests = [m for m in metrics if m["benchmark"] == "fabric" and m["metric"] == "pair_busbw_gbps"
               and json.loads(m["parameters"])["retest"]]
    assert len(retests) == 2, retests                # each node of the slow link, with a known-good node

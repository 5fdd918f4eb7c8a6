"""Replay nodes' pods at real latencies, and the pods they cannot serve (issue #52 item 2).

A replay pool's ``replayLatency: {startS, runS}`` becomes kwok Stage delays: each pod on its nodes is Running no
sooner than ``startS`` after it was created, a replayed one Succeeded no sooner than ``runS`` after it started. A
gpuproof workload pod (label ``gpuproof.dev/component``) that no recording serves fails at once, saying so: a per-node
check that starts a pod replay nodes cannot serve fails, rather than waiting out its deadline there. Other pods run
on, as on any kwok node."""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from gpuproof.errors import FleetError
from gpuproof.sim import replay
from gpuproof.sim.fleet_file import parse_fleet
from gpuproof.sim.stages import UNSERVED_REASON, pod_stages
from gpuproof.vocab import COMPONENT_LABEL

H100 = {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}
START_S, RUN_S = 3, 4
FLEET = {"name": "lat2", "pools": [{"name": "h100", "count": 2, "backend": "replay", "gpu": dict(H100),
                                    "replayLatency": {"startS": START_S, "runS": RUN_S}}]}


def test_the_latencies_are_kwok_stage_delays_on_the_pools_nodes_only():
    fleet = parse_fleet(FLEET, source="lat2.yaml")
    assert fleet.pools[0].replay_latency.start_s == START_S and fleet.pools[0].replay_latency.run_s == RUN_S
    stages = {s["metadata"]["name"]: s["spec"] for s in pod_stages(fleet, ["bench-health-h100-0"])}
    start, done = stages["pod-replay-start-h100"], stages["pod-replay-complete-h100"]
    assert start["delay"] == {"durationMilliseconds": 3000, "jitterDurationMilliseconds": 3300}
    assert done["delay"]["durationMilliseconds"] == 4000
    for spec in (start, done, stages["pod-replay-unserved-h100"]):
        assert spec["weight"] == 1          # over kwok's pod-ready and pod-complete for the same pods
        assert {"key": ".spec.nodeName", "operator": "In", "values": ["h100-0", "h100-1"]} in \
            spec["selector"]["matchExpressions"]
    unserved = stages["pod-replay-unserved-h100"]["selector"]["matchExpressions"]
    assert {"key": f'.metadata.labels.["{COMPONENT_LABEL}"]', "operator": "Exists"} in unserved
    assert {"key": ".metadata.name", "operator": "NotIn", "values": ["bench-health-h100-0"]} in unserved
    # without latencies: no start stage, completion at once
    plain = parse_fleet({**FLEET, "pools": [{k: v for k, v in FLEET["pools"][0].items() if k != "replayLatency"}]},
                        source="p.yaml")
    names = {s["metadata"]["name"]: s["spec"] for s in pod_stages(plain, ["x"])}
    assert "pod-replay-start-h100" not in names and "delay" not in names["pod-replay-complete-h100"]


@pytest.mark.parametrize("pool, field, words", [
    ({"backend": "kwok"}, "replayLatency", "is for replay nodes"),
    ({"replayLatency": {"startS": -1}}, "replayLatency.startS", "from 0 to 3600"),
    ({"replayLatency": {"runS": "20s"}}, "replayLatency.runS", "a string '20s'"),
    ({"replayLatency": {"start": 2}}, "replayLatency", "start"),
])
def test_a_bad_latency_is_refused_naming_the_field(pool, field, words):
    bad = {**FLEET["pools"][0], **pool}
    with pytest.raises(FleetError) as err:
        parse_fleet({"name": "r", "pools": [bad]}, source="r.yaml")
    assert field in str(err.value) and words in str(err.value), str(err.value)


def _pod(name: str, node: str, component: str | None) -> dict:
    labels = {COMPONENT_LABEL: component} if component else {}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}], "restartPolicy": "Never",
                     "containers": [{"name": replay.CONTAINER, "image": replay.PAUSE}]}}


def _at(text) -> dt.datetime:
    return text if isinstance(text, dt.datetime) else dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))


@pytest.mark.sim
def test_replayed_pods_take_their_latency_and_an_unserved_workload_pod_fails_at_once(embedded, tmp_path):
    from gpuproof.cluster.api import watch_until

    if replay.load() is None:
        pytest.skip("no replay recordings: python -m gpuproof.sim.replay_record")
    with embedded.fleet_loaded(FLEET):
        core = embedded.client.core
        ns = "gpuproof-replay-latency"
        core.create_namespace({"metadata": {"name": ns}})
        try:
            served = replay.pod_names("h100-0")["health"]
            pods = {served: _pod(served, "h100-0", "health"),
                    "access-nope-h100-1": _pod("access-nope-h100-1", "h100-1", "access"),     # no recording
                    "plain-h100-1": _pod("plain-h100-1", "h100-1", None)}                     # not a workload
            for body in pods.values():
                core.create_namespaced_pod(ns, body)
            seen: dict[str, object] = {}
            lock = threading.Lock()

            def settled(cache: dict) -> bool:
                with lock:
                    seen.update(cache)
                by = {p.metadata.name: p for p in cache.values()}
                return (by.get(served) is not None and by[served].status.phase == "Succeeded"
                        and by.get("access-nope-h100-1") is not None
                        and by["access-nope-h100-1"].status.phase == "Failed"
                        and by.get("plain-h100-1") is not None and by["plain-h100-1"].status.phase == "Running")

            watch_until(core.list_namespaced_pod, settled, 60, "the three pods on replay nodes to settle",
                        namespace=ns)
            by = {p.metadata.name: p for p in seen.values()}
            ok = by[served]
            term = ok.status.container_statuses[0].state.terminated
            created = _at(ok.metadata.creation_timestamp)
            assert (_at(ok.status.start_time) - created).total_seconds() >= START_S - 1, ok.status
            assert (_at(term.finished_at) - _at(ok.status.start_time)).total_seconds() >= RUN_S - 1, ok.status
            bad = by["access-nope-h100-1"]
            assert bad.status.reason == UNSERVED_REASON and "no recording" in bad.status.message, bad.status
            assert by["plain-h100-1"].status.phase == "Running"
        finally:
            core.delete_namespace(ns)

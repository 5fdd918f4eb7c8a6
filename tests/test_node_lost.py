"""A node lost mid-run (issue #41 item 4): deleted, or turned NotReady, while a run judges it.

Unit: which nodes the node watch takes as lost, and when a pod wait names one. Server: a check that meets a lost node
is a skip 'not judged' naming it, in pytest's report and in JUnit. Cluster: a pod wait on a kwok node deleted under it
ends at once (not at its deadline); and `gpuproof run` with a node deleted while its checks run ends with exit 75,
one line naming the node, the whole report, the other nodes judged and the lost node's checks not judged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from kubernetes import client as k8s

from gpuproof.cluster.nodewatch import NodeLoss, pod_node, raise_if_node_lost
from gpuproof.errors import ApiUnreachable, NodeLost


def node(name: str, ready: str = "True", reason: str = "KubeletReady", message: str = "") -> dict:
    return {"metadata": {"name": name},
            "status": {"conditions": [{"type": "Ready", "status": ready, "reason": reason, "message": message}]}}


# ------------------------------------------------------------------------------ unit


def test_a_deleted_or_not_ready_node_is_lost_once_and_stays_lost():
    loss = NodeLoss([node("a"), node("b"), node("c", "False")])
    assert loss.observe("MODIFIED", node("a")) == ""                  # a heartbeat
    assert loss.observe("DELETED", node("a"), clock="10:00:01Z") == "node a was deleted during the run (at 10:00:01Z)"
    assert loss.observe("MODIFIED", node("b", "Unknown", "NodeStatusUnknown", "Kubelet stopped posting node status."),
                        clock="10:00:02Z") == ("node b went NotReady at 10:00:02Z (Ready=Unknown (NodeStatusUnknown: "
                                               "Kubelet stopped posting node status.))")
    assert loss.observe("MODIFIED", node("b")) == "" and loss.reason("b").startswith("node b went NotReady")
    assert loss.observe("ADDED", node("a")) == "" and loss.reason("a")  # re-created: still the node that was lost
    # NotReady from the start: the nodes suite fails it; it is not lost. A node that joins later is not watched
    assert loss.observe("MODIFIED", node("c", "False")) == "" and loss.observe("DELETED", node("d")) == ""
    assert sorted(loss.snapshot()) == ["a", "b"]


def test_a_relist_after_a_cut_watch_finds_the_nodes_deleted_meanwhile():
    loss = NodeLoss([node("a"), node("b"), node("c")])
    assert loss.relisted([node("a"), node("c", "False")], clock="10:00:03Z") == [
        "node c went NotReady at 10:00:03Z (Ready=False (KubeletReady))",
        "node b was deleted during the run (at 10:00:03Z)"]
    assert loss.relisted([node("a")]) == []                         # c is lost already; said once


def _pod(name: str, bound: str = "", pinned: str = "") -> k8s.V1Pod:
    affinity = None
    if pinned:
        term = k8s.V1NodeSelectorTerm(match_fields=[k8s.V1NodeSelectorRequirement(
            key="metadata.name", operator="In", values=[pinned])])
        affinity = k8s.V1Affinity(node_affinity=k8s.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=k8s.V1NodeSelector(node_selector_terms=[term])))
    return k8s.V1Pod(metadata=k8s.V1ObjectMeta(name=name),
                     spec=k8s.V1PodSpec(containers=[], node_name=bound or None, affinity=affinity))


class _Cluster:
    def __init__(self, loss: NodeLoss):
        self.nodewatch = loss


def test_a_pod_wait_names_the_lost_node_its_pod_is_bound_or_pinned_to_even_once_the_pod_is_gone():
    assert pod_node(_pod("p", bound="a")) == "a" and pod_node(_pod("p", pinned="b")) == "b"
    assert pod_node(_pod("p")) == ""
    loss = NodeLoss([node("a"), node("b")])
    cluster, seen = _Cluster(loss), {}
    raise_if_node_lost(cluster, {"p": _pod("p", bound="a"), "q": _pod("q", pinned="b")}, seen, "pod p to finish")
    loss.observe("DELETED", node("a"), clock="10:00:04Z")
    with pytest.raises(NodeLost, match=r"^node a was deleted during the run \(at 10:00:04Z\); gave up waiting for "
                                       r"pod p on it: pod p to finish$") as err:
        raise_if_node_lost(cluster, {}, seen, "pod p to finish")      # the pod went with its node: still named
    assert err.value.node == "a" and isinstance(err.value, ApiUnreachable)
    raise_if_node_lost(object(), {"p": _pod("p", bound="a")}, {}, "x")  # no node watch: nothing to say


@pytest.mark.parametrize("suite, work", [("test_health", "health_pod"), ("test_census", "census_pod")])
def test_a_node_lost_under_a_health_or_census_pod_is_no_pod_error(monkeypatch, suite, work):
    """The health and census pods turn a pod's errors into a failed check ('pod_error'); a NodeLost (an
    ApiUnreachable) goes through to the plugin instead, which makes the node's check a skip 'not judged'."""
    import contextlib
    import importlib
    from types import SimpleNamespace

    mod = importlib.import_module(f"gpuproof.suites.{suite}")

    class Bench:
        timeout_s = 60

        def params(self, *args, **kwargs):
            return {}

        def run_in_cluster(self, *args, **kwargs):
            raise NodeLost("h100-1", "node h100-1 was deleted during the run (at 10:00:05Z)", "pod p to finish")

    monkeypatch.setattr(mod.bench_checks, "node_gpus", lambda discovery, name, all_gpus: ("nvidia.com/gpu", 8))
    monkeypatch.setattr(mod.bench_checks, "device", lambda run: "cpu")
    monkeypatch.setattr(mod.bench_checks, "image", lambda run: "img")
    monkeypatch.setattr(mod, "free_on", lambda cluster, node, resource: 8)
    monkeypatch.setattr(mod, "get", lambda name: Bench())
    target = SimpleNamespace(cluster=None, timeout=lambda s: s)
    lane = SimpleNamespace(pods=lambda n: contextlib.nullcontext())
    node = SimpleNamespace(name="h100-1", product="NVIDIA-H100-80GB-HBM3", taints=[])
    with pytest.raises(NodeLost, match="node h100-1 was deleted during the run"):
        getattr(mod, work)(None, target, None, node, lane)


# ------------------------------------------------------------------------------ the plugin


@pytest.mark.server  # tier: pytest as a process, with gpuproof's plugin
def test_a_check_that_meets_a_lost_node_is_not_judged(tmp_path):
    (tmp_path / "test_lost.py").write_text(
        "from gpuproof.errors import NodeLost\n\n\n"
        "def test_on_the_lost_node():\n"
        "    raise NodeLost('a100-1', 'node a100-1 was deleted during the run (at 10:00:00Z)', 'pod p to finish')\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_lost.py", "-q", "-rs", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--junitxml={tmp_path / 'junit.xml'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "1 skipped" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-3000:]
    said = "not judged: node a100-1 was deleted during the run (at 10:00:00Z); gave up waiting for pod p to finish"
    assert said in proc.stdout, proc.stdout[-3000:]
    assert f'<skipped type="pytest.skip" message="{said}' in (tmp_path / "junit.xml").read_text()


# ------------------------------------------------------------------------------ the embedded cluster

# two kwok L4 nodes: a pod held on each, one node deleted under a wait on its pod
HELD = {"name": "lost-held", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
        "pools": [{"name": "l4", "count": 2, "gpu": {"product": "NVIDIA-L4", "count": 1}}]}


def _waiter(fn, entered: threading.Event, out: dict, key: str) -> threading.Thread:
    def go():
        try:
            out[key] = fn()
        except Exception as exc:          # noqa: BLE001  (the outcome the test asserts)
            out[key] = exc
        out[f"{key}_ended"] = time.monotonic()

    t = threading.Thread(target=go, name=f"wait-{key}", daemon=True)
    t.start()
    return t


def _not_ready(cluster, name: str) -> None:
    """The node's Ready condition made False, as the node lifecycle controller or a kubelet would (the test's doing:
    kwok's heartbeat may make it True again; the node stays lost)."""
    import datetime as dt

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster.core.patch_node_status(name, {"status": {"conditions": [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "turned NotReady by the test",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}})


@pytest.mark.parametrize("fault", ["deleted", "not_ready"])
def test_a_pod_wait_on_a_node_lost_under_it_ends_at_once_naming_it(embedded, fault):
    """Run.wait_pods (one watch per wait) and PodWatch (the fan-out's shared watch) both wait for a pod on a kwok node
    to finish (it never does: deadline 300 s); the node is deleted, or turned NotReady: both end within seconds with
    NodeLost naming it, and the pod on the other node is still waited on as before. The fleet is loaded for the test,
    and the mixed fleet comes back when the cluster is next used (conftest's fleet_loaded)."""
    from gpuproof.cluster.api import Run, connect
    from gpuproof.cluster.nodewatch import watch_nodes
    from gpuproof.cluster.podwatch import PodWatch
    from gpuproof.plugin.checks import TOLERATE_ALL, pod
    from gpuproof.results import new_run_id

    finished = ("Succeeded", "Failed")
    with embedded.fleet_loaded(HELD):
        cluster = connect(embedded.kubeconfig)
        watcher = watch_nodes(cluster, cluster.node_dicts())
        run = Run(cluster, "lost" + new_run_id()[-6:])
        run.create()
        shared = None
        try:
            for name, on in (("held-0", "l4-0"), ("held-1", "l4-1")):
                run.apply(pod(name, {"nvidia.com/gpu": 1}, node=on, tolerations=TOLERATE_ALL, labels={"t": "held"}))
            run.wait_pods(lambda c: all(n in c and c[n].status.phase == "Running" for n in ("held-0", "held-1"))
                          or None, 60, "both held pods to run")
            shared = PodWatch(run, "t=held")
            out: dict = {}
            in_run, in_shared = threading.Event(), threading.Event()
            threads = [
                _waiter(lambda: run.wait_pod("held-0", lambda p: in_run.set() or p.status.phase in finished, 300,
                                             "to finish"), in_run, out, "run"),
                _waiter(lambda: shared.wait("held-0", lambda p: in_shared.set() or (
                    p is not None and p.status.phase in finished), 300, "to finish"), in_shared, out, "shared")]
            assert in_run.wait(60) and in_shared.wait(60), "the waits never looked at their pod"
            deleted = time.monotonic()
            if fault == "deleted":
                cluster.core.delete_node("l4-0")      # the test's doing: gpuproof never deletes a node
            else:
                _not_ready(cluster, "l4-0")
            for t in threads:
                t.join(60)
            for key in ("run", "shared"):
                exc = out.get(key)
                assert isinstance(exc, NodeLost) and exc.node == "l4-0", (key, exc)
                said = ("node l4-0 was deleted during the run (at " if fault == "deleted" else
                        "node l4-0 went NotReady at ")
                assert str(exc).startswith(said), str(exc)
                if fault == "not_ready":
                    assert "(Ready=False (KubeletNotReady: turned NotReady by the test))" in str(exc), str(exc)
                assert "gave up waiting for pod held-0 on it: pod " in str(exc), str(exc)
                assert out[f"{key}_ended"] - deleted < 15, (key, out[f"{key}_ended"] - deleted)   # not at 300 s
            assert watcher.reason("l4-0") and not watcher.reason("l4-1")
            # the other node goes on: its pod is still there, Running, and waited on as before
            assert run.wait_running("held-1", 30).spec.node_name == "l4-1"
        finally:
            if shared is not None:
                shared.close()
            watcher.stop()
            run.cleanup(wait=True, timeout=120)
        assert run.run_id not in cluster.leftover_runs()


# three replay nodes: their health, census and topology pods run (kwok serves recorded logs), one node at a time
REPLAY = {"name": "lost-replay", "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
          "pools": [{"name": "h100", "count": 3, "backend": "replay", "instanceType": "p5.48xlarge",
                     "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}}]}
VICTIM = "h100-1"


def test_a_node_deleted_while_its_checks_run_is_named_and_not_judged(embedded, tmp_path):
    """`gpuproof run` (census, health, labels and node checks; one pod in flight) against three replay nodes; the
    moment the census's first pod is on h100-0, h100-1 is deleted (by the test). The run ends with exit 75 and one line
    naming h100-1; summary.md, report.html, parquet and junit.xml are written and name it; h100-0 and h100-2 are
    judged, before and after the loss; every check on h100-1 from the loss on is a skip 'not judged' with the reason;
    nothing failed; and after `gpuproof clean` nothing of the run is left."""
    import datetime as dt

    from gpuproof.cluster.api import connect, watch_until
    from gpuproof.errors import WaitTimeout

    reports, rid = tmp_path / "reports", "lost"
    with embedded.fleet_loaded(REPLAY):
        kubeconfig = embedded.kubeconfig
        cluster = connect(kubeconfig)
        proc = subprocess.Popen([sys.executable, "-m", "gpuproof", "run", "--kubeconfig", kubeconfig, "--report-dir",
                                 str(reports), "--run-id", rid, "--parallel", "1",
                                 "-k", "census or health or labels or test_nodes", "--", "--no-lease"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            try:                          # or until the run ended before: then what it said is the failure
                watch_until(cluster.core.list_namespaced_pod,
                            lambda c: proc.poll() is not None or any(p.spec.node_name == "h100-0" for p in c.values()),
                            300, "the run's first census pod to be bound to h100-0", tick=2,
                            namespace=f"gpuproof-{rid}")
            except WaitTimeout:
                proc.kill()
            if proc.poll() is not None:
                raise AssertionError(
                    f"the run never placed its census pod on h100-0:\n{proc.communicate()[0][-5000:]}")
            lost_at = dt.datetime.now(dt.timezone.utc)
            cluster.core.delete_node(VICTIM)          # the test's doing: gpuproof never deletes a node
            out, _ = proc.communicate(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        clean = subprocess.run([sys.executable, "-m", "gpuproof", "clean", "--kubeconfig", kubeconfig],
                               capture_output=True, text=True, timeout=300)
        left = cluster.leftover_runs()
    (tmp_path / "run.out").write_text(out)            # what the run said, kept beside its report
    assert proc.returncode == 75, out[-5000:]
    assert "internal error" not in out and "Traceback" not in out, out[-5000:]
    said = [line for line in out.splitlines() if line.startswith(f"gpuproof: run {rid} cut short:")]
    assert len(said) == 1 and f"node {VICTIM} was deleted during the run (at " in said[0] \
        and "its checks are not judged" in said[0] and "gpuproof clean" in said[0], out[-3000:]
    run = reports / rid
    for name in ("summary.md", "report.html", "checks.parquet", "junit.xml", "run.json"):
        assert (run / name).exists(), name
    meta = json.loads((run / "run.json").read_text())
    assert f"cut short: node {VICTIM} was deleted during the run" in meta["outcome"], meta["outcome"]
    assert list(meta["extra"]["lost_nodes"]) == [VICTIM]
    summary = (run / "summary.md").read_text()
    assert "Nodes lost during the run (1)" in summary and f"`{VICTIM}`: node {VICTIM} was deleted" in summary
    checks = [json.loads(line) for line in (run / "checks.jsonl").read_text().splitlines()]
    assert not [c for c in checks if c["verdict"] == "fail"], [c for c in checks if c["verdict"] == "fail"]
    for other in ("h100-0", "h100-2"):              # the other nodes are judged, census and health included
        judged = {c["feature"] for c in checks if c["target"] == other and c["verdict"] == "pass"}
        assert {"census", "health", "labels", "nodes"} <= judged, (other, judged)
    after = [c for c in checks if c["target"] == VICTIM and dt.datetime.fromisoformat(c["ts"]) >= lost_at]
    assert after and all(c["verdict"] == "skip" and c["message"].startswith(f"not judged: node {VICTIM} was deleted")
                         for c in after), after
    assert {"census", "health", "labels", "nodes"} <= {c["feature"] for c in after}, after
    junit = (run / "junit.xml").read_text()
    for test in ("test_health_per_node", "test_node_ready"):
        case = junit.split(f'name="{test}[{VICTIM}]"', 1)[1].split("</testcase>", 1)[0]
        assert f'<skipped type="pytest.skip" message="not judged: node {VICTIM} was deleted' in case, case
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert rid not in left, left

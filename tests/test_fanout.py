"""The fan-out of per-node checks (issue #36): every node's work at once, never more than --parallel pods in flight,
each node's verdict its own test, a failing or skipped node affecting no other, the work of one check ended before
another check starts, everything stopped at the end; --parallel refused in one line; an image that cannot be pulled
ends its pod's wait after a bounded number of tries, naming image, node, reason and how to use a mirror."""

from __future__ import annotations

import threading
import types

import pytest

from gpuproof.errors import GpuproofError, WaitTimeout
from gpuproof.plugin.fanout import Budget, parse_parallel

pytest_plugins = ["pytester"]


@pytest.mark.parametrize("text", ["0", "-3", "two", "", "1.5"])
def test_parallel_that_is_not_a_positive_whole_number_is_one_line(text):
    with pytest.raises(GpuproofError) as err:
        parse_parallel(text)
    assert "--parallel" in str(err.value) and "\n" not in str(err.value)


def test_parallel_accepts_a_whole_number():
    assert parse_parallel("4") == 4 and parse_parallel(" 32 ") == 32


def test_the_budget_never_holds_more_pods_than_its_bound():
    budget, stop = Budget(3), threading.Event()
    seen, lock = [], threading.Lock()

    def worker(pods):
        with budget.take(pods, stop):
            with lock:
                seen.append(budget.in_flight)
            threading.Event().wait(0.01)

    threads = [threading.Thread(target=worker, args=(1 + i % 2,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert max(seen) <= 3 and budget.most <= 3 and budget.in_flight == 0
    with budget.take(7, stop):           # more pods than the bound: the node runs alone, never refused
        assert budget.in_flight == 3


# A suite of six per-node checks run by pytest in-process, with work that needs no cluster (its parameter is
# `node`, not `gpu_node`, which gpuproof parametrizes from a cluster): what the fan-out does
# is seen through what the work records (which ran at once, in which thread) and through each item's outcome.
SUITE = '''
import threading
import types

import pytest

from gpuproof.plugin import fanout as fo

NODES = [types.SimpleNamespace(name=f"n{i}") for i in range(6)]
LOG = {"running": 0, "most": 0, "ran": [], "threads": set(), "lines": []}
LOCK = threading.Lock()
BARRIER = threading.Barrier(int("{at_once}"), timeout=20)


@pytest.fixture(scope="session")
def fan(request):
    return fo.get(request.config, run=None, say=LOG["lines"].append)


def work(node, lane):
    with lane.pods(1):
        with LOCK:
            LOG["running"] += 1
            LOG["most"] = max(LOG["most"], LOG["running"])
            LOG["ran"].append(node.name)
            LOG["threads"].add(threading.current_thread().name)
        try:
            if node.name in ("n0", "n1", "n2"):
                BARRIER.wait()           # the first three meet: they ran at the same time, or this times out
        finally:
            with LOCK:
                LOG["running"] -= 1
    if node.name == "n3":
        raise fo.NodeSkip("health", "n3 has no free nvidia.com/gpu")
    if node.name == "n4":
        raise RuntimeError("the pod on n4 printed no JSON result")
    return {"node": node.name}


@pytest.mark.parametrize("node", NODES, ids=[n.name for n in NODES])
def test_per_node(node, fan, request):
    try:
        result = fan.result(request.node, node, work, name="health", member=lambda p: p.get("node"))
    except fo.NodeSkip as skip:
        pytest.skip(skip.reason)
    assert result == {"node": node.name}


def test_after(fan):
    job = next(iter(fan.jobs.values()))
    assert job.finished()
    assert LOG["most"] <= fan.parallel, LOG
    assert sorted(LOG["ran"]) == [n.name for n in NODES]
    assert "gpuproof-fanout" in " ".join(LOG["threads"])
    print("LINES", LOG["lines"])
'''


def run_suite(pytester, parallel: str, at_once: int):
    pytester.makepyfile(test_suite=SUITE.replace("{at_once}", str(at_once)))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", f"--parallel={parallel}", "-s",
                                        "--progress-after=0")


def test_every_node_runs_at_once_within_the_bound_and_each_keeps_its_own_verdict(pytester):
    result = run_suite(pytester, "3", at_once=3)
    result.assert_outcomes(passed=5, failed=1, skipped=1)
    out = result.stdout.str()
    assert "test_per_node[n4]" in out and "the pod on n4 printed no JSON result" in out
    assert "n3 has no free nvidia.com/gpu" in out
    assert "health: 6 nodes at once, at most 3 pods in flight" in out
    assert "health: 6 nodes in" in out and "slowest" in out


def test_one_pod_at_a_time_when_the_bound_is_one(pytester):
    # the suite's own last test holds the most pods ever in flight to --parallel: 1 here
    result = run_suite(pytester, "1", at_once=1)
    result.assert_outcomes(passed=5, failed=1, skipped=1)


def test_parallel_refused_by_the_plugin_in_one_line(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--parallel=none")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--parallel takes a whole number of pods in flight" in result.stderr.str()


DRAIN = '''
import threading
import types

import pytest

from gpuproof.plugin import fanout as fo

NODES = [types.SimpleNamespace(name=f"n{i}") for i in range(4)]
STATE = {"ran": [], "stopped": threading.Event(), "open": 0}


@pytest.fixture(scope="session")
def fan(request):
    return fo.get(request.config, run=None, say=lambda m: None)


def slow(node, lane):
    with lane.pods(1):
        STATE["open"] += 1
        STATE["ran"].append(node.name)
        lane.stop.wait(0.3)
        STATE["open"] -= 1
    return node.name


@pytest.mark.parametrize("node", NODES[:1], ids=["n0"])
def test_first_check_selects_one_node(node, fan, request):
    # only n0's item is selected: the job is n0 alone, however many nodes the suite knows
    assert fan.result(request.node, node, slow, name="probe", member=lambda p: p.get("node")) == "n0"
    assert [n.name for n in fan.jobs[request.node.function].members] == ["n0"]


@pytest.mark.parametrize("node", NODES, ids=[n.name for n in NODES])
def test_second_check(node, fan, request):
    if node.name == "n0":
        fan.result(request.node, node, slow, name="health", member=lambda p: p.get("node"))
        return
    pytest.skip("only n0 asks; the other nodes' work goes on in the background")


def test_third_check_starts_after_the_second_has_drained(fan):
    assert STATE["open"] == 0, "a pod of the earlier check was still running when this one started"
    health = [j for j in fan.jobs.values() if j.name == "health"][0]
    assert health.finished()
'''


def test_a_check_starts_only_after_earlier_checks_work_has_ended(pytester):
    pytester.makepyfile(test_drain=DRAIN)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--parallel=2", "--progress-after=0")
    result.assert_outcomes(passed=3, skipped=3)


STOP = '''
import threading
import types

import pytest

from gpuproof.plugin import fanout as fo

NODES = [types.SimpleNamespace(name=f"n{i}") for i in range(8)]
STARTED = []


@pytest.fixture(scope="session")
def fan(request):
    return fo.get(request.config, run=None, say=lambda m: None)


def hang(node, lane):
    with lane.pods(1):
        STARTED.append(node.name)
        if not lane.stop.wait(30):
            raise AssertionError("never stopped")
        raise RuntimeError("stopped")


@pytest.mark.parametrize("node", NODES, ids=[n.name for n in NODES])
def test_hangs(node, fan, request):
    if node.name == "n0":
        fan.result(request.node, node, lambda n, lane: (_ for _ in ()).throw(KeyboardInterrupt())
                   if n.name == "n0" else hang(n, lane), name="hang", member=lambda p: p.get("node"))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    fan = session.config.stash[fo._KEY]
    job = next(iter(fan.jobs.values()))
    assert fan.stop.is_set()
    assert all(f.done() for f in job.futures.values()), "a worker outlived the session"
    assert len(STARTED) <= 2
    print("STOPPED CLEANLY", sorted(STARTED))
'''


def test_ctrl_c_during_the_fan_out_stops_every_worker(pytester):
    pytester.makepyfile(test_stop=STOP)
    pytester.makeconftest("from test_stop import pytest_sessionfinish  # noqa: F401\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--parallel=2", "--progress-after=0", "-s",
                                          no_reraise_ctrlc=True)
    assert result.ret == pytest.ExitCode.INTERRUPTED
    assert "STOPPED CLEANLY" in result.stdout.str()


# -------------------------------------------------------------------- image pulls


def _pod(reason: str, message: str = "", node: str = "a100-0", image: str = "pytorch/pytorch:2.5.1"):
    waiting = types.SimpleNamespace(reason=reason, message=message)
    cs = types.SimpleNamespace(name="workload", image=image, state=types.SimpleNamespace(waiting=waiting))
    return types.SimpleNamespace(metadata=types.SimpleNamespace(name="bench-health-a100-0", deletion_timestamp=None),
                                 spec=types.SimpleNamespace(node_name=node),
                                 status=types.SimpleNamespace(init_container_statuses=[], container_statuses=[cs]))


def test_an_image_that_cannot_be_pulled_ends_the_wait_after_a_bounded_number_of_tries():
    from gpuproof.cluster.api import PULL_TRIES, raise_if_pull_fails

    pulls: dict = {}
    msg = 'failed to pull "pytorch/pytorch:2.5.1": dial tcp: lookup registry-1.docker.io: no such host'
    sequence = ["ContainerCreating", "ErrImagePull", "ImagePullBackOff", "ImagePullBackOff", "ErrImagePull",
                "ImagePullBackOff", "ErrImagePull"]
    raised_at = None
    for i, reason in enumerate(sequence):
        try:
            raise_if_pull_fails({"p": _pod(reason, msg)}, pulls, "gpuproof-x", "the health pod to finish")
        except WaitTimeout as exc:
            raised_at, text = i, str(exc)
            break
    assert raised_at == len(sequence) - 1 and PULL_TRIES == 3
    for words in ("pytorch/pytorch:2.5.1", "a100-0", "failed to pull 3 times", "ErrImagePull", "no such host",
                  "GPUPROOF_IMAGE=<mirror>/<image>", "the health pod to finish"):
        assert words in text, text


def test_a_pull_that_recovers_is_not_counted_against_the_pod():
    from gpuproof.cluster.api import raise_if_pull_fails

    pulls: dict = {}
    for reason in ["ErrImagePull", "ImagePullBackOff", "ContainerCreating", "ErrImagePull"]:
        raise_if_pull_fails({"p": _pod(reason)}, pulls, "ns", "x")      # two failed pulls: still waiting


# -------------------------------------------------------------------- a node that cannot take the pod any more


def test_a_pod_pinned_to_a_cordoned_or_vanished_node_is_named_with_why(embedded, tmp_path):
    """The fan-out's wait (one shared watch) ends as soon as its pod's node was cordoned or is gone, naming the node
    and why, instead of waiting out the deadline; a pod the scheduler merely cannot place yet waits on."""
    from test_suite_faults import with_fault

    from gpuproof.cluster.api import Run
    from gpuproof.cluster.podwatch import PodWatch
    from gpuproof.plugin.checks import pod
    from gpuproof.results import new_run_id

    GPU_TAINT = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

    with embedded.fleet_loaded(with_fault("a100", node=1, unschedulable=True)):
        run = Run(embedded.client, "t" + new_run_id())
        run.create()
        watch = PodWatch(run, "gpuproof.dev/fanout=edge", tick=1.0)
        try:
            labels = {"gpuproof.dev/fanout": "edge"}
            for name, node in (("on-cordoned", "a100-1"), ("on-gone", "a100-9")):
                run.apply(pod(name, {"nvidia.com/gpu": 1}, tolerations=GPU_TAINT, labels=labels,   # as workload pods
                              node=node))                      # pinned by name: gpuproof.cluster.placement
            with pytest.raises(WaitTimeout) as cordoned:
                watch.wait_done("on-cordoned", timeout=120)
            with pytest.raises(WaitTimeout) as gone:
                watch.wait_done("on-gone", timeout=120)
        finally:
            watch.close()
            run.cleanup(wait=False)
    assert "node a100-1 was cordoned after the run began" in str(cordoned.value), cordoned.value
    assert "node a100-9 is gone from the cluster" in str(gone.value), gone.value
    for err in (cordoned.value, gone.value):
        assert "timed out" not in str(err) and "the scheduler: 0/" in str(err), err

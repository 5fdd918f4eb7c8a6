"""The test tiers of tests/conftest.py and the unit tier's guard, in a pytest session of their own with a copy of
the conftest: the fixtures a test uses decide its tier (through fixtures built on them too), markers add what
fixtures cannot tell, `-m unit` and `-m "not unit"` split the tests, and a test left in the unit
tier that starts a process, or asks for the embedded cluster by name at run time, fails naming what it did,
before the process or the cluster starts. No cluster starts here, and one process: `true`, in the test that
shows the other tiers may start processes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

PROJECT = '''
import os
import subprocess
import threading

import pytest


@pytest.fixture(scope="module")
def on_the_cluster(embedded):
    return embedded


@pytest.fixture
def runs_a_server(stub):
    return stub


def test_pure():
    assert 1 + 1 == 2


def test_takes_the_cluster(embedded):
    pass


def test_takes_a_run_namespace(run_in):
    pass


def test_takes_a_fixture_built_on_the_cluster(on_the_cluster):
    pass


def test_takes_a_fixture_built_on_a_server(runs_a_server):
    pass


@pytest.mark.server
def test_marked_server():
    pass


@pytest.mark.sim
def test_marked_sim():
    pass


@pytest.mark.kubelet
def test_kubelet_outweighs_the_cluster(embedded):
    pass


def test_starts_a_process(tmp_path):
    subprocess.run(["touch", str(tmp_path / "ran")])


def test_starts_a_process_in_a_thread_and_swallows_the_error(tmp_path):
    def child():
        try:
            subprocess.run(["touch", str(tmp_path / "ran")])
        except BaseException:
            pass
    thread = threading.Thread(target=child)
    thread.start()
    thread.join()


def test_runs_a_shell(tmp_path):
    os.system(f"touch {tmp_path / 'ran'}")


def test_asks_for_the_cluster_by_name(request):
    request.getfixturevalue("embedded")


def test_asks_for_a_run_namespace_by_name(request):
    request.getfixturevalue("run_in")


@pytest.mark.unit
def test_marked_unit_but_takes_the_cluster(embedded):
    pass


@pytest.mark.slow
def test_marked_slow_only():
    pass
'''

CLUSTER = {"test_takes_the_cluster", "test_takes_a_run_namespace", "test_takes_a_fixture_built_on_the_cluster",
           "test_marked_sim", "test_marked_unit_but_takes_the_cluster"}
SERVER = {"test_takes_a_fixture_built_on_a_server", "test_marked_server"}
KUBELET = {"test_kubelet_outweighs_the_cluster"}
UNIT = {"test_pure", "test_starts_a_process", "test_starts_a_process_in_a_thread_and_swallows_the_error",
        "test_runs_a_shell", "test_asks_for_the_cluster_by_name", "test_asks_for_a_run_namespace_by_name",
        "test_marked_slow_only"}


@pytest.fixture
def project(pytester, monkeypatch, request):
    """A project with this repository's markers (strict) and a copy of its tests/conftest.py. Should the guard let
    a test through to the embedded cluster, the cluster refuses to start (at once, not after a minute)."""
    from gpuproof.sim.controlplane import SimCluster

    def refuse(*args, **kwargs):
        raise RuntimeError("the embedded cluster was started")

    monkeypatch.setattr(SimCluster, "up", refuse)
    pytester.makeini("[pytest]\naddopts = --strict-markers -p no:cacheprovider\nmarkers =\n"
                     + "".join(f"    {m}\n" for m in request.config.getini("markers")))
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.makepyfile(test_tiers_inner=PROJECT)
    return pytester


def collected(result) -> set[str]:
    return set(re.findall(r"::(test_\w+)", result.stdout.str()))


def test_the_tier_markers_are_registered(request):
    names = {m.split(":")[0] for m in request.config.getini("markers")}
    assert {"unit", "cluster", "kubelet", "build", "server", "sim", "slow"} <= names


@pytest.fixture
def tiering(request):
    """tests/conftest.py, as this session loaded it."""
    (module,) = [p for p in request.config.pluginmanager.get_plugins()
                 if getattr(p, "__file__", None) == str(TESTS / "conftest.py")]
    return module


def test_every_fixture_in_the_table_is_there(tiering):
    """A renamed fixture would leave its tests in the unit tier (where the guard fails them)."""
    for key, (tier, why) in tiering.FIXTURE_TIERS.items():
        file, name = key.split("::")
        assert re.search(rf"^def {name}\(", (TESTS / file).read_text(), re.M), f"{key}: no such fixture"
        assert tier in tiering.TIERS and why, key


def test_fixtures_and_markers_decide_the_tier_and_the_tiers_do_not_overlap(project):
    tiers = {}
    for tier in ("unit", "cluster", "server", "kubelet", "build"):
        result = project.runpytest_inprocess("--collect-only", "-q", "-m", tier)
        tiers[tier] = collected(result)
    # a test marked unit whose fixtures make it heavier is in the unit run too, where it fails (below)
    assert tiers == {"unit": UNIT | {"test_marked_unit_but_takes_the_cluster"}, "cluster": CLUSTER,
                     "server": SERVER, "kubelet": KUBELET, "build": set()}
    rest = collected(project.runpytest_inprocess("--collect-only", "-q", "-m", "not unit"))
    assert rest == (CLUSTER | SERVER | KUBELET) - {"test_marked_unit_but_takes_the_cluster"}


def test_a_unit_test_that_starts_a_process_or_asks_for_the_cluster_fails_saying_so(project):
    result = project.runpytest_inprocess("-m", "unit")
    result.assert_outcomes(passed=1, failed=5, errors=2)
    out = result.stdout.str()
    assert not list(project.path.rglob("ran")), "a blocked process ran"
    asks = "but asks for a cluster-tier fixture at run time (fixture 'embedded'"
    for test, words in [
        ("test_starts_a_process", "but starts a process (subprocess: touch "),
        ("test_starts_a_process_in_a_thread_and_swallows_the_error", "but starts a process (subprocess: touch "),
        ("test_runs_a_shell", "but starts a process (os.system touch "),
        ("test_asks_for_the_cluster_by_name", asks),
        ("test_asks_for_a_run_namespace_by_name", asks),
    ]:
        assert re.search(rf"{test} is in the unit tier \(no fixture or marker of another tier\) {re.escape(words)}",
                         out), (test, out)
    assert "Mark the test or its module with the tier of what it starts (kubelet, build, cluster, server)" in out
    assert re.search(r"test_marked_unit_but_takes_the_cluster: it is marked unit, but its tier is cluster "
                     r"\(fixture 'embedded'", out), out
    assert "test_marked_slow_only: it is marked slow but has no tier" in out, out
    assert "the embedded cluster was started" not in out, out
    assert re.search(r"^tiers: unit 7 tests [\d.]+ s; cluster 1 tests", out, re.M), out      # the one marked unit


@pytest.mark.server  # tier: its project's server-tier test starts a process
def test_tests_of_other_tiers_may_start_processes(project):
    project.makepyfile(test_tiers_inner=PROJECT.replace("def test_marked_server():\n    pass",
                                                        "def test_marked_server():\n    import subprocess\n"
                                                        "    subprocess.run(['true'], check=True)"))
    result = project.runpytest_inprocess("-m", "server", "-k", "marked_server")
    result.assert_outcomes(passed=1)


GROUPS_PLUGIN = '''
def pytest_collection_finish(session):
    for item in session.items:
        mark = item.get_closest_marker("xdist_group")
        print("ITEM", item.name, mark.args[0] if mark else "-")
'''


def test_workers_make_a_module_fixture_once_and_take_kubelet_tests_in_one_queue(project):
    """Under pytest-xdist (`-n N --dist loadgroup`, as .ci/run runs the tiers after the unit tier): the kubelet tier is
    one group (one worker, one test at a time), a module's tests that share a module-scoped fixture are one group
    (the fixture is made once), other tests go wherever a worker is free, and a test marked speed is collected last."""
    project.makepyfile(test_speed_inner="import pytest\n\n\n@pytest.mark.speed\ndef test_compares_speeds():\n"
                                        "    pass\n\n\ndef test_collected_after_it():\n    pass\n",
                       groups_plugin=GROUPS_PLUGIN)
    project.syspathinsert()
    out = project.runpytest_inprocess("--collect-only", "-q", "-p", "groups_plugin").stdout.str()
    items = re.findall(r"^ITEM (\S+) (\S+)$", out, re.M)
    groups = dict(items)
    assert groups["test_kubelet_outweighs_the_cluster"] == "kubelet"
    assert groups["test_takes_a_fixture_built_on_the_cluster"] == "test_tiers_inner.py"
    assert groups["test_pure"] == groups["test_takes_the_cluster"] == groups["test_collected_after_it"] == "-"
    assert items[-1] == ("test_compares_speeds", "-"), items


XDIST_PROJECT = '''
import pytest


@pytest.fixture(scope="module")
def made_once():
    return object()
''' + "".join(f'''

@pytest.mark.kubelet
def test_kubelet_{n}():
    pass


def test_anywhere_{n}():
    pass


def test_shares_{n}(made_once):
    pass
''' for n in range(6))


@pytest.mark.server  # tier: the project runs in pytest-xdist workers, which are processes
def test_a_group_runs_in_one_worker_under_xdist(project):
    """The groups hold in a real `-n 2 --dist loadgroup` run: each one's tests all ran in one worker (the ones of
    pytest-xdist 3.8 did not under pytest 9.2 until tests/conftest.py's XdistGroups)."""
    project.makepyfile(test_tiers_inner=XDIST_PROJECT)
    result = project.runpytest_subprocess("-n", "2", "--dist", "loadgroup", "-v", "-p", "no:randomly")
    result.assert_outcomes(passed=18)
    ran = re.findall(r"^\[(gw\d)\] .*PASSED .*::(test_\w+?)_\d(@\S+)?\s*$", result.stdout.str(), re.M)
    workers = {}
    for worker, test, _group in ran:
        workers.setdefault(test, set()).add(worker)
    # the grouped ones in one worker each; the rest wherever a worker was free (both, or one when the other was busy
    # with a group: which, is the scheduler's timing)
    assert {test: len(ids) for test, ids in workers.items() if test != "test_anywhere"} == {"test_kubelet": 1,
                                                                                          "test_shares": 1}, ran
    assert workers.get("test_anywhere"), ran
    assert "ran in 2 workers" not in result.stdout.str()


def test_a_group_split_over_workers_fails_the_session(tiering):
    """Should pytest-xdist ever scatter a group again, the controller says so and the session fails."""
    groups = tiering.XdistGroups()

    class Report:
        when = "call"

        def __init__(self, nodeid, worker):
            self.nodeid, self.node = nodeid, type("Node", (), {"gateway": type("Gw", (), {"id": worker})})

    for nodeid, worker in [("t.py::a@kubelet", "gw0"), ("t.py::b@kubelet", "gw1"), ("t.py::c[x@y]", "gw1"),
                           ("t.py::d@t.py", "gw2"), ("t.py::e@t.py", "gw2")]:
        groups.pytest_runtest_logreport(Report(nodeid, worker))
    assert groups.split() == ["tests/conftest.py: the xdist group 'kubelet' ran in 2 workers (gw0, gw1), not one: "
                              "its tests compete for what they judge"]


def test_the_costliest_work_is_handed_out_first(tiering, monkeypatch, tmp_path):
    """Work units (a group, or a test alone) in the order of their measured seconds, a unit's tests together and in
    their order, the `speed` test last in its group; a test the file does not list counts 1 s."""
    durations = tmp_path / "durations.json"
    durations.write_text('{"seconds": {"t.py::long": 300, "t.py::k1": 100, "t.py::k2": 100, "t.py::mid": 50}}')
    monkeypatch.setattr(tiering, "DURATIONS", durations)

    class Item:
        def __init__(self, nodeid, *marks):
            self.nodeid, self.marks = nodeid, {m.name: m for m in marks}

        def get_closest_marker(self, name):
            return self.marks.get(name)

    kubelet = pytest.mark.xdist_group("kubelet").mark
    items = [Item("t.py::short"), Item("t.py::slow", kubelet, pytest.mark.speed.mark), Item("t.py::mid"),
             Item("t.py::k1", kubelet), Item("t.py::long"), Item("t.py::k2", kubelet), Item("t.py::new")]
    cost = tiering._scope_costs(items)
    assert cost["@kubelet"] == 201 and cost["t.py::new"] == 1
    tiering.costliest_first(items)
    assert [i.nodeid for i in items] == ["t.py::long", "t.py::k1", "t.py::k2", "t.py::slow", "t.py::mid",
                                         "t.py::short", "t.py::new"]

"""Fixtures for gpuproof's own tests: one embedded cluster for the whole test session.

Tests that need another fleet load it with ``fleet_loaded(...)``, which swaps the
simulated nodes (the control plane keeps running); the mixed fleet comes back when the cluster is next used.
Suites are run as real pytest subprocesses against the cluster's kubeconfig, exactly
as a user would run them.

Each test is given a tier (``unit``, ``server``, ``cluster``, ``build``, ``kubelet``) from the fixtures it uses
and its markers, and the unit tier is guarded (see "tiers" below; ``pytest -m unit`` runs the pure tier).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuproof.sim.fleet import Fleet
from gpuproof.sim.fleet_file import load_fleet, parse_fleet
from gpuproof.sim.controlplane import SimCluster, find_free_base

REPO = Path(__file__).resolve().parents[1]


class EmbeddedCluster:
    """The session's embedded cluster. A test that loads another fleet (``fleet_loaded``) leaves it loaded; the mixed
    fleet comes back, freshly loaded, the moment anything else uses the cluster (its kubeconfig, client or sim), so
    a run of fault cases swaps fleets once per case, not twice (issue #37)."""

    def __init__(self, sim: SimCluster):
        self._sim = sim
        self.fleet_name = "mixed"
        self._client = None
        self._stale = False          # a test's own fleet is still loaded: restore mixed before the next use
        self._inside = 0             # fleet_loaded contexts open now
        self.loads = 0               # fleet loads this session (how many the fault tables cost)

    def _restore(self) -> None:
        if self._stale and not self._inside:
            self._stale = False
            self.load("mixed")

    @property
    def sim(self) -> SimCluster:
        self._restore()
        return self._sim

    @property
    def kubeconfig(self) -> str:
        self._restore()
        return str(self._sim.kubeconfig)

    @property
    def client(self):
        self._restore()
        if self._client is None:
            from gpuproof.cluster.api import connect

            self._client = connect(str(self._sim.kubeconfig))
        return self._client

    def load(self, fleet: Fleet | str | dict) -> Fleet:
        if isinstance(fleet, str):
            fleet = load_fleet(fleet)
        elif isinstance(fleet, dict):
            fleet = parse_fleet(fleet, source=f"test:{fleet.get('name', 'fleet')}")
        self._stale = False
        self._sim.load_fleet(fleet)
        self.loads += 1
        self.fleet_name = fleet.source or fleet.name
        return fleet

    @contextlib.contextmanager
    def fleet_loaded(self, fleet):
        loaded = self.load(fleet)
        self._inside += 1
        try:
            yield loaded
        finally:
            self._inside -= 1
            if not self._inside:
                self._stale = True    # mixed comes back when the cluster is next used outside a test's fleet

    def suite_command(self, *suite_args: str, report_dir: Path, run_id: str) -> list[str]:
        return [sys.executable, "-m", "pytest", *suite_args, f"--kubeconfig={self.kubeconfig}",
                f"--report-dir={report_dir}", f"--run-id={run_id}", "-p", "no:cacheprovider", "-q",
                "-o", "addopts=-ra --strict-markers", f"--rootdir={REPO}"]

    def run_suite(self, *suite_args: str, report_dir: Path, run_id: str, timeout: float = 300) -> "SuiteResult":
        """Run suites as a user would: a pytest subprocess against this cluster's kubeconfig."""
        cmd = self.suite_command(*suite_args, report_dir=report_dir, run_id=run_id)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        return SuiteResult(proc, report_dir / run_id)

    def run_suites_together(self, runs: dict[str, list[str]], report_dir: Path, timeout: float = 600
                            ) -> dict[str, "SuiteResult"]:
        """Start one suite run per run id at once (as two users would) and wait for all of them."""
        procs = {rid: subprocess.Popen(self.suite_command(*args, report_dir=report_dir, run_id=rid), cwd=REPO,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rid, args in runs.items()}
        out = {}
        for rid, proc in procs.items():
            try:
                stdout, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, _ = proc.communicate()
            out[rid] = SuiteResult(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, ""),
                                   report_dir / rid)
        return out


@contextlib.contextmanager
def private_cluster(fleet: dict, state: Path, source: str):
    """An embedded cluster of its own for one test (a fleet with other control-plane settings), stopped after."""
    sim = SimCluster(state, base_port=find_free_base(), private=True)
    sim.up(parse_fleet(fleet, source=source))
    try:
        yield EmbeddedCluster(sim)
    finally:
        sim.down()


class SuiteResult:
    def __init__(self, proc: subprocess.CompletedProcess, run_path: Path):
        self.proc = proc
        self.code = proc.returncode
        self.output = proc.stdout + proc.stderr
        self.run_path = run_path

    @property
    def checks(self) -> list[dict]:
        p = self.run_path / "checks.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def failed_checks(self, check: str | None = None) -> list[dict]:
        return [c for c in self.checks if c["verdict"] == "fail" and (check is None or c["check"] == check)]

    def __repr__(self) -> str:
        return f"exit {self.code}\n{self.output[-6000:]}"


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedCluster:
    """A private embedded cluster (mixed fleet) shared by the whole test session."""
    state = tmp_path_factory.mktemp("sim")
    sim = SimCluster(state, base_port=find_free_base(), private=True)
    sim.up(load_fleet("mixed"), progress=lambda m: print(f"[sim] {m}", file=sys.stderr))
    try:
        yield EmbeddedCluster(sim)
    finally:
        sim.down()


@pytest.fixture
def run_in(embedded):
    """A fresh run namespace in the embedded cluster, cleaned up after the test."""
    from gpuproof.cluster.api import Run
    from gpuproof.results import new_run_id

    run = Run(embedded.client, "t" + new_run_id())
    run.create()
    try:
        yield run
    finally:
        run.cleanup(wait=False)


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """``workloads/loadstub.py`` on 127.0.0.1 for a test module (a fast endpoint shaped like an inference
    server's answers); its URL."""
    from loadprocs import start_process, stop_process

    url, proc = start_process("loadstub.py", tmp_path_factory.mktemp("stub"))
    try:
        yield url
    finally:
        assert stop_process(proc)["ok"]


# ------------------------------------------------------------------ tiers
#
# Every test is in one tier, its heaviest need, and carries that tier's marker (heaviest first):
#   kubelet  kubelet nodes: a private cluster with them, `gpuproof run --fleet <lab-like>` as a process
#   build    a wheel, a virtualenv, a Go build
#   cluster  the shared embedded cluster, or a control plane of the test's own
#   server   a child process: an inference server, a load process, a workload, the CLI, a tool
#   unit     none of these: pure and in-process (`pytest -m unit`: under a minute on 2 cores)
# The tier is decided where the need is: by the fixtures a test uses, through its whole fixture closure
# (FIXTURE_TIERS: a new test that takes `embedded`, `run_in` or a fixture built on them is `cluster`
# without a word); by a marker on the test or its module where the test starts something itself; and by
# the older markers (`sim` means at least `cluster`). What is left is `unit`, and the unit tier is guarded:
# a unit test that starts a process (subprocess, fork, os.system: from its thread or one it starts) or asks
# for a tiered fixture by name at run time fails, naming what it started and how to tier it; a `unit`
# marker cannot pull a heavier test into the tier. So a test cannot sit in the wrong tier unnoticed, in a
# run of the unit tier or of the whole suite (tests/test_tiers.py tests the guard).

TIERS = ("kubelet", "build", "cluster", "server")          # heaviest first
UNIT = "unit"

# fixtures that start what a tier stands for: "file.py::name" (the file the fixture is written in) -> (tier, why)
FIXTURE_TIERS = {
    "conftest.py::embedded": ("cluster", "the shared embedded cluster: a control plane and kwok nodes"),
    "conftest.py::stub": ("server", "workloads/loadstub.py as a process"),
    "test_aiperf_parity.py::timed_stub": ("server", "workloads/loadstub.py as a process"),
    "test_aiperf_parity.py::aiperf": ("server", "AIPerf, and its tokenizer built in a child process"),
    "test_workloads_inference.py::server": ("server", "the CPU-path inference server as a process"),
    "test_hbm.py::cpu_result": ("server", "workloads/hbm.py as a process"),
    "test_nvml_mock.py::software": ("server", "NVIDIA's mock NVML (built under CI when missing); its users run "
                                              "workloads and probes over it as processes"),
    "test_kind_configs.py::loaded": ("server", "tools/kindcheck (kind's own config loading, in Go) as a process"),
    "test_packaging.py::wheel": ("build", "builds gpuproof's wheel (and the venvs on it)"),
    "test_kubelet_net.py::cluster": ("kubelet", "a private cluster with kubelet nodes"),
    "test_kubelet_dra.py::dra_cluster": ("kubelet", "a private cluster with a DRA kubelet node"),
}

# tiers whose tests run one after another in one worker when the suite runs in several (`-n N --dist loadgroup`,
# as .ci/run does): each kubelet test starts a cluster of real containers, which would compete for the same cores
# and the host's network setup; the other tiers' tests each take their own embedded cluster or process. The bundle's
# tests (tests/test_bundle_lab.py, lab's whole suite among them) are a second such lane, a group of their own
SERIAL_TIERS = ("kubelet",)

# older markers: the lightest tier each one implies
MARK_TIERS = {"sim": "cluster"}

TIER_KEY = pytest.StashKey[str]()
TIER_WHY = pytest.StashKey[str]()
TIER_ERROR = pytest.StashKey[str]()
_ran: dict[str, list] = {}         # tier -> [tests, seconds] of this session
_slow_units: list[tuple[float, str]] = []
SLOW_UNIT_S = 3.0                  # a unit test this slow is named at the end of the session


def _fixture_tier(fixturedef) -> tuple[str, str] | None:
    module = getattr(fixturedef.func, "__module__", None) or ""
    return FIXTURE_TIERS.get(f"{module.rsplit('.', 1)[-1]}.py::{fixturedef.argname}")


def _heaviest(found):
    return min(found, key=lambda t: TIERS.index(t[0])) if found else None


def _closure_tier(fixturedefs_of, names) -> tuple[str, str] | None:
    """The heaviest tier among these fixtures and everything they request: the closest definition of each
    name, and the ones it overrides where it asks for its own name."""
    found, seen, todo = [], set(), list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        defs = list(fixturedefs_of(name) or ())
        while defs:
            fixturedef = defs.pop()
            if hit := _fixture_tier(fixturedef):
                found.append((hit[0], f"fixture {name!r}: {hit[1]}"))
            todo.extend(n for n in fixturedef.argnames if n != name)
            if name not in fixturedef.argnames:
                break
    return _heaviest(found)


def item_tier(item) -> tuple[str, str, str | None]:
    """(tier, why, what is wrong with its markers or None) of a collected test."""
    found = []
    info = getattr(item, "_fixtureinfo", None)
    if info is not None and (hit := _closure_tier(info.name2fixturedefs.get, info.names_closure)):
        found.append(hit)
    found += [(tier, f"marked {tier}") for tier in TIERS if item.get_closest_marker(tier)]
    found += [(tier, f"marked {mark}") for mark, tier in MARK_TIERS.items() if item.get_closest_marker(mark)]
    if found:
        tier, why = _heaviest(found)
        wrong = (f"it is marked unit, but its tier is {tier} ({why}); a unit marker cannot make a test pure"
                 if item.get_closest_marker(UNIT) else None)
        return tier, why, wrong
    if item.get_closest_marker("slow"):
        return UNIT, "marked slow only", ("it is marked slow but has no tier: mark it with the tier of what makes "
                                          f"it slow ({', '.join(TIERS)}); the unit tier has a minute in all")
    return UNIT, "no fixture or marker of another tier", None


def _module_fixtures(item) -> list[str]:
    """The module-, class- or package-scoped fixtures a test uses (a wheel, a server, a cluster of the module's own):
    in several workers its module's tests go to one worker, so each such fixture is made once, not once a worker."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return []
    return [name for name in info.names_closure
            if (defs := info.name2fixturedefs.get(name)) and defs[-1].scope in ("module", "class", "package")]


@pytest.hookimpl(tryfirst=True)       # before -m selects on the markers added here
def pytest_collection_modifyitems(config, items):
    for item in items:
        tier, why, wrong = item_tier(item)
        item.stash[TIER_KEY], item.stash[TIER_WHY] = tier, why
        if wrong:
            item.stash[TIER_ERROR] = wrong
        if not item.get_closest_marker(tier):
            item.add_marker(tier)
        if item.get_closest_marker("xdist_group"):
            pass                    # a group of its own, said where the test is (tests/test_bundle_lab.py)
        elif tier in SERIAL_TIERS:
            item.add_marker(pytest.mark.xdist_group(tier))
        elif _module_fixtures(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
    # under xdist the costliest work first (tests/durations.json: the seconds of a measured run), so that no long test
    # starts when the others are done and leaves the cores idle at the end; a verdict that compares CPU speeds between
    # nodes is fairest on a quiet machine: last in its group's queue
    costliest_first(items)


DURATIONS = Path(__file__).with_name("durations.json")


def _scope(item) -> str:
    """The work unit xdist's loadgroup schedules an item in: its group, else the item alone."""
    group = item.get_closest_marker("xdist_group")
    return f"@{group.args[0]}" if group and group.args else item.nodeid


def costliest_first(items) -> None:
    """Sort the items by their work unit's measured seconds, costliest first; a unit's tests stay together and in
    their order, a `speed` test last."""
    cost = _scope_costs(items)
    items.sort(key=lambda item: (-cost[_scope(item)], bool(item.get_closest_marker("speed"))))


def _scope_costs(items) -> dict[str, float]:
    """Each work unit's measured seconds (a test not in tests/durations.json counts 1 s: a new test runs among the
    short ones until the file is measured again)."""
    try:
        seconds = json.loads(DURATIONS.read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        seconds = {}
    cost: dict[str, float] = {}
    for item in items:
        scope = _scope(item)
        cost[scope] = cost.get(scope, 0.0) + float(seconds.get(item.nodeid, 1))
    return cost


class XdistGroups:
    """The groups of `--dist loadgroup` holding under pytest 9.2. pytest-xdist 3.8 names a test's group by appending
    it to the test's id in its worker (`item._nodeid = "<id>@<group>"`), which its controller splits to schedule the
    group on one worker; pytest 9.2 keeps the id in `item._id` and no longer reads `_nodeid`, so no test had a group
    and kubelet tests ran beside each other. Here the id xdist meant is the id pytest reads (after xdist's hook).
    In the controller: every group's tests must have run in one worker, or the session fails naming the group."""

    def __init__(self):
        self.workers: dict[str, set[str]] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        meant = [(item, item.__dict__.pop("_nodeid")) for item in items if "_nodeid" in item.__dict__]
        if not meant or all(item.nodeid == nodeid for item, nodeid in meant):
            return
        from _pytest.nodeid import coerce_node_id     # pytest >= 9.2: where a node's id is kept
        for item, nodeid in meant:
            item._id = coerce_node_id(nodeid)

    def pytest_runtest_logreport(self, report):
        node = getattr(report, "node", None)          # the worker that ran it (in the controller only)
        head, at, group = report.nodeid.rpartition("@")
        if node is not None and at and "]" not in group and report.when == "call":
            self.workers.setdefault(group, set()).add(node.gateway.id)

    def split(self) -> list[str]:
        return [f"tests/conftest.py: the xdist group {group!r} ran in {len(ids)} workers ({', '.join(sorted(ids))}), "
                f"not one: its tests compete for what they judge" for group, ids in sorted(self.workers.items())
                if len(ids) > 1]

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session):
        if lines := self.split():
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            for line in lines:
                if reporter is not None:
                    reporter.write_line(line, red=True)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config):
    config.pluginmanager.register(XdistGroups(), "gpuproof-xdist-groups")
    # loadgroup hands out work units in the order pytest_collection_modifyitems leaves them (the costliest first),
    # not re-sorted by how many tests each holds (xdist's default, which put every one-test unit last, the longest too)
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


# ---- the unit tier's guard


class _Guard:
    """While a unit test sets up and runs: no process may start (from its thread or a thread it starts) and no
    tiered fixture may be asked for by name."""

    def __init__(self, item):
        self.item, self.violations, self.undo = item, [], []
        self.thread = threading.current_thread()

    def mine(self) -> bool:
        """Whether the running thread is the test's (not, say, a watch thread of a cluster started earlier)."""
        thread = threading.current_thread()
        return thread is self.thread or self in getattr(thread, "_unit_guards", ())

    def violate(self, what: str):
        msg = (f"{self.item.nodeid} is in the unit tier ({self.item.stash.get(TIER_WHY, '')}) but {what}. Mark "
               f"the test or its module with the tier of what it starts ({', '.join(TIERS)}), or, for a fixture, "
               f"add it to FIXTURE_TIERS in tests/conftest.py")
        self.violations.append(msg)
        pytest.fail(msg)

    def patch(self, owner, name, make):
        original = getattr(owner, name, None)
        if original is not None:
            self.undo.append((owner, name, original))
            setattr(owner, name, make(original))

    def __enter__(self):
        import _posixsubprocess

        from _pytest.fixtures import FixtureRequest

        guard = self

        def blocking(describe):
            def make(original):
                def blocked(*args, **kwargs):
                    if guard.mine():
                        guard.violate(f"starts a process ({describe(args)[:300]})")
                    return original(*args, **kwargs)
                return blocked
            return make

        def command(args):
            cmd = args[1] if len(args) > 1 else "?"
            return "subprocess: " + (" ".join(map(str, cmd)) if isinstance(cmd, (list, tuple)) else str(cmd))

        self.patch(subprocess.Popen, "_execute_child", blocking(command))     # run, Popen, check_output, asyncio
        self.patch(_posixsubprocess, "fork_exec", blocking(lambda args: "_posixsubprocess.fork_exec"))
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            self.patch(os, name, blocking(lambda args, name=name: f"os.{name}" + (f" {args[0]}" if args else "")))

        def tag(original):
            def start(thread, *args, **kwargs):
                if guard.mine():
                    thread._unit_guards = (*getattr(thread, "_unit_guards", ()), guard)
                return original(thread, *args, **kwargs)
            return start

        self.patch(threading.Thread, "start", tag)

        def asked(original):
            def getfixturevalue(request, argname):
                if guard.mine():
                    defs = request._fixturemanager.getfixturedefs
                    if hit := _closure_tier(lambda name: defs(name, request.node), [argname]):
                        guard.violate(f"asks for a {hit[0]}-tier fixture at run time ({hit[1]})")
                return original(request, argname)
            return getfixturevalue

        self.patch(FixtureRequest, "getfixturevalue", asked)
        return self

    def __exit__(self, *exc):
        while self.undo:
            owner, name, original = self.undo.pop()
            setattr(owner, name, original)
        return False


def _guarded(item):
    if item.stash.get(TIER_KEY, None) != UNIT:
        return (yield)
    with _Guard(item) as guard:
        try:
            result = yield
        except pytest.fail.Exception as exc:
            if guard.violations and exc.msg not in guard.violations:
                raise pytest.fail.Exception(guard.violations[0], pytrace=False) from None
            raise                     # the violation itself, with the line that started the process
        except BaseException:
            if guard.violations:
                raise pytest.fail.Exception(guard.violations[0], pytrace=False) from None
            raise
    if guard.violations:              # what a thread or a broad `except` swallowed
        pytest.fail(guard.violations[0], pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    if wrong := item.stash.get(TIER_ERROR, None):
        pytest.fail(f"{item.nodeid}: {wrong}", pytrace=False)      # before any fixture is set up
    return (yield from _guarded(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    return (yield from _guarded(item))


# ---- each tier's time, at the end of the session (from the test reports, so a run in several workers
# (pytest-xdist) counts every worker's tests in the process that prints the summary)


def pytest_runtest_logreport(report):
    tiers = [t for t in TIERS if t in report.keywords] or [UNIT]
    tier = tiers[0]                   # heaviest first; a hand-set lighter marker beside it does not count
    count = _ran.setdefault(tier, [0, 0.0])
    if report.when == "setup":
        count[0] += 1
    count[1] += report.duration
    if tier == UNIT and report.when == "call" and report.duration > SLOW_UNIT_S:
        _slow_units.append((report.duration, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if not _ran:
        return
    order = (UNIT, *reversed(TIERS))
    terminalreporter.write_line("tiers: " + "; ".join(
        f"{tier} {_ran[tier][0]} tests {_ran[tier][1]:.1f} s" for tier in order if tier in _ran))
    for took, nodeid in sorted(_slow_units, reverse=True)[:10]:
        terminalreporter.write_line(f"tiers: a unit test took {took:.1f} s (over {SLOW_UNIT_S:g} s; the unit tier "
                                    f"has a minute in all): {nodeid}")

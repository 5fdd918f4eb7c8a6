"""The pytest side of gpuproof: options, the target cluster, the run, and check records.

Target selection:
- no ``--kubeconfig``/``--context``: a private embedded cluster is started for the
  session (fleet from ``--fleet``, default ``mixed``) and stopped at the end;
- ``--kubeconfig`` and/or ``--context``: that cluster, as it is. Nothing outside the
  run's namespace and labelled objects is changed.

Suites use the fixtures ``target``, ``run``, ``discovery``, ``check``, ``run_dir`` and the
parametrizing fixtures ``gpu_node`` / ``gpu_pool`` (one test per discovered node or pool).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from .errors import GpuproofError
from .results import CheckRecord, RunDir, new_run_id

REAL_GPU_REASON = "needs real GPUs: the target's GPU nodes are simulated (kwok)"

# progress lines + ETA; the `creates` marker for plans; the nodes each check left out
pytest_plugins = ["gpuproof.progress", "gpuproof.plan", "gpuproof.coverage"]


def pytest_addoption(parser: pytest.Parser) -> None:
    # Canonical names are --gpuproof-*; the short ones (--kubeconfig, --fleet, ...) stay as aliases. Each
    # option's dest is its short name, so config.getoption("--kubeconfig") and ("--gpuproof-kubeconfig") agree.
    g = parser.getgroup("gpuproof", "gpuproof target and run")
    g.addoption("--gpuproof-kubeconfig", "--kubeconfig", dest="kubeconfig", default=None,
                help="run against the cluster of this kubeconfig (default: a private embedded cluster)")
    g.addoption("--gpuproof-context", "--context", dest="context", default=None,
                help="kubeconfig context to use (implies a real cluster)")
    g.addoption("--gpuproof-fleet", "--fleet", dest="fleet", default=None,
                help="fleet file (or shipped fleet name) for the embedded cluster; default: mixed")
    g.addoption("--gpuproof-sim-port", "--sim-port", dest="sim_port", default="auto",
                help="base port of the embedded cluster (uses 6 ports from it); default: auto")
    g.addoption("--gpuproof-report-dir", "--report-dir", dest="report_dir",
                default=os.environ.get("GPUPROOF_REPORT_DIR", "reports"),
                help="folder that gets one sub-folder per run (default: reports)")
    g.addoption("--gpuproof-run-id", "--run-id", dest="run_id", default=None,
                help="run id (default: time-stamp + random suffix)")
    g.addoption("--gpuproof-pool-label", "--pool-label", dest="pool_label", default=None,
                help="node label that names node pools (default: the first of the common cloud labels)")
    g.addoption("--gpuproof-strict-taints", "--strict-taints", dest="strict_taints", action="store_true",
                help="fail (rather than warn) when a GPU node has no NoSchedule taint")
    g.addoption("--gpuproof-shared-requests-refused", "--shared-requests-refused", dest="shared_requests_refused",
                default=None, metavar="POOLS",
                help="pools (comma-separated, or 'all') whose time-slicing has failRequestsGreaterThanOne; "
                     "on the embedded cluster the fleet says so")
    g.addoption("--gpuproof-timeout-scale", "--timeout-scale", dest="timeout_scale", type=float,
                default=float(os.environ.get("GPUPROOF_TIMEOUT_SCALE", "1")),
                help="multiply every wait's deadline (slow clusters)")
    g.addoption("--gpuproof-lease-wait", "--lease-wait", dest="lease_wait", type=float, default=300.0,
                metavar="SECONDS", help="how long to wait for another gpuproof run on the same cluster to finish "
                                        "(its run lease); default 300")
    g.addoption("--gpuproof-no-lease", "--no-lease", dest="no_lease", action="store_true",
                help="run without taking the cluster's run lease (concurrent runs are then not kept apart)")


# ---------------------------------------------------------------------------- session state


class Target:
    """The cluster a session runs against, and this session's run in it."""

    def __init__(self, config: pytest.Config):
        self.config = config
        opt = config.getoption
        from .providers import choose

        # pytest-kubernetes's --k8s-provider/--k8s-kubeconfig, or gpuproof's --kubeconfig/--context (providers.py)
        self.choice = choose(opt)
        self.real = self.choice.real
        self.run_id = opt("--run-id") or new_run_id()
        self.scale = opt("--timeout-scale")
        self.sim = None
        self.fleet = None
        self.cluster = None
        self._run = None
        self._run_dir = None
        self._discovery = None
        self.error: GpuproofError | None = None
        self.lease = None
        self._closed = False

    def progress(self, msg: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None and not self.config.getoption("quiet", 0) > 1:
            # progress comes during collection and tests too, where pytest captures output: step past it
            capman = self.config.pluginmanager.get_plugin("capturemanager")
            with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
                tr.write_line(f"[gpuproof] {msg}")

    def timeout(self, seconds: float) -> float:
        return seconds * self.scale

    # -- lazily connect / start

    def connect(self):
        if self.cluster is not None or self.error is not None:
            if self.error is not None:
                raise self.error
            return self.cluster
        from .cluster import connect

        try:
            if self.real:
                kubeconfig, context = self.choice.open(self.progress)   # creates a throwaway (kind, ...) cluster
                self.cluster = connect(kubeconfig, context)
                from .rbac import preflight, pytest_needs

                # the RBAC rules of gpuproof/rbac.yaml this session needs, before the lease or anything else
                preflight(self.cluster, pytest_needs(self.config))
                if not self.config.getoption("--no-lease", False):
                    from .lease import RunLease

                    self.lease = RunLease(self.cluster, self.run_id)
                    self.lease.acquire(self.config.getoption("--lease-wait", 300.0), progress=self.progress)
            else:
                from .fleet import load_fleet
                from .sim.controlplane import SimCluster, find_free_base

                self.fleet = load_fleet(self.choice.fleet or "mixed")
                port = self.config.getoption("--sim-port")
                base = find_free_base() if port == "auto" else int(port)
                state = Path(tempfile.mkdtemp(prefix="gpuproof-sim-"))
                self.sim = SimCluster(state, base_port=base, private=True)
                self.progress(f"starting embedded cluster (fleet {self.fleet.name}, {self.fleet.node_count} nodes)")
                kubeconfig = self.sim.up(self.fleet, progress=self.progress)
                self.cluster = connect(str(kubeconfig))
                self.cluster.name = "embedded"
        except GpuproofError as exc:
            self.error = exc
            raise
        return self.cluster

    @property
    def is_embedded(self) -> bool:
        return not self.real

    @property
    def run(self):
        if self._run is None:
            cluster = self.connect()
            from .cluster import Run

            run = Run(cluster, self.run_id)
            if self.sim is not None:           # kubelet nodes lend the host's Python over NVIDIA's mock NVML
                run.workload_image = self.sim.workload_image()
            self._run = run          # set before create so a half-made run is still cleaned up
            self.run_dir             # a run that touches the cluster always leaves its record
            run.create(progress=self.progress, timeout=self.timeout(60))
        return self._run

    @property
    def run_dir(self) -> RunDir:
        if self._run_dir is None:
            root = Path(self.config.getoption("--report-dir"))
            target = self.choice.label()
            cluster = "embedded" if not self.real else (self.choice.context or self.choice.cluster_name or "")
            self._run_dir = RunDir.create(root, self.run_id, target=target, argv=sys.argv[1:], cluster=cluster,
                                          fleet=(self.choice.fleet or "mixed") if not self.real else "")
        return self._run_dir

    def discovery(self, refresh: bool = False):
        if self._discovery is None or refresh:
            from .discovery import discover

            cluster = self.connect()
            self._discovery = discover(cluster.node_dicts(), pool_label=self.config.getoption("--pool-label"),
                                       slices=cluster.dra_objects("resourceslices"),
                                       device_classes=cluster.dra_objects("deviceclasses"))
        return self._discovery

    def shared_requests_refused(self, node) -> bool | None:
        """Whether the node's device plugin refuses shared requests > 1 (None: unknown)."""
        if node.scheme == "gke" and node.time_sliced:
            return True          # GKE's device plugin always refuses more than one shared GPU
        if self.fleet is not None:    # the embedded cluster: the fleet wrote each pool's device-plugin config file
            try:
                ts = self.fleet.pool(node.name.rsplit("-", 1)[0]).time_slicing
            except KeyError:
                return None
            return bool(ts and ts.fail_requests_greater_than_one)
        opt = self.config.getoption("--shared-requests-refused")
        if not opt:
            return None
        named = {p.strip() for p in opt.split(",")} - {"all"}
        unknown = sorted(named - {n.pool for n in self.discovery().gpu_nodes})
        if unknown and not getattr(self, "_told_unknown_pools", False):
            self._told_unknown_pools = True          # a misspelt pool would silently mean "not refusing"
            self.progress(f"--shared-requests-refused names no pool of this cluster: {', '.join(unknown)} "
                          f"(its pools: {', '.join(sorted({n.pool for n in self.discovery().gpu_nodes}))})")
        return opt == "all" or node.pool in named

    def write_inventory(self) -> None:
        if self.cluster is None or self._run_dir is None:
            return
        from .inventory import snapshot

        try:
            inv = snapshot(self.cluster, pool_label=self.config.getoption("--pool-label"))
            self._run_dir.write_inventory(inv)
            self._run_dir.meta.cluster = self.cluster.name
            self._run_dir.meta.kubernetes_version = inv["kubernetes_version"]
            self._run_dir.write_meta()
        except Exception as exc:  # the inventory is a record, never a reason to fail cleanup
            self.progress(f"could not write the inventory: {exc}")

    def close(self, outcome: str = "") -> None:
        """Clean up everything the run created; stop a private embedded cluster. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._run is not None and not self._run._cleaned:
            try:
                self._run.cleanup(wait=True, timeout=self.timeout(120), progress=self.progress)
            except Exception as exc:
                self.progress(f"cleanup of run {self.run_id} incomplete: {exc}. "
                              f"Run `gpuproof clean` to remove what is left.")
        if self.lease is not None:
            self.lease.release()
        if self._run_dir is not None:
            self.write_inventory()
            self._run_dir.finalize(outcome)
        if self.sim is not None:
            self.sim.down()
            self.sim = None
        self.choice.close(self.progress)     # deletes a throwaway cluster this session created


_KEY = pytest.StashKey[Target]()


def stop_session(exc: GpuproofError):
    """A target that cannot be used ends the session in one line, not in an error for every module or
    test that needs it (pytest interrupts, exit status 2, and cleans up as after Ctrl-C)."""
    raise pytest.Session.Interrupted(f"gpuproof cannot use its target cluster: {exc}") from None


def get_target(config: pytest.Config) -> Target:
    if _KEY not in config.stash:
        config.stash[_KEY] = Target(config)
    return config.stash[_KEY]


@pytest.hookimpl(tryfirst=True)      # before pytest-kubernetes checks its options (providers.install)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "places_pods: the test places pods, so only GPU nodes that can take pods "
                                       "(Ready, not cordoned, no node-lifecycle taint) are offered to it")
    config.addinivalue_line("markers", "device_plugin: the check is about the device plugin's extended resources, "
                                       "so nodes that offer GPUs only through DRA are not offered to it")
    from .providers import install

    install(config, get_target(config).choice)
    # SIGTERM (CI cancelling a job) gets the same cleanup as Ctrl-C
    if hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        def _term(signum, frame):
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, _term)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    t = get_target(session.config)
    outcome = {0: "passed", 1: "failed", 2: "interrupted"}.get(int(exitstatus), f"exit {int(exitstatus)}")
    t.close(outcome)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _KEY in config.stash:
        config.stash[_KEY].close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    t = get_target(config)
    return [f"gpuproof: target {t.choice.describe()}; run {t.run_id}"]


# ---------------------------------------------------------------------------- parametrization


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per discovered GPU node (``gpu_node``) or pool (``gpu_pool``), over the nodes the check is for.

    Nodes a check leaves out (unfit for its pods, DRA-only for a device-plugin check, simulated for a
    check that needs real GPUs) are recorded with the reason when the check runs (gpuproof.coverage).
    """
    from .coverage import note, split

    wanted = [f for f in ("gpu_node", "gpu_pool", "gpu_product") if f in metafunc.fixturenames]
    marked = metafunc.definition.get_closest_marker
    places = marked("places_pods") is not None
    # one test per node or pool places device-plugin pods (DRA claims are placed by the DRA suite's own tests)
    kind = {"places_pods": places, "device_plugin": marked("device_plugin") is not None or (places and bool(wanted)),
            "real_gpus": "needs_real_gpus" in metafunc.fixturenames}
    if not wanted and not any(kind.values()):
        return
    t = get_target(metafunc.config)
    try:
        d = t.discovery()
    except GpuproofError as exc:       # cannot start, unreachable, refused: stop before anything runs
        stop_session(exc)
    # a dead or cordoned node is reported by the nodes suite, not timed out on; a kwok node runs no GPU code
    candidates, left_out = split(d.gpu_nodes, **kind)
    note(metafunc, left_out)
    select = getattr(metafunc.function, "gpuproof_select", None)
    if kind["real_gpus"] and not candidates:
        real = [f"{r['node']}: {r['reason']}" for r in left_out if not d.node(r["node"]).simulated]
        none = f"no real GPU node can take pods ({'; '.join(real)})" if real else REAL_GPU_REASON
    elif not d.gpu_nodes:
        none = "no GPU nodes in the cluster"
    else:   # nodes of its kind left out (a kwok MIG node for a real-GPU check) are named, with why
        fit = [f"{r['node']}: {r['reason']}" for r in left_out if select is None or select(d.node(r["node"]))]
        kind_doc = (getattr(select, "__doc__", "") or "filtered") + (f"; left out: {'; '.join(fit)}" if fit else "")
        none = f"no GPU node of the kind this check is for ({kind_doc})"
    if "gpu_node" in wanted:
        nodes = [n for n in candidates if select is None or select(n)]
        if nodes:
            metafunc.parametrize("gpu_node", nodes, ids=[n.name for n in nodes])
        else:
            metafunc.parametrize("gpu_node", [pytest.param(None, marks=pytest.mark.skip(reason=none))], ids=["none"])
    if "gpu_pool" in wanted:
        pools: dict[str, list] = {}
        for n in candidates:
            pools.setdefault(n.pool, []).append(n)
        pools = {name: nodes for name, nodes in pools.items() if select is None or any(select(n) for n in nodes)}
        if pools:
            metafunc.parametrize("gpu_pool", [Pool(k, v) for k, v in sorted(pools.items())], ids=sorted(pools))
        else:
            metafunc.parametrize("gpu_pool", [pytest.param(None, marks=pytest.mark.skip(reason=none))], ids=["none"])
    if "gpu_product" in wanted:
        products = sorted({n.product for n in candidates if n.product and (select is None or select(n))})
        if products:
            metafunc.parametrize("gpu_product", products, ids=products)
        else:
            metafunc.parametrize("gpu_product", [pytest.param(None, marks=pytest.mark.skip(
                reason="no labelled GPU products in the cluster"))], ids=["none"])


class Pool:
    def __init__(self, name: str, nodes: list):
        self.name, self.nodes = name, nodes

    def __repr__(self) -> str:
        return f"Pool({self.name}, {len(self.nodes)} nodes)"


def for_nodes(predicate):
    """Decorator: parametrize ``gpu_node``/``gpu_pool`` only over nodes where predicate(node) holds.

    The predicate's docstring says which nodes, and shows in the skip reason when none match.
    """
    def mark(fn):
        fn.gpuproof_select = predicate
        return fn
    return mark


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def target(request) -> Target:
    t = get_target(request.config)
    try:
        t.connect()
    except GpuproofError as exc:
        stop_session(exc)
    return t


@pytest.fixture(scope="session")
def run(target):
    """The run (namespace + labels) in the target cluster."""
    try:
        return target.run
    except GpuproofError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def run_dir(request) -> RunDir:
    return get_target(request.config).run_dir


@pytest.fixture(scope="session")
def discovery(target):
    return target.discovery()


@pytest.fixture(scope="session")
def gpu_products(discovery) -> dict[str, list[str]]:
    """Product -> nodes, for the benchmarks: their pods ask nvidia.com/gpu, so DRA-only nodes are left out, and
    they run GPU code, so simulated (kwok) nodes are too."""
    from .discovery import products_of

    return products_of(n for n in discovery.gpu_nodes if not n.dra_only and not n.simulated)


@pytest.fixture
def scratch(run, target):
    """Pods for one test, deleted when it ends (so the next test finds the GPUs free)."""
    from .suite import Scratch

    unfit = [n.name for n in target.discovery().gpu_nodes if n.unfit_for_placement]
    s = Scratch(run, timeout=target.timeout(120), avoid=unfit)
    yield s
    s.close()


def real_gpu_skip_reason(params: dict, discovery) -> str:
    """Why a test that needs real GPUs cannot run ('' when it can). Real and simulated is a fact of each node:
    a test with a node (``gpu_node``) or pool (``gpu_pool``) of its own is judged by its nodes, one without by
    the cluster's (every GPU node simulated). Parametrization already offers such tests real nodes only and
    records the kwok ones it left out (gpuproof.coverage); this holds for a test given its node another way."""
    node, pool = params.get("gpu_node"), params.get("gpu_pool")
    nodes = [node] if node is not None else getattr(pool, "nodes", None)
    if nodes is None:
        return REAL_GPU_REASON if discovery.simulated else ""
    if nodes and all(n.simulated for n in nodes):
        from .coverage import SIMULATED_REASON

        return f"{', '.join(n.name for n in nodes)}: {SIMULATED_REASON}"
    return ""


@pytest.fixture
def needs_real_gpus(request, discovery):
    why = real_gpu_skip_reason(getattr(getattr(request.node, "callspec", None), "params", {}), discovery)
    if why:
        raise pytest.skip.Exception(why, _use_item_location=True)


class Checker:
    """Records each check's verdict and fails the test with node, expected and actual."""

    def __init__(self, run_dir: RunDir, feature: str, node=None, known_nodes: dict | None = None):
        self.run_dir = run_dir
        self.feature = feature
        self.node = node
        self.known_nodes = known_nodes or {}
        self.failures: list[str] = []
        self.churn_skips: list[str] = []

    def _target(self, target: str | None) -> tuple[str, str, str]:
        node = self.node if target is None else self.known_nodes.get(target)
        if node is not None:
            return (target or node.name), node.pool, node.product
        return target or "cluster", "", ""

    def record(self, check: str, verdict: str, expected: Any = "", actual: Any = "", message: str = "",
               target: str | None = None) -> CheckRecord:
        tgt, pool, product = self._target(target)
        return self.run_dir.add_check(CheckRecord(feature=self.feature, check=check, target=tgt, verdict=verdict,
                                                  expected=expected, actual=actual, message=message, pool=pool,
                                                  product=product))

    def equal(self, check: str, expected: Any, actual: Any, what: str = "", target: str | None = None,
              churn=None) -> bool:
        """Record pass/fail of expected == actual; the test fails at its end with every failed check listed."""
        return self.true(check, expected == actual, expected, actual, what, target, churn)

    def true(self, check: str, ok: bool, expected: Any, actual: Any, what: str = "",
             target: str | None = None, churn=None) -> bool:
        """Record a check whose pass condition is given (expected describes the rule).

        ``churn`` (a :class:`gpuproof.churn.ForeignPods`): a failure while other people's pods
        changed on the check's nodes is recorded as a skip with that reason, not as a failure.
        """
        if ok:
            self.record(check, "pass", expected, actual, target=target)
            return True
        tgt = self._target(target)[0]
        moved = churn.changed() if churn is not None else ""
        if moved:
            msg = f"{tgt}: {what or check}: not judged, {moved} (expected {_show(expected)}, actual {_show(actual)})"
            self.record(check, "skip", expected, actual, msg, target=target)
            self.churn_skips.append(msg)
            return False
        msg = f"{tgt}: {what or check}: expected {_show(expected)}, actual {_show(actual)}"
        self.record(check, "fail", expected, actual, msg, target=target)
        self.failures.append(msg)
        return False

    def warn(self, check: str, message: str, expected: Any = "", actual: Any = "", target: str | None = None):
        import warnings

        tgt = self._target(target)[0]
        self.record(check, "warn", expected, actual, f"{tgt}: {message}", target=target)
        warnings.warn(f"gpuproof: {tgt}: {message}", GpuproofWarning, stacklevel=2)

    def skip(self, check: str, reason: str, target: str | None = None):
        self.record(check, "skip", message=reason, target=target)
        # reported at the test's location, not here
        raise pytest.skip.Exception(reason, _use_item_location=True)

    def finish(self) -> None:
        if self.failures:
            pytest.fail("\n".join(self.failures), pytrace=False)
        if self.churn_skips:
            raise pytest.skip.Exception("\n".join(self.churn_skips), _use_item_location=True)


class GpuproofWarning(UserWarning):
    pass


def _show(value: Any) -> str:
    if value is None:
        return "(missing)"
    return repr(value) if isinstance(value, str) else str(value)


@pytest.fixture
def check(request, run_dir):
    """A Checker for this test. The feature is the suite module's FEATURE (or its file name)."""
    module = request.module
    feature = getattr(module, "FEATURE", module.__name__.rsplit(".", 1)[-1].removeprefix("test_"))
    node = request.getfixturevalue("gpu_node") if "gpu_node" in request.fixturenames else None
    t = get_target(request.config)
    known = {n.name: n for n in t._discovery.gpu_nodes} if t._discovery is not None else {}
    checker = Checker(run_dir, feature, node, known)
    request.node._gpuproof_checker = checker
    return checker


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test whose checks failed fails in its call phase, with every failed check listed."""
    result = yield
    checker = getattr(item, "_gpuproof_checker", None)
    if checker is not None:
        checker.finish()
    return result

"""The fixtures suites use: ``target``, ``run``, ``run_dir``, ``fanout``, ``discovery``, ``gpu_products``, ``scratch``,
``needs_real_gpus`` and ``check`` (one record per verdict)."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from ..errors import GpuproofError
from .target import REAL_GPU_REASON, Target, get_target, stop_session
from ..results import CheckRecord, RunDir


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
def fanout(request, run, run_dir):
    """The session's :class:`gpuproof.plugin.fanout.FanOut`: per-node work on every node at once, bounded by
    ``--parallel`` pods in flight; its lines go through the progress plugin (threads may speak there)."""
    from . import fanout as fo
    from .progress import PLUGIN_NAME

    progress = request.config.pluginmanager.get_plugin(PLUGIN_NAME)
    t = get_target(request.config)

    def say(msg: str) -> None:
        if progress is not None and progress.active:
            progress.say(msg)
        else:
            import threading

            if threading.current_thread() is threading.main_thread():
                t.progress(msg)

    return fo.get(request.config, run=run, say=say, run_dir=run_dir)


@pytest.fixture(scope="session")
def discovery(target):
    return target.discovery()


@pytest.fixture(scope="session")
def gpu_products(discovery) -> dict[str, list[str]]:
    """Product -> nodes, for the benchmarks: their pods ask nvidia.com/gpu, so DRA-only nodes are left out, and
    they run GPU code, so simulated (kwok) nodes are too."""
    from ..discovery.nodes import products_of

    return products_of(n for n in discovery.gpu_nodes if not n.dra_only and not n.simulated)


@pytest.fixture
def scratch(run, target):
    """Pods for one test, deleted when it ends (so the next test finds the GPUs free)."""
    from .checks import Scratch

    unfit = [n.name for n in target.discovery().gpu_nodes if n.unfit_for_placement]
    s = Scratch(run, timeout=target.timeouts.pods_settled, avoid=unfit)
    yield s
    s.close()


def real_gpu_skip_reason(params: dict, discovery) -> str:
    """Why a test that needs real GPUs cannot run ('' when it can). Real and simulated is a fact of each node:
    a test with a node (``gpu_node``) or pool (``gpu_pool``) of its own is judged by its nodes, one without by
    the cluster's (every GPU node simulated). Parametrization already offers such tests real nodes only and
    records the kwok ones it left out (gpuproof.plugin.coverage); this holds for a test given its node another way."""
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

    def __init__(self, run_dir: RunDir, feature: str, node=None, known_nodes: dict | None = None,
                 lost: Callable[[str], str] | None = None):
        self.run_dir = run_dir
        self.feature = feature
        self.node = node
        self.known_nodes = known_nodes or {}
        self.lost = lost                  # node -> why the run lost it ('' when it did not): cluster/nodewatch.py
        self.failures: list[str] = []
        self.churn_skips: list[str] = []
        self.not_judged: list[str] = []
        self.targets: set[str] = set()    # the targets this test wrote a record for

    def _target(self, target: str | None) -> tuple[str, str, str]:
        node = self.node if target is None else self.known_nodes.get(target)
        if node is not None:
            return (target or node.name), node.pool, node.product
        return target or "cluster", "", ""

    def record(self, check: str, verdict: str, expected: Any = "", actual: Any = "", message: str = "",
               target: str | None = None) -> CheckRecord:
        tgt, pool, product = self._target(target)
        why = self.lost(tgt) if self.lost is not None and verdict != "skip" else ""
        if why:                       # a node lost during the run: what was seen of it is no verdict (issue #41)
            verdict, message = "skip", f"not judged: {why}"
            self.not_judged.append(f"not judged: {why} ({tgt}: {check})")
        self.targets.add(tgt)
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

        ``churn`` (a :class:`gpuproof.cluster.churn.ForeignPods`): a failure while other people's pods
        changed on the check's nodes is recorded as a skip with that reason, not as a failure.
        """
        if ok:
            self.record(check, "pass", expected, actual, target=target)
            return True
        tgt = self._target(target)[0]
        if self.lost is not None and self.lost(tgt):
            self.record(check, "fail", expected, actual, target=target)      # recorded as not judged
            return False
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
        if self.lost is not None and self.lost(tgt):
            return
        warnings.warn(f"gpuproof: {tgt}: {message}", GpuproofWarning, stacklevel=2)

    def skip(self, check: str, reason: str, target: str | None = None):
        self.record(check, "skip", message=reason, target=target)
        # reported at the test's location, not here
        raise pytest.skip.Exception(reason, _use_item_location=True)

    def finish(self) -> None:
        if self.failures:
            pytest.fail("\n".join(self.failures), pytrace=False)
        if self.churn_skips or self.not_judged:
            raise pytest.skip.Exception("\n".join(self.churn_skips + self.not_judged), _use_item_location=True)


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
    # the fleet's index, built once per discovery (rebuilt per check it cost O(nodes) per item: issue #52)
    known = t._discovery.by_name() if t._discovery is not None else {}
    checker = Checker(run_dir, feature, node, known, lost=t.lost_reason)
    request.node._gpuproof_checker = checker
    return checker

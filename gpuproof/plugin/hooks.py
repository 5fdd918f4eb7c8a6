"""gpuproof's pytest hooks: its options, the target at configure time, one test per GPU node or pool, check records."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest
import urllib3

from ..errors import ApiGone, ApiUnreachable, GpuproofError, NodeLost, one_line
from . import options
from .target import REAL_GPU_REASON, get_target, started_target, stop_session
from .checks import GPU_NODES_MARKER, Pool, node_predicate


def pytest_addoption(parser: pytest.Parser) -> None:
    # Canonical names are --gpuproof-*; the short ones (--kubeconfig, --fleet, ...) stay as aliases. Each
    # option's dest is its short name, so config.getoption("--kubeconfig") and ("--gpuproof-kubeconfig") agree.
    # The options, their help and their checks are declared once, for gpuproof run too: gpuproof/plugin/options.py.
    options.add_to_pytest(parser.getgroup("gpuproof", "gpuproof target and run"))


@pytest.hookimpl(tryfirst=True)      # before pytest-kubernetes checks its options (providers.install)
def pytest_configure(config: pytest.Config) -> None:
    try:
        options.check_config(config)
    except GpuproofError as exc:          # one line, before anything starts
        raise pytest.UsageError(str(exc)) from None
    config.addinivalue_line("markers", "places_pods: the test places pods, so only GPU nodes that can take pods "
                                       "(Ready, not cordoned, no node-lifecycle taint) are offered to it")
    config.addinivalue_line("markers", "device_plugin: the check is about the device plugin's extended resources, "
                                       "so nodes that offer GPUs only through DRA are not offered to it")
    config.addinivalue_line("markers", f"{GPU_NODES_MARKER}(predicate): gpu_node/gpu_pool are only the GPU nodes where "
                                       "predicate(node) holds (a GpuNode; its docstring names them in the skip "
                                       "reason when none do): @pytest.mark.gpu_nodes.with_args(predicate), or "
                                       "gpuproof.plugin.checks.for_nodes(predicate)")
    from ..report.conformance import MARKER_HELP

    config.addinivalue_line("markers", MARKER_HELP)
    from .providers import install

    install(config, get_target(config))
    if config.pluginmanager.get_plugin(Interrupt.NAME) is None:
        config.pluginmanager.register(Interrupt(config), Interrupt.NAME)
    # SIGTERM (CI cancelling a job) gets the same cleanup as Ctrl-C
    if hasattr(signal, "SIGTERM") and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        def _term(signum, frame):
            raise KeyboardInterrupt("SIGTERM")

        signal.signal(signal.SIGTERM, _term)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    outcome = {0: "passed", 1: "failed", 2: "interrupted"}.get(int(exitstatus), f"exit {int(exitstatus)}")
    end_run(session.config, outcome)


def end_run(config: pytest.Config, outcome: str, interrupted: bool = False) -> None:
    """The run's end: the fan-out's workers stopped, what the run made deleted, its records written. Idempotent.

    Interrupted, the watches on the run's pods stop first (deleting hundreds of pods sends as many events, each
    decoded in Python), and the run's namespaces are asked to be deleted, one request each (the namespace controller
    takes 5 s at least, and takes the fan-out's pods with them: its workers send no deletes of their own); otherwise
    the workers delete their own pods before the run's namespace goes. Interrupted, its records are written without
    their parquet copies (Target.close). A second interrupt meanwhile stops the waiting, never the writing of the
    records."""
    from . import fanout
    from .progress import PLUGIN_NAME

    t = started_target(config)
    if interrupted:
        progress = config.pluginmanager.get_plugin(PLUGIN_NAME)
        if progress is not None:
            progress.stop_following()
        fanout.stop_now(config)
        if t is not None:
            t.delete_now()
    try:
        fanout.close(config)
    finally:
        get_target(config).close(outcome, interrupted=interrupted)


class Interrupt:
    """Ctrl-C (or SIGTERM): the run ends at once, before pytest renders the interrupt (issue #52 item 5). One per
    session (pytest_keyboard_interrupt is given no config), registered at configure.

    pytest's terminal reporter renders the whole traceback of the interrupt (each frame's source file parsed) to
    print its last line, unless --full-trace: 70 frames deep in a wait on the cluster, that took 10 to 30 s on a
    loaded machine before any cleanup began. Its traceback is cut to the frames from the last one pytest would show,
    and the exceptions it interrupted are left out, unless --full-trace asks for them."""

    NAME = "gpuproof-interrupt"

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
        # pytest.exit(), or the session stopped on purpose (Session.Interrupted, a KeyboardInterrupt: -x, or the run
        # cut short by an API server gone, hooks above): the session's end, as usual, with its parquet tables
        if not isinstance(excinfo.value, KeyboardInterrupt) or isinstance(excinfo.value, pytest.Session.Interrupted):
            return
        if not self.config.getoption("fulltrace", False):
            _shorten(excinfo)
        end_run(self.config, "interrupted", interrupted=True)


def _shorten(excinfo: pytest.ExceptionInfo) -> None:
    tb = excinfo.traceback
    last = next((i for i in range(len(tb) - 1, -1, -1) if not tb[i].ishidden(excinfo)), None)
    if last is not None:
        excinfo.traceback = tb[last:]
    excinfo.value.__suppress_context__ = True        # the exceptions it interrupted: not rendered
    excinfo.value.__cause__ = None


def pytest_unconfigure(config: pytest.Config) -> None:
    t = started_target(config)
    if t is not None:
        t.close()


def pytest_report_header(config: pytest.Config) -> list[str]:
    t = get_target(config)
    return [f"gpuproof: target {t.choice.describe()}; run {t.run_id}"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """One test per discovered GPU node (``gpu_node``) or pool (``gpu_pool``), over the nodes the check is for.

    Nodes a check leaves out (unfit for its pods, DRA-only for a device-plugin check, simulated for a
    check that needs real GPUs) are recorded with the reason when the check runs (gpuproof.plugin.coverage).
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
    select = node_predicate(metafunc.definition)
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


def item_nodes(item: pytest.Item) -> list[str]:
    """The nodes a test is about: its ``gpu_node``, or every node of its ``gpu_pool``."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    node, pool = params.get("gpu_node"), params.get("gpu_pool")
    nodes = [node] if node is not None else list(getattr(pool, "nodes", None) or [])
    return [n.name for n in nodes if getattr(n, "name", None)]


def lost_under(item: pytest.Item) -> tuple[str, str]:
    """(node, why) for the first node this test is about that the run lost (deleted, NotReady); ('', '') if none."""
    t = started_target(item.config)
    if t is None:
        return "", ""
    for name in item_nodes(item):
        why = t.lost_reason(name)
        if why:
            return name, why
    return "", ""


def _not_judged_record(item: pytest.Item, node: str, why: str, always: bool = False) -> None:
    """One skip record for a test on a lost node that wrote none for it (it never ran, or was cut before a verdict);
    ``always``: also beside what it recorded before it was cut (an API server that stopped answering under it)."""
    checker = getattr(item, "_gpuproof_checker", None)
    if checker is not None and node in checker.targets and not always:
        return
    t = started_target(item.config)
    if t is None or t._run_dir is None:
        return
    from ..results import CheckRecord

    module = getattr(item, "module", None)
    feature = getattr(module, "FEATURE", (getattr(module, "__name__", "") or "").rsplit(".", 1)[-1]
                      .removeprefix("test_"))
    params = getattr(getattr(item, "callspec", None), "params", {})
    n = params.get("gpu_node") or next((x for x in getattr(params.get("gpu_pool"), "nodes", None) or []
                                         if getattr(x, "name", "") == node), None)
    check = getattr(item, "originalname", item.name).removeprefix("test_").replace("_", "-")
    with contextlib.suppress(Exception):          # a record of a skip never fails a run
        t._run_dir.add_check(CheckRecord(feature=feature, check=check, target=node, verdict="skip",
                                         message=f"not judged: {why}", pool=getattr(n, "pool", "") or "",
                                         product=getattr(n, "product", "") or ""))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test on a node lost during the run is not run: it is not judged, with the reason (issue #41 item 4)."""
    node, why = lost_under(item)
    if why:
        _not_judged_record(item, node, why)
        raise pytest.skip.Exception(f"not judged: {why}", _use_item_location=True)


def _from_the_api(call: pytest.CallInfo) -> bool:
    """A connection error raised in the Kubernetes client (a watch's stream broken off by the API server), not one of
    another server a check talks to (Prometheus, an inference server), whose failure is the check's verdict."""
    return any(f"{os.sep}kubernetes{os.sep}" in str(entry.path) for entry in call.excinfo.traceback)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A check cut by an API server that stopped answering is not judged: its report is a skip naming the wait. So is
    a check on a node lost during the run (deleted or NotReady before its verdict), whatever it found."""
    report = yield
    where = (str(item.path), (item.location[1] or 0) + 1)
    if report.failed and call.excinfo is not None and call.excinfo.errisinstance(NodeLost):
        _not_judged_record(item, call.excinfo.value.node, call.excinfo.value.reason)
        report.outcome = "skipped"
        report.longrepr = (*where, f"not judged: {call.excinfo.value}")
    elif report.failed and call.excinfo is not None and (call.excinfo.errisinstance(ApiUnreachable) or (
            call.excinfo.errisinstance((urllib3.exceptions.HTTPError, ConnectionError)) and _from_the_api(call))):
        # what the check observed was cut by the API server (issue #41 item 3): no verdict, a record saying why
        t = get_target(item.config)
        why = one_line(call.excinfo.value, 400)
        if not call.excinfo.errisinstance(ApiUnreachable):        # a raw no-answer (a watch's stream broken off)
            why = f"the API server stopped answering ({type(call.excinfo.value).__name__}: {why})"
        t.cut_short = t.cut_short or f"the API server stopped answering during {item.nodeid}"
        if call.excinfo.errisinstance(ApiGone) and not t.api_gone:
            # gone for the API deadline: the run stops here, as one cut short (the checks to come are not run)
            t.cut_short, t.api_gone = f"{why}, during {item.nodeid}; the run stopped there", True
            item.session.shouldstop = f"the API server stopped answering: {why}"
        if report.when != "teardown":           # the test's own cleanup cut too: its check has its record already
            nodes = item_nodes(item)
            _not_judged_record(item, nodes[0] if nodes else "cluster", why, always=True)
        report.outcome = "skipped"
        report.longrepr = (*where, f"not judged: {why}")
    elif report.when == "call" and not report.skipped:
        node, why = lost_under(item)
        if why:                                  # judged on what the run saw of a node that is gone: no verdict
            _not_judged_record(item, node, why)
            report.outcome = "skipped"
            report.longrepr = (*where, f"not judged: {why}")
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A test whose checks failed fails in its call phase, with every failed check listed."""
    result = yield
    checker = getattr(item, "_gpuproof_checker", None)
    if checker is not None:
        checker.finish()
    return result

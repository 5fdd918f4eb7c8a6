"""gpuproof's options, declared once: the pytest plugin's (``--gpuproof-<name>``, with ``--<name>`` as an alias) and
those of them ``gpuproof run`` and ``gpuproof plan`` take and hand to pytest. One help text and one check per option:
the plugin adds them all (:func:`add_to_pytest`) and checks them when pytest starts (:func:`check_config`); the command
line adds its share (:func:`add_to_argparse`), checks them before anything starts (:func:`check_args`) and hands the
ones given to pytest by their short names (:func:`forward`).

No pytest import here: the command line builds its parsers from this table without loading pytest.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

from ..errors import GpuproofError

# pods in flight of the per-node checks (gpuproof/plugin/fanout.py): a width a real control plane carries (it runs
# thousands of pods); the API server is spared by the rate of requests (--api-qps) and of pod starts (POD_RATE)
DEFAULT_PARALLEL = 256
POD_RATE = 20.0                     # pods a second the fan-out starts at most (a burst of as many)
PARALLEL_ENV = "GPUPROOF_PARALLEL"
DEFAULT_PROGRESS_AFTER = 10.0       # seconds before a step is reported (gpuproof/plugin/progress.py)


def parse_parallel(text: Any, source: str = "--parallel") -> int:
    """A whole number of pods in flight, 1 or more; anything else is one line naming the option."""
    try:
        value = int(str(text).strip())
    except ValueError:
        raise GpuproofError(f"{source} takes a whole number of pods in flight (1 or more), got {text!r}") from None
    if value < 1:
        raise GpuproofError(f"{source} must be 1 or more pods in flight, got {value}")
    return value


def _seconds_or_off(value: float) -> None:
    if value < 0:
        raise GpuproofError(f"--progress-after must be 0 (off) or more seconds, got {value:g}")


def _rate(value: float) -> None:
    if value < 0:
        raise GpuproofError(f"--api-qps must be 0 (unbounded) or more requests a second, got {value:g}")


def _more_than_zero(value: float) -> None:
    if not value > 0:
        raise GpuproofError(f"--api-deadline must be more than 0 seconds, got {value:g}")


def _gang_scheduler(value: str) -> None:
    from ..discovery.gang import check_name

    try:
        check_name(value)
    except ValueError as exc:
        raise GpuproofError(str(exc)) from None


def _window(value: float) -> None:
    if not value > 0:
        raise GpuproofError(f"--gang-negative-window must be more than 0 seconds, got {value:g}")


def _positive_seconds(option: str) -> Callable[[float], None]:
    def check(value: float) -> None:
        if not value > 0:
            raise GpuproofError(f"--{option} must be more than 0 seconds, got {value:g}")
    return check


# which of gpuproof's commands take an option too, beside pytest
TARGET = "target"       # gpuproof run and gpuproof plan: which cluster
RUN = "run"             # gpuproof run
SELECT = "select"       # gpuproof run and gpuproof plan, among the options that choose the checks (cli/options.py)


@dataclasses.dataclass(frozen=True)
class Option:
    name: str                              # --<name>, --gpuproof-<name>; its dest has '_' for '-'
    help: str
    metavar: str | None = None
    type: Callable[[str], Any] | None = None   # what a value is read as (None: text)
    flag: bool = False                     # takes no value
    default: Any = None                    # pytest's default; a callable is called when pytest adds the option
    check: Callable[[Any], Any] | None = None   # a given value's check: raises GpuproofError naming the option
    cli: str = ""                          # TARGET, RUN or SELECT: the commands that take it too ("": pytest only)
    cli_default: Any = None                # the command line's default (None: not handed to pytest unless given)

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    def pytest_default(self) -> Any:
        return self.default() if callable(self.default) else self.default


OPTIONS: tuple[Option, ...] = (
    Option("kubeconfig", "run against the cluster of this kubeconfig (default: a private embedded cluster)",
           cli=TARGET),
    Option("context", "kubeconfig context to use (implies a real cluster)", cli=TARGET),
    Option("fleet", "fleet file (or shipped fleet name) for the embedded cluster; default: mixed", cli=TARGET),
    Option("sim-port", "base port of the embedded cluster (uses 6 ports from it); default: auto (six free ports no "
                       "other session on this machine has chosen)", default="auto"),
    Option("report-dir", "folder that gets one sub-folder per run (default: reports)",
           default=lambda: os.environ.get("GPUPROOF_REPORT_DIR", "reports"), cli=RUN, cli_default="reports"),
    Option("run-id", "run id (default: time-stamp + random suffix)", cli=RUN),
    Option("pool-label", "node label that names node pools (default: the first of the common cloud labels)",
           cli=TARGET),
    Option("strict-taints", "fail (rather than warn) when a GPU node has no NoSchedule taint", flag=True, cli=RUN),
    Option("shared-requests-refused", "pools (comma-separated, or 'all') whose time-slicing has "
                                      "failRequestsGreaterThanOne; on the embedded cluster the fleet says so",
           metavar="POOLS", cli=TARGET),
    Option("quick-bench", "benchmarks at their smallest sizes, seconds each (gpuproof run and plan: also runs them, "
                          "as --bench does): proves every benchmark's path on the cluster; their figures are marked "
                          "sizes=quick and are not for comparison with a full run", flag=True, cli=SELECT),
    Option("timeout-scale", "multiply every wait's deadline (slow clusters)", type=float,
           default=lambda: float(os.environ.get("GPUPROOF_TIMEOUT_SCALE", "1"))),
    Option("lease-wait", "how long to wait for another gpuproof run on the same cluster to finish (its run lease); "
                         "default 300", metavar="SECONDS", type=float, default=300.0),
    Option("api-deadline", "how long a request may go without an answer from the API server (refused, reset, "
                           "silent) before the run takes it as gone and stops, cut short (exit 75 under gpuproof run, "
                           "the report written); within it reads, deletes and lease renewals are sent again, so a "
                           "restarted API server is outlasted. Default 120, or $GPUPROOF_API_DEADLINE",
           metavar="SECONDS", type=float, check=_more_than_zero, cli=RUN),
    Option("api-qps", "requests a second this run sends the API server at most, 100 at once (watches aside; a 429 "
                      "is sent again as the API server says); 0 for no bound. Default 50, or $GPUPROOF_API_QPS",
           metavar="N", type=float, check=_rate, cli=RUN),
    Option("no-lease", "run without taking the cluster's run lease (concurrent runs are then not kept apart)",
           flag=True),
    Option("progress-after", "report a step (a check, a pod waiting, an image pull, a benchmark pod) once it has "
                             "lasted this long, then at doubling intervals; the time left is shown at most every 3x "
                             f"this; 0 turns progress off (default {DEFAULT_PROGRESS_AFTER:g})",
           metavar="SECONDS", type=float, default=DEFAULT_PROGRESS_AFTER, check=_seconds_or_off, cli=RUN),
    Option("parallel", "per-node checks (health, census, topology, access, driver and time-slicing probes) start on "
                       f"every node at once, with at most N pods in flight (default {DEFAULT_PARALLEL}, or "
                       f"${PARALLEL_ENV}), started at most {POD_RATE:g} a second; each node is still its own test. "
                       "Lower it for fewer pods at once; --api-qps bounds the requests",
           metavar="N", default=lambda: os.environ.get(PARALLEL_ENV), check=parse_parallel, cli=RUN),
    Option("gang-scheduler", "the gang scheduler the gang suite tests: auto (the first the cluster's API shows of "
                             "kueue, volcano, kai, workload-api) or one of them (default auto)",
           metavar="NAME", default="auto", check=_gang_scheduler, cli=RUN),
    Option("gang-queue", "the Kueue ClusterQueue the gang suite's LocalQueue points at (default: the cluster's that "
                         "admits the run's namespace and has nvidia.com/gpu quota; gpuproof never makes one)",
           metavar="CLUSTERQUEUE", cli=RUN),
    Option("gang-negative-window", "seconds the gang suite's oversized gang must keep every pod unbound (upstream's "
                                   "-gang-negative-window; default 30)",
           metavar="SECONDS", type=float, default=30.0, check=_window, cli=RUN),
    Option("operator-ready-timeout", "seconds the operators suite waits for an operator's pods to be Ready "
                                     "(upstream's OperatorPodsRunning: 300)",
           metavar="SECONDS", type=float, default=300.0, check=_positive_seconds("operator-ready-timeout"), cli=RUN),
    Option("operator-job-timeout", "seconds the operators suite waits for its distributed job (a TrainJob, a "
                                   "JobSet) to complete (upstream's ControllerReconcilesCR: 180; default 600, for a "
                                   "real cluster's image pulls)",
           metavar="SECONDS", type=float, default=600.0, check=_positive_seconds("operator-job-timeout"), cli=RUN),
)
BY_NAME = {o.name: o for o in OPTIONS}


def _kwargs(o: Option, default: Any) -> dict:
    kw: dict[str, Any] = {"dest": o.dest, "help": o.help}
    if o.flag:
        kw["action"] = "store_true"
        return kw
    kw["default"] = default
    if o.metavar:
        kw["metavar"] = o.metavar
    if o.type is not None:
        kw["type"] = o.type
    return kw


def add_to_pytest(group) -> None:
    """Every option to pytest's ``gpuproof`` group: ``--gpuproof-<name>`` and its alias ``--<name>``."""
    for o in OPTIONS:
        group.addoption(f"--gpuproof-{o.name}", f"--{o.name}", **_kwargs(o, o.pytest_default()))


def check_value(o: Option, value: Any) -> None:
    if o.check is not None and value not in (None, ""):
        o.check(value)


def check_config(config) -> None:
    """The given options' checks, when pytest starts (raises GpuproofError)."""
    for o in OPTIONS:
        check_value(o, config.getoption(o.dest, None))


def cli_options(*kinds: str) -> list[Option]:
    return [o for o in OPTIONS if o.cli in kinds]


def add_to_argparse(parser, *kinds: str) -> None:
    """The options of these kinds (TARGET, RUN, SELECT) to a command's parser, by their short names."""
    for o in cli_options(*kinds):
        parser.add_argument(f"--{o.name}", **_kwargs(o, o.cli_default))


def check_args(args, *kinds: str) -> None:
    """The checks of the options of these kinds the command was given (raises GpuproofError)."""
    for o in cli_options(*kinds):
        check_value(o, getattr(args, o.dest, None))


def forward(args, *kinds: str, exclude: tuple[str, ...] = ()) -> list[str]:
    """The options of these kinds the command was given (but those in ``exclude``), as pytest takes them
    (``--<name>=<value>``, a flag alone)."""
    argv = []
    for o in cli_options(*kinds):
        value = getattr(args, o.dest, None)
        if o.name in exclude or value is None or value is False or value == "":
            continue
        if o.flag:
            argv.append(f"--{o.name}")
        else:
            argv.append(f"--{o.name}={value:g}" if isinstance(value, float) else f"--{o.name}={value}")
    return argv

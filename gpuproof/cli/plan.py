"""``gpuproof plan`` (and ``gpuproof run --dry-run``): what a run would create, where, with which priorities."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys

from ..errors import GpuproofError
from .options import (SUITES_INI, add_selection_options, add_target_options, check_kubeconfig, runs_benchmarks,
                      selection_argv, suites_dir)

DESCRIPTION = """\
List what `gpuproof run` with the same options would create in the cluster, on which nodes,
and with which priorities, without creating anything.

The suites are collected exactly as a run collects them (same -k, --bench, --only-bench and
target options), and for every selected check the plan shows:

  targets     the GPU nodes, pools or products the check runs against, from discovery (which only
              reads the cluster's nodes); where the check picks its node at run time from free
              capacity (preemption), the node it would pick now
  objects     kind, name (pattern), namespace and count of what it creates: pods with the GPUs they
              request and where they are pinned, PriorityClasses, namespaces, quotas, ConfigMaps, Jobs;
              benchmark pods come from the benchmarks' own manifests. Where only the run decides
              (how many pods fill a node's free GPUs), the plan says so and gives today's figure
  priorities  the PriorityClasses a run creates (negative values: only gpuproof's own pods can be
              preempted) and the pods that use them

and the run-wide objects: the run namespace gpuproof-<run-id> and, on a named cluster, the run
Lease. Checks that would skip here and checks that only read are summed up at the end.

Nothing is created. With --kubeconfig/--context the cluster's nodes (and, for the preemption
check, its pods) are read; no lease is taken and no namespace, pod or PriorityClass is made.
Missing permissions a run needs are shown as a warning. Without them, a private embedded cluster
is started from --fleet to read its nodes and stopped again, as `gpuproof run` would.
"""

EPILOG = """\
examples:
  gpuproof plan                                         the embedded cluster (mixed fleet)
  gpuproof plan --kubeconfig ~/.kube/config --context gpu-prod --bench
  gpuproof plan --context gpu-prod -k preemption --format json
  gpuproof run --context gpu-prod --dry-run             the same as gpuproof plan
"""


def register(sub) -> None:
    p = sub.add_parser("plan", help="list what a run would create, on which nodes, with which priorities "
                                    "(creates nothing)",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_options(p)
    add_selection_options(p)
    p.add_argument("--run-id", default=None,
                   help="show names with this run id (default: <run-id>, as each run makes its own)")
    p.add_argument("--format", choices=("text", "json"), default="text", help="text (default) or json")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --), e.g. a suite file")
    p.set_defaults(func=plan_command)


def _plan_argv(args) -> list[str]:
    suites = suites_dir()
    argv = [str(suites), f"--rootdir={suites.parent}", f"--confcutdir={suites}", "-c", str(SUITES_INI),
            "-p", "gpuproof.pytest_plugin", "-p", "no:cacheprovider", "--collect-only", "-q", "--no-lease",
            "--gpuproof-progress-after=0"]
    from ..plugin.options import TARGET, forward

    return argv + forward(args, TARGET) + selection_argv(args) + list(args.pytest_args)


def _preflight(args) -> list[str]:
    """One-line refusals for bad input; warnings for what would stop a run but not the plan."""
    real = bool(args.kubeconfig or args.context)
    if real and args.fleet:
        raise GpuproofError("--fleet is for the embedded cluster; it cannot be combined with --kubeconfig/--context")
    if args.run_id:
        from ..results import _SAFE

        if not _SAFE.match(args.run_id):
            raise GpuproofError(f"--run-id {args.run_id!r} is not a safe folder name (letters, digits, '.', '_', '-')")
    warnings = []
    if real:
        from ..cluster.api import connect
        from ..errors import ClusterError
        from ..cluster.rbac import preflight as rbac_preflight, run_needs

        check_kubeconfig(args.kubeconfig)
        cluster = connect(args.kubeconfig, args.context)
        no_lease = bool({"--no-lease", "--gpuproof-no-lease"} & set(args.pytest_args))
        try:       # access reviews only: they ask, they create nothing
            rbac_preflight(cluster, run_needs(bench=runs_benchmarks(args), lease=not no_lease))
        except ClusterError as exc:
            warnings.append(f"a run would stop before creating anything: {exc}")
    else:
        from ..sim.fleet_file import load_fleet

        load_fleet(args.fleet or "mixed")
    return warnings


def plan_command(args) -> int:
    import pytest

    from ..plugin.plan import Collector, render_text

    warnings = _preflight(args)
    collector = Collector(args.run_id, args.kubeconfig, args.context)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = int(pytest.main(_plan_argv(args), plugins=[collector]))
    if collector.errors:
        raise GpuproofError(collector.errors[0])
    if collector.plan is None:
        said = [ln.strip() for ln in out.getvalue().splitlines() if ln.strip()]
        why = next((ln.removeprefix("ERROR:").strip() for ln in said if ln.startswith("ERROR")), None) or \
            (said[-1] if said else f"pytest exited with status {code}")
        raise GpuproofError(f"cannot make the plan: {why}")
    plan = collector.plan
    plan["warnings"] = warnings
    if not plan["checks"]:
        chosen = f" by -k {args.keyword!r}" if args.keyword else ""
        err = GpuproofError(f"no checks selected{chosen}; nothing would run")
        err.exit_code = 5
        raise err
    if getattr(args, "format", "text") == "json":
        json.dump(plan, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        selection = " (benchmarks only)" if args.only_bench else (" (with benchmarks)" if runs_benchmarks(args) else "")
        if args.keyword:
            selection += f" (-k {args.keyword})"
        sys.stdout.write(render_text(plan, selection))
    return 0

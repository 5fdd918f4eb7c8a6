"""``gpuproof run``: the acceptance suite (optionally the benchmarks) against a cluster."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from ..errors import GpuproofError
from ..plugin.options import RUN, TARGET, add_to_argparse, check_args, forward
from ..results import new_run_id
from .options import (SUITES_INI, add_selection_options, add_target_options, check_kubeconfig, runs_benchmarks,
                      selection_argv, suites_dir)


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run the acceptance suites (default: against a private embedded cluster)",
        description="Run gpuproof's acceptance suites with pytest and write reports/<run-id>/ (junit.xml, "
                    "checks and metrics as JSONL + parquet, inventory.json, summary.md, report.html). "
                    "Without --kubeconfig/--context a private embedded cluster is started with --fleet and "
                    "stopped afterwards. Extra pytest arguments go after '--'. While it runs, steps that last "
                    "longer than --progress-after seconds (image pulls, pods waiting, benchmarks) are reported "
                    "as [gpuproof] lines, with checks done / total and the time left (from earlier runs in "
                    "--report-dir against the same target, when there are any). --dry-run shows what the run "
                    "would create instead of running it (see: gpuproof plan --help).",
        epilog="examples:\n  gpuproof run\n  gpuproof run --fleet minimal\n"
               "  gpuproof run --kubeconfig ~/.kube/config --context gpu-prod --bench\n"
               "  gpuproof run --kubeconfig ~/.kube/config --context gpu-prod --dry-run\n"
               "  gpuproof run -k taints -- -x\n\n"
               "exit codes: 0 every check passed (or skipped, saying why); 1 a check failed;\n"
               "  2 bad input, or the run was interrupted (Ctrl-C, SIGTERM: what it created is deleted);\n"
               "  75 the cluster stopped answering (nothing for --api-deadline seconds, or during the cleanup),\n"
               "     or a node the run judges was deleted or went NotReady:\n"
               "     the run was cut short, its report holds what was judged and names what was lost (checks\n"
               "     cut by it are skipped as 'not judged'), `gpuproof clean` removes what it left;\n"
               "  70 a bug in gpuproof",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    add_target_options(p)
    add_selection_options(p)
    add_to_argparse(p, RUN)         # --report-dir, --run-id, --strict-taints, --api-deadline, --progress-after, ...
    p.add_argument("--dry-run", action="store_true",
                   help="create nothing: list what the run would create, on which nodes, with which priorities "
                        "(the same as gpuproof plan)")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    p.set_defaults(func=_run)


def pytest_argv(args, run_id: str) -> list[str]:
    suites = suites_dir()
    run_path = Path(args.report_dir) / run_id
    # rootdir = the folder above suites/, so test ids read suites/test_x.py::... wherever it is installed;
    # -p loads the plugin also where PYTEST_DISABLE_PLUGIN_AUTOLOAD is set (a no-op when already loaded)
    argv = [str(suites), f"--rootdir={suites.parent}", f"--confcutdir={suites}", "-c", str(SUITES_INI),
            "-p", "gpuproof.pytest_plugin", "-p", "no:cacheprovider", f"--run-id={run_id}",
            f"--report-dir={args.report_dir}", f"--junitxml={run_path / 'junit.xml'}", "-o", "junit_family=xunit2",
            "-rs"]
    argv += forward(args, TARGET, RUN, exclude=("run-id", "report-dir"))      # those two are given above
    argv += selection_argv(args)
    return argv + list(args.pytest_args)


def preflight(args) -> None:
    """Refuse, in one line, what would otherwise fail inside pytest: a bad fleet, an unreachable or
    forbidding cluster, an embedded cluster without control-plane binaries or NVIDIA's node software
    (built here, with progress, where Go is installed), an unusable report folder."""
    real = bool(args.kubeconfig or args.context)
    if real and args.fleet:
        raise GpuproofError("--fleet is for the embedded cluster; it cannot be combined with --kubeconfig/--context")
    report_dir = Path(args.report_dir)
    if report_dir.exists() and not report_dir.is_dir():
        raise GpuproofError(f"--report-dir {report_dir} is a file, not a folder")
    if args.run_id:
        from ..results import _SAFE

        if not _SAFE.match(args.run_id):
            raise GpuproofError(f"--run-id {args.run_id!r} is not a safe folder name (letters, digits, '.', '_', '-')")
    suites_dir()
    if real:
        from ..cluster.api import connect
        from ..cluster.rbac import preflight as rbac_preflight, run_needs

        check_kubeconfig(args.kubeconfig)
        no_lease = bool({"--no-lease", "--gpuproof-no-lease"} & set(args.pytest_args))
        rbac_preflight(connect(args.kubeconfig, args.context),
                       run_needs(bench=runs_benchmarks(args), lease=not no_lease))
    else:
        from ..sim.fleet_file import load_fleet
        from ..sim import binaries
        from .sim import progress

        fleet = load_fleet(args.fleet or "mixed")   # FleetError names the file and the field
        binaries.locate(progress=progress)  # finds them, or builds them on first use, or says how to get them
        if any(p.needs_nvidia() or p.dra for p in fleet.pools):
            from ..sim import nvidia

            nvidia.locate(progress=progress)    # NVIDIA's GFD, device plugin, DRA driver and mock NVML, likewise


def _run(args) -> int:
    import pytest

    if args.dry_run:
        from .plan import plan_command

        return plan_command(args)
    check_args(args, TARGET, RUN)            # -1, 0 or a word: one line, before any cluster starts
    preflight(args)
    run_id = args.run_id or new_run_id()
    code = int(pytest.main(pytest_argv(args, run_id)))
    run_path = Path(args.report_dir) / run_id
    from ..plugin.target import CUT_SHORT_EXIT

    cut = _cut_short(run_path)
    if run_path.exists():
        try:
            from ..report import write_all
        except ImportError:
            write_all = None
        if write_all is not None:
            try:
                write_all(run_path)
            except Exception as exc:  # the records stay; only their rendering failed: say so, keep pytest's code
                print(f"gpuproof: could not render the report of {run_path}: {type(exc).__name__}: {exc} "
                      f"(checks.jsonl, metrics.jsonl and junit.xml are there; `gpuproof report html {run_path}` "
                      "tries again)", file=sys.stderr)
        print(f"\ngpuproof: run {run_id} -> {run_path}/", file=sys.stderr)
    if cut:
        print(f"gpuproof: run {run_id} cut short: {cut}; its report holds what was judged; once the cluster "
              f"answers, `gpuproof clean` removes what the run left (exit {CUT_SHORT_EXIT})", file=sys.stderr)
        return CUT_SHORT_EXIT
    return code


def _cut_short(run_path: Path) -> str:
    """What cut the run short, from its run.json ('' for a run that ended as it should)."""
    import json

    from ..plugin.target import CUT_SHORT

    with contextlib.suppress(OSError, ValueError):
        outcome = str(json.loads((run_path / "run.json").read_text()).get("outcome") or "")
        if CUT_SHORT in outcome:
            return outcome.split(CUT_SHORT, 1)[1]
    return ""

"""``gpuproof run``: the acceptance suite (optionally the benchmarks) against a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import GpuproofError
from ..results import new_run_id

# pytest's configuration for the suites, passed with -c: markers and options are the same in a
# checkout and an installed wheel, and no pytest.ini/tox.ini/pyproject.toml around the install or
# the current folder changes how the suites run.
SUITES_INI = Path(__file__).with_name("suites.ini")


def suites_dir() -> Path:
    """The acceptance suites: ``suites/`` in the repository, ``gpuproof/suites`` installed."""
    from ..workloads import package_folder

    return package_folder("suites")


def add_target_options(p) -> None:
    """The options that name the target cluster (shared by run and plan)."""
    p.add_argument("--kubeconfig", default=None, help="a real cluster's kubeconfig")
    p.add_argument("--context", default=None, help="the kubeconfig context (implies a real cluster)")
    p.add_argument("--fleet", default=None, help="fleet for the embedded cluster (default: mixed)")
    p.add_argument("--shared-requests-refused", metavar="POOLS", default=None,
                   help="pools (comma-separated, or 'all') whose device plugin sets failRequestsGreaterThanOne; "
                        "the embedded cluster knows this from its fleet")
    p.add_argument("--pool-label", default=None,
                   help="node label naming node pools (default: the first common cloud pool label found)")


def add_selection_options(p) -> None:
    """The options that choose the checks (shared by run and plan)."""
    p.add_argument("--bench", action="store_true", help="also run the benchmarks (suites/test_bench_*.py)")
    p.add_argument("--only-bench", action="store_true", help="run only the benchmarks")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select checks")


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
               "  gpuproof run -k taints -- -x",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    add_target_options(p)
    p.add_argument("--report-dir", default="reports", help="parent folder of run folders (default: reports)")
    p.add_argument("--run-id", default=None, help="run id (default: time-stamp + random suffix)")
    add_selection_options(p)
    p.add_argument("--strict-taints", action="store_true", help="untainted GPU nodes fail instead of warn")
    p.add_argument("--progress-after", type=float, default=None, metavar="SECONDS",
                   help="report a step once it has lasted this long, then at doubling intervals; 0: no progress "
                        "lines (default 10)")
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
    for opt in ("kubeconfig", "context", "fleet", "shared_requests_refused", "pool_label"):
        if getattr(args, opt):
            argv.append(f"--{opt.replace('_', '-')}={getattr(args, opt)}")
    if args.strict_taints:
        argv.append("--strict-taints")
    if getattr(args, "progress_after", None) is not None:
        argv.append(f"--gpuproof-progress-after={args.progress_after}")
    argv += selection_argv(args)
    return argv + list(args.pytest_args)


def selection_argv(args) -> list[str]:
    """-m and -k for --bench/--only-bench/-k."""
    argv: list[str] = []
    if args.only_bench:
        argv += ["-m", "bench"]
    elif not args.bench:
        argv += ["-m", "not bench"]
    if args.keyword:
        argv += ["-k", args.keyword]
    return argv


def check_kubeconfig(path: str | None) -> None:
    """A named kubeconfig exists and is a YAML mapping (the client library fails obscurely otherwise)."""
    if not path:
        return
    import yaml

    p = Path(path).expanduser()
    if not p.is_file():
        raise GpuproofError(f"kubeconfig not found: {path}")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise GpuproofError(f"kubeconfig {path} cannot be read as YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("clusters"), list):
        raise GpuproofError(f"kubeconfig {path} is not a kubeconfig (no list of clusters in it)")


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
        from ..cluster import connect
        from ..rbac import preflight as rbac_preflight, run_needs

        check_kubeconfig(args.kubeconfig)
        no_lease = bool({"--no-lease", "--gpuproof-no-lease"} & set(args.pytest_args))
        rbac_preflight(connect(args.kubeconfig, args.context),
                       run_needs(bench=args.bench or args.only_bench, lease=not no_lease))
    else:
        from ..fleet import load_fleet
        from ..sim import binaries
        from ..sim.cli import progress

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
    if args.progress_after is not None and args.progress_after < 0:
        raise GpuproofError(f"--progress-after must be 0 (off) or more seconds, got {args.progress_after:g}")
    preflight(args)
    run_id = args.run_id or new_run_id()
    code = int(pytest.main(pytest_argv(args, run_id)))
    run_path = Path(args.report_dir) / run_id
    if run_path.exists():
        try:
            from ..report import write_all
        except ImportError:
            write_all = None
        if write_all is not None:
            write_all(run_path)
        print(f"\ngpuproof: run {run_id} -> {run_path}/", file=sys.stderr)
    return code

"""``gpuproof run``: the acceptance suite (optionally the benchmarks) against a cluster."""

from __future__ import annotations

import sys
from pathlib import Path

from ..results import new_run_id

REPO = Path(__file__).resolve().parents[2]
SUITES = REPO / "suites"


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="run the acceptance suites (default: against a private embedded cluster)",
        description="Run gpuproof's acceptance suites with pytest and write reports/<run-id>/ (junit.xml, "
                    "checks and metrics as JSONL + parquet, inventory.json, summary.md, report.html). "
                    "Without --kubeconfig/--context a private embedded cluster is started with --fleet and "
                    "stopped afterwards. Extra pytest arguments go after '--'.",
        epilog="examples:\n  gpuproof run\n  gpuproof run --fleet minimal\n"
               "  gpuproof run --kubeconfig ~/.kube/config --context gpu-prod --bench\n"
               "  gpuproof run -k taints -- -x",
        formatter_class=__import__("argparse").RawDescriptionHelpFormatter)
    p.add_argument("--kubeconfig", default=None, help="a real cluster's kubeconfig")
    p.add_argument("--context", default=None, help="the kubeconfig context (implies a real cluster)")
    p.add_argument("--fleet", default=None, help="fleet for the embedded cluster (default: mixed)")
    p.add_argument("--report-dir", default="reports", help="parent folder of run folders (default: reports)")
    p.add_argument("--run-id", default=None, help="run id (default: time-stamp + random suffix)")
    p.add_argument("--bench", action="store_true", help="also run the benchmarks (suites/test_bench_*.py)")
    p.add_argument("--only-bench", action="store_true", help="run only the benchmarks")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select checks")
    p.add_argument("--strict-taints", action="store_true", help="untainted GPU nodes fail instead of warn")
    p.add_argument("--shared-requests-refused", metavar="POOLS", default=None,
                   help="pools (comma-separated, or 'all') whose device plugin sets failRequestsGreaterThanOne; "
                        "the embedded cluster knows this from its fleet")
    p.add_argument("--pool-label", default=None,
                   help="node label naming node pools (default: the first common cloud pool label found)")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    p.set_defaults(func=_run)


def pytest_argv(args, run_id: str) -> list[str]:
    run_path = Path(args.report_dir) / run_id
    argv = [str(SUITES), f"--rootdir={REPO}", "-p", "no:cacheprovider", f"--run-id={run_id}",
            f"--report-dir={args.report_dir}", f"--junitxml={run_path / 'junit.xml'}", "-o", "junit_family=xunit2",
            "-rs"]
    for opt in ("kubeconfig", "context", "fleet", "shared_requests_refused", "pool_label"):
        if getattr(args, opt):
            argv.append(f"--{opt.replace('_', '-')}={getattr(args, opt)}")
    if args.strict_taints:
        argv.append("--strict-taints")
    if args.only_bench:
        argv += ["-m", "bench"]
    elif not args.bench:
        argv += ["-m", "not bench"]
    if args.keyword:
        argv += ["-k", args.keyword]
    return argv + list(args.pytest_args)


def _run(args) -> int:
    import pytest

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

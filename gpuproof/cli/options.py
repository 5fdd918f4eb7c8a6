"""Options and arguments the commands share: which cluster, which suites, the suites' folder."""

from __future__ import annotations

from pathlib import Path

from ..errors import GpuproofError


# pytest's configuration for the suites, passed with -c: markers and options are the same in a
# checkout and an installed wheel, and no pytest.ini/tox.ini/pyproject.toml around the install or
# the current folder changes how the suites run.
SUITES_INI = Path(__file__).with_name("suites.ini")


def suites_dir() -> Path:
    """The acceptance suites: ``suites/`` in the repository, ``gpuproof/suites`` installed."""
    from .. import package_folder

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
    p.add_argument("--quick-bench", action="store_true",
                   help="also run the benchmarks, at their smallest sizes (seconds each): proves each benchmark's "
                        "path on the cluster; figures are marked sizes=quick, not for comparison with a full run")
    p.add_argument("-k", dest="keyword", default=None, help="pytest -k expression to select checks")


def runs_benchmarks(args) -> bool:
    """Whether the selection options (add_selection_options) include the benchmarks."""
    return args.bench or args.only_bench or args.quick_bench


def selection_argv(args) -> list[str]:
    """-m and -k for --bench/--only-bench/-k."""
    argv: list[str] = []
    if args.only_bench:
        argv += ["-m", "bench"]
    elif not runs_benchmarks(args):
        argv += ["-m", "not bench"]
    if args.quick_bench:
        argv.append("--gpuproof-quick-bench")
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

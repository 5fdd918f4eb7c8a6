"""Options and arguments the commands share: which cluster, which suites, the suites' folder.

The options that pytest takes too are declared once, with the plugin's: gpuproof/plugin/options.py.
"""

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
    """The options that name the target cluster (shared by run and plan; declared with the plugin's)."""
    from ..plugin.options import TARGET, add_to_argparse

    add_to_argparse(p, TARGET)


def add_selection_options(p) -> None:
    """The options that choose the checks (shared by run and plan)."""
    from ..plugin.options import SELECT, add_to_argparse

    p.add_argument("--bench", action="store_true", help="also run the benchmarks (suites/test_bench_*.py)")
    p.add_argument("--only-bench", action="store_true", help="run only the benchmarks")
    add_to_argparse(p, SELECT)          # --quick-bench
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

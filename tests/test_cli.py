"""The command line: help texts and how `gpuproof run` hands its options to pytest."""

import os
import subprocess
import sys

import pytest

from gpuproof.cli.main import build_parser
from gpuproof.cli.run import pytest_argv


def test_run_passes_target_options_to_pytest():
    args = build_parser().parse_args(["run", "--context", "prod", "--shared-requests-refused", "g6.4xlarge",
                                      "--pool-label", "pool", "--strict-taints", "-k", "taints", "--", "-x"])
    argv = pytest_argv(args, "rid")
    for want in ["--context=prod", "--shared-requests-refused=g6.4xlarge", "--pool-label=pool", "--strict-taints",
                 "--run-id=rid", "-m", "not bench", "-k", "taints", "-x"]:
        assert want in argv
    assert any(a.startswith("--junitxml=") and a.endswith("rid/junit.xml") for a in argv)


@pytest.mark.parametrize("command", [[], ["run"], ["sim"], ["sim", "up"], ["clean"], ["bench"], ["report"]])
@pytest.mark.server  # tier: gpuproof's CLI (or pytest) as a process
def test_help_explains(command):
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", *command, "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: gpuproof") and len(proc.stdout) > 400


def test_run_finds_its_suites_through_the_package():
    """`gpuproof run` runs the suites from the gpuproof package (a link to suites/ here, copies in a wheel),
    with its own pytest configuration, so test ids read suites/test_x.py wherever gpuproof is installed."""
    from pathlib import Path

    import gpuproof
    from gpuproof.cli.options import SUITES_INI, suites_dir

    argv = pytest_argv(build_parser().parse_args(["run"]), "rid")
    suites = suites_dir()
    assert suites == Path(gpuproof.__file__).parent / "suites" and (suites / "conftest.py").is_file()
    assert argv[0] == str(suites) and f"--rootdir={suites.parent}" in argv
    assert argv[argv.index("-c") + 1] == str(SUITES_INI) and SUITES_INI.is_file()
    assert (Path(__file__).parents[1] / "suites" / "test_taints.py").samefile(suites / "test_taints.py")


@pytest.mark.server  # tier: gpuproof's CLI (or pytest) as a process
def test_python_dash_m_gpuproof():
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "--version"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("gpuproof "), proc.stderr


@pytest.mark.server  # tier: gpuproof's CLI (or pytest) as a process
def test_plugin_options_have_canonical_names_and_short_aliases(tmp_path):
    """--gpuproof-* are the canonical names; the short names stay as aliases for the same option."""
    (tmp_path / "test_opts.py").write_text(
        "def test_opts(pytestconfig):\n"
        "    g = pytestconfig.getoption\n"
        "    assert g('--kubeconfig') == g('--gpuproof-kubeconfig') == 'kc.yaml'\n"
        "    assert g('--fleet') == g('--gpuproof-fleet') == 'minimal'\n"
        "    assert g('--context') == 'ctx' and g('--strict-taints') is True\n"
        "    assert g('--shared-requests-refused') == 'l4' and g('--gpuproof-pool-label') == 'pool'\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "gpuproof.pytest_plugin",
                           "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
                           "test_opts.py", "--gpuproof-kubeconfig=kc.yaml", "--fleet", "minimal",
                           "--gpuproof-context=ctx", "--strict-taints", "--shared-requests-refused=l4",
                           "--pool-label=pool"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    helptext = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "gpuproof.pytest_plugin"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120).stdout
    for name in ("--gpuproof-kubeconfig", "--gpuproof-fleet", "--gpuproof-strict-taints", "--kubeconfig", "--fleet"):
        assert name in helptext


def test_the_suites_waits_have_names_scaled_in_one_place():
    """Named timeouts (issue #40 item 5): every figure a suite waits with is a name of gpuproof.plugin.timeouts,
    scaled by --timeout-scale; no suite or plugin module waits with a literal through target.timeout(<number>)."""
    import re
    from pathlib import Path

    from gpuproof.plugin.timeouts import Timeouts

    t = Timeouts(scale=2.5)
    assert t.pod_placed == 2.5 * t.pod_placed_s and t.pod_done == 2.5 * 900
    with pytest.raises(AttributeError):
        _ = t.no_such_wait
    root = Path(__file__).resolve().parents[1]
    literal = [f"{p.relative_to(root)}:{n}" for p in [*root.glob("suites/*.py"), *root.glob("gpuproof/plugin/*.py")]
               for n, line in enumerate(p.read_text().splitlines(), 1) if re.search(r"\.timeout\(\d", line)]
    assert literal == []

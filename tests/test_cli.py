"""The command line: help texts and how `gpuproof run` hands its options to pytest."""

import subprocess
import sys

import pytest

from gpuproof.cli import build_parser
from gpuproof.commands.run import pytest_argv


def test_run_passes_target_options_to_pytest():
    args = build_parser().parse_args(["run", "--context", "prod", "--shared-requests-refused", "g6.4xlarge",
                                      "--pool-label", "pool", "--strict-taints", "-k", "taints", "--", "-x"])
    argv = pytest_argv(args, "rid")
    for want in ["--context=prod", "--shared-requests-refused=g6.4xlarge", "--pool-label=pool", "--strict-taints",
                 "--run-id=rid", "-m", "not bench", "-k", "taints", "-x"]:
        assert want in argv
    assert any(a.startswith("--junitxml=") and a.endswith("rid/junit.xml") for a in argv)


@pytest.mark.parametrize("command", [[], ["run"], ["sim"], ["sim", "up"], ["clean"], ["bench"], ["report"]])
def test_help_explains(command):
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", *command, "--help"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: gpuproof") and len(proc.stdout) > 400

"""Every `gpuproof` subcommand, given a user's mistake, ends in one line on stderr and a non-zero exit.

Each case runs the real command line (``python -m gpuproof``) in a scratch folder, as a user would:
a fleet that is missing or malformed, a kubeconfig that is missing, garbage or points nowhere, a
report folder that does not exist, an unknown benchmark, bad baseline and rules files, and so on.
None of them may print a traceback, and none may touch a cluster (nothing here needs one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.server  # tier: each test runs gpuproof's CLI as a process

BAD_FLEET = """\
name: broken
pools:
  - name: a100
    gpu: {product: NVIDIA-A100-SXM4-80GB, count: lots}
"""

# a kubeconfig whose API server does not exist: port 1 on this host refuses at once
UNREACHABLE_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: someone
  user: {token: not-a-real-token}
contexts:
- name: nowhere
  context: {cluster: nowhere, user: someone}
current-context: nowhere
"""

RULES = """\
rules:
  - metric: matmul/tflops
    tolerance: 5%
    direction: higher_is_better
"""


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("cli-errors")
    (d / "bad-fleet.yaml").write_text(BAD_FLEET)
    (d / "not-yaml.yaml").write_text("pools: [1, 2\nname: x: y\n")
    (d / "unreachable.kubeconfig").write_text(UNREACHABLE_KUBECONFIG)
    (d / "garbage.kubeconfig").write_text("this is not a kubeconfig\n")
    (d / "a-file").write_text("not a folder\n")
    (d / "rules.yaml").write_text(RULES)
    (d / "bad-rules.yaml").write_text("rules: [metric: x\n  tolerance: : :\n")
    (d / "bad-baseline.json").write_text("{not json")
    run = d / "reports" / "r1"                 # a run folder (so check gets as far as the baseline)
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"run_id": "r1"}')
    return d


# (id, argv, a word the one line must contain)
CASES = [
    ("unknown-command", ["nosuch"], "invalid choice"),
    ("unknown-option", ["run", "--nosuch"], "unrecognized arguments"),
    ("run-missing-fleet", ["run", "--fleet", "no-such-fleet.yaml"], "no-such-fleet.yaml"),
    ("run-malformed-fleet", ["run", "--fleet", "bad-fleet.yaml"], "pools[0].gpu.count"),
    ("run-fleet-not-yaml", ["run", "--fleet", "not-yaml.yaml"], "not valid YAML"),
    ("run-missing-kubeconfig", ["run", "--kubeconfig", "no-such.kubeconfig"], "no-such.kubeconfig"),
    ("run-garbage-kubeconfig", ["run", "--kubeconfig", "garbage.kubeconfig"], "garbage.kubeconfig"),
    ("run-unreachable-kubeconfig", ["run", "--kubeconfig", "unreachable.kubeconfig"], "127.0.0.1:1"),
    ("run-unknown-context", ["run", "--kubeconfig", "unreachable.kubeconfig", "--context", "nosuch"], "nosuch"),
    ("run-fleet-and-kubeconfig", ["run", "--kubeconfig", "unreachable.kubeconfig", "--fleet", "minimal"], "--fleet"),
    ("run-report-dir-is-a-file", ["run", "--report-dir", "a-file"], "a-file"),
    ("run-unsafe-run-id", ["run", "--run-id", "../elsewhere"], "--run-id"),
    ("sim-up-missing-fleet", ["sim", "up", "--fleet", "no-such-fleet.yaml", "--state-dir", "sim"], "no-such-fleet"),
    ("sim-up-bad-port", ["sim", "up", "--fleet", "minimal", "--port", "abc", "--state-dir", "sim"], "--port"),
    ("sim-fleets-check-malformed", ["sim", "fleets", "--check", "bad-fleet.yaml"], "pools[0].gpu.count"),
    ("sim-load-not-running", ["sim", "load", "--fleet", "minimal", "--state-dir", "sim"], "not running"),
    ("sim-no-action", ["sim"], "required"),
    ("clean-nothing-named-nothing-running", ["clean"], "no embedded cluster running"),
    ("clean-missing-kubeconfig", ["clean", "--kubeconfig", "no-such.kubeconfig"], "no-such.kubeconfig"),
    ("clean-unreachable", ["clean", "--kubeconfig", "unreachable.kubeconfig", "--dry-run"], "127.0.0.1:1"),
    ("bench-unknown-benchmark", ["bench", "--local", "nosuch"], "nosuch"),
    ("bench-without-local", ["bench", "matmul"], "--local"),
    ("bench-out-is-a-file", ["bench", "--local", "probe", "--device", "cpu", "--out", "a-file/x"], "a-file"),
    ("bench-unsafe-run-id", ["bench", "--local", "probe", "--device", "cpu", "--run-id", "a/b"], "--run-id"),
    ("report-summary-missing-run", ["report", "summary", "reports/no-such-run"], "no-such-run"),
    ("report-summary-latest-none", ["report", "summary", "latest"], "no run folders"),
    ("report-html-missing-run", ["report", "html", "no-such-run"], "no-such-run"),
    ("report-compare-missing-run", ["report", "compare", "reports/r1", "reports/gone"], "gone"),
    ("report-baseline-missing-run", ["report", "baseline", "make", "gone", "-o", "b.json"], "gone"),
    ("report-check-missing-rules", ["report", "check", "reports/r1", "--baseline", "b.json", "--rules", "no.yaml"],
     "no.yaml"),
    ("report-check-bad-rules", ["report", "check", "reports/r1", "--baseline", "b.json", "--rules", "bad-rules.yaml"],
     "bad-rules.yaml"),
    ("report-check-missing-baseline", ["report", "check", "reports/r1", "--baseline", "no.json",
                                       "--rules", "rules.yaml"], "no.json"),
    ("report-check-bad-baseline", ["report", "check", "reports/r1", "--baseline", "bad-baseline.json",
                                   "--rules", "rules.yaml"], "bad-baseline.json"),
]


@pytest.mark.parametrize("argv,word", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_user_mistake_is_one_line(scratch, argv, word):
    env = {**os.environ, "GPUPROOF_CACHE": str(scratch / "cache")}   # never the user's embedded cluster
    env.pop("GPUPROOF_DEBUG", None)
    cwd = scratch
    if "latest" in argv:                       # a folder with no reports/ in it
        cwd = scratch / "empty-folder"
        cwd.mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "gpuproof", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=env)
    err = proc.stderr.strip()
    assert proc.returncode != 0, f"exit 0 for {argv}:\n{proc.stdout}\n{err}"
    assert "Traceback" not in err, err
    assert len(err.splitlines()) == 1, f"{len(err.splitlines())} lines on stderr:\n{err}"
    assert err.startswith("gpuproof"), err
    assert word in err, f"{word!r} not in: {err}"


def test_help_exits_zero():
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: gpuproof"), proc.stderr


# ------------------------------------------------------------------ an embedded cluster that cannot start


def _no_go_env(scratch: Path) -> dict:
    """No Go, no control-plane binaries: not on PATH, not named, not in the (empty) build cache."""
    from gpuproof.sim.binaries import BINARIES, env_var

    env = {k: v for k, v in os.environ.items()
           if k not in {"GPUPROOF_BIN_DIR", "KUBEBUILDER_ASSETS", "GPUPROOF_DEBUG", *map(env_var, BINARIES)}}
    (scratch / "empty-path").mkdir(exist_ok=True)
    return {**env, "PATH": str(scratch / "empty-path"), "GPUPROOF_CACHE": str(scratch / "no-go-cache")}


@pytest.mark.parametrize("command", ["run", "plan"])
def test_without_go_or_binaries_the_embedded_cluster_is_one_line(scratch, command):
    """`gpuproof run` stops before pytest starts; `gpuproof plan` (whose pytest collects) says the same."""
    proc = subprocess.run([sys.executable, "-m", "gpuproof", command, "--fleet", "minimal", "--run-id", "no-go"],
                          cwd=scratch, capture_output=True, text=True, timeout=120, env=_no_go_env(scratch))
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, proc
    assert err.startswith("gpuproof: error: ") and "the embedded cluster needs etcd, kube-apiserver" in err, err
    assert all(way in err for way in ("install Go 1.25", "GPUPROOF_BIN_DIR", "KUBEBUILDER_ASSETS")), err
    assert not proc.stdout and not (scratch / "reports" / "no-go").exists()


@pytest.mark.parametrize("where", ["suites", "external_project"])
def test_pytest_with_a_target_that_cannot_start_says_so_once(scratch, where):
    """Plain pytest, on gpuproof's suites (parametrized per node at collection) or on a user's project
    (the target fixture): one line, not an error per module or test."""
    from gpuproof.cli.options import suites_dir

    path = suites_dir() if where == "suites" else Path(__file__).parent / "external_project"
    proc = subprocess.run([sys.executable, "-m", "pytest", str(path), "-p", "gpuproof.pytest_plugin",
                           "-p", "no:cacheprovider", "--gpuproof-fleet", "minimal",
                           f"--gpuproof-report-dir={scratch / 'reports'}"],
                          cwd=scratch, capture_output=True, text=True, timeout=120, env=_no_go_env(scratch))
    out = proc.stdout + proc.stderr
    said = [line for line in out.splitlines() if "gpuproof cannot use its target cluster" in line]
    assert proc.returncode == 2 and "Traceback" not in out and "ERROR collecting" not in out, out[-3000:]
    assert len(said) == 1 and "GPUPROOF_BIN_DIR" in said[0] and "KUBEBUILDER_ASSETS" in said[0], out[-3000:]


@pytest.mark.sim
def test_run_whose_cluster_cannot_start_says_so_in_one_line(scratch):
    """A failure only starting can show (a port taken), inside the run's pytest: one line, exit 2."""
    import socket

    from gpuproof.sim.binaries import locate

    locate()                                    # the binaries are there, so the start itself fails
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--fleet", "minimal", "--run-id", "busy",
                               "--", f"--sim-port={port}"], cwd=scratch, capture_output=True, text=True,
                              timeout=300)
    out = proc.stdout + proc.stderr
    said = [line for line in out.splitlines() if "gpuproof cannot use its target cluster" in line]
    assert proc.returncode == 2 and "Traceback" not in out and len(said) == 1, out[-3000:]
    assert f"port {port} (kube-apiserver)" in said[0] and "in use by another process" in said[0], said

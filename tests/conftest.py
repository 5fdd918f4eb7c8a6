"""Fixtures for gpuproof's own tests: one embedded cluster for the whole test session.

Tests that need another fleet load it with ``fleet_loaded(...)``, which swaps the
simulated nodes (the control plane keeps running) and puts the mixed fleet back after.
Suites are run as real pytest subprocesses against the cluster's kubeconfig, exactly
as a user would run them.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuproof.sim.fleet import Fleet
from gpuproof.sim.fleet_file import load_fleet, parse_fleet
from gpuproof.sim.controlplane import SimCluster, find_free_base

REPO = Path(__file__).resolve().parents[1]


class EmbeddedCluster:
    def __init__(self, sim: SimCluster):
        self.sim = sim
        self.fleet_name = "mixed"
        self._client = None

    @property
    def kubeconfig(self) -> str:
        return str(self.sim.kubeconfig)

    @property
    def client(self):
        if self._client is None:
            from gpuproof.cluster.api import connect

            self._client = connect(self.kubeconfig)
        return self._client

    def load(self, fleet: Fleet | str | dict) -> Fleet:
        if isinstance(fleet, str):
            fleet = load_fleet(fleet)
        elif isinstance(fleet, dict):
            fleet = parse_fleet(fleet, source=f"test:{fleet.get('name', 'fleet')}")
        self.sim.load_fleet(fleet)
        self.fleet_name = fleet.source or fleet.name
        return fleet

    @contextlib.contextmanager
    def fleet_loaded(self, fleet):
        loaded = self.load(fleet)
        try:
            yield loaded
        finally:
            self.load("mixed")

    def suite_command(self, *suite_args: str, report_dir: Path, run_id: str) -> list[str]:
        return [sys.executable, "-m", "pytest", *suite_args, f"--kubeconfig={self.kubeconfig}",
                f"--report-dir={report_dir}", f"--run-id={run_id}", "-p", "no:cacheprovider", "-q",
                "-o", "addopts=-ra --strict-markers", f"--rootdir={REPO}"]

    def run_suite(self, *suite_args: str, report_dir: Path, run_id: str, timeout: float = 300) -> "SuiteResult":
        """Run suites as a user would: a pytest subprocess against this cluster's kubeconfig."""
        cmd = self.suite_command(*suite_args, report_dir=report_dir, run_id=run_id)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        return SuiteResult(proc, report_dir / run_id)

    def run_suites_together(self, runs: dict[str, list[str]], report_dir: Path, timeout: float = 600
                            ) -> dict[str, "SuiteResult"]:
        """Start one suite run per run id at once (as two users would) and wait for all of them."""
        procs = {rid: subprocess.Popen(self.suite_command(*args, report_dir=report_dir, run_id=rid), cwd=REPO,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for rid, args in runs.items()}
        out = {}
        for rid, proc in procs.items():
            try:
                stdout, _ = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, _ = proc.communicate()
            out[rid] = SuiteResult(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, ""),
                                   report_dir / rid)
        return out


@contextlib.contextmanager
def private_cluster(fleet: dict, state: Path, source: str):
    """An embedded cluster of its own for one test (a fleet with other control-plane settings), stopped after."""
    sim = SimCluster(state, base_port=find_free_base(), private=True)
    sim.up(parse_fleet(fleet, source=source))
    try:
        yield EmbeddedCluster(sim)
    finally:
        sim.down()


class SuiteResult:
    def __init__(self, proc: subprocess.CompletedProcess, run_path: Path):
        self.proc = proc
        self.code = proc.returncode
        self.output = proc.stdout + proc.stderr
        self.run_path = run_path

    @property
    def checks(self) -> list[dict]:
        p = self.run_path / "checks.jsonl"
        return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []

    def failed_checks(self, check: str | None = None) -> list[dict]:
        return [c for c in self.checks if c["verdict"] == "fail" and (check is None or c["check"] == check)]

    def __repr__(self) -> str:
        return f"exit {self.code}\n{self.output[-6000:]}"


@pytest.fixture(scope="session")
def embedded(tmp_path_factory) -> EmbeddedCluster:
    """A private embedded cluster (mixed fleet) shared by the whole test session."""
    state = tmp_path_factory.mktemp("sim")
    sim = SimCluster(state, base_port=find_free_base(), private=True)
    sim.up(load_fleet("mixed"), progress=lambda m: print(f"[sim] {m}", file=sys.stderr))
    try:
        yield EmbeddedCluster(sim)
    finally:
        sim.down()


@pytest.fixture
def run_in(embedded):
    """A fresh run namespace in the embedded cluster, cleaned up after the test."""
    from gpuproof.cluster.api import Run
    from gpuproof.results import new_run_id

    run = Run(embedded.client, "t" + new_run_id())
    run.create()
    try:
        yield run
    finally:
        run.cleanup(wait=False)


@pytest.fixture(scope="module")
def stub(tmp_path_factory):
    """``workloads/loadstub.py`` on 127.0.0.1 for a test module (a fast endpoint shaped like an inference
    server's answers); its URL."""
    from loadprocs import start_process, stop_process

    url, proc = start_process("loadstub.py", tmp_path_factory.mktemp("stub"))
    try:
        yield url
    finally:
        assert stop_process(proc)["ok"]

"""``gpuproof bench``: help, refusals, and a local run writing a run folder."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from gpuproof.cli.main import main
from gpuproof.results import load_table


def test_help(capsys):
    try:
        main(["bench", "--help"])
    except SystemExit as exc:
        assert exc.code == 0
    out = capsys.readouterr().out
    for word in ("--local", "matmul", "allreduce", "inference", "probe", "--sizes", "--device", "--out"):
        assert word in out


def test_without_local_is_refused(capsys):
    assert main(["bench", "matmul"]) == 2
    assert "--local" in capsys.readouterr().err


def test_all_with_sizes_is_ambiguous(capsys, tmp_path):
    """--sizes means matrices to matmul and messages to all-reduce (their classes' ``shared_options``): with both in
    one run, in either order, it is refused naming each one's own option."""
    for todo in ("all", "allreduce,matmul"):
        assert main(["bench", "--local", todo, "--sizes", "64", "--out", str(tmp_path)]) == 2
        assert ("--sizes is ambiguous with both matmul and allreduce (their sizes differ); use --matmul-sizes and "
                "--allreduce-sizes") in capsys.readouterr().err
    assert not list(tmp_path.iterdir())       # refused before a run folder is made


@pytest.mark.server  # tier: gpuproof bench --local as a process
def test_local_probe_writes_a_run_folder(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", "bench", "--local", "probe", "--device", "cpu",
                           "--threads", "1", "--out", str(tmp_path), "--run-id", "b1", "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "b1"
    assert (run / "metrics.parquet").exists() and (run / "metrics.jsonl").exists()
    meta = json.loads((run / "run.json").read_text())
    assert meta["target"] == "local" and meta["outcome"] == "passed"
    df = load_table(run, "metrics.jsonl")
    assert isinstance(df, pd.DataFrame)
    assert {"run_id", "cluster", "node", "product", "benchmark", "parameters", "metric", "value", "unit"} <= set(df)
    ok = df[df.metric == "kernel_check_ok"]
    assert list(ok.value) == [1.0] and list(ok.node) == ["local"] and list(ok.run_id) == ["b1"]
    raw = json.loads((run / "bench-probe.json").read_text())
    assert raw["workload"] == "probe" and raw["ok"] is True

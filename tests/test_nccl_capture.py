"""The workload's capture of NCCL's transport (workloads/nccl_capture.py): each rank's own NCCL log, read and merged
per node; gloo on the CPU says so."""

from __future__ import annotations

from pathlib import Path

from gpuproof.bench.workloads import import_workload

capture = import_workload("nccl_capture")
NCCL = Path(__file__).parent / "data" / "nccl"


def test_each_rank_writes_its_own_nccl_log_when_nccl_debug_is_on(monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    assert capture.prepare(0, "cuda") is None                        # NCCL_DEBUG off: nothing to capture
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    assert capture.prepare(3, "cpu") is None                         # gloo prints no NCCL line
    path = capture.prepare(3, "cuda")
    assert "rank3" in path and capture.os.environ["NCCL_DEBUG_FILE"] == path


def test_a_recorded_log_read_per_rank_and_merged_per_node(tmp_path):
    logs = sorted(p for p in NCCL.iterdir() if p.suffix == ".log")
    reads = [capture.local(str(p), "cuda", r) for r, p in enumerate(logs[:2])]
    assert all(r["backend"] == "nccl" and r["lines"] for r in reads)
    merged = capture.by_node(reads + [{}], ["n0", "n0", "n1"])
    assert list(merged) == ["n0"] and merged["n0"]["ranks"] == [0, 1]
    assert merged["n0"]["transport"] == "+".join(dict.fromkeys(r["transport"] for r in reads if r["transport"]))
    missing = capture.local(str(tmp_path / "none.log"), "cuda", 0)
    assert missing["transport"] is None and missing["lines"] == 0


def test_gloo_reads_tcp():
    read = capture.local(None, "cpu", 0)
    assert read["backend"] == "gloo" and read["transport"] == capture.GLOO
    assert capture.by_node([read, read], ["a", "b"])["b"]["transport"] == capture.GLOO

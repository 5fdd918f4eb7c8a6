"""The collectives beside all-reduce (workloads/collectives.py, allreduce.py --collectives): nccl-tests' sizes and
bandwidth factors against numbers worked by hand, the #wrong patterns against a reference of each collective, and
3 ranks on the CPU (gloo) over every collective, with one that gloo lacks recorded with its reason and a spoiled
output element counted as wrong.
"""

import json
import os
import subprocess
import sys

import pytest

from gpuproof.bench.workloads import import_workload, workloads_dir

allreduce = import_workload("allreduce")
coll = import_workload("collectives")
try:  # torch at collection: its first import runs ldconfig, a process the unit tier's guard refuses inside a test
    import torch
except ImportError:  # the pure tests run without it
    torch = None

ALL = ("all_reduce", "all_gather", "reduce_scatter", "alltoall", "sendrecv")


def run_collectives(*args, env_extra=None, timeout=120):
    """(exit status, result, stderr) of workloads/allreduce.py on the CPU with tiny settings."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
              allreduce.SLOW_RANK_ENV, coll.CORRUPT_RANK_ENV, coll.CORRUPT_COLLECTIVE_ENV):
        env.pop(k, None)
    env.update(env_extra or {})
    cmd = [sys.executable, str(workloads_dir() / "allreduce.py"), "--device", "cpu", "--threads", "1",
           "--sample-hz", "0", "--iters", "3", "--warmup", "1", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return p.returncode, json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


# ---------------------------------------------------------------- sizes and factors, by hand


@pytest.mark.parametrize("collective, size, elem, n, want", [
    # all_reduce, sendrecv: count = S / e, the size is one rank's buffer
    ("all_reduce", 2**20, 4, 8, (262144, 2**20)),
    ("sendrecv", 8, 4, 2, (2, 8)),
    ("sendrecv", 1001, 4, 3, (250, 1000)),
    # shared: base = (S/e/n) rounded down to 16 bytes' worth; size = base x e x n (nccl-tests prints base)
    ("all_gather", 2**20, 4, 3, (87380, 1048560)),      # 262144/3 = 87381 -> 87380 (a multiple of 4)
    ("reduce_scatter", 1024, 4, 8, (32, 1024)),         # 256/8 = 32
    ("alltoall", 1000, 2, 3, (160, 960)),               # fp16: 500/3 = 166 -> 160 (a multiple of 8)
    ("all_gather", 100, 8, 4, (2, 64)),                 # fp64: 12/4 = 3 -> 2 (a multiple of 2)
    ("all_gather", 8, 4, 2, (0, 0)),                    # 2/2 = 1 -> 0: left out of the sweep
    ("alltoall", 2**30, 4, 8, (2**25, 2**30)),
])
def test_sizes_are_nccl_tests(collective, size, elem, n, want):
    assert coll.coll_counts(collective, size, elem, n) == want


def test_buffers_per_rank():
    # (input, output) elements for a count of 4 on 3 ranks
    assert coll.buffer_counts("all_reduce", 4, 3) == (4, 4)
    assert coll.buffer_counts("all_gather", 4, 3) == (4, 12)
    assert coll.buffer_counts("reduce_scatter", 4, 3) == (12, 4)
    assert coll.buffer_counts("alltoall", 4, 3) == (12, 12)
    assert coll.buffer_counts("sendrecv", 4, 3) == (4, 4)


def test_bandwidths_by_hand():
    # all_gather, 8 ranks, 1 GiB gathered in 10 ms: algbw = 2^30 / 0.01 / 1e9 = 107.3741824; busbw x 7/8 = 93.9524096
    assert allreduce.algbw_gbps(2**30, 10e-3) == pytest.approx(107.3741824, rel=1e-12)
    assert allreduce.busbw_gbps(2**30, 10e-3, 8, "all_gather") == pytest.approx(93.9524096, rel=1e-12)
    # reduce_scatter, 16 ranks, 512 MiB in 4 ms: algbw = 134.217728; x 15/16 = 125.829120
    assert allreduce.busbw_gbps(2**29, 4e-3, 16, "reduce_scatter") == pytest.approx(125.82912, rel=1e-12)
    # alltoall, 4 ranks, 256 MiB in 5 ms: algbw = 53.6870912; x 3/4 = 40.2653184
    assert allreduce.busbw_gbps(2**28, 5e-3, 4, "alltoall") == pytest.approx(40.2653184, rel=1e-12)
    # sendrecv, factor 1: nccl-tests' sendrecv_perf printed 1073741824 B in 5503.4 us as 195.10 / 195.10 GB/s
    # (both rounded in print: 2^30 / 5503.4 us = 195.105)
    assert allreduce.algbw_gbps(2**30, 5503.4e-6) == pytest.approx(195.10, abs=0.01)
    assert allreduce.busbw_gbps(2**30, 5503.4e-6, 8, "sendrecv") == pytest.approx(195.10, abs=0.01)
    assert {c: allreduce.BUSBW_FACTORS[c](4) for c in ALL} == {
        "all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "alltoall": 0.75, "sendrecv": 1.0}


# ---------------------------------------------------------------- the #wrong patterns


def reference(collective: str, inputs: list[list[int]], count: int) -> list[list[int]]:
    """Every rank's output of ``collective`` from every rank's input, by the collective's definition."""
    n = len(inputs)
    if collective == "all_reduce":
        return [[sum(col) for col in zip(*inputs)] for _ in range(n)]
    if collective == "reduce_scatter":
        total = [sum(col) for col in zip(*inputs)]
        return [total[q * count:(q + 1) * count] for q in range(n)]
    if collective == "all_gather":
        return [[x for src in inputs for x in src] for _ in range(n)]
    if collective == "alltoall":  # rank q gets chunk q of every rank s, in rank order
        return [[x for s in range(n) for x in inputs[s][q * count:(q + 1) * count]] for q in range(n)]
    if collective == "sendrecv":  # from rank q-1
        return [list(inputs[(q - 1) % n]) for q in range(n)]
    raise AssertionError(collective)


@pytest.mark.parametrize("collective", ALL)
@pytest.mark.parametrize("n, count", [(3, 4), (2, 5), (5, 3)])
def test_expected_pattern_is_what_the_collective_makes(collective, n, count):
    n_in, n_out = coll.buffer_counts(collective, count, n)
    inputs = [[coll.input_pattern(collective, r, n, count, g) for g in range(n_in)] for r in range(n)]
    outputs = reference(collective, inputs, count)
    for q in range(n):
        assert [coll.expected_pattern(collective, q, n, count, g) for g in range(n_out)] == outputs[q]


@pytest.mark.parametrize("collective", ALL)
def test_patterns_on_tensors_match_the_ints(collective):
    if torch is None:
        pytest.skip("torch is not installed")
    n, count = 3, 8
    n_in, n_out = coll.buffer_counts(collective, count, n)
    for rank in range(n):
        g_in, g_out = torch.arange(n_in), torch.arange(n_out)
        assert coll.input_pattern(collective, rank, n, count, g_in).tolist() == \
            [coll.input_pattern(collective, rank, n, count, g) for g in range(n_in)]
        assert coll.expected_pattern(collective, rank, n, count, g_out).tolist() == \
            [coll.expected_pattern(collective, rank, n, count, g) for g in range(n_out)]


def test_moved_chunks_tell_their_source_and_destination_apart():
    """A chunk from another rank, or meant for another rank, differs in every element."""
    chunk = [coll.moved_value(2, k, 1) for k in range(8)]
    for src, dst in ((0, 1), (1, 1), (3, 1), (2, 0), (2, 2)):
        assert all(a != b for a, b in zip(chunk, [coll.moved_value(src, k, dst) for k in range(8)]))
    assert max(coll.moved_value(s, k, d) for s in range(9) for k in range(300) for d in range(9)) < 127


def test_the_reductions_keep_all_reduce_s_pattern():
    # ranks 0..4, b=0: 0+1+2+0+1 = 4; b=1: 1+2+0+1+2 = 6; b=2: 2+0+1+2+0 = 5
    assert allreduce.expected_sum_table(5) == [4, 6, 5]
    assert [coll.expected_pattern("all_reduce", 0, 5, 4, g) for g in range(4)] == [4, 6, 5, 4]
    # reduce_scatter: rank 1's share of 4 starts at global index 4 (4 mod 3 = 1)
    assert [coll.expected_pattern("reduce_scatter", 1, 5, 4, g) for g in range(4)] == [6, 5, 4, 6]


# ---------------------------------------------------------------- options


def test_parse_collectives():
    assert allreduce.parse_collectives("auto", "nccl") == list(ALL)
    assert allreduce.parse_collectives("auto", "gloo") == ["all_reduce"]   # the CPU runs stay quick
    assert allreduce.parse_collectives("all", "gloo") == list(ALL)
    assert allreduce.parse_collectives("sendrecv, all-gather,all_reduce", "gloo") == \
        ["all_reduce", "all_gather", "sendrecv"]
    with pytest.raises(ValueError, match="unknown broadcast"):
        allreduce.parse_collectives("all_reduce,broadcast", "nccl")


def test_row_at_size():
    rows = [{"size_bytes": s, "busbw_gbps": s / 1e3, "algbw_gbps": 1.0} for s in (48, 960, 4080)]
    assert allreduce.row_at_size(rows, 1024)["size_bytes"] == 960
    assert allreduce.row_at_size(rows, None)["size_bytes"] == 4080
    assert allreduce.row_at_size(rows, 16) is None
    assert allreduce.row_at_size([], None) is None


# ---------------------------------------------------------------- ranks on the CPU


@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_three_ranks_every_collective_gloo_has():
    rc, result, err = run_collectives("--nproc", "3", "--sizes", "64,4K", "--collectives", "all",
                                      "--report-size", "1K", env_extra={allreduce.SLOW_RANK_ENV: "2",
                                                                        allreduce.SLOW_MS_ENV: "5"})
    assert rc == 0 and result["ok"], err[-3000:]
    assert set(result["collectives"]) == set(ALL)   # (the JSON has sorted keys)
    measured = [c for c, rec in result["collectives"].items() if rec["measured"]]
    missing = [c for c in ALL if c not in measured]
    assert "all_reduce" in measured and len(measured) >= 3, result["collectives"]
    for c in measured:
        rows = [r for r in result["results_all"] if r["collective"] == c]
        assert [r["wrong"] for r in rows] == [0, 0], c
        # 64 B: all_reduce and sendrecv 16 elements; the shared ones 16/3 = 5 -> 4 per rank, 48 B in all
        want = (48, 4080) if c in coll.SHARED else (64, 4096)
        assert tuple(r["size_bytes"] for r in rows) == want, c
        assert all(r["busbw_gbps"] > 0 and r["algbw_gbps"] > 0 for r in rows)
        assert all(r["rank_time_us"][2] >= 5000 for r in rows), c   # the slow rank's delay, every collective
        rec = result["collectives"][c]
        assert rec["wrong_total"] == 0 and rec["why_not"] is None and rec["max_busbw_gbps"] > 0
        assert result["at_size"][c]["size_bytes"] == want[0]    # the largest up to --report-size 1K
        assert f"{c:>14} " in err                                # the progress lines say the collective
    for c in missing:
        rec = result["collectives"][c]
        assert rec["why_not"].startswith("not supported by backend gloo"), rec
        assert rec["wrong_total"] is None and result["at_size"][c] is None
        assert f"{c}: not measured: not supported by backend gloo" in err
    # all_reduce's keys as they were
    assert [r["collective"] for r in result["results"]] == ["all_reduce", "all_reduce"]
    assert result["avg_busbw_gbps"] == result["collectives"]["all_reduce"]["avg_busbw_gbps"]
    assert result["wrong_total"] == 0 and result["wrong_total_all"] == 0 and result["report_size_bytes"] == 1024


@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_a_spoiled_element_is_counted_wrong():
    rc, result, err = run_collectives("--nproc", "2", "--sizes", "64,1K", "--collectives", "all_reduce,sendrecv",
                                      env_extra={coll.CORRUPT_RANK_ENV: "1", coll.CORRUPT_COLLECTIVE_ENV: "sendrecv"})
    assert rc == 1 and result["ok"] is False, err[-3000:]
    assert result["collectives"]["sendrecv"]["wrong_total"] == 2            # one element per size, on rank 1
    assert [r["wrong"] for r in result["results_all"] if r["collective"] == "sendrecv"] == [1, 1]
    assert result["collectives"]["all_reduce"]["wrong_total"] == 0 and result["wrong_total"] == 0
    assert result["wrong_total_all"] == 2
    assert "#wrong 1" in err


@pytest.mark.server  # tier: workloads/allreduce.py as processes
def test_one_rank_has_no_sendrecv_and_says_why():
    rc, result, _ = run_collectives("--sizes", "64", "--collectives", "all_reduce,sendrecv")
    assert rc == 0 and result["ok"]
    rec = result["collectives"]["sendrecv"]
    assert rec["measured"] is False and rec["why_not"].startswith("1 rank: sendrecv has no other rank")
    assert result["collectives"]["all_reduce"]["avg_busbw_gbps"] is None   # 1 rank: no bandwidth
    assert result["at_size"] == {"all_reduce": {"size_bytes": 64, "busbw_gbps": None, "algbw_gbps": None},
                                 "sendrecv": None}


def test_bad_collectives_are_refused(capsys):
    assert allreduce.main(["--device", "cpu", "--collectives", "all_reduce,bcast"]) == 2
    assert "unknown bcast" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])["error"]
    assert allreduce.main(["--device", "cpu", "--report-size", "lots"]) == 2

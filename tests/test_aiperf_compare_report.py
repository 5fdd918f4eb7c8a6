"""benchmarks/aiperf_compare.py's verdicts against issue #29's targets, on rows of a made-up run: which
figure each target reads (at once at 120% when the run has it), the median rule, and the capacity's
rule of every round."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "aiperf_compare.py"


def load():
    spec = importlib.util.spec_from_file_location("aiperf_compare", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def rows(together: bool, capacity=(2.0, 2.0, 2.0)) -> list[dict]:
    out = []
    for r in range(3):
        out.append({"round": r, "part": "search", "capacity_rps": capacity[r]})
        out += [{"round": r, "part": "over", "client": "aiperf", "slice": 0, "served_rps": 2.0},
                {"round": r, "part": "over", "client": "gpuproof", "slice": 0, "served_rps": 1.8},   # 0.90
                {"round": r, "part": "over", "client": "aiperf", "slice": 1, "served_rps": 2.0},
                {"round": r, "part": "under", "client": "gpuproof", "ttft_p50_ms": 101.0, "tpot_p50_ms": 50.0,
                 "client_cpu_per_request_ms": 8.0},
                {"round": r, "part": "under", "client": "aiperf", "ttft_p50_ms": 100.0, "tpot_p50_ms": 49.0,
                 "client_cpu_per_request_ms": 20.0}]
        if together:
            out += [{"round": r, "part": "over-together", "client": "gpuproof", "served_rps": 1.02},
                    {"round": r, "part": "over-together", "client": "aiperf", "served_rps": 1.0}]
    return out


def verdicts(lines: list[str]) -> dict:
    return {line.split(" | ")[0].lstrip("| "): line.rsplit(" | ", 2)[-1].rstrip(" |") for line in lines[2:]}


def test_the_throughput_target_reads_both_clients_at_once_when_the_run_has_them():
    mod = load()
    got = verdicts(mod.targets(rows(together=True), [0, 1, 2]))
    assert got["request throughput at 120% (within 3%)"] == "**held**"          # 1.02 at once
    assert got["TTFT p50 at 50% (within 3%)"] == "**held**"
    assert got["client CPU per completed request at 50% (<= AIPerf's)"] == "**held**"
    assert got["capacity (within 5% in each round)"] == "**held**"
    assert "`over-together`" in mod.targets(rows(together=True), [0, 1, 2])[2]


def test_without_the_at_once_part_it_reads_one_after_the_other_and_fails():
    got = verdicts(load().targets(rows(together=False), [0, 1, 2]))
    assert got["request throughput at 120% (within 3%)"] == "**not held**"      # 0.90 one after the other


def test_the_capacity_must_hold_in_every_round():
    got = verdicts(load().targets(rows(together=True, capacity=(2.0, 1.8, 2.05)), [0, 1, 2]))
    assert got["capacity (within 5% in each round)"] == "**not held**"          # round 2: 0.90

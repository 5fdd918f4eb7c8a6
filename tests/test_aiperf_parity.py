"""gpuproof's load client and NVIDIA's AIPerf report the same figures for the same server.

The server is ``workloads/loadstub.py`` with known delays: the first token ``TTFT_MS`` after
an answer starts, then a token every ``GAP_MS``, ``TOKENS`` tokens, and a queue that starts
at most ``SERVICE_RPS`` answers per second (so it completes that many, whatever is offered).
Each client runs the same constant-rate load twice: under the service rate, where both must
report the stub's TTFT, time per output token, latency and tokens; and at twice it, where
both must report what the stub served (answered requests / first request sent to last answer,
AIPerf's request throughput), not what was offered.

None of this measures how fast this machine is. The stub keeps every delay on an absolute
schedule, so a late wake-up delays one write, not the rest of the answer. Lower bounds are
structural: no first token can arrive before ``TTFT_MS``, and the queue cannot finish N
answers sooner than (N - 1) / ``SERVICE_RPS`` + one answer's time. Upper bounds leave room
for a late wake-up of the stub or the client on a loaded machine (tens of milliseconds
against delays of 150 ms and 15 x 15 ms), and medians, not tails, are compared.

AIPerf is the test-only extra ``gpuproof[aiperf]`` (or ``$GPUPROOF_AIPERF``, its executable
in a virtual environment of its own). Without it these tests skip, or fail under
``GPUPROOF_REQUIRE_TOOLS=1`` (CI).
"""

import json
import os
import subprocess
import sys

import pytest

import aiperf_client
from gpuproof.bench.workloads import WORKLOADS_DIR
from loadprocs import ENV, last_json, start_process, stop_process

pytestmark = pytest.mark.slow

TTFT_MS, GAP_MS, TOKENS, SERVICE_RPS = 150.0, 15.0, 16, 8.0
UNDER, OVER = 4.0, 16.0           # offered req/s: half the service rate, and twice it
UNDER_N, OVER_N = 16, 64          # requests: 4 s of sending at each rate
INPUT_TOKENS = 16
LATE = 1.25                       # a median may be this much above the stub's delay (late wake-ups)


@pytest.fixture(scope="module")
def aiperf(tmp_path_factory):
    exe = aiperf_client.find_aiperf()
    if exe is None:
        why = (f"AIPerf is not installed: pip install 'gpuproof[aiperf]' (aiperf=={aiperf_client.AIPERF_VERSION}) "
               f"or set ${aiperf_client.ENV_VAR}")
        if os.environ.get("GPUPROOF_REQUIRE_TOOLS") == "1":
            pytest.fail(f"{why} (GPUPROOF_REQUIRE_TOOLS=1 requires it)", pytrace=False)
        pytest.skip(why)
    return exe, aiperf_client.build_tokenizer(exe, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def timed_stub(tmp_path_factory):
    url, proc = start_process("loadstub.py", tmp_path_factory.mktemp("timed"), "--ttft-ms", f"{TTFT_MS:g}",
                              "--token-gap-ms", f"{GAP_MS:g}", "--service-rps", f"{SERVICE_RPS:g}")
    try:
        yield url
    finally:
        assert stop_process(proc)["answered"] > 0


@pytest.fixture(scope="module")
def gpuproof_steps(timed_stub):
    """gpuproof's client: one step at each rate, 4 s of sending each (16 and 64 requests)."""
    proc = subprocess.run([sys.executable, str(WORKLOADS_DIR / "loadgen.py"), "--url", timed_stub,
                           "--rates", f"{UNDER:g},{OVER:g}", "--step-s", "4", "--drain-s", "60", "--users", "64",
                           "--input-tokens", str(INPUT_TOKENS), "--output-tokens", str(TOKENS),
                           "--slo-ttft-ms", "60000", "--slo-tpot-ms", "60000", "--metrics-path", ""],
                          capture_output=True, text=True, timeout=180, env=ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    under, over = last_json(proc.stdout)["steps"]
    return under, over


@pytest.fixture(scope="module")
def aiperf_runs(aiperf, timed_stub, tmp_path_factory):
    """AIPerf: the same two loads."""
    exe, tokenizer = aiperf
    out = {}
    for name, rate, count in (("under", UNDER, UNDER_N), ("over", OVER, OVER_N)):
        art = tmp_path_factory.mktemp(f"aiperf-{name}")
        proc = subprocess.run(aiperf_client.command(exe, timed_stub, "stub", tokenizer, art, rate=rate, count=count,
                                                    input_tokens=INPUT_TOKENS, output_tokens=TOKENS),
                              capture_output=True, text=True, timeout=300, env=aiperf_client.env())
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
        out[name] = aiperf_client.summary(art)
    return out


def served_at_most(n: int) -> float:
    """The stub's queue cannot answer ``n`` requests faster: the last starts (n - 1) / SERVICE_RPS after
    the first and takes TTFT + (TOKENS - 1) gaps."""
    return n / ((n - 1) / SERVICE_RPS + (TTFT_MS + (TOKENS - 1) * GAP_MS) / 1e3)


def check_known_delays(who: str, figures: dict) -> None:
    assert figures["mean_output_tokens"] == TOKENS, (who, figures)
    assert TTFT_MS <= figures["ttft_p50_ms"] <= TTFT_MS * LATE, (who, figures)
    assert GAP_MS * 0.9 <= figures["tpot_p50_ms"] <= GAP_MS * LATE, (who, figures)
    e2e = TTFT_MS + (TOKENS - 1) * GAP_MS
    assert e2e <= figures["e2e_p50_ms"] <= e2e * LATE, (who, figures)


def test_both_clients_report_the_stubs_delays_and_tokens(gpuproof_steps, aiperf_runs):
    under, _ = gpuproof_steps
    ours, theirs = under, aiperf_runs["under"]
    assert ours["ok"] == ours["requests"] == UNDER_N and theirs["requests"] == UNDER_N and theirs["errors"] == 0
    keys = ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "mean_output_tokens")
    print(f"\nunder capacity: gpuproof {[round(ours[k], 2) for k in keys]}, "
          f"aiperf {[round(theirs[k], 2) for k in keys]}")
    check_known_delays("gpuproof", ours)
    check_known_delays("aiperf", theirs)
    assert ours["keeps_pace"] is True and ours["slo_met"] is True


def test_both_clients_report_what_the_server_served_past_saturation(gpuproof_steps, aiperf_runs):
    _, over = gpuproof_steps
    theirs = aiperf_runs["over"]
    assert over["ok"] == OVER_N and theirs["requests"] == OVER_N and theirs["errors"] == 0
    ceiling = served_at_most(OVER_N)
    print(f"\npast saturation: served at most {ceiling:.3f} req/s; gpuproof {over['served_rps']:.3f}, "
          f"aiperf {theirs['served_rps']:.3f}")
    for who, served in (("gpuproof", over["served_rps"]), ("aiperf", theirs["served_rps"])):
        assert ceiling * 0.95 <= served <= ceiling * 1.001, (who, served, ceiling)
    # the same definition: first request sent to last answer received, on the same schedule
    assert abs(over["served_rps"] / theirs["served_rps"] - 1) <= 0.05, (over["served_rps"], theirs["served_rps"])
    # gpuproof also says what was offered and sent, and that the server fell behind
    assert over["offered_rps"] == OVER and over["sent_rps"] >= OVER * 0.95
    assert over["keeps_pace"] is False and over["slo_met"] is False and over["queue_growth"] > 0
    assert any(r.startswith("overloaded") for r in over["fail_reasons"]), over["fail_reasons"]


def test_tokenizer_counts_one_token_per_word(aiperf):
    """What the servers make (one token per word) is what AIPerf counts with the local tokenizer."""
    exe, tokenizer = aiperf
    code = ("import sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(len(t.encode(' w5 w17 w123 From fairest creatures', add_special_tokens=False)))")
    out = subprocess.run([str(aiperf_client.interpreter(exe)), "-c", code, str(tokenizer)], capture_output=True,
                         text=True, timeout=120, env=aiperf_client.env(), check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == 6

"""Where a capacity search starts (``loadgen.search_start``): LO of the range, a rate given, or
``auto``, an eighth of what the server could complete if batching cost nothing. On a GPU the 7b
model's search started at 1 req/s, where a step waits 80 s for its 40 answers, and spent two
minutes under a sixth of the 13.7 req/s it later passed (an H200, benchmarks/RESULTS.md "GPU run").
The end-to-end cases are in tests/test_workloads_inference.py."""

import json

import pytest
from loadprocs import loadgen_child

pytestmark = pytest.mark.server  # tier: each test runs loadgen's rules in a child interpreter

# loadgen monkey-patches the process for gevent when imported: its rules run in a child interpreter
CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import loadgen
out = []
for c in json.loads(sys.argv[2]):
    if "argv" in c:
        out.append(loadgen._validate(loadgen.build_parser().parse_args(["--url", "http://127.0.0.1:9", *c["argv"]])))
    else:
        out.append(list(loadgen.search_start(c["text"], c["lo"], c["hi"], c.get("idle"), c.get("slots"))))
print(json.dumps(out))
"""


def starts(*cases: dict) -> list:
    return [tuple(x) if isinstance(x, list) else x for x in loadgen_child(CHILD, json.dumps(cases))]


def test_auto_is_an_eighth_of_the_batch_slots_over_one_requests_time():
    (rps, why), = starts({"text": "auto", "lo": 1, "hi": 1024, "idle": {"e2e_ms": 4900.0}, "slots": 64})
    assert rps == 1.63   # 0.125 x 64 / 4.9 s, three figures
    assert why == "auto: 0.125 x 64 batch slots / 4.9 s for one request alone (= 13.1 req/s if batching cost nothing)"


def test_auto_without_the_servers_slots_or_an_answer_starts_at_lo():
    got = starts({"text": "auto", "lo": 2, "hi": 64, "idle": {"e2e_ms": 500.0}, "slots": None},
                 {"text": "auto", "lo": 2, "hi": 64, "idle": {"e2e_ms": None}, "slots": 16},
                 {"text": "auto", "lo": 2, "hi": 64, "idle": None, "slots": 16})
    assert got[0] == (2, "auto: LO of --rates (2), the server does not report its batch slots")
    assert got[1] == got[2] == (2, "auto: LO of --rates (2), the idle probe got no answer")


def test_the_start_stays_inside_the_users_range():
    got = starts({"text": "auto", "lo": 1, "hi": 8, "idle": {"e2e_ms": 100.0}, "slots": 64},
                 {"text": "auto", "lo": 5, "hi": 64, "idle": {"e2e_ms": 10_000.0}, "slots": 16},
                 {"text": "100", "lo": 1, "hi": 64},
                 {"text": "4", "lo": 1, "hi": 64},
                 {"text": "lo", "lo": 1, "hi": 64})
    assert got[0][0] == 8.0 and got[0][1].endswith(", held inside 1:8")
    assert got[1][0] == 5.0 and got[1][1].endswith(", held inside 5:64")
    assert got[2] == (64, "--search-start 100, held inside 1:64")
    assert got[3] == (4.0, "--search-start 4")
    assert got[4] == (1, "LO of --rates (1)")


def test_a_bad_start_is_one_clear_line():
    got = starts({"argv": ["--search-start", "soon"]}, {"argv": ["--search-start", "0"]},
                 {"argv": ["--search-start", "auto"]})
    assert got[0] == got[1].replace("'0'", "'soon'") == "--search-start 'soon': lo, auto or a rate > 0"
    assert got[2] is None

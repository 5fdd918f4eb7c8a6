"""How long a load step sends (``loadgen.Runner.step_length``): the rules that make a step's pace
judgement (completions against the offer over its second half) precise enough for the search.

A capacity search's steps hold ``--pace-answers`` answers in their judged half at the offered rate:
a slow server otherwise gives 10 answers a 20 s step, and the two answers at the window's edges
are 20% of the count, four times the search's precision (a CPU server's capacity came out 12-14%
under what AIPerf measured it to sustain). Fixed rates send for ``--step-s``, as asked.
"""

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
for case in json.loads(sys.argv[2]):
    run = loadgen.Runner.__new__(loadgen.Runner)   # no server: only the step-length rules are exercised
    run.args = loadgen.build_parser().parse_args(["--url", "http://127.0.0.1:9", *case["argv"]])
    run.steps, run.searching = case.get("steps", []), case["searching"]
    out.append(list(run.step_length(case["rate"])) if "rate" in case else loadgen._validate(run.args))
print(json.dumps(out))
"""


def step_lengths(*cases: dict) -> list:
    return [tuple(x) if isinstance(x, list) else x for x in loadgen_child(CHILD, json.dumps(cases))]


def case(*argv: str, rate: float | None = None, searching: bool = True, steps: list | None = None) -> dict:
    return {"argv": list(argv), "searching": searching, "steps": steps or [],
            **({"rate": rate} if rate is not None else {})}


def test_a_search_step_holds_the_answers_its_pace_needs():
    assert step_lengths(case("--step-s", "20", rate=1.0), case("--step-s", "20", rate=2.5),
                        case("--step-s", "20", rate=8.0)) == [
        (80.0, "40 answers in the judged half at 1 req/s"),
        (32.0, "40 answers in the judged half at 2.5 req/s"),
        (20.0, "--step-s")], "a fast server's steps are --step-s long"


def test_the_answer_count_is_the_users_to_set_or_turn_off():
    got = step_lengths(case("--step-s", "20", "--pace-answers", "10", rate=1.0),
                       case("--step-s", "5", "--pace-answers", "10", rate=1.0),
                       case("--step-s", "5", "--pace-answers", "0", rate=1.0),
                       case("--pace-answers", "-1"))
    assert got[:3] == [(20.0, "--step-s"), (20.0, "10 answers in the judged half at 1 req/s"), (5.0, "--step-s")]
    assert got[3].startswith("--pace-answers >= 0")


def test_fixed_rates_send_for_the_step_asked():
    assert step_lengths(case("--step-s", "20", rate=0.5, searching=False)) == [(20.0, "--step-s")]


def test_the_longest_rule_wins_and_says_so():
    kept = [{"e2e_p50_ms": 30_000.0, "keeps_pace": True, "pace_judged": True, "slo_met": True}]
    assert step_lengths(case("--step-s", "20", rate=4.0, steps=kept), case("--step-s", "20", rate=0.5, steps=kept)) \
        == [(120.0, "4 x the median latency 30s of an earlier step"),
            (160.0, "40 answers in the judged half at 0.5 req/s")]


LEAD_CHILD = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
import loadgen
now = time.time()
args = loadgen.build_parser().parse_args(["--url", "http://127.0.0.1:9", "--start-epoch", str(now + 30)])
plain = loadgen.build_parser().parse_args(["--url", "http://127.0.0.1:9"])
late = loadgen.build_parser().parse_args(["--url", "http://127.0.0.1:9", "--start-epoch", str(now - 5)])
print(json.dumps({"first": loadgen._lead(args, 0, 0.05), "second": loadgen._lead(args, 1, 0.05),
                  "plain": loadgen._lead(plain, 0, 0.05), "past": loadgen._lead(late, 0, 0.25),
                  "filling": loadgen._served_at_most({"completion_rps": 1.5, "late_rps": 1.66}),
                  "few": loadgen._served_at_most({"completion_rps": 1.5, "late_rps": None})}))
"""


def test_start_epoch_sets_the_first_steps_first_send_and_late_answers_set_the_ceiling():
    got = loadgen_child(LEAD_CHILD)
    assert 25 < got["first"] <= 30, "the first step waits for --start-epoch"
    assert got["second"] == 0.05 and got["plain"] == 0.05, "later steps, and runs without it, start at once"
    assert got["past"] == 0.25, "a start already past starts at once"
    # an overloaded step's server completes at most its late answers' rate (a full batch), not the
    # second half's (a batch still filling)
    assert got["filling"] == 1.66 and got["few"] == 1.5


FILE_CHILD = r"""
import json, sys, threading, time
sys.path.insert(0, sys.argv[1])
import loadgen
path, bad, missing = sys.argv[2], sys.argv[3], sys.argv[4]
when = time.time() + 20
threading.Timer(0.3, lambda: open(path, "w").write(f"{when:.3f}")).start()   # written after loadgen waits
args = loadgen.build_parser().parse_args(["--url", "http://127.0.0.1:9", "--start-epoch-file", path])
out = {"lead": loadgen._lead(args, 0, 0.05), "epoch": args.start_epoch, "when": when}
open(bad, "w").write("soon")
for name, p, wait in (("bad", bad, 5.0), ("missing", missing, 0.2)):
    try:
        loadgen.start_epoch_from(p, wait)
    except SystemExit as exc:
        out[name] = str(exc)
print(json.dumps(out))
"""


def test_the_start_time_can_be_written_after_loadgen_has_started(tmp_path):
    """``--start-epoch-file``: loadgen, started first, waits until the file holds a Unix time and starts its
    first step then; a file without one, or none in time, ends it with one line saying so."""
    start, bad, missing = tmp_path / "start", tmp_path / "bad", tmp_path / "never"
    got = loadgen_child(FILE_CHILD, start, bad, missing)
    assert abs(got["epoch"] - got["when"]) < 0.01, "the time read is the time written"
    assert 15 < got["lead"] <= 20, "the first step waits until then"
    assert got["bad"] == f"loadgen: --start-epoch-file {bad}: 'soon' is not a Unix time"
    assert got["missing"] == f"loadgen: no start time in --start-epoch-file {missing} after 0 s"

"""The pace rule (``loadclient.pace``) on send and answer times written out by hand.

A continuous-batching server near its capacity, started from an empty queue, lets the number in
flight rise while its batch fills and it speeds up; that is not overload when its late answers
come as fast as the offer. An overloaded server's late answers come at its own, lower rate."""

from gpuproof.bench.workloads import import_workload

lc = import_workload("loadclient")

RATE, SPAN = 2.0, 60.0          # 2 req/s for 60 s: 120 sends


def _times(service):
    """Sends every 0.5 s from t=0; request i answered at service(i). Returns (sends, ended, answered)."""
    sends = [i / RATE for i in range(int(RATE * SPAN))]
    answered = sorted(service(i, t) for i, t in enumerate(sends))
    return sends, answered, answered


def test_steady_server_keeps_pace():
    sends, ended, answered = _times(lambda i, t: t + 3.0)
    got = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05)
    assert got["keeps_pace"] is True and got["caught_up"] is False
    assert abs(got["late_rps"] - RATE) < 0.01


def test_batch_filling_server_caught_up_keeps_pace():
    # latency grows from 3 s to 8 s over the first 45 s (the batch filling), then holds: in flight
    # rises through the judged half, but the last quarter's answers come at the offered rate
    sends, ended, answered = _times(lambda i, t: t + 3.0 + 5.0 * min(t, 40.0) / 40.0)
    got = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05)
    assert got["queue_growth"] > got["slack"], got          # the count alone would call it behind
    assert got["late_rps"] >= RATE * 0.95
    assert got["keeps_pace"] is True and got["caught_up"] is True


def test_overloaded_server_is_behind_even_late():
    # the server completes 1.6 req/s whatever is offered: its queue grows all the time
    sends, ended, answered = _times(lambda i, t: 2.0 + i / 1.6)
    got = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05)
    assert got["keeps_pace"] is False and got["caught_up"] is False
    assert abs(got["late_rps"] - 1.6) < 0.02
    assert got["queue_growth"] > 0


def test_few_late_answers_leave_the_count_to_judge():
    # 0.2 req/s: the last quarter holds 3 answers, too few for a rate
    sends = [i * 5.0 for i in range(12)]
    answered = [t + 1.0 for t in sends]
    got = lc.pace(sends, answered, answered, 0.0, SPAN, 0.2, 0.05)
    assert got["late_rps"] is None and got["keeps_pace"] is True


def test_growth_inside_the_batch_slots_is_not_a_queue():
    # latency grows from 3 s to 7 s over the step: in flight rises from 6 to 14, every one of them
    # inside a 16-slot batch (served at once), and the server is still speeding up at the end
    sends, ended, answered = _times(lambda i, t: t + 3.0 + 4.0 * t / SPAN)
    counted = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05)
    batched = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05, slots=16)
    assert counted["queue_growth"] > counted["slack"] and counted["caught_up"] is False
    assert counted["keeps_pace"] is False, "counting every request in flight, it is behind"
    assert batched["queue_growth"] == 0 and batched["keeps_pace"] is True
    assert batched["queue_counts"] == "in flight beyond the server's 16 batch slots"


def test_a_queue_beyond_the_batch_slots_is_behind():
    # the server completes 1.6 req/s with 8 slots: in flight passes 8 early and its queue grows
    sends, ended, answered = _times(lambda i, t: 2.0 + i / 1.6)
    got = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05, slots=8)
    assert got["keeps_pace"] is False and got["queue_growth"] > got["slack"]

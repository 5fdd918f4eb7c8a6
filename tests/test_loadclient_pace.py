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
    slotted = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05, slots=16)
    assert slotted["keeps_pace"] is True and slotted["queue_growth"] <= slotted["slack"], "all inside 16 slots"


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


def test_a_batch_still_filling_without_catching_up_is_behind_whatever_the_slots():
    # latency grows from 3 s to 7 s over the step: in flight rises from 6 to 14, inside a 16-slot
    # batch, but the late answers still come slower than the offer: nothing shows it will catch up
    sends, ended, answered = _times(lambda i, t: t + 3.0 + 4.0 * t / SPAN)
    for slots in (None, 16):
        got = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05, slots=slots)
        assert got["in_flight_growth"] > got["slack"] and got["late_rps"] < RATE * 0.95
        assert got["keeps_pace"] is False and got["caught_up"] is False
    assert got["queue_growth"] == 0 and got["queue_counts"] == "in flight beyond the server's 16 batch slots"


def test_caught_up_late_is_not_enough_when_the_queue_beyond_the_slots_grew():
    # latency grows from 3 s to 12 s over the first 30 s, then holds: in flight passes 16 and keeps
    # rising through most of the judged half, the last quarter's answers come at the offered rate
    sends, ended, answered = _times(lambda i, t: t + 3.0 + 9.0 * min(t, 30.0) / 30.0)
    plain = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05)
    slotted = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05, slots=16)
    assert plain["late_rps"] >= RATE * 0.95 and plain["keeps_pace"] is True, "no slots known: the late answers judge"
    assert slotted["queue_growth"] > slotted["slack"]
    assert slotted["keeps_pace"] is False, "16 slots: requests waited, and more of them at the end"


def test_a_queue_beyond_the_batch_slots_is_behind():
    # the server completes 1.6 req/s with 8 slots: in flight passes 8 early and its queue grows
    sends, ended, answered = _times(lambda i, t: 2.0 + i / 1.6)
    got = lc.pace(sends, ended, answered, 0.0, SPAN, RATE, 0.05, slots=8)
    assert got["keeps_pace"] is False and got["queue_growth"] > got["slack"]


def test_answers_in_clusters_do_not_read_as_caught_up():
    # alike requests finish together: the server answers 4 at a time every 2 s (2 req/s) against
    # 2.2 offered. Timed first to last, the last quarter's 7 clusters read 2.25 req/s (27 answers
    # over 12 s), above the offer's 95%; counted over the quarter they read 1.87
    sends = [i / 2.2 for i in range(int(2.2 * SPAN))]
    answered = sorted(max(t + 1.0, 2.0 * (i // 4) + 2.5) for i, t in enumerate(sends))
    got = lc.pace(sends, answered, answered, 0.0, SPAN, 2.2, 0.05)
    assert got["late_rps"] < 2.2 * 0.95 and got["caught_up"] is False and got["keeps_pace"] is False

"""A check that fills a node's free capacity with its own pods (issue #41 item 5): one of them taken away meanwhile
(preempted by other people's pods, or deleted) ends its wait at once, and the check is not judged, naming whose
pods came, instead of waiting out its deadline into a failure."""

from __future__ import annotations

from types import SimpleNamespace

from gpuproof.cluster.churn import fill_done, taken_away


def _pod(phase: str = "Pending", going: bool = False):
    return SimpleNamespace(status=SimpleNamespace(phase=phase),
                           metadata=SimpleNamespace(deletion_timestamp="now" if going else None))


def _settled(p) -> bool:
    return p.status.phase == "Running"


def test_a_fill_pod_taken_away_ends_the_wait_naming_it():
    done = fill_done(["f-0", "f-1"], _settled)
    assert not done({})                                        # not made yet: nothing taken
    assert not done({"f-0": _pod("Running"), "f-1": _pod()})   # one still pending
    assert done({"f-1": _pod("Running")}) == ("taken", ["f-0"])             # f-0 gone once seen
    done = fill_done(["f-0", "f-1"], _settled)
    assert done({"f-0": _pod("Running", going=True), "f-1": _pod("Running")}) == ("taken", ["f-0"])   # going
    cache = {"f-0": _pod("Running"), "f-1": _pod("Running")}
    assert fill_done(["f-0", "f-1"], _settled)(cache) == ("placed", cache)


def test_the_skip_names_whose_pods_came_or_says_the_fill_pods_were_taken():
    moved = "pods of others changed on l4-0 while the check ran: 1 arrived (team/big on l4-0)"
    assert taken_away(SimpleNamespace(changed=lambda: moved), "l4-0", ["f-0"]) == moved
    assert taken_away(SimpleNamespace(changed=lambda: ""), "l4-0", ["f-0", "f-2"]) == (
        "f-0, f-2 taken away while l4-0 filled (preempted by other pods, or deleted): the capacity the check was "
        "filling is not its own")

"""The fabric's pair schedule and its judgement (gpuproof.bench.fabric_plan), by hand on small pools: the circle
method's rounds, the reference a slow node or link does not move, the known-good retests, node and link verdicts,
and the catalog's floors and their overrides."""

from __future__ import annotations

import itertools

import pytest

from gpuproof.bench import fabric_plan as plan
from gpuproof.errors import GpuproofError

FAST, SLOW = 40.0, 4.0


def figures(nodes: list[str], rounds: list[list[tuple]], slow_node: str | None = None,
            slow_link: tuple | None = None) -> dict:
    """Each scheduled pair's figure on a fabric with one slow node or one slow link."""
    out = {}
    for pair in itertools.chain.from_iterable(rounds):
        slow = slow_node in pair or (slow_link is not None and plan.norm(pair) == plan.norm(slow_link))
        out[pair] = SLOW if slow else FAST + 0.1 * len(out)
    return out


@pytest.mark.parametrize("count", range(2, 12))
def test_every_round_is_disjoint_and_every_pair_comes_once(count):
    nodes = [f"n{i:02d}" for i in range(count)]
    every = plan.pair_rounds(nodes, every_pair=True)
    pairs = [p for r in every for p in r]
    assert len(pairs) == len(set(pairs)) == count * (count - 1) // 2
    for r in every:
        assert len({n for p in r for n in p}) == 2 * len(r)            # no node twice in a round
    default = plan.pair_rounds(nodes)
    partners = {n: {x for r in default for p in r if n in p for x in p} - {n} for n in nodes}
    assert all(len(v) >= min(2, count - 1) for v in partners.values()), partners   # two partners each
    assert len(default) == min(plan.default_rounds(count), len(every))


def test_a_thousand_nodes_take_two_rounds_of_five_hundred_pairs():
    nodes = [f"h100-{i}" for i in range(1000)]
    rounds = plan.pair_rounds(nodes)
    assert [len(r) for r in rounds] == [500, 500]
    assert len(plan.pair_rounds(nodes, rounds=5)) == 5


def test_schedule_from_env():
    assert plan.schedule_from_env({}) == (False, None)
    assert plan.schedule_from_env({plan.PAIRS_ENV: "all"}) == (True, None)
    assert plan.schedule_from_env({plan.PAIRS_ENV: "4"}) == (False, 4)
    with pytest.raises(GpuproofError, match="'all' .* or a number of rounds"):
        plan.schedule_from_env({plan.PAIRS_ENV: "some"})


@pytest.mark.parametrize("count", [3, 4, 5, 8, 9])
def test_a_slow_node_is_named_and_its_links_are_not(count):
    nodes = [f"n{i}" for i in range(count)]
    rounds = plan.pair_rounds(nodes)
    slow = nodes[-1]
    j = plan.judge(figures(nodes, rounds, slow_node=slow))
    assert j.reference >= FAST and all(slow in p for p in j.slow)
    again = {p: (SLOW if slow in p else FAST) for r in plan.retests(j) for p in r}
    v = plan.verdicts(j, again)
    assert list(v.bad_nodes) == [slow] and not v.bad_links and not v.undecided, v
    assert f"{SLOW:.3g}" in v.bad_nodes[slow] and "reference" in v.bad_nodes[slow]


@pytest.mark.parametrize("count", [4, 5, 6, 9])
def test_a_slow_link_is_named_and_its_nodes_are_not(count):
    nodes = [f"n{i}" for i in range(count)]
    rounds = plan.pair_rounds(nodes, every_pair=True)
    link = ("n0", "n1")
    j = plan.judge(figures(nodes, rounds, slow_link=link))
    assert list(j.slow) == [link]
    retest = plan.retests(j)
    assert sorted(n for r in retest for p in r for n in p if n in link) == ["n0", "n1"]
    for r in retest:
        assert len({n for p in r for n in p}) == 2 * len(r)
    v = plan.verdicts(j, {p: FAST for r in retest for p in r})
    assert not v.bad_nodes and list(v.bad_links) == [link], v
    assert v.bad_links[link].startswith("n0<->n1 4 GB/s, below 80%")


def test_a_node_slow_with_every_partner_is_told_with_or_without_a_retest():
    """Three nodes, one slow: the others' only slow pairs are with it, so they are the known-good ones it is measured
    again with; had no retest run, being slow with every partner tells it alone."""
    nodes = ["a", "b", "c"]
    rounds = plan.pair_rounds(nodes)
    j = plan.judge(figures(nodes, rounds, slow_node="c"))
    assert j.every == ["c"] and j.good == ["a", "b"]
    again = {p: SLOW for r in plan.retests(j) for p in r}
    assert list(again) == [("a", "c")]
    assert "measured again with known-good a" in plan.verdicts(j, again).bad_nodes["c"]
    v = plan.verdicts(j, {})
    assert list(v.bad_nodes) == ["c"] and "no known-good node" in v.bad_nodes["c"]


def test_two_nodes_have_no_reference():
    j = plan.judge({("a", "b"): 1.0})
    assert j.reference is None and not j.slow


def test_a_pair_that_did_not_run_has_no_figure_and_no_verdict_here():
    j = plan.judge({("a", "b"): 40.0, ("b", "c"): None, ("a", "c"): 41.0, ("c", "d"): 39.0, ("a", "d"): 40.0})
    assert not j.slow and "b" not in j.good and "c" not in j.good


def test_floors_from_the_catalog_have_sources_and_apply_by_transport():
    found = plan.floors()
    assert found and all(f.source for f in found)
    ib = plan.floor_for(found, "NVIDIA-H100-80GB-HBM3", 8, "IB/GDRDMA", "network")
    assert ib is not None and ib.transport == "IB"
    assert plan.floor_for(found, "NVIDIA-H100-80GB-HBM3", 8, "Socket", "network") is None
    assert plan.floor_for(found, "NVIDIA-H100-80GB-HBM3", 8, None, "network") is None
    assert plan.matches("NVLink", "P2P/IPC") and plan.matches("NVLink", "NVLS") and not plan.matches("IB", "RoCE")


def test_floor_overrides():
    pct, found = plan.settings({plan.FLOORS_ENV: "pool=70,ib=45"})
    assert pct == 70
    ib = [f for f in found if f.transport == "IB"]
    assert ib and all(f.busbw_gbps == 45 and f.source.startswith(plan.FLOORS_ENV) for f in ib)
    assert plan.settings({}, device="cpu")[0] == plan.CPU_POOL_PCT and plan.settings({})[0] == plan.DEFAULT_POOL_PCT
    for bad, words in (("pool=150", "100 at most"), ("ib", "not name=number"), ("ib=0", "above 0")):
        with pytest.raises(GpuproofError, match=words):
            plan.settings({plan.FLOORS_ENV: bad})


def test_every_pair_a_slow_node_and_a_slow_link_at_once():
    """Five nodes, every pair: a slow node is in a pair with everybody, so no node's pairs are all fast; the nodes
    whose only slow pair is with the slow node are the known-good ones (the kubelet run's fleet)."""
    nodes = [f"n{i}" for i in range(5)]
    rounds = plan.pair_rounds(nodes, every_pair=True)
    j = plan.judge(figures(nodes, rounds, slow_node="n4", slow_link=("n0", "n1")))
    assert j.every == ["n4"] and j.good == ["n2", "n3"]
    again = {p: (SLOW if "n4" in p else FAST) for r in plan.retests(j) for p in r}
    assert {n for p in again for n in p} >= {"n0", "n1", "n4"}
    v = plan.verdicts(j, again)
    assert list(v.bad_nodes) == ["n4"] and list(v.bad_links) == [("n0", "n1")] and not v.undecided, v
    assert "measured again with known-good" in v.bad_nodes["n4"]

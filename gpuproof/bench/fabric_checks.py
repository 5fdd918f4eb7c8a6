"""The fabric suite's verdicts and records (issue #50): what a pool's outcome (:class:`.fabric.PoolOutcome`: its pairs
run, judged and measured again) says, as the checks the suite records and the figures a report compares.

Pure: no cluster here. Every failure names the node or pair, its figure, the pool's reference and the limit, or the
line NCCL printed.
"""

from __future__ import annotations

import dataclasses

from ..results import MetricRecord
from . import fabric_plan as plan
from .fabric import PoolOutcome
from .workloads import import_workload


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check's verdict, as the suite records it (``check.true(check, ok, expected, actual, what, target)``)."""

    check: str
    ok: bool
    expected: str
    actual: str
    what: str
    target: str
    skip: str = ""          # not judged, and why (recorded as a skip)


CHECKS = ("fabric-pair-result", "fabric-node", "fabric-link", "fabric-transport", "fabric-floor")
PAIR_OK = "the pair's job ran and every collective's result is right (no wrong element)"
NODE_OK = "not slow among its pool's pairs, nor with a known-good node"
LINK_OK = "the pair's bus bandwidth near its pool's reference"
TRANSPORT_OK = "NCCL used the RDMA fabric the node offers, not TCP sockets"


def findings(o: PoolOutcome, floors: list[plan.Floor]) -> list[Finding]:
    """The pool's checks: each job ran right, each node and link against its pool, NCCL's transport against what each
    node offers, and the catalog's floors where NCCL's transport is theirs."""
    nccl_log = import_workload("nccl_log")
    out: list[Finding] = []
    where = f"fabric {o.key}"
    for j in o.pairs + o.retests:
        kind = "measured again" if j.retest else "pair"
        out.append(Finding("fabric-pair-result", j.ok, PAIR_OK, "ok" if j.ok else j.why_not_ok(),
                           f"{where}: {kind} {j.name}", j.name))
    j = o.judgement
    lone = len(o.nodes) == 2
    for node in o.nodes:
        bad = o.verdicts.bad_nodes.get(node)
        skip = ("2 nodes: one pair, nothing to compare it with (3 nodes or more can tell a slow node; the floor "
                "still judges the pair)") if lone else ("" if j.reference is not None else "no pair ran: no reference")
        out.append(Finding("fabric-node", bad is None, NODE_OK, bad or _best_words(o, node), f"{where}: node {node}",
                           node, skip if bad is None else ""))
    for run in o.pairs:
        pair = run.pair
        why = o.verdicts.bad_links.get(pair) or o.verdicts.undecided.get(pair)
        fine = why is None
        actual = why or (f"{run.busbw:.3g} GB/s against the reference {j.reference:.3g} GB/s"
                         if run.busbw is not None and j.reference else "no figure" if run.busbw is None else
                         f"{run.busbw:.3g} GB/s")
        skip = "" if not fine or j.reference is not None else "no reference (fewer than 3 nodes with a figure)"
        if fine and any(n in o.verdicts.bad_nodes for n in pair):
            skip = "a node of the pair is bad (fabric-node): the link is not blamed"
        out.append(Finding("fabric-link", fine, LINK_OK, actual, f"{where}: link {run.name}", run.name, skip))
    out += _transport_findings(o, nccl_log, where)
    out += _floor_findings(o, floors, where)
    return out


def _best_words(o: PoolOutcome, node: str) -> str:
    j = o.judgement
    if node not in j.best:
        return "no figure"
    ref = f" against the reference {j.reference:.3g} GB/s" if j.reference else ""
    return f"best pair {j.best[node]:.3g} GB/s{ref}"


def _transport_findings(o: PoolOutcome, nccl_log, where: str) -> list[Finding]:
    seen: dict[str, list[tuple[str, dict]]] = {}
    for run in o.pairs + o.retests:
        for node, read in run.transports().items():
            seen.setdefault(node, []).append((run.name, read))
    out = []
    for node in o.nodes:
        offered = o.offers.get(node) or []
        reads = seen.get(node) or []
        if not reads:
            out.append(Finding("fabric-transport", True, TRANSPORT_OK, "no job of this node reported a transport",
                               f"{where}: node {node}", node, "no pair of this node ran"))
            continue
        problems = []
        for pair, read in reads:
            hcas = [f"HCA {h} in the pod" for h in read.get("hcas_visible") or []]
            why = nccl_log.socket_fallback(read, offered + hcas) if read.get("backend", "nccl") == "nccl" else None
            if why:
                problems.append(f"{pair}: {why}")
        names = sorted({str(r.get("transport")) for _, r in reads})
        actual = "; ".join(problems) if problems else (
            f"{', '.join(names)} (offered: {', '.join(offered) or 'no RDMA resource, HCA or DRA network device'})")
        skip = "" if problems or offered else "the node offers no RDMA fabric: nothing to hold NCCL's choice against"
        out.append(Finding("fabric-transport", not problems, TRANSPORT_OK, actual, f"{where}: node {node}", node, skip))
    return out


def _floor_findings(o: PoolOutcome, floors: list[plan.Floor], where: str) -> list[Finding]:
    out = []
    for run in o.pairs:
        if run.busbw is None:
            continue
        reads = run.transports()
        transport = _common([r.get("transport") for r in reads.values()])
        floor = plan.floor_for(floors, o.product, o.gpus, transport, "network")
        size = run.size_bytes or 0
        if floor is None:
            continue
        expected = f">= {floor.busbw_gbps:g} GB/s bus bandwidth over {floor.transport} ({floor.source})"
        if size < floor.min_bytes:
            out.append(Finding("fabric-floor", True, expected, f"{run.busbw:.3g} GB/s at {size} bytes",
                               f"{where}: floor of {run.name}", run.name,
                               f"measured at {size} bytes; the floor is for {floor.min_bytes} bytes and more"))
            continue
        out.append(Finding("fabric-floor", run.busbw >= floor.busbw_gbps, expected,
                           f"{run.busbw:.3g} GB/s over {transport} at {size} bytes",
                           f"{where}: floor of {run.name}", run.name))
    return out


def _common(values: list) -> str | None:
    """The one transport every side read (None when they differ or none was read)."""
    found = {v for v in values if v}
    return found.pop() if len(found) == 1 else None


# ------------------------------------------------------------------ records


def records(o: PoolOutcome) -> list[MetricRecord]:
    """Per pair its bus bandwidth (and the transport read), per node its best pair, per pool the reference and the
    verdicts' counts, the schedule and its wall time: ``gpuproof report compare`` follows a pair or node across
    runs."""
    base = {"pool": o.key, "device": o.device}
    out: list[MetricRecord] = []

    def rec(metric, value, unit, params, node):
        if value is not None:
            out.append(MetricRecord("fabric", metric, float(value), unit, {**base, **params}, node=node,
                                    product=o.product))

    for run in o.pairs + o.retests:
        transports = sorted({str(r.get("transport")) for r in run.transports().values()})
        p = {"size_bytes": run.size_bytes, "collective": "all_reduce", "retest": run.retest,
             "transport": ",".join(transports), "slow": run.pair in o.judgement.slow and not run.retest}
        rec("pair_busbw_gbps", run.busbw, "GB/s", p, run.name)
        rec("pair_seconds", run.seconds, "s", {"retest": run.retest}, run.name)
    for node in o.nodes:
        rec("node_best_pair_busbw_gbps", o.judgement.best.get(node), "GB/s",
            {"bad": node in o.verdicts.bad_nodes}, node)
    where = f"{len(o.nodes)} nodes"
    rec("reference_busbw_gbps", o.judgement.reference, "GB/s", {"pct": o.judgement.pct}, where)
    rec("slow_pairs", len(o.judgement.slow), "count", {"names": ",".join(map(plan.pair_name, o.judgement.slow))}, where)
    rec("bad_nodes", len(o.verdicts.bad_nodes), "count", {"names": ",".join(sorted(o.verdicts.bad_nodes))}, where)
    rec("bad_links", len(o.verdicts.bad_links), "count",
        {"names": ",".join(map(plan.pair_name, o.verdicts.bad_links))}, where)
    rec("rounds", len(o.rounds), "count", {"pairs": sum(map(len, o.rounds)), "retests": len(o.retests)}, where)
    rec("pairs_wall_s", o.wall_s, "s", {"pairs": len(o.pairs) + len(o.retests)}, where)
    return out

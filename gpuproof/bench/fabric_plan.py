"""The fabric between GPU nodes, judged (issue #50): which pairs to measure, and what their figures say.

Pure: no cluster here. :mod:`gpuproof.bench.fabric` runs the pairs this module plans and hands their figures back.

- **The pair schedule** (:func:`pair_rounds`): rounds of disjoint node pairs by the circle method (each round pairs
  every node once, no pair twice across rounds). By default 2 rounds (3 for an odd count): every node meets two
  partners, enough to tell a slow node (slow with both) from a slow link (slow with one); ``every_pair`` takes all
  n-1 rounds, every pair once, n(n-1)/2 pairs.
- **The reference** of a pool (one product in one node shape): the median over its nodes of each node's best pair.
  A slow node drags only its own best down and a slow link nobody's, so neither moves the reference (a plain median
  of pairs moves: a slow node is in two of every n pairs of a ring). A pair below ``pct`` % of it is slow.
- **Measured again** (:func:`retests`): each node of a slow pair is paired with a known-good node (every pair of it
  above the limit, but those with a node slow with every partner), as GoogleCloudPlatform's cluster-health-scanner
  does before it blames a node.
- **Verdicts** (:func:`verdicts`): a node is bad when its pair with a known-good node is slow too (or, with no
  known-good node to try, when it is slow with every partner, two or more); a link is bad when its pair is slow
  and neither node is. Every verdict names the pair or node, its figure, the pool's reference and the limit.
- **Floors** (:func:`floors`): the catalog's ``fabricFloors`` (per interconnect, each with its source), judged
  only at messages of their ``minBytes`` or more and only where NCCL's transport read in the run is the floor's.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from pathlib import Path

import yaml

from ..catalog import CATALOG_FILE
from ..errors import GpuproofError
from ..vocab import circle_rounds, default_rounds, pair_rounds  # noqa: F401  (the schedule: the replay nodes need it)

Pair = tuple[str, str]
DEFAULT_POOL_PCT = 80.0            # a pair below 80% of its pool's reference is slow (nccl-tests figures of one
                                   # fabric run within a few percent of each other; a degraded link at half or less)
CPU_POOL_PCT = 25.0                # on the CPU path (gloo between kubelet nodes on one machine) pairs measured side by
                                   # side share its cores; a link shaped by tc runs 20 times slower or more
FLOORS_ENV = "GPUPROOF_FABRIC_FLOORS"
PAIRS_ENV = "GPUPROOF_FABRIC_PAIRS"         # "all": every pair (n-1 rounds), else a number of rounds
SEP = "<->"


def pair_name(pair: Pair) -> str:
    """How a pair is named in checks and records: 'a100-0<->a100-1' (the nodes sorted)."""
    a, b = sorted(pair)
    return f"{a}{SEP}{b}"


def norm(pair: Pair) -> Pair:
    a, b = sorted(pair)
    return a, b


# ------------------------------------------------------------------ the schedule
# circle_rounds, default_rounds and pair_rounds live in gpuproof.vocab (imported above): the replay nodes of the
# simulator, which may not import this layer, write the logs of the pairs the default schedule measures


def schedule_from_env(environ=None) -> tuple[bool, int | None]:
    """``GPUPROOF_FABRIC_PAIRS``: ``all`` (every pair), a number of rounds, or unset (the default rounds)."""
    text = ((os.environ if environ is None else environ).get(PAIRS_ENV) or "").strip().lower()
    if not text:
        return False, None
    if text == "all":
        return True, None
    if text.isdigit() and int(text) >= 1:
        return False, int(text)
    raise GpuproofError(f"{PAIRS_ENV} takes 'all' (every pair) or a number of rounds (1 or more), got {text!r}")


# ------------------------------------------------------------------ judging


@dataclasses.dataclass
class Judgement:
    """A pool's pairs against its reference."""

    pct: float
    reference: float | None                   # median over nodes of their best pair (GB/s)
    slow: dict[Pair, float]                   # slow pair -> its figure
    good: list[str]                           # nodes whose every pair is above the limit
    partners: dict[str, list[Pair]]           # node -> its pairs (measured, not retests)
    figures: dict[Pair, float | None]
    every: list[str] = dataclasses.field(default_factory=list)   # nodes slow with every partner (two or more)
    best: dict[str, float] = dataclasses.field(default_factory=dict)   # node -> its best pair's figure

    @property
    def limit(self) -> float | None:
        return None if self.reference is None else self.reference * self.pct / 100.0

    def words(self, figure: float) -> str:
        return (f"{figure:.3g} GB/s, below {self.pct:g}% ({self.limit:.3g} GB/s) of the pool's reference "
                f"{self.reference:.3g} GB/s (the median of its nodes' best pairs)")


def judge(figures: dict[Pair, float | None], pct: float = DEFAULT_POOL_PCT) -> Judgement:
    """Slow pairs of one pool. ``figures``: pair -> bus bandwidth (None: no figure, a pair that failed to run, judged
    elsewhere). Fewer than two nodes with a figure: no reference, nothing is slow."""
    figures = {norm(p): v for p, v in figures.items()}
    partners: dict[str, list[Pair]] = {}
    best: dict[str, float] = {}
    for pair, value in figures.items():
        for node in pair:
            partners.setdefault(node, []).append(pair)
            if value is not None:
                best[node] = max(best.get(node, 0.0), value)
    reference = statistics.median(best.values()) if len(best) >= 3 or (len(best) == 2 and len(figures) > 1) else None
    limit = None if reference is None else reference * pct / 100.0
    slow = {p: v for p, v in figures.items() if v is not None and limit is not None and v < limit}
    # slow with every partner (two or more): the likely bad nodes; a node whose only slow pairs are with them is good
    every = sorted(n for n, ps in partners.items() if len(ps) >= 2 and all(p in slow for p in ps))
    good = sorted(n for n, ps in partners.items() if n not in every and all(figures[p] is not None for p in ps)
                  and not any(p in slow and not set(p) & set(every) for p in ps))
    return Judgement(pct, reference, slow, good, partners, figures, every, best)


def retests(j: Judgement) -> list[list[Pair]]:
    """Rounds of disjoint pairs that measure each node of a slow pair again with a known-good node. Nodes of a slow
    pair with no known-good node left get none (:func:`verdicts` says so)."""
    # a slow pair with a node slow with every partner suspects that node; any other slow pair both of its nodes
    suspects = sorted({n for p in j.slow for n in (set(p) & set(j.every) or p)})
    if not j.good:
        return []
    out: list[list[Pair]] = []
    for node in suspects:
        partners = {x for p in j.partners[node] for x in p} - {node}
        choice = [g for g in j.good if g != node and g not in partners] or [g for g in j.good if g != node]
        if not choice:
            continue
        # the earliest round with a chosen good node free (a new partner preferred), so the retests take few rounds
        for r in [*out, []]:
            busy = {x for q in r for x in q}
            free = [g for g in choice if g not in busy]
            if node not in busy and free:
                if not r:
                    out.append(r)
                r.append(norm((node, free[0])))
                break
    return out


@dataclasses.dataclass
class Verdicts:
    bad_nodes: dict[str, str]               # node -> why (figures, reference)
    bad_links: dict[Pair, str]              # pair -> why
    undecided: dict[Pair, str]              # slow pair nobody could be blamed for (no known-good node to try)


def verdicts(j: Judgement, again: dict[Pair, float | None]) -> Verdicts:
    """A bad node, a bad link, or a slow pair that cannot be told (see the module's doc). ``again``: the figures of
    the :func:`retests` pairs."""
    again = {norm(p): v for p, v in again.items()}
    limit = j.limit
    bad: dict[str, str] = {}
    for pair, value in again.items():
        suspect = next((n for n in pair if n not in j.good), None)
        if suspect is None or limit is None:
            continue
        other = pair[1] if pair[0] == suspect else pair[0]
        if value is None:
            bad[suspect] = f"measured again with known-good {other}: no figure (the pair did not run)"
        elif value < limit:
            slow_with = ", ".join(f"{pair_name(p)} {j.slow[p]:.3g}" for p in j.partners[suspect] if p in j.slow)
            every = "slow with every partner" if suspect in j.every else "slow"
            bad[suspect] = (f"{every}: {slow_with} GB/s, and measured again with known-good {other} "
                            f"{j.words(value)}")
    tried = {n for p in again for n in p if n not in j.good}       # suspects measured again
    fine = set(j.good) | (tried - set(bad))                           # known-good, or fast with a known-good node
    for node in j.every:        # no known-good node to measure it against: slow with every partner tells it alone
        if node not in tried:
            figs = ", ".join(f"{pair_name(p)} {j.slow[p]:.3g}" for p in j.partners[node])
            bad[node] = (f"slow with every partner ({figs} GB/s; no known-good node to measure it against), each "
                         f"below {j.pct:g}% ({limit:.3g} GB/s) of the pool's reference {j.reference:.3g} GB/s")
    links, undecided = {}, {}
    for pair, value in j.slow.items():
        if any(n in bad for n in pair):
            continue
        if all(n in fine for n in pair):
            links[pair] = (f"{pair_name(pair)} {j.words(value)}, while each node is fast with a known-good node "
                           f"(measured again where in doubt)")
        else:
            undecided[pair] = (f"{pair_name(pair)} {j.words(value)}; no known-good node to tell the link from its "
                               f"nodes")
    return Verdicts(bad, links, undecided)


# ------------------------------------------------------------------ floors


@dataclasses.dataclass(frozen=True)
class Floor:
    """A bus-bandwidth floor for one interconnect, from the catalog's ``fabricFloors``."""

    transport: str            # what NCCL's read must say for the floor to apply: NVLink, IB, RoCE, EFA, TCPXO, ...
    within: str               # node (a node's own GPUs) or network (between nodes)
    busbw_gbps: float
    collective: str = "all_reduce"
    min_bytes: int = 1 << 30
    product: str = ""         # the GFD product label, "" for any
    gpus: int = 0             # GPUs per node, 0 for any
    source: str = ""

    def applies(self, product: str, gpus: int, transport: str | None, within: str, collective: str) -> bool:
        return (self.within == within and self.collective == collective
                and (not self.product or self.product == product) and (not self.gpus or self.gpus == gpus)
                and transport is not None and matches(self.transport, transport))


def matches(floor_transport: str, read: str) -> bool:
    """Whether a transport NCCL's read named ('IB/GDRDMA', 'RoCE', 'EFA', 'P2P/IPC', 'NVLS') is the floor's
    ('IB' covers IB and IB/GDRDMA; 'NVLink' covers the P2P and NVLS transports within a node)."""
    head = read.split("/")[0].upper()
    want = floor_transport.upper()
    if want == "NVLINK":
        return head in ("P2P", "NVLS")
    return head == want


def _bytes(text) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = str(text).strip().upper().removesuffix("B").removesuffix("I")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def floors(path: Path = CATALOG_FILE) -> list[Floor]:
    """The catalog's ``fabricFloors``."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    out = []
    for i, row in enumerate(data.get("fabricFloors") or []):
        try:
            out.append(Floor(transport=str(row["transport"]), within=str(row["within"]),
                             busbw_gbps=float(row["busbwGBps"]), collective=str(row.get("collective", "all_reduce")),
                             min_bytes=_bytes(row.get("minBytes", "1G")), product=str(row.get("product", "")),
                             gpus=int(row.get("gpus", 0)), source=str(row.get("source", ""))))
        except (KeyError, TypeError, ValueError) as exc:
            raise GpuproofError(f"{path}: fabricFloors[{i}] is not a floor ({exc!r}): it needs transport, within, "
                                f"busbwGBps and may have collective, minBytes, product, gpus, source") from None
    return out


def parse_overrides(text: str) -> dict[str, float]:
    """``GPUPROOF_FABRIC_FLOORS``: ``pool=80,ib=45,efa=300,nvlink=460``: the pool percent, and a floor in GB/s per
    transport over the catalog's (every product)."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        try:
            out[key.strip().lower()] = float(value)
        except ValueError:
            raise GpuproofError(f"{FLOORS_ENV}: {part!r} is not name=number (e.g. pool=80,ib=45)") from None
        if out[key.strip().lower()] <= 0:
            raise GpuproofError(f"{FLOORS_ENV}: {part!r} must be above 0")
    if "pool" in out and out["pool"] > 100:
        raise GpuproofError(f"{FLOORS_ENV}: pool={out['pool']:g} is a percent of the pool's reference, 100 at most")
    return out


def settings(environ=None, device: str = "cuda", cpu_pct: float = CPU_POOL_PCT) -> tuple[float, list[Floor]]:
    """(pool percent, floors) for this run: the defaults (on the CPU path ``cpu_pct``: pods measured at once share
    one machine's cores) and the catalog's floors, under ``GPUPROOF_FABRIC_FLOORS``."""
    over = parse_overrides((os.environ if environ is None else environ).get(FLOORS_ENV, ""))
    pct = over.pop("pool", cpu_pct if device == "cpu" else DEFAULT_POOL_PCT)
    out = []
    for f in floors():
        value = over.get(f.transport.lower())
        out.append(dataclasses.replace(f, busbw_gbps=value, source=f"{FLOORS_ENV} (catalog: {f.busbw_gbps:g} GB/s, "
                                                                   f"{f.source})") if value else f)
    known = {f.transport.lower() for f in out}
    for name, value in over.items():
        if name not in known:
            out.append(Floor(transport=name, within="node" if name == "nvlink" else "network", busbw_gbps=value,
                             source=FLOORS_ENV))
    return pct, out


def floor_for(found: list[Floor], product: str, gpus: int, transport: str | None, within: str,
              collective: str = "all_reduce") -> Floor | None:
    """The most specific floor that applies (product and GPU count named beat any)."""
    fits = [f for f in found if f.applies(product, gpus, transport, within, collective)]
    return max(fits, key=lambda f: (bool(f.product), bool(f.gpus)), default=None)

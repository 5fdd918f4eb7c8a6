"""What changed in the cluster between two inventory snapshots, at the level a person
thinks in.

A driver upgrade rewrites four GFD labels (``nvidia.com/cuda.driver-version.*``) and
usually the CUDA version the driver reports, yet it is ONE change:
``driver_version 550.54.15 -> 560.35.03`` on that node. So:

- the summarized node fields (driver_version, product, gpu_count, ...) are compared;
- labels a summarized field already represents are not compared again;
- a change that follows from another change on the same node (CUDA version from the
  driver, allocatable from capacity, gpu_count from nvidia.com/gpu capacity, capacity
  from time-slicing replicas, GPU family from product) is folded into that change and
  shown in its ``also`` text instead of being counted;
- capacity and allocatable give one change per resource; every other label one per key;
- nodes added or removed, taints added or removed, and the Kubernetes version are changes.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import re
from typing import Any

from .tables import Table, name_list

SUMMARY_FIELDS = ("pool", "gpu", "product", "gpu_count", "gpu_memory_mib", "driver_version", "cuda_version",
                  "sharing_strategy", "replicas", "mig_strategy")
# Node keys compared specially (or not at all).
_STRUCTURED = {"name", "labels", "capacity", "allocatable", "taints"}
# Top-level keys that identify a snapshot rather than describe the cluster.
_IDENTITY = {"captured", "cluster", "nodes", "gpu_nodes"}   # gpu_nodes: a count the node changes explain

# Labels a summarized field represents: skipped whenever the node has that field.
COVERED_LABELS = {
    "driver_version": ("nvidia.com/cuda.driver-version.*", "nvidia.com/cuda.driver.*"),
    "cuda_version": ("nvidia.com/cuda.runtime-version.*", "nvidia.com/cuda.runtime.*"),
    "product": ("nvidia.com/gpu.product",),
    "gpu_count": ("nvidia.com/gpu.count",),
    "gpu_memory_mib": ("nvidia.com/gpu.memory",),
    "replicas": ("nvidia.com/gpu.replicas",),
    "sharing_strategy": ("nvidia.com/gpu.sharing-strategy",),
    "mig_strategy": ("nvidia.com/mig.strategy",),
    "gpu": ("nvidia.com/gpu.present",),
}

# (follower, primary): when both changed on one node, the follower is folded into the
# primary. The follower is a regular expression on Change.field; the primary may use
# its named group {r}. The first rule whose primary also changed wins; chains resolve
# to the root (a MIG label -> its capacity -> the MIG strategy).
_MIG_LABEL = r"label/nvidia\.com/mig-(?P<r>.+?)\.(count|memory|multiprocessors|slices\..+|engines\..+)"
FOLDS = (
    (r"cuda_version", "driver_version"),
    (r"capacity/nvidia\.com/gpu.*", "replicas"),
    (r"capacity/nvidia\.com/gpu.*", "sharing_strategy"),
    (r"capacity/nvidia\.com/.+|product|gpu_count|gpu_memory_mib", "mig_strategy"),
    (r"gpu_count", "capacity/nvidia.com/gpu"),
    (r"allocatable/(?P<r>.+)", "capacity/{r}"),
    (_MIG_LABEL, "capacity/nvidia.com/mig-{r}"),
    (r"gpu_memory_mib|label/nvidia\.com/gpu\.(family|compute\..+)", "product"),
)


@dataclasses.dataclass
class Change:
    node: str               # node name; "" for the cluster as a whole
    field: str              # driver_version, capacity/nvidia.com/gpu, label/<key>, taint, node, kubernetes_version
    before: Any
    after: Any
    also: str = ""          # changes folded into this one, for the reader

    @property
    def where(self) -> str:
        return self.node or "cluster"

    def describe(self) -> str:
        if self.field == "node":
            text = f"node added ({self.after})" if self.before is None else f"node removed (was {self.before})"
        elif self.field == "taint":
            text = f"taint added {self.after}" if self.before is None else f"taint removed {self.before}"
        else:
            text = f"{self.field} {_show(self.before)} -> {_show(self.after)}"
        return text + (f" (also {self.also})" if self.also else "")

    def __str__(self) -> str:
        return f"{self.where}: {self.describe()}"


def _show(value: Any) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return str(value)


def _node_brief(node: dict) -> str:
    parts = []
    if node.get("pool"):
        parts.append(f"pool {node['pool']}")
    if node.get("gpu_count") and node.get("product"):
        parts.append(f"{node['gpu_count']} x {node['product']}")
    elif node.get("product"):
        parts.append(str(node["product"]))
    else:
        parts.append("no GPU")
    if node.get("driver_version"):
        parts.append(f"driver {node['driver_version']}")
    return ", ".join(parts)


def _covered(label: str, a: dict, b: dict) -> bool:
    for field, patterns in COVERED_LABELS.items():
        if (field in a or field in b) and any(fnmatch.fnmatchcase(label, p) for p in patterns):
            return True
    return False


def _map_changes(node: str, prefix: str, a: dict, b: dict, skip=lambda key: False) -> list[Change]:
    out = []
    for key in sorted(set(a) | set(b)):
        if skip(key):
            continue
        before, after = a.get(key), b.get(key)
        # quantities may be "8" in one snapshot and 8 in the other: compare as text
        if (before is None) != (after is None) or str(before) != str(after):
            out.append(Change(node, f"{prefix}/{key}", before, after))
    return out


def _node_changes(name: str, a: dict, b: dict) -> list[Change]:
    changes = []
    fields = [f for f in SUMMARY_FIELDS if f in a or f in b]
    fields += sorted(k for k in set(a) | set(b) if k not in SUMMARY_FIELDS and k not in _STRUCTURED)
    for field in fields:
        if a.get(field) != b.get(field):
            changes.append(Change(name, field, a.get(field), b.get(field)))
    changes += _map_changes(name, "capacity", a.get("capacity") or {}, b.get("capacity") or {})
    changes += _map_changes(name, "allocatable", a.get("allocatable") or {}, b.get("allocatable") or {})
    changes += _map_changes(name, "label", a.get("labels") or {}, b.get("labels") or {},
                            skip=lambda key: _covered(key, a, b))
    ta, tb = list(a.get("taints") or []), list(b.get("taints") or [])
    changes += [Change(name, "taint", t, None) for t in ta if t not in tb]
    changes += [Change(name, "taint", None, t) for t in tb if t not in ta]
    return _fold(changes)


def _fold(changes: list[Change]) -> list[Change]:
    """Fold changes that follow from another change on the same node into it."""
    by_field = {c.field: c for c in changes}
    parent: dict[str, str] = {}
    for follower, primary in FOLDS:
        for field in by_field:
            match = re.fullmatch(follower, field)
            if not match or field in parent:
                continue
            target = primary.format(**match.groupdict())
            if target in by_field and target != field:
                parent[field] = target

    def root(field: str) -> str:
        seen = set()
        while field in parent and field not in seen:
            seen.add(field)
            field = parent[field]
        return field

    kept = []
    for c in changes:
        if c.field in parent:
            r = by_field[root(c.field)]
            note = f"{c.field} {_show(c.before)} -> {_show(c.after)}"
            r.also = f"{r.also}; {note}" if r.also else note
        else:
            kept.append(c)
    return kept


def diff_inventories(a: dict, b: dict) -> list[Change]:
    """The changes from inventory ``a`` (before) to ``b`` (after), cluster-level first,
    then per node in name order."""
    changes = []
    for key in sorted((set(a) | set(b)) - _IDENTITY):
        if a.get(key) != b.get(key):
            changes.append(Change("", key, a.get(key), b.get(key)))
    nodes_a = {n.get("name", f"#{i}"): n for i, n in enumerate(a.get("nodes") or [])}
    nodes_b = {n.get("name", f"#{i}"): n for i, n in enumerate(b.get("nodes") or [])}
    for name in sorted(set(nodes_a) | set(nodes_b)):
        if name not in nodes_b:
            changes.append(Change(name, "node", _node_brief(nodes_a[name]), None))
        elif name not in nodes_a:
            changes.append(Change(name, "node", None, _node_brief(nodes_b[name])))
        else:
            changes.extend(_node_changes(name, nodes_a[name], nodes_b[name]))
    return changes


def group_changes(changes: list[Change]) -> list[tuple[Change, list[str]]]:
    """Identical changes on several nodes (a pool-wide driver upgrade) as one row with
    the list of nodes, in first-seen order."""
    groups: dict[tuple, tuple[Change, list[str]]] = {}
    for c in changes:
        key = (c.field, _show(c.before), _show(c.after), c.also)
        if c.field == "node":
            key = (c.field, c.node)
        if key not in groups:
            groups[key] = (c, [])
        groups[key][1].append(c.where)
    return list(groups.values())


def changes_table(changes: list[Change]) -> Table:
    table = Table(["change", "before", "after", "where", "nodes", "follows from it"], align="llllrl")
    for c, nodes in group_changes(changes):
        what = c.field
        before = "" if c.before is None else _show(c.before)
        after = "" if c.after is None else _show(c.after)
        if c.field == "node":
            what = "node added" if c.before is None else "node removed"
        elif c.field == "taint":
            what = "taint added" if c.before is None else "taint removed"
        table.add(what, before, after, name_list(nodes), str(len(nodes)) if c.node else "", c.also)
    return table


def _dra_cell(node: dict) -> str:
    """'8 devices (gpu)' where NVIDIA's DRA driver publishes devices for the node; '' where it does not."""
    count = node.get("dra_devices") or 0
    return f"{count} devices ({node.get('dra_device_types') or '?'})" if count else ""


def fleet_table(inventory: dict) -> Table:
    """Nodes grouped by pool and configuration: one row per distinct combination."""
    table = Table(["pool", "nodes", "product", "GPUs/node", "memory (MiB)", "driver", "CUDA", "sharing", "MIG",
                   "GPU capacity", "DRA", "taints"], align="lrlrrllllrll")
    groups: dict[tuple, list[str]] = {}
    for n in inventory.get("nodes") or []:
        gpu_res = {k: v for k, v in (n.get("capacity") or {}).items() if k.startswith("nvidia.com/")}
        sharing = n.get("sharing_strategy") or ""
        if sharing and sharing != "none" and n.get("replicas"):
            sharing = f"{sharing} x{n['replicas']}"
        key = (n.get("pool") or "", n.get("product") or ("" if n.get("gpu") else "(no GPU)"),
               str(n.get("gpu_count") or ""), str(n.get("gpu_memory_mib") or ""), n.get("driver_version") or "",
               n.get("cuda_version") or "", sharing, n.get("mig_strategy") or "",
               ", ".join(f"{k.removeprefix('nvidia.com/')}={v}" for k, v in sorted(gpu_res.items())),
               _dra_cell(n), ", ".join(n.get("taints") or []))
        groups.setdefault(key, []).append(n.get("name", "?"))
    for key, names in sorted(groups.items()):
        table.add(key[0], str(len(names)), *key[1:])
    return table

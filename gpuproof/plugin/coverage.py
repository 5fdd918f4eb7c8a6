"""Coverage: which GPU nodes each check left out, and why. Nothing is skipped silently.

A check that offers itself to GPU nodes (one test per node or pool) leaves a node out when

- the node cannot take pods and the check places pods (not Ready, cordoned, a node-lifecycle taint);
- the node offers its GPUs only through DRA and the check is about the device plugin's resources;
- the node is simulated (kwok) and the check needs real GPUs: real and simulated is a fact about each
  node, so on a cluster with both, such checks run on the real nodes only.

When such a check runs, the nodes it left out are written to ``coverage.jsonl`` in the run folder,
one row per check and node (check, feature, node, pool, reason). The report joins them with the
checks' own per-node skip records (no free GPU, another label scheme, ...) into its coverage table.
A check deselected with ``-k`` or ``-m`` writes nothing: it left nothing out, it did not run.
"""

from __future__ import annotations

import pytest

from ..results import COVERAGE_FILE  # noqa: F401  (where the rows go)

SIMULATED_REASON = "simulated (kwok): no GPU executes there, and this check needs real GPUs"
_PENDING = pytest.StashKey[dict]()          # test nodeid (without parameters) -> rows to write when it runs


def why_left_out(node, *, places_pods: bool, device_plugin: bool, real_gpus: bool) -> str:
    """Why a check of this kind leaves the node out ('' when it does not)."""
    if device_plugin and node.dra_only:
        return "offers its GPUs only through DRA: the device plugin's resources are not expected there"
    if (places_pods or real_gpus) and node.unfit_for_placement:
        return f"cannot take pods: {node.unfit_for_placement}"
    if real_gpus and node.simulated:
        return SIMULATED_REASON
    return ""


def split(nodes, **kind) -> tuple[list, list[dict]]:
    """(the nodes a check of this kind is offered, {node, pool, reason} of each node it leaves out)."""
    kept, left_out = [], []
    for n in nodes:
        why = why_left_out(n, **kind)
        if why:
            left_out.append({"node": n.name, "pool": n.pool, "reason": why})
        else:
            kept.append(n)
    return kept, left_out


def note(metafunc: pytest.Metafunc, left_out: list[dict]) -> None:
    """Keep what this test function leaves out, to write when one of its tests runs."""
    if not left_out:
        return
    module = metafunc.module
    feature = getattr(module, "FEATURE", module.__name__.rsplit(".", 1)[-1].removeprefix("test_"))
    rows = [{"check": metafunc.function.__name__, "feature": feature, **r} for r in left_out]
    metafunc.config.stash.setdefault(_PENDING, {})[metafunc.definition.nodeid] = rows


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem) -> None:
    pending = item.config.stash.get(_PENDING, {})
    rows = pending.pop(item.nodeid.split("[", 1)[0], None)
    if rows:
        from .target import get_target

        get_target(item.config).run_dir.add_coverage(rows)

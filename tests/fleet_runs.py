"""A run folder of a whole fleet (1,000 GPU nodes and more) in the exact shapes a real run writes, without a cluster.

The seed (tests/data/runs/replay4/, its source in SOURCES.md there) is what one real ``gpuproof run`` wrote against 4
replay nodes: 8x H100 each, node h100-2 the slow one whose census fails, every record as the suites wrote it
(checks.jsonl, metrics.jsonl, junit.xml, inventory.json, run.json); beside it the access suite's records and JUnit
cases of one kubelet node of the lab run in docs/examples/lab-1.37 (replay nodes did not serve the access suite's pods
when the seed was recorded), so each node carries the default run's suites.

:func:`make_fleet_run` writes ``nodes`` nodes from it: each node's records are a seed node's (h100-0, h100-1 and
h100-3 in turn; the ``slow`` nodes the slow h100-2's), with the node's name and its GPUs' UUIDs rewritten wherever
they appear (targets, messages, parameters, pod names, JUnit case names), as a replay fleet rewrites the recordings'
identifiers; the records of the cluster, the pools and the namespaces once, the pool's GPU and node counts in their
messages made the fleet's. Then the parquet copies and run.json, as ``RunDir.finalize`` leaves them; no report.

    python tests/fleet_runs.py /tmp/fleet 1000     # reports/<run>/ of 1,000 nodes, then its reports are written
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

SEED = Path(__file__).resolve().parent / "data" / "runs" / "replay4"
SEED_NODES = ("h100-0", "h100-1", "h100-2", "h100-3")
NORMAL, SLOW = ("h100-0", "h100-1", "h100-3"), "h100-2"
LAB_NODE = "a100-0"                          # the access suite's records come from this lab node
UUID = re.compile(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _read(name: str) -> str:
    path = SEED / name
    if path.suffix == ".gz":
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    return path.read_text(encoding="utf-8")


def _word(name: str) -> re.Pattern:
    """``name`` as a whole name: not inside a longer one (h100-2 is not in h100-20), but inside a pod's name."""
    return re.compile(r"(?<![0-9A-Za-z])" + re.escape(name) + r"(?![0-9A-Za-z])")


def gpu_uuid(node: str, seed_uuid: str) -> str:
    """The UUID a node's GPU gets in place of the seed's: the same GPU index, a different node, a different UUID."""
    digest = hashlib.sha256(f"{node}/{seed_uuid}".encode()).digest()[:16]
    return "GPU-" + str(uuid.UUID(bytes=digest))


class _Renamer:
    """Rewrites a seed node's text as another node's: its name and its GPUs' UUIDs."""

    def __init__(self, seed_node: str):
        self.pattern = _word(seed_node)

    def __call__(self, text: str, node: str) -> str:
        text = self.pattern.sub(node, text)
        return UUID.sub(lambda m: gpu_uuid(node, m.group(0)), text)


def _fleet_counts(text: str, nodes: int, gpus: int) -> str:
    """The seed pool's counts in messages and parameters (4 nodes, 32 GPUs) made the fleet's."""
    text = text.replace(f"x8, {len(SEED_NODES) * 8} GPUs", f"x8, {gpus} GPUs")
    text = text.replace(f"x8, {len(SEED_NODES)} nodes", f"x8, {nodes} nodes")
    return text.replace(f'\\"nodes\\": {len(SEED_NODES)},', f'\\"nodes\\": {nodes},')


def _node_of_line(line: str, key: str) -> str:
    value = json.loads(line).get(key, "")
    return value if value in SEED_NODES else ""


def _split(text: str, key: str) -> tuple[list[str], dict[str, list[str]]]:
    """JSONL lines of nobody's (the cluster's, a pool's) and of each seed node (by ``key``: target or node)."""
    shared, per_node = [], {n: [] for n in SEED_NODES}
    for line in text.splitlines():
        if not line.strip():
            continue
        node = _node_of_line(line, key)
        (per_node[node] if node else shared).append(line)
    return shared, per_node


def node_names(nodes: int) -> list[str]:
    return [f"h100-{i}" for i in range(nodes)]


def template_of(index: int, slow: tuple[int, ...]) -> str:
    return SLOW if index in slow else NORMAL[index % len(NORMAL)]


def make_fleet_run(root: str | Path, run_id: str = "fleet-1000", nodes: int = 1000, slow: tuple[int, ...] = (416,),
                   parquet: bool = True) -> Path:
    """Write a run folder of ``nodes`` replay-shaped GPU nodes under ``root``; its path."""
    import pandas as pd

    path = Path(root) / run_id
    path.mkdir(parents=True, exist_ok=True)
    names = node_names(nodes)
    renamers = {n: _Renamer(n) for n in SEED_NODES}
    lab = _Renamer(LAB_NODE)
    gpus = 8 * nodes

    def per_node_lines(seed_lines: dict[str, list[str]], extra: list[str] = ()) -> list[str]:
        out = []
        blocks = {n: "\n".join(lines) for n, lines in seed_lines.items()}
        access = "\n".join(extra)
        for i, node in enumerate(names):
            seed = template_of(i, slow)
            if access:
                out.append(lab(access, node))
            if blocks[seed]:
                out.append(renamers[seed](blocks[seed], node))
        return out

    seed_run_id = json.loads(_read("run.json"))["run_id"]

    def finish(text: str) -> str:
        return _fleet_counts(text, nodes, gpus).replace(f'"run_id": "{seed_run_id}"', f'"run_id": "{run_id}"')

    # checks: the access suite's (the lab node's, as this pool's), then each node's, then the shared ones
    shared, per_node = _split(_read("checks.jsonl.gz"), "target")
    seed_pool = json.loads(per_node[NORMAL[0]][0])
    access = []
    for line in _read("access-a100-0.jsonl").splitlines():
        rec = json.loads(line)
        rec.update(pool=seed_pool["pool"], product=seed_pool["product"], run_id=seed_run_id)
        access.append(json.dumps(rec, sort_keys=True))
    checks = finish("\n".join(per_node_lines(per_node, access) + shared)) + "\n"
    (path / "checks.jsonl").write_text(checks, encoding="utf-8")

    shared, per_node = _split(_read("metrics.jsonl.gz"), "node")
    metrics = finish("\n".join(per_node_lines(per_node) + shared)) + "\n"
    (path / "metrics.jsonl").write_text(metrics, encoding="utf-8")

    _write_junit(path / "junit.xml", names, slow, renamers, lab)
    _write_inventory(path / "inventory.json", names, renamers)
    meta = json.loads(_read("run.json"))
    meta.update(run_id=run_id, fleet=f"replay{nodes}", argv=["run", "--fleet", f"replay{nodes}.yaml"])
    (path / "run.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if parquet:
        for name, text in (("checks", checks), ("metrics", metrics)):
            rows = [json.loads(line) for line in text.splitlines() if line]
            pd.DataFrame(rows).to_parquet(path / f"{name}.parquet", index=False)
    return path


def _write_junit(out: Path, names: list[str], slow: tuple[int, ...], renamers: dict, lab: _Renamer) -> None:
    """pytest's junit.xml for the fleet: each per-node case once per node, in pytest's order (test by test)."""
    root = ET.fromstring(_read("junit.xml.gz"))
    suite = root.find("testsuite")
    param = re.compile(r"\[(" + "|".join(map(re.escape, SEED_NODES)) + r")\]$")
    # (kind, seed texts): "once" a case of nobody's; "lab" an access case of the lab node; "nodes" one case per seed
    # node of one test (pytest writes a test's per-node cases one after another)
    groups: list[tuple[str, str, dict[str, str]]] = [
        ("lab", "", {LAB_NODE: ET.tostring(c, encoding="unicode")})
        for c in ET.fromstring(_read("access-a100-0.xml")).iter("testcase")]
    for case in suite.iter("testcase"):
        text = ET.tostring(case, encoding="unicode")
        m = param.search(case.get("name", ""))
        if not m:
            groups.append(("once", "", {"": text}))
            continue
        test = case.get("classname", "") + "::" + case.get("name", "")[:m.start()]
        if groups[-1][0] == "nodes" and groups[-1][1] == test:
            groups[-1][2][m.group(1)] = text
        else:
            groups.append(("nodes", test, {m.group(1): text}))
    cases, counts = [], {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for kind, _, what in groups:
        if kind == "once":
            texts = [what[""]]
        elif kind == "lab":
            texts = [lab(what[LAB_NODE], node) for node in names]
        else:
            texts = [renamers[template_of(i, slow)](what[template_of(i, slow)], node) for i, node in enumerate(names)]
        for text in texts:
            cases.append(text)
            counts["tests"] += 1
            for tag, key in (("<failure", "failures"), ("<error", "errors"), ("<skipped", "skipped")):
                if tag in text:
                    counts[key] += 1
    attrs = dict(suite.attrib, **{k: str(v) for k, v in counts.items()})
    head = " ".join(f'{k}="{v}"' for k, v in attrs.items())
    body = _fleet_counts("".join(cases), len(names), 8 * len(names))
    out.write_text(f'<?xml version="1.0" encoding="utf-8"?><testsuites name="{root.get("name", "pytest tests")}">'
                   f"<testsuite {head}>{body}</testsuite></testsuites>", encoding="utf-8")


def _write_inventory(out: Path, names: list[str], renamers: dict) -> None:
    inv = json.loads(_read("inventory.json.gz"))
    seed = {n["name"]: n for n in inv["nodes"]}
    others = [n for n in inv["nodes"] if n["name"] not in SEED_NODES]
    text = json.dumps(seed[NORMAL[0]], sort_keys=True)
    nodes = [json.loads(renamers[NORMAL[0]](text, node)) for node in names]
    inv["nodes"] = nodes + others
    if isinstance(inv.get("gpu_nodes"), list):
        inv["gpu_nodes"] = list(names)
    elif isinstance(inv.get("gpu_nodes"), int):
        inv["gpu_nodes"] = len(names)
    out.write_text(json.dumps(inv, indent=2, sort_keys=True) + "\n", encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover - for trying the reports at fleet scale
    import sys
    import time

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "reports")
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    t0 = time.monotonic()
    run = make_fleet_run(root, f"fleet-{n}", nodes=n)
    print(f"{run}: written in {time.monotonic() - t0:.1f}s")

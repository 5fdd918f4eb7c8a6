"""What transport a distributed workload's ranks really used, captured in the workload itself (issue #50).

NCCL prints its init and network lines (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,NET``) to the process's stdout,
where the ranks of a pod interleave and a long log is cut. :func:`prepare` points each rank's NCCL output to a file of
its own (``NCCL_DEBUG_FILE``, unless the user set one) before the process group starts; after the run :func:`local`
reads that file with ``nccl_log.read`` and adds what the pod sees of the RDMA fabric (``/sys/class/infiniband``); rank
0 gathers every rank's read and :func:`by_node` merges them per node, for the result's ``fabric`` field. On the CPU
the ranks talk gloo over TCP: the read says so, it is not NCCL's. Every rank also echoes its decisive line to stderr.

Standard library only (with ``nccl_log``): it runs in pods beside the other workloads.
"""

from __future__ import annotations

import os
import sys
import tempfile

import nccl_log

GLOO = "TCP (gloo)"
KEEP = ("nccl_version", "network", "net_plugin", "ofi_provider", "hcas", "link_layer", "transport", "gdr", "intra",
        "evidence", "warnings", "nodes", "lines")


def prepare(rank: int, device: str) -> str | None:
    """On CUDA with NCCL_DEBUG set: this rank's NCCL output goes to a file of its own (the path, or None)."""
    if device != "cuda" or not os.environ.get("NCCL_DEBUG"):
        return None
    if os.environ.get("NCCL_DEBUG_FILE"):
        return os.environ["NCCL_DEBUG_FILE"].replace("%h", os.uname().nodename).replace("%p", str(os.getpid()))
    path = os.path.join(tempfile.gettempdir(), f"gpuproof-nccl-rank{rank}.{os.getpid()}.log")
    os.environ["NCCL_DEBUG_FILE"] = path
    return path


def hcas_visible(root: str = "/sys/class/infiniband") -> list[str]:
    """The RDMA devices this pod sees (what an RDMA device plugin or host networking hands it)."""
    try:
        return sorted(os.listdir(root))
    except OSError:
        return []


def local(path: str | None, device: str, rank: int) -> dict:
    """This rank's read: NCCL's transports from its own log, or gloo's TCP on the CPU."""
    if device != "cuda":
        return {"backend": "gloo", "transport": GLOO, "intra": [], "evidence": None, "warnings": [],
                "hcas_visible": hcas_visible()}
    text = ""
    if path:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError as exc:
            text = ""
            print(f"rank {rank}: NCCL's log {path} could not be read: {exc}", file=sys.stderr, flush=True)
    read = nccl_log.read(text)
    out = {"backend": "nccl", **{k: read.get(k) for k in KEEP}, "hcas_visible": hcas_visible()}
    if read.get("evidence"):
        print(f"rank {rank}: NCCL: {nccl_log.summary(read)}: {read['evidence']}", file=sys.stderr, flush=True)
    return out


def by_node(reads: list[dict], node_of: list[str]) -> dict[str, dict]:
    """Per node, its ranks' reads merged: the transport when all agree (else each, joined), the first evidence, every
    warning, HCA and transport within the node once. ``node_of[r]``: the node of rank r."""
    out: dict[str, dict] = {}
    for rank, read in enumerate(reads):
        if not read:
            continue
        node = out.setdefault(node_of[rank], {"backend": read.get("backend"), "transports": [], "evidence": None,
                                              "warnings": [], "hcas": [], "hcas_visible": [], "intra": [],
                                              "nccl_version": read.get("nccl_version"), "ranks": []})
        node["ranks"].append(rank)
        for key, many in (("transports", [read.get("transport")]), ("warnings", read.get("warnings")),
                          ("hcas", read.get("hcas")), ("hcas_visible", read.get("hcas_visible")),
                          ("intra", read.get("intra"))):
            for v in many or []:
                if v and v not in node[key]:
                    node[key].append(v)
        node["evidence"] = node["evidence"] or read.get("evidence")
    for node in out.values():
        node["transport"] = "+".join(node["transports"]) if node["transports"] else None
    return out

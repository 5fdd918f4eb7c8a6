"""Which transport NCCL really used, read from its debug output (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET).

A multi-node job can pass every bandwidth threshold a little too slowly and still hide the one fact that matters: its
GPUs talked over TCP sockets although the nodes offer InfiniBand, RoCE or EFA (a missing libibverbs in the image, no
/dev/infiniband in the pod, an RDMA resource not requested). NCCL says so in its log; this module reads it.

Standard library only: it is shipped into pods next to the other workloads (``import nccl_log``) and imported locally
with ``gpuproof.bench.workloads.import_workload("nccl_log")``.

What it reads, in the forms NCCL 2.4 to 2.28 print them, from one process or from several interleaved (a pod log,
torchrun's or mpirun's merged output, lines with ``host:pid:tid [dev]`` or any other prefix before ``NCCL INFO``):

- per-channel connections: ``Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA`` (also ``NET/IB/0(1)/GDRDMA``
  when PXN proxies through another GPU, ``/Shared``, ``NET/Socket/0``, ``NET/AWS Libfabric/0/GDRDMA``, any plugin's
  name), ``via P2P/IPC``, ``P2P/CUMEM``, ``P2P/direct pointer``, ``SHM/direct/direct``; the older ``Ring 00 : ...``
  and ``via direct shared memory``; NVLS (``NVLS multicast support is available``, ``Connected NVLS``);
- the network banner ``Using network IB`` (``Socket``, ``IBext``, ``AWS Libfabric``, ``GPUDirectTCPX_v7``,
  ``FasTrak``...), 2.27's ``Assigned NET plugin IB to comm``, ``comm ... nNodes 2`` and
  ``Connected all rings, use ring PXN 0 GDR 1``;
- the network plugins' own lines: ``NET/IB : Using [0]mlx5_0:1/IB ...`` (``/RoCE`` for RoCE), ``NET/Socket : Using``,
  ``NET/OFI Selected Provider is efa`` (aws-ofi-nccl), ``NET/GPUDirectTCPX ...`` (GCP TCPX), ``NET/FasTrak ...``
  (GCP TCPXO);
- the lines that explain a fall-back: ``Failed to open libibverbs.so``, ``NET/IB : No device found.``,
  ``NCCL_IB_DISABLE set by environment to 1``, ``Call to ibv_... failed``, ``GPU Direct RDMA Disabled``, a network
  plugin that failed to initialise.

Traffic between nodes is what a ``NET`` channel line shows (unless both of its ranks are known to live on the host
that printed it: then the node's own GPUs talked over the network). Without channel lines, a log that spans several
nodes (``nNodes 2``, or NCCL lines from two hosts or more) is read from the network NCCL chose. A log that shows
neither reads ``transport = None``: nothing proves traffic between nodes, so nothing can be called a fall-back.

The tests read logs copied from public issues and guides (tests/data/nccl/SOURCES.md).
"""

from __future__ import annotations

import re
from collections import Counter

_MARK = re.compile(r"NCCL (?:INFO|WARN) ")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
_HOST = re.compile(r"(?P<host>[^\s:]*):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\]")
_CHANNEL = re.compile(r"^(?:Channel|Ring) \d+(?:/\d+)? : (?P<a>\d+)\[[0-9a-fA-F]+\] -> (?P<b>\d+)\[[0-9a-fA-F]+\]"
                      r"(?: \[(?P<dir>send|receive)\])? via (?P<via>.+?)\s*$")
_NET_VIA = re.compile(r"^NET/(?P<name>[^/]+)/(?P<dev>\d+)(?:\((?P<proxy>\d+)\))?(?P<rest>.*)$")
_BANNER = re.compile(r"^Using network (?P<name>.+?)\s*$")
_ASSIGNED = re.compile(r"^Assigned NET plugin (?P<name>.+?) to comm\s*$")
_NNODES = re.compile(r"\bnNodes (\d+)")
_COMM_RANK = re.compile(r"^(?:\[Rank \d+\] )?(?:ncclCommInit\w* )?comm 0x[0-9a-fA-F]+ rank (\d+) n[Rr]anks \d+")
_RINGS_GDR = re.compile(r"^Connected all rings, use ring PXN \d+ GDR (\d)")
_NET_USING = re.compile(r"^NET/(?P<name>\S+) : Using (?P<rest>.*)$")
_HCA = re.compile(r"\[\d+\](?P<hca>[^\s\[;]+?:\d+)/(?P<link>IB|RoCE)\b")
_OFI_PROVIDER = re.compile(r"^NET/OFI Selected [Pp]rovider is (?P<prov>[^\s,;(]+)")

# lines that explain why NCCL did not use the RDMA fabric (or GPUDirect RDMA), most telling first
_FALLBACK = [
    re.compile(r"Failed to open libibverbs"),
    re.compile(r"NET/IB : No device found"),
    re.compile(r"NCCL_IB_DISABLE set by environment to [1-9]"),
    re.compile(r"NCCL_NET set by environment to Socket"),
    re.compile(r"Call to ibv_\w+ failed"),
    re.compile(r"memlock", re.IGNORECASE),
    re.compile(r"Failed to initialize (?:any )?NET plugin"),
    re.compile(r"NET/OFI .*(?:[Ii]nvalid|[Uu]nable|[Cc]ould ?n.t|[Ff]ail)"),
    re.compile(r"NET/(?!Socket\b)\S+ : GPU Direct RDMA Disabled"),
    re.compile(r"nv_peer_mem|nvidia[-_]peermem", re.IGNORECASE),
]

def net_family(name: str | None) -> str | None:
    """The network plugin a NET name belongs to: "IB" (NCCL's own verbs, IBext*, the RDMA/SHARP plugin, gIB),
    "Socket", "OFI" (aws-ofi-nccl: "AWS Libfabric", "Libfabric"), "GPUDirectTCPX", "FasTrak", else the name."""
    if not name:
        return None
    low = name.strip().lower()
    if low in ("ib", "gib") or low.startswith("ibext") or low.startswith("nccl rdma plugin"):
        return "IB"
    if low == "socket":
        return "Socket"
    if "libfabric" in low or low.startswith("ofi"):
        return "OFI"
    if low.startswith("gpudirecttcpx"):
        return "GPUDirectTCPX"
    if low.startswith("fastrak"):
        return "FasTrak"
    return name.strip()


def _intra_label(via: str) -> str | None:
    """The within-node transport of a non-NET channel's via text (None for CollNet and the unknown)."""
    if via.startswith("P2P/"):
        kind = via.split("/")[1]
        if kind.startswith("direct"):
            return "P2P/direct"
        return {"IPC": "P2P/IPC", "CUMEM": "P2P/CUMEM", "MNNVL": "P2P/MNNVL", "indirect": "P2P/indirect"}.get(kind)
    if via.startswith("SHM") or via.startswith("direct shared memory"):
        return "SHM"
    return None


def _empty() -> dict:
    return {"nccl_version": None, "network": None, "networks": [], "net_plugin": None, "ofi_provider": None,
            "hcas": [], "link_layer": None, "transport": None, "gdr": None, "intra": [], "peers": {},
            "hosts": [], "nodes": None, "evidence": None, "warnings": [], "lines": 0}


def _transport_name(family: str | None, link: str | None, provider: str | None, gdr: bool | None) -> str | None:
    if family is None:
        return None
    if family == "IB":
        name = "RoCE" if link == "RoCE" else "IB"
    elif family == "OFI":
        name = "EFA" if (provider or "").startswith("efa") else "OFI"
    else:
        name = {"GPUDirectTCPX": "TCPX", "FasTrak": "TCPXO"}.get(family, family)
    return name + "/GDRDMA" if gdr and name != "Socket" else name


def read(text: str) -> dict:
    """Read NCCL's debug output (see the module's docstring); never raises, garbage reads as empty values.

    Keys: nccl_version ("2.21.5"), network (the first ``Using network`` word), networks (all of them), net_plugin
    (net_family of the network the channels or the banner name), ofi_provider, hcas (["mlx5_0:1", ...]), link_layer
    ("IB", "RoCE", "IB+RoCE" or None), transport (the one summary of the traffic between nodes, None when none is
    seen), gdr (whether every inter-node channel used GPUDirect RDMA, None when unknown), intra (sorted transports
    within a node), peers ("a->b" -> via text), hosts, nodes (the largest ``nNodes``), evidence (the line that decided
    transport, as printed), warnings (fall-back explaining lines, one per message, as printed), lines (NCCL lines).
    """
    out = _empty()
    try:
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", "replace")
        _read(text if isinstance(text, str) else "", out)
    except Exception:   # a reader of logs must not fail on a log
        return _empty() | {"lines": out.get("lines", 0)}
    return out


def _read(text: str, out: dict) -> None:
    hosts: list[str] = []
    rank_host: dict[str, str] = {}
    channels = []          # (line, host, a, b, direction, via)
    banners, assigned, plugin_lines = [], [], {}
    hcas, links, providers, warned = [], set(), [], {}
    nodes, rings_gdr, intra = 0, None, set()
    for raw in text.splitlines():
        line = raw.rstrip()
        version = _VERSION.search(line)
        mark = _MARK.search(line)
        if not (mark or version):
            continue
        out["lines"] += 1
        if version and out["nccl_version"] is None:
            out["nccl_version"] = version.group(1)
        if not mark:
            continue
        msg = line[mark.end():].strip()
        found = _HOST.search(line[:mark.start()])
        host = (found.group("host") or None) if found else None    # "" when the host was cut from the log
        if host is not None and host not in hosts:
            hosts.append(host)
        for pattern in _FALLBACK:
            if pattern.search(msg):
                warned.setdefault(msg, line)
                break
        channel = _CHANNEL.match(msg)
        if channel:
            via = re.split(r"\s+comm\s", channel["via"])[0]
            a, b, direction = channel["a"], channel["b"], channel["dir"]
            channels.append((line, host, a, b, direction, via))
            out["peers"].setdefault(f"{a}->{b}", via)
            if host is not None:
                local = [a] if direction == "send" else [b] if direction == "receive" else [a, b]
                for rank in local:
                    rank_host.setdefault(rank, host)
            continue
        if msg.startswith("NVLS multicast support is available") or msg.startswith("Connected NVLS"):
            intra.add("NVLS")
        if m := _BANNER.match(msg):
            banners.append((m["name"], line))
        elif m := _ASSIGNED.match(msg):
            assigned.append((m["name"], line))
        elif m := _RINGS_GDR.match(msg):
            rings_gdr = m.group(1) == "1"
        elif m := _OFI_PROVIDER.match(msg):
            providers.append(m["prov"])
            plugin_lines.setdefault("OFI", line)
        elif m := _NET_USING.match(msg):
            for hca in _HCA.finditer(m["rest"]):
                links.add(hca["link"])
                if hca["hca"] not in hcas:
                    hcas.append(hca["hca"])
            family = net_family(m["name"])
            if family in ("IB", "Socket") or _HCA.search(m["rest"]):
                plugin_lines.setdefault("IB" if _HCA.search(m["rest"]) else family, line)
        elif msg.startswith("NET/GPUDirectTCPX"):
            plugin_lines.setdefault("GPUDirectTCPX", line)
        elif msg.startswith("NET/FasTrak"):
            plugin_lines.setdefault("FasTrak", line)
        if m := _NNODES.search(msg):
            nodes = max(nodes, int(m.group(1)))
        if host is not None and (m := _COMM_RANK.match(msg)):
            rank_host.setdefault(m.group(1), host)

    out["hosts"] = hosts
    out["nodes"] = nodes or None
    out["hcas"] = hcas
    out["link_layer"] = "IB+RoCE" if links == {"IB", "RoCE"} else (links.pop() if links else None)
    out["ofi_provider"] = providers[0] if providers else None
    out["networks"] = sorted({name for name, _ in banners})
    out["network"] = banners[0][0] if banners else None
    out["warnings"] = list(warned.values())

    inter = []             # (line, net name, gdr) of channels between nodes
    for line, host, a, b, direction, via in channels:
        net = _NET_VIA.match(via)
        if not net:
            if label := _intra_label(via):
                intra.add(label)
            continue
        local, peer = (a, b) if direction == "send" else (b, a)
        if host is not None and rank_host.get(peer) == host and rank_host.get(local, host) == host:
            intra.add("NET")
        else:
            inter.append((line, net["name"], "/GDRDMA" in net["rest"]))
    out["intra"] = sorted(intra)

    chosen = (Counter(name for _, name, _ in inter).most_common(1)[0][0] if inter
              else banners[0][0] if banners else assigned[0][0] if assigned else None)
    family = net_family(chosen)
    if family is None:
        for candidate in ("GPUDirectTCPX", "FasTrak", "OFI", "IB", "Socket"):
            if candidate in plugin_lines:
                family = candidate
                break
    out["net_plugin"] = family

    if inter:
        used = [row for row in inter if net_family(row[1]) == family]
        out["gdr"] = all(gdr for _, _, gdr in used)
        out["evidence"] = used[0][0]
    elif family is not None and (nodes >= 2 or len(hosts) >= 2):
        out["gdr"] = rings_gdr if family != "Socket" else False
        if banners:
            out["evidence"] = next(line for name, line in banners if net_family(name) == family)
        elif assigned:
            out["evidence"] = assigned[0][1]
        else:
            out["evidence"] = plugin_lines.get(family)
    else:
        return
    out["transport"] = _transport_name(family, out["link_layer"], out["ofi_provider"], out["gdr"])


def inter_node(result: dict) -> bool:
    """Whether the log shows traffic between nodes (a transport was read)."""
    return bool(result and result.get("transport"))


def _worst_warning(result: dict) -> str | None:
    warnings = result.get("warnings") or []
    for pattern in _FALLBACK:
        for line in warnings:
            if pattern.search(line):
                return line
    return None


def socket_fallback(result: dict, offers: list[str]) -> str | None:
    """One sentence when the node offers an RDMA fabric (``offers``: resource names such as ``rdma/ib``,
    ``nvidia.com/hostdev``, ``vpc.amazonaws.com/efa``, DRA device names or HCA names) but NCCL sent the traffic
    between nodes over TCP sockets; None otherwise, also when the log shows no traffic between nodes at all (then
    ``result["transport"]`` is None, which callers report on its own)."""
    offered = [str(o) for o in (offers or []) if str(o).strip()]
    if not offered or not result or result.get("transport") != "Socket":
        return None
    sentence = (f"NCCL sent the traffic between nodes over TCP sockets although the node offers RDMA "
                f"({', '.join(offered)}): it logged \"{result.get('evidence')}\"")
    if cause := _worst_warning(result):
        sentence += f", and before that \"{cause}\""
    return sentence + "."


def summary(result: dict) -> str:
    """One short line, e.g. "IB/GDRDMA over mlx5_0:1,mlx5_1:1 (NCCL 2.21.5); within node P2P/IPC, NVLS"."""
    if not result or not result.get("lines"):
        return "no NCCL log lines"
    transport = result.get("transport")
    if transport:
        head = transport
        if result.get("hcas") and transport.split("/")[0] in ("IB", "RoCE"):
            head += " over " + ",".join(result["hcas"])
    else:
        head = "no traffic between nodes seen"
        if result.get("network"):
            head += f" (network {result['network']})"
    if result.get("nccl_version"):
        head += f" (NCCL {result['nccl_version']})"
    if result.get("intra"):
        head += "; within node " + ", ".join(result["intra"])
    if result.get("warnings"):
        head += f"; {len(result['warnings'])} fall-back warning(s)"
    return head


if __name__ == "__main__":   # python nccl_log.py < pod.log
    import json
    import sys

    found = read(sys.stdin.read())
    print(summary(found))
    print(json.dumps(found, indent=1))

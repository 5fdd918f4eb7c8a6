"""The nodes' network: a host bridge per cluster (``gpk<id>``, 10.250.<c>.1/24) and one veth per node (the node's
``eth0``, 10.250.<c>.<10+i>, in the node's own network namespace). The node reaches the API server at the bridge
address, which the host DNATs to the API server's 127.0.0.1 port (``route_localnet`` on the bridge only). Pods get
10.251.<i>.0/24 from the CNI bridge plugin inside the node's namespace (:func:`cni_config`), and nodes route each
other's pod ranges over the bridge, so the host routes nothing."""

from __future__ import annotations

from pathlib import Path

from ...errors import ControlPlaneError
from .host import _sh
from .layout import Node, State


def pick_subnet(cluster: str) -> int:
    """A 10.250.<c>.0/24 no interface of this host has an address in."""
    start = int(cluster, 16)
    for k in range(200):
        c = 20 + (start + k) % 200
        if not _sh("ip", "-4", "addr", "show", "to", f"10.250.{c}.0/24", check=False).stdout.strip():
            return c
    raise ControlPlaneError("kubelet nodes: no free 10.250.<c>.0/24 subnet for the node bridge")


def up(state: State, nodes: list[Node]) -> None:
    """The bridge, the API server's DNAT rule, and each node's namespace, veth, routes and pod masquerade."""
    br, gw = state.bridge, state.gateway
    _sh("ip", "link", "add", br, "type", "bridge")
    _sh("ip", "addr", "add", f"{gw}/24", "dev", br)
    _sh("ip", "link", "set", br, "up")
    Path(f"/proc/sys/net/ipv4/conf/{br}/route_localnet").write_text("1")
    _sh("iptables", "-t", "nat", "-A", *state.dnat_rule())
    for n in nodes:
        ns, host_end, node_end = state.netns(n.index), state.veth(n.index), f"gpk{state.cluster}n{n.index}"
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", node_end)
        _sh("ip", "link", "set", host_end, "master", br, "up")
        _sh("ip", "link", "set", node_end, "netns", ns)
        inside = ("ip", "netns", "exec", ns)
        _sh(*inside, "ip", "link", "set", node_end, "name", "eth0")
        _sh(*inside, "ip", "addr", "add", f"{n.ip(state.subnet)}/24", "dev", "eth0")
        _sh(*inside, "ip", "link", "set", "eth0", "up")
        _sh(*inside, "ip", "link", "set", "lo", "up")
        _sh(*inside, "ip", "route", "add", "default", "via", gw)
        _sh(*inside, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        for other in nodes:
            if other is not n:
                _sh(*inside, "ip", "route", "add", other.pod_cidr, "via", other.ip(state.subnet))
        # pods reach the API server (and the host) as their node: the host routes no pod range
        _sh(*inside, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", n.pod_cidr, "-d", f"{gw}/32",
            "-j", "MASQUERADE")
        # Services, the `kubernetes` one included, are the node's kube-proxy's (clusternet.start_proxy)


def down(state: State) -> None:
    """Remove what :func:`up` made (what is already gone is passed over)."""
    _sh("iptables", "-t", "nat", "-D", *state.dnat_rule(), check=False)
    for i in range(len(state.nodes)):
        _sh("ip", "netns", "del", state.netns(i), check=False)
        _sh("ip", "link", "del", state.veth(i), check=False)
    _sh("ip", "link", "del", state.bridge, check=False)


def cni_config(node: Node) -> dict:
    """The node's CNI config: the bridge plugin over its pod range, and portmap."""
    return {"cniVersion": "0.4.0", "name": "gpuproof", "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_cidr}]], "routes": [{"dst": "0.0.0.0/0"}]}},
        {"type": "portmap", "capabilities": {"portMappings": True}}]}

"""What the kubelet nodes are (:class:`Node`: a fleet pool's node, numbered across the kubelet pools) and what they
made on the host (:class:`State`, saved as ``<state>/kubelet/state.json``, whose names :func:`~.nodes.stop` removes).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .host import DRA_NODE_LABEL, NVIDIA_NODE_LABEL


@dataclasses.dataclass
class Node:
    name: str
    index: int
    labels: dict[str, str]
    taints: list[str]
    max_pods: int
    dra: bool = False          # NVIDIA's DRA driver runs here, over containerd 1.7 with CDI (kubelet.dra)
    toolkit: dict | None = None  # NVIDIA's container toolkit as its runtime, with these settings (kubelet.toolkit)

    def ip(self, c: int) -> str:
        return f"10.250.{c}.{10 + self.index}"

    @property
    def pod_cidr(self) -> str:
        return f"10.251.{self.index}.0/24"


@dataclasses.dataclass
class State:
    """What the nodes made on the host: all of it is removed by :func:`~.nodes.stop`."""

    cluster: str                                       # the id in every host name (bridge, netns, cgroup)
    subnet: int                                        # the c of 10.250.<c>.0/24
    api_port: int
    api_service: str = ""                              # the `kubernetes` Service's ClusterIP, DNATed in each node
    nodes: list[str] = dataclasses.field(default_factory=list)
    pids: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def bridge(self) -> str:
        return f"gpk{self.cluster}"

    @property
    def gateway(self) -> str:
        return f"10.250.{self.subnet}.1"

    @property
    def cgroup(self) -> str:
        return f"gpuproof-{self.cluster}"

    @property
    def comment(self) -> str:
        return f"gpuproof-{self.cluster}"

    def netns(self, i: int) -> str:
        return f"gpk{self.cluster}-{i}"

    def veth(self, i: int) -> str:
        return f"gpk{self.cluster}h{i}"

    def dnat_rule(self) -> list[str]:
        return ["PREROUTING", "-i", self.bridge, "-d", self.gateway, "-p", "tcp", "--dport", str(self.api_port),
                "-j", "DNAT", "--to-destination", f"127.0.0.1:{self.api_port}", "-m", "comment",
                "--comment", self.comment]


def state_dir(sim_dir: Path) -> Path:
    return Path(sim_dir) / "kubelet"


def _load(sim_dir: Path) -> State | None:
    try:
        return State(**json.loads((state_dir(sim_dir) / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _save(sim_dir: Path, state: State) -> None:
    path = state_dir(sim_dir) / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(dataclasses.asdict(state), indent=2))
    tmp.replace(path)


def fleet_nodes(fleet) -> list[tuple[Node, object]]:
    """(node, pool) for every node of the fleet's kubelet pools, numbered across them."""
    from ..fleet import POOL_LABEL

    out = []
    for pool in (p for p in fleet.pools if p.backend == "kubelet"):
        labels = {POOL_LABEL: pool.instance_type or pool.name, **pool.labels}
        if pool.gpu is not None:
            labels[NVIDIA_NODE_LABEL] = "true"
        if pool.dra:
            labels[DRA_NODE_LABEL] = "true"
        for name in pool.node_names():
            toolkit = pool.container_toolkit(pool.node_names().index(name)) if pool.gpu is not None else None
            out.append((Node(name, len(out), labels, [str(t) for t in pool.taints], pool.pods, dra=pool.dra,
                             toolkit=toolkit), pool))
    return out

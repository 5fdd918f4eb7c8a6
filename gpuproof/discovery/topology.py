"""Is the set of GPUs a pod got NVLink-connected? Judged from what the probe read (no cluster access).

NVIDIA's device plugin hands a pod asking for several GPUs a topology-aware set (GetPreferredAllocation:
GPUs that share NVLink). The probe (``workloads/probe.py``, :func:`nvml_topology`) reads the NVLink links
among the GPUs its pod sees; :func:`nvlink_set` says whether they form a connected set.

The rule: **every pair** of the pod's GPUs has at least one active NVLink between them, directly (a link
whose far end is the other GPU: NVLink bridges, a hybrid cube mesh) or through NVSwitch (both GPUs have
active links to NVSwitches: every GPU on a node's NVSwitch fabric reaches every other, which is how
``nvidia-smi topo -m`` counts NV# on HGX/DGX nodes). NVML's P2P status over NVLink saying OK also counts (a
driver that names no link type still says the pair talks over NVLink). A chain is not enough: two GPUs that
reach each other only through a third GPU's links move their traffic over PCIe, which is what
topology-aware allocation exists to avoid.

A set where none of the GPUs has an active NVLink is PCIe only (T4, L4, L40S): it cannot be a fragmented
NVLink set, so the check records skipped with that reason. A GPU whose links are all down on a node that
has NVLink is the health check's ``nvlink_links`` item, not this one. GPUs are named by their number on the
node (their minor number, ``/dev/nvidia<N>``), with their UUID, and their NVML index in the pod where it
differs.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: str            # pass, fail, warn or skip
    node: str
    expected: str = ""
    actual: str = ""
    reason: str = ""        # why it skipped or only warns

    @property
    def detail(self) -> str:
        """The reason of a skip, else the expected and the actual (and why it only warns)."""
        if self.verdict == "skip":
            return self.reason
        text = f"the GPUs of one pod: expected {self.expected}, actual {self.actual}"
        return f"{text} ({self.reason})" if self.reason else text

    @property
    def message(self) -> str:
        """What a person reads: the node, then the detail."""
        return f"{self.node}: {self.detail}"


def nvlink_set(result: dict, node: str, held_by_others: int = 0) -> Verdict:
    """The verdict on the GPUs one probe pod on ``node`` saw.

    ``held_by_others``: GPUs of the node other pods hold. With some held, the free GPUs may include no linked
    set, so a fragmented one only warns."""
    topo = result.get("topology") or {}
    if not topo.get("available"):
        why = topo.get("reason") or "the probe reported no topology (an older probe?)"
        return Verdict("skip", node, reason=f"the GPUs' NVLink links could not be read: {why}")
    gpus = {g["uuid"]: g for g in topo.get("gpus") or []}
    if len(gpus) < 2:
        return Verdict("skip", node, reason=f"NVML in the pod lists {len(gpus)} GPU(s): a set needs 2")
    numbers = ",".join(str(_number(g)) for g in gpus.values())
    if not any((g.get("nvlink") or {}).get("active") for g in gpus.values()):
        why = next((g["nvlink_unavailable"] for g in gpus.values() if g.get("nvlink_unavailable")),
                   "no link is active")
        return Verdict("skip", node, reason=f"PCIe only: none of GPUs {numbers} has an active NVLink ({why}); a "
                                            "PCIe-only node cannot have a fragmented NVLink set")
    expected = (f"GPUs {numbers} share NVLink" if len(gpus) == 2 else
                f"an NVLink-connected set of {len(gpus)} GPUs ({numbers}: every pair linked, directly or "
                "through NVSwitch)")
    pairs = topo.get("pairs") or []
    unlinked = [p for p in pairs if not linked(p)]
    if not unlinked:
        counts = sorted({p["nvlink"] for p in pairs if p.get("nvlink")})
        via = " through NVSwitch" if all(p.get("through_nvswitch") for p in pairs) else ""
        nv = (f"NV{counts[0]}" + (f" to NV{counts[-1]}" if len(counts) > 1 else "")) if counts else \
            "P2P over NVLink OK"
        return Verdict("pass", node, expected, f"every pair of GPUs {numbers} linked ({nv}{via})")
    actual = "; ".join(_unlinked(p, gpus) for p in unlinked)
    if held_by_others:
        return Verdict("warn", node, expected, actual,
                       f"other pods hold {held_by_others} GPUs of the node: the free ones may include no linked set")
    return Verdict("fail", node, expected, actual)


def linked(pair: dict) -> bool:
    """One NVLink or more between the pair, directly or through NVSwitch, or P2P over NVLink OK."""
    return (pair.get("nvlink") or 0) > 0 or pair.get("p2p_nvlink") == "OK"


def _number(gpu: dict) -> int:
    minor = gpu.get("minor")
    return minor if isinstance(minor, int) else gpu["index"]


def _name(gpu: dict) -> str:
    here = f", index {gpu['index']} in the pod" if _number(gpu) != gpu["index"] else ""
    return f"GPU {_number(gpu)} ({gpu['uuid']}{here})"


def _unlinked(pair: dict, gpus: dict[str, dict]) -> str:
    a, b = gpus[pair["a"]], gpus[pair["b"]]
    text = (f"no NVLink between {_name(a)} and {_name(b)} (P2P over NVLink: {pair.get('p2p_nvlink')}, PCIe "
            f"path {pair.get('common_ancestor')})")
    ours = {g["pci_bus_id"] for g in gpus.values()}
    for g in (a, b):
        away = {bus: n for bus, n in ((g.get("nvlink") or {}).get("gpus") or {}).items() if bus not in ours}
        if away:
            text += (f"; GPU {_number(g)}'s NVLinks reach " + ", ".join(f"{bus} ({n})" for bus, n in away.items())
                     + ", outside this pod")
        elif not (g.get("nvlink") or {}).get("active"):
            text += f"; GPU {_number(g)} has no active NVLink ({g.get('nvlink_unavailable') or 'every link down'})"
    return text

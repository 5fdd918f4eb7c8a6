"""The driver a pod really gets against what its node advertises (AI Conformance ``driver_runtime_management``).

A pod granted a GPU reads, through NVML, the driver version (``nvmlSystemGetDriverVersion``: ``580.126.09``) and the
CUDA driver version (``nvmlSystemGetCudaDriverVersion``: ``13.0``); workloads/probe.py reports them as
``nvml.driver_version`` and ``nvml.cuda_driver_version``. The node advertises them two ways:

- GPU Feature Discovery's labels: ``nvidia.com/cuda.driver-version.full`` / ``.major`` / ``.minor`` / ``.revision``
  (older GFD: ``nvidia.com/cuda.driver.major`` / ``.minor`` / ``.rev``), and for the CUDA driver version
  ``nvidia.com/cuda.runtime-version.full`` / ``.major`` / ``.minor`` (older: ``nvidia.com/cuda.runtime.major`` /
  ``.minor``), GFD's name for what ``nvidia-smi`` heads "CUDA Version";
- NVIDIA's DRA driver's device attributes ``driverVersion`` and ``cudaDriverVersion`` (semver: ``580.126.9``,
  ``13.0.0``).

Each label and attribute present is compared on its own, at the precision both share: ``580.65.6`` equals
``580.65.06``, ``13.0.0`` equals ``13.0``, a ``.major`` label equals the first number. Pure: no cluster.
"""

from __future__ import annotations

import dataclasses
import re

# kind -> (label, which number of the version it holds: None = all of it); GFD's names, then older GFD's
LABELS: dict[str, tuple[tuple[str, int | None], ...]] = {
    "driver": (("nvidia.com/cuda.driver-version.full", None), ("nvidia.com/cuda.driver-version.major", 0),
               ("nvidia.com/cuda.driver-version.minor", 1), ("nvidia.com/cuda.driver-version.revision", 2),
               ("nvidia.com/cuda.driver.major", 0), ("nvidia.com/cuda.driver.minor", 1),
               ("nvidia.com/cuda.driver.rev", 2)),
    "cuda": (("nvidia.com/cuda.runtime-version.full", None), ("nvidia.com/cuda.runtime-version.major", 0),
             ("nvidia.com/cuda.runtime-version.minor", 1), ("nvidia.com/cuda.runtime.major", 0),
             ("nvidia.com/cuda.runtime.minor", 1)),
}
DRA_ATTRIBUTES = {"driver": "driverVersion", "cuda": "cudaDriverVersion"}
IN_POD = {"driver": "driver_version", "cuda": "cuda_driver_version"}     # keys of the probe's ``nvml``
WHAT = {"driver": "driver version", "cuda": "CUDA driver version"}


def numbers(text) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6); '' -> ()."""
    return tuple(int(p) for p in re.findall(r"\d+", str(text or "")))


def same_version(advertised, actual, part: int | None = None) -> bool:
    """Whether an advertised version (or one number of it, ``part``) is the one reported, at shared precision."""
    a, b = numbers(advertised), numbers(actual)
    if part is not None:
        return len(a) == 1 and len(b) > part and a[0] == b[part]
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


@dataclasses.dataclass(frozen=True)
class Advertised:
    source: str                # the label, or 'DRA <attribute> of <devices>'
    value: str
    part: int | None = None    # a label holding one number of the version


def advertised(node, kind: str) -> list[Advertised]:
    """What the node says the ``kind`` ('driver' or 'cuda') version is: each GFD label present, and each distinct
    value NVIDIA's DRA driver publishes for its devices."""
    out = [Advertised(key, node.labels[key], part) for key, part in LABELS[kind] if node.labels.get(key)]
    by_value: dict[str, list[str]] = {}
    for d in getattr(node, "dra_devices", None) or []:
        value = d.attributes.get(DRA_ATTRIBUTES[kind])
        if value not in (None, ""):
            by_value.setdefault(str(value), []).append(d.name)
    for value, names in sorted((v, sorted(n)) for v, n in by_value.items()):
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        out.append(Advertised(f"DRA {DRA_ATTRIBUTES[kind]} of {shown}", value))
    return out


@dataclasses.dataclass
class Comparison:
    kind: str
    in_pod: str                          # what NVML reported in the pod ('' when it could not say)
    compared: list[str]                  # the sources compared
    bad: list[str]                       # '<source>=<value> but NVML in the pod reports <in_pod>'
    skip: str = ""                       # why nothing was compared

    @property
    def ok(self) -> bool:
        return not self.skip and not self.bad


def compare(node, nvml: dict, kind: str) -> Comparison:
    """The ``kind`` version NVML reported in a pod on ``node`` (the probe's ``nvml``) against each source the node
    advertises. Nothing advertised: skipped, saying so; NVML unable to say: every source disagrees with that."""
    sources = advertised(node, kind)
    if not sources:
        labels = ", ".join(k for k, _ in LABELS[kind])
        return Comparison(kind, "", [], [], f"{node.name} advertises no {WHAT[kind]}: none of {labels}, and no DRA "
                                            f"{DRA_ATTRIBUTES[kind]} attribute")
    nvml = nvml or {}
    in_pod = str(nvml.get(IN_POD[kind]) or "")
    if not in_pod:
        why = nvml.get("reason") if nvml.get("available") is False else nvml.get("driver_error")
        in_pod_text = f"no {WHAT[kind]} ({why or 'NVML reported none'})"
    else:
        in_pod_text = in_pod
    bad = [f"{s.source}={s.value} but NVML in the pod reports {in_pod_text}" for s in sources
           if not (in_pod and same_version(s.value, in_pod, s.part))]
    return Comparison(kind, in_pod, [s.source for s in sources], bad)

"""Which GPUs a container reached, from the result of ``workloads/access.py`` in it, judged against its grant.

Kubernetes AI Conformance's ``secure_accelerator_access`` (upstream ``TestSecureAcceleratorAccess``): a container
granted one GPU (the device plugin's extended resource, or a DRA claim) reaches exactly that GPU, and a container
without a grant reaches none. What a container reaches:

- its GPU device files, ``/dev/nvidia[0-9]*`` (the upstream test's count; ``nvidiactl``, ``nvidia-uvm`` and
  ``nvidia-caps`` are the driver's control nodes, not GPUs): the NVIDIA driver serves a GPU to a process only
  through its ``/dev/nvidia<N>``;
- the GPUs NVML lists in it (count and UUIDs), when NVML initialises there.

One exception, NVIDIA's mock NVML (the embedded cluster's kubelet nodes; ``mock_nvml`` in the result): the mock
lists only the GPUs whose ``/dev/nvidia<N>`` the container has, but every GPU of its config when the container
has none, which it takes for the host (k8s-test-infra ``engine.go detectVisibleDevicesAt``). In a container without
a GPU device file its list is therefore the mock's host view, not the container's: it is shown, not counted. A real
NVML without ``/dev/nvidia<N>`` cannot open a GPU at all.

Pure: the suite (suites/test_access.py) and the unit tests call it.
"""

from __future__ import annotations

import dataclasses
import re

UUID = re.compile(r"^(GPU|MIG)-[0-9a-fA-F-]+$")


@dataclasses.dataclass
class Seen:
    files: list[str]                     # the container's /dev/nvidia<N>
    gpus: list[str]                      # the GPUs NVML lists there that count (UUIDs, or 'NVML GPU <i>: error')
    note: str = ""                       # NVML unavailable, or its list not counted (and why)
    env: dict = dataclasses.field(default_factory=dict)

    @property
    def count(self) -> int:
        """How many GPUs the container reaches: the more of its device files and NVML's count."""
        return max(len(self.files), len(self.gpus))

    def describe(self) -> str:
        if not self.files and not self.gpus:
            return "no GPU: no /dev/nvidia<N>" + (f"; {self.note}" if self.note else "; NVML lists none")
        files = ", ".join(self.files) or "no /dev/nvidia<N>"
        nvml = (f"NVML lists {len(self.gpus)}: {', '.join(self.gpus)}" if self.gpus else
                (self.note or "NVML lists none"))
        return f"{self.count} GPU{'s' if self.count != 1 else ''}: {files}; {nvml}"


def seen(result: dict) -> Seen:
    """What a container reached, from its ``access.py`` result."""
    files = [f["path"] for f in result.get("device_files") or []]
    nvml = result.get("nvml") or {}
    env = {k: v for k, v in (result.get("env") or {}).items() if v is not None}
    if not nvml.get("available"):
        return Seen(files, [], f"NVML unavailable ({nvml.get('reason') or 'no reason given'})", env)
    gpus = [g.get("uuid") or f"NVML GPU {g.get('index')}: {g.get('error') or 'no UUID'}"
            for g in nvml.get("gpus") or []]
    if result.get("mock_nvml") and not files and gpus:
        return Seen(files, [], f"NVIDIA's mock NVML lists its {len(gpus)} GPU(s) to a container without "
                               "/dev/nvidia<N> (its host view, not counted)", env)
    return Seen(files, gpus, "", env)


def allocated_by_plugin(result: dict) -> list[str] | None:
    """The GPUs NVIDIA's device plugin says it allocated to the container: the UUIDs of the NVIDIA_VISIBLE_DEVICES
    its Allocate answer sets (strategy envvar, device ids by UUID); None where it names them otherwise (indexes,
    CDI, volume mounts) or not at all."""
    value = ((result.get("env") or {}).get("NVIDIA_VISIBLE_DEVICES") or "").strip()
    # a time-sliced GPU's replica is named <uuid>::<n> by the plugin: the GPU is the UUID
    ids = list(dict.fromkeys(v.strip().split("::")[0] for v in value.split(",") if v.strip()))
    return ids if ids and all(UUID.match(i) for i in ids) else None


def granted_one(result: dict, allocated: list[str] | None) -> tuple[bool, str, str]:
    """A container granted one GPU: (ok, expected, actual). It reaches exactly one GPU: one ``/dev/nvidia<N>``,
    NVML's count 1, and that GPU's UUID is the one allocated (when the allocation names it)."""
    s = seen(result)
    want = f" ({allocated[0]})" if allocated and len(allocated) == 1 else ""
    expected = f"exactly 1 GPU, the one allocated{want}: 1 /dev/nvidia<N>, NVML lists 1 with that UUID"
    ok = len(s.files) == 1 and len(s.gpus) == 1 and (not allocated or s.gpus == list(allocated))
    actual = s.describe()
    if allocated is not None and len(s.gpus) == 1 and s.gpus != list(allocated):
        actual += f" (allocated: {', '.join(allocated)})"
    return ok, expected, actual


def sees_none(result: dict) -> tuple[bool, str, str]:
    """A container without a grant: (ok, expected, actual). It reaches no GPU."""
    s = seen(result)
    actual = s.describe()
    env = ", ".join(f"{k}={v}" for k, v in sorted(s.env.items()) if k.startswith("NVIDIA_"))
    if s.count and env:        # as the container saw it (NVIDIA's runtime sets void once it has injected the GPUs)
        actual += f" (env in the container: {env})"
    return s.count == 0, "no GPU: no /dev/nvidia<N>, none listed by NVML", actual

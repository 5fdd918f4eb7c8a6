"""The container images gpuproof's pods run, and what a node lends them: a base module (imports nothing of gpuproof).

The check pods' pause image, the workload image (a stock PyTorch image on a real cluster; on the embedded
cluster's kubelet nodes the image they lend, ``gpuproof.sim.kubelet.workload_image``) and the load generator's.
The simulator builds an :class:`Image`, the benchmarks and checks run pods with one.
"""

from __future__ import annotations

import dataclasses
import os

DEFAULT_IMAGE = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
DEFAULT_LOADGEN_IMAGE = "locustio/locust:2.31.8"  # python + locust; the load generator needs no torch


@dataclasses.dataclass(frozen=True)
class Image:
    """A container image and what each node lends the pods that run it: hostPath volumes (mounted read-only
    at the same path) and environment. A stock image needs neither (``Image("pytorch/pytorch:...")``); the
    embedded cluster's kubelet nodes lend the host's Python and virtualenv (``gpuproof.sim.kubelet``)."""

    name: str
    host_paths: tuple[tuple[str, str], ...] = ()   # (host path, container path): the host's files, read-only
    node_paths: tuple[tuple[str, str], ...] = ()   # (node folder, container path): the node's own files, read-only
    env: tuple[tuple[str, str], ...] = ()
    pull_policy: str = ""                   # "Never": the image is already on every node
    device: str = "cuda"                    # what the workloads compute on ("cpu": NVML answers, CUDA is absent)

    def __str__(self) -> str:
        return self.name

    def volumes(self) -> tuple[list[dict], list[dict]]:
        vols, mounts = [], []
        pairs = [(h, c, "") for h, c in self.host_paths] + [(n, c, "DirectoryOrCreate") for n, c in self.node_paths]
        for i, (host, path, kind) in enumerate(pairs):
            vols.append({"name": f"lent-{i}", "hostPath": {"path": host, "type": kind}})
            mounts.append({"name": f"lent-{i}", "mountPath": path, "readOnly": True})
        return vols, mounts

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "Image":
        return cls(name=data["name"], host_paths=tuple(tuple(p) for p in data.get("host_paths") or ()),
                   node_paths=tuple(tuple(p) for p in data.get("node_paths") or ()),
                   env=tuple(tuple(e) for e in data.get("env") or ()), pull_policy=data.get("pull_policy") or "",
                   device=data.get("device") or "cuda")


def as_image(image: "str | Image") -> Image:
    return image if isinstance(image, Image) else Image(str(image))


# the check pods' image (GPUPROOF_PAUSE_IMAGE: a mirror)
PAUSE_IMAGE = os.environ.get("GPUPROOF_PAUSE_IMAGE", "registry.k8s.io/pause:3.10")

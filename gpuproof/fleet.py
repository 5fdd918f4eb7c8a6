"""The fleet file: which simulated nodes the embedded cluster has, and what they advertise.

A fleet is a list of node pools. Each pool turns into ``count`` Node objects. The fleet names the
hardware (product, count, driver, CUDA) and the device plugin's settings (time-slicing, MPS, MIG);
what the nodes then carry, their GPU labels, capacity and allocatable, is what NVIDIA's GPU Feature
Discovery and device plugin write over NVIDIA's mock NVML (``gpuproof.sim.gpunodes``). Example::

    name: mixed
    defaults:
      gpu: {driverVersion: "550.54.15", cudaVersion: "12.4"}
      taints: ["nvidia.com/gpu=present:NoSchedule"]
    pools:
      - name: a100
        count: 2
        gpu: {product: NVIDIA-A100-SXM4-80GB, count: 8}
      - name: l4-shared
        count: 1
        gpu: {product: NVIDIA-L4, count: 1}
        timeSlicing: {replicas: 4}
      - name: cpu
        count: 1
        taints: []

Validation is strict: unknown keys, wrong types and impossible hardware (a MIG
profile the product does not have) are refused with the file and the field named.

``faults`` exist so gpuproof's own tests can build clusters that are broken in a
known way (capacity disagreeing with a label, a missing taint, ...) and show that
each acceptance check catches its fault. Users have no reason to set them.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import time
from pathlib import Path
from typing import Any

import yaml

from . import catalog
from . import vocab as d
from .vocab import KWOK_ANNOTATION
from .sim.nvidia import MOCK_MAX_GPUS
from .vocab import LABELS_BY, NFD_PCI_LABEL, RESOURCES_BY
from .errors import FleetError

POOL_LABEL = "node.kubernetes.io/instance-type"
FLEETS_DIR = Path(__file__).parent / "fleets"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_VERSION = re.compile(r"^\d+(\.\d+){1,2}$")
_QUANTITY = re.compile(r"^\d+(\.\d+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P)?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
MIG_STRATEGIES = ("none", "single", "mixed")
# failure modes NVIDIA's mock NVML injects into one GPU (engine/config_types.go)
NVML_FAILURES = ("lost", "fallen_off_bus", "ecc_uncorrectable")
# nvml-mock-ctl's commands that change what a node's NVML reports (cmd/nvml-mock-ctl in NVIDIA's k8s-test-infra)
NVML_CTL_COMMANDS = ("fail", "temp", "power", "fan", "util", "clocks", "throttle", "pstate", "nvlink-error",
                     "sram-ecc", "fabric-health", "set")
# the sections of NVIDIA's device-plugin config file (api/config/v1 Config) a node's own config may set
PLUGIN_CONFIG_SECTIONS = ("flags", "resources", "sharing", "imex")
# images every kubelet node imports, which a fault can leave out of one node's containerd (gpuproof.sim.kubelet_faults)
NODE_IMAGES = ("workloads",)
# how a pool's nodes are labelled: GPU Feature Discovery, or a managed offering's own scheme
LABEL_SCHEMES = ("gfd", "gke", "eks", "karpenter", "aks", "openshift")
# how a pool's GPUs reach pods: the device plugin (extended resources), DRA (ResourceSlices), or both
OFFERS = ("device-plugin", "dra", "both")
# what plays a pool's nodes: kwok (Node objects only), or real kubelets with containerd (gpuproof.sim.kubelet)
BACKENDS = ("kwok", "kubelet")
# GPU operator components (nvidia.com/gpu.deploy.<component>) on an operator-managed (OpenShift) node
OPERATOR_COMPONENTS = ("driver", "container-toolkit", "device-plugin", "gpu-feature-discovery",
                       "dcgm-exporter", "dcgm", "operator-validator", "node-status-exporter")
# a node label that keeps the embedded cluster's stand-in for a GPU operator component off the node
# (gpuproof's own tests use it to play a component whose pod is missing)
NO_OPERATOR_POD = "gpuproof.dev/sim-no-pod.{component}"


# --------------------------------------------------------------------------- model


@dataclasses.dataclass
class Taint:
    key: str
    value: str
    effect: str

    def as_dict(self) -> dict:
        d = {"key": self.key, "effect": self.effect}
        if self.value:
            d["value"] = self.value
        return d

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclasses.dataclass
class GpuSpec:
    product: str
    count: int
    memory_mib: int
    family: str
    compute: tuple[int, int]
    driver_version: str
    cuda_version: str


@dataclasses.dataclass
class TimeSlicing:
    """GPU sharing by the device plugin: time-slicing, or MPS (``strategy``)."""

    replicas: int
    rename_by_default: bool = False
    fail_requests_greater_than_one: bool = False
    strategy: str = "time-slicing"          # time-slicing | mps


@dataclasses.dataclass
class Mig:
    strategy: str                       # single | mixed
    profiles: dict[str, int]            # profile -> instances per GPU; empty: MIG mode off on every GPU

    @property
    def enabled(self) -> bool:
        return bool(self.profiles)


@dataclasses.dataclass
class Fault:
    """A deliberate misconfiguration applied to the generated Node objects."""

    node: int | None = None             # index within the pool; None = every node
    set_labels: dict[str, str] = dataclasses.field(default_factory=dict)
    drop_labels: list[str] = dataclasses.field(default_factory=list)
    set_capacity: dict[str, str] = dataclasses.field(default_factory=dict)
    drop_capacity: list[str] = dataclasses.field(default_factory=list)
    set_allocatable: dict[str, str] = dataclasses.field(default_factory=dict)
    drop_allocatable: list[str] = dataclasses.field(default_factory=list)
    # node state: a dead kubelet (ready: false), a cordon, conditions, extra taints
    ready: bool | None = None
    unschedulable: bool = False
    conditions: dict[str, str] = dataclasses.field(default_factory=dict)     # type -> "True"/"False"
    add_taints: list[Taint] = dataclasses.field(default_factory=list)
    # DRA: devices left out of the node's ResourceSlice, attributes overwritten on each of its devices,
    # and its first device published a second time (in a second slice of the same pool)
    dra_drop_devices: list[str] = dataclasses.field(default_factory=list)
    dra_set_attributes: dict[str, str] = dataclasses.field(default_factory=dict)
    dra_duplicate_device: bool = False
    # NVIDIA's mock NVML: GPU index -> failure mode (lost, fallen_off_bus, ecc_uncorrectable), injected
    # into the node's mock config before NVIDIA's GFD and device plugin run over it
    nvml_failures: dict[int, str] = dataclasses.field(default_factory=dict)
    # kubelet nodes: NVIDIA's own fault tool, ``nvml-mock-ctl <command>`` (e.g. ``fail --gpu 1 --mode
    # ecc_uncorrectable --xid 79``), run against the node's mock before it starts; every process on the node
    # that reads NVML (NVIDIA's daemons, gpuproof's pods) then sees the fault
    nvml_ctl: list[str] = dataclasses.field(default_factory=list)
    # kubelet nodes: the node's own device-plugin config (the one NVIDIA's chart picks per node by its
    # nvidia.com/device-plugin.config label), merged over the pool's; NVIDIA's GFD and device plugin read it
    device_plugin_config: dict = dataclasses.field(default_factory=dict)
    # kubelet nodes: images the node's containerd lacks (NODE_IMAGES): pods of them never start there
    missing_images: list[str] = dataclasses.field(default_factory=list)

    @property
    def unmanaged(self) -> bool:
        """kwok would rewrite the node's conditions: such a node is left to nobody, like a dead kubelet."""
        return self.ready is False or bool(self.conditions)


@dataclasses.dataclass
class Pool:
    name: str
    count: int
    cpu: str = "32"
    memory: str = "256Gi"
    pods: int = 110
    instance_type: str = ""
    gpu: GpuSpec | None = None
    taints: list[Taint] = dataclasses.field(default_factory=list)
    labels: dict[str, str] = dataclasses.field(default_factory=dict)
    time_slicing: TimeSlicing | None = None
    mig: Mig | None = None
    faults: list[Fault] = dataclasses.field(default_factory=list)
    label_scheme: str = "gfd"
    offer: str = "device-plugin"
    backend: str = "kwok"

    @property
    def device_plugin(self) -> bool:
        return self.gpu is not None and self.offer in ("device-plugin", "both")

    @property
    def dra(self) -> bool:
        return self.gpu is not None and self.offer in ("dra", "both")

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.count)]

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None and self.mig.enabled

    def faults_for(self, index: int) -> list[Fault]:
        """The faults that apply to the pool's node ``index`` (those naming it, and those for every node)."""
        return [f for f in self.faults if f.node is None or f.node == index]

    def nvml_failures(self, index: int) -> dict[int, str]:
        """Failures injected into this node's mock NVML (by its faults)."""
        out: dict[int, str] = {}
        for fault in self.faults_for(index):
            out.update(fault.nvml_failures)
        return out

    def nvml_ctl(self, index: int) -> list[str]:
        """nvml-mock-ctl commands for this node's mock NVML (kubelet nodes)."""
        return [cmd for fault in self.faults_for(index) for cmd in fault.nvml_ctl]

    def node_plugin_config(self, index: int, config: dict) -> dict:
        """The pool's device-plugin ``config`` as node ``index`` reads it: its faults' own settings merged over it."""
        for fault in self.faults_for(index):
            config = _merge(config, fault.device_plugin_config)
        return config

    def missing_images(self, index: int) -> set[str]:
        """Images node ``index``'s containerd lacks (kubelet nodes)."""
        return {image for fault in self.faults_for(index) for image in fault.missing_images}

    def needs_nvidia(self) -> bool:
        """Whether NVIDIA's GFD or device plugin produce part of this pool's nodes."""
        return self.gpu is not None and (self.device_plugin or self.label_scheme in ("gfd", "openshift"))

    # ---- labels no NVIDIA software writes: managed offerings' own, the GPU operator's, NFD's PCI label

    def provider_labels(self) -> dict[str, str]:
        """The GPU labels a managed offering puts on a node of this pool (none for gfd and openshift)."""
        if self.gpu is None or self.label_scheme in ("gfd", "openshift"):
            return {}
        scheme = self.label_scheme
        known = catalog.lookup(self.gpu.product)
        aliases = dict(reversed(known.aliases)) if known else {}
        if scheme == "gke":
            labels = {d.GKE_ACCELERATOR: aliases["gke"], "cloud.google.com/gke-nodepool": self.name,
                      "cloud.google.com/gke-gpu-driver-version": "default"}
            if self.time_slicing:
                labels[d.GKE_MAX_CLIENTS] = str(self.time_slicing.replicas)
                labels[d.GKE_SHARING] = "time-sharing"
            if self.mig_enabled:
                labels[d.GKE_PARTITION] = next(iter(self.mig.profiles))
            return labels
        if scheme == "karpenter":
            return {"karpenter.sh/nodepool": self.name, "karpenter.sh/capacity-type": "on-demand",
                    d.KARPENTER_GPU_NAME: aliases["karpenter"], d.KARPENTER_GPU_MAKER: "nvidia",
                    d.KARPENTER_GPU_COUNT: str(self.gpu.count), d.KARPENTER_GPU_MEMORY: str(self.gpu.memory_mib)}
        if scheme == "aks":
            return {"kubernetes.azure.com/agentpool": self.name, "agentpool": self.name,
                    d.AKS_ACCELERATOR: "nvidia", "kubernetes.azure.com/mode": "user"}
        return {"eks.amazonaws.com/nodegroup": self.name, "eks.amazonaws.com/capacityType": "ON_DEMAND"}

    def operator_labels(self) -> dict[str, str]:
        """What the GPU operator's controllers put on a node it manages (all healthy)."""
        labels = {f"nvidia.com/gpu.deploy.{c}": "true" for c in OPERATOR_COMPONENTS}
        labels["nvidia.com/gpu.present"] = "true"
        labels.update({"nvidia.com/gpu-driver-upgrade-state": "upgrade-done",
                       "node-role.kubernetes.io/worker": "", "node.openshift.io/os_id": "rhcos"})
        if self.mig_enabled:
            labels["nvidia.com/gpu.deploy.mig-manager"] = "true"
            profiles = self.mig.profiles
            (only, per_gpu), = list(profiles.items())[:1]
            known = catalog.lookup(self.gpu.product)
            prof = known.mig_profile(only) if known else None
            uniform = len(profiles) == 1 and prof is not None and per_gpu == prof.max_per_gpu
            labels["nvidia.com/mig.config"] = f"all-{only}" if uniform else f"custom-{self.name}"
            labels["nvidia.com/mig.config.state"] = "success"
        return labels

    def node_objects(self, views: dict | None = None) -> list[dict]:
        """The Node objects (with status) a kwok-managed cluster gets for this pool.

        ``views`` (node index -> :class:`gpuproof.sim.gpunodes.NodeView`) hold what NVIDIA's GFD and
        device plugin said about the pool's nodes; a GPU pool cannot be rendered without them.
        """
        if self.needs_nvidia() and (views is None or any(i not in views for i in range(self.count))):
            raise ValueError(f"pool {self.name}: NVIDIA's GFD and device plugin have not run for it "
                             "(use Fleet.node_objects(), which runs them)")
        nodes = []
        for i, name in enumerate(self.node_names()):
            view = views[i] if self.needs_nvidia() else None
            resources = {
                "cpu": self.cpu,
                "memory": self.memory,
                "pods": str(self.pods),
                "ephemeral-storage": "500Gi",
            }
            capacity = {**resources, **(view.resources if view else {})}
            allocatable = {**resources, **(view.allocatable if view else {})}
            gpu_labels = dict(self.provider_labels())
            if self.gpu is not None and self.label_scheme in ("gfd", "openshift"):
                # NFD's PCI label (the device plugin chart deploys NFD with GFD), then what GFD wrote
                gpu_labels[NFD_PCI_LABEL] = "true"
                gpu_labels.update(view.labels)
                if self.label_scheme == "openshift":
                    gpu_labels.update(self.operator_labels())
            labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "beta.kubernetes.io/arch": "amd64",
                "type": "kwok",
                POOL_LABEL: self.instance_type or self.name,
                **gpu_labels,
                **self.labels,
            }
            annotations = {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"}
            if view:
                annotations.update(view.annotations())
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": {"taints": [t.as_dict() for t in self.taints]},
                "status": {
                    "capacity": capacity,
                    "allocatable": allocatable,
                    "nodeInfo": {
                        "architecture": "amd64",
                        "operatingSystem": "linux",
                        "osImage": "kwok simulated node",
                        "kernelVersion": "",
                        "kubeletVersion": "fake",
                        "kubeProxyVersion": "fake",
                        "containerRuntimeVersion": "",
                        "machineID": "",
                        "systemUUID": "",
                        "bootID": "",
                    },
                },
            }
            if self.label_scheme == "openshift":
                node["status"]["nodeInfo"].update({"osImage": "Red Hat Enterprise Linux CoreOS (simulated)",
                                                   "containerRuntimeVersion": "cri-o://1.32.0"})
            for fault in self.faults_for(i):
                _apply_fault(node, fault)
            nodes.append(node)
        return nodes


    def resource_slices(self, node_uids: dict[str, str]) -> list[dict]:
        """The ResourceSlices NVIDIA's DRA driver would publish for this pool's nodes (faults applied)."""
        from . import dra

        if not self.dra:
            return []
        out = []
        for i, name in enumerate(self.node_names()):
            devices = dra.gpu_devices(name, self.gpu, self.mig if self.mig_enabled else None)
            devices, duplicate = dra_faults_applied(devices, self.faults_for(i))
            uid = node_uids.get(name, "")
            if duplicate is None:
                out.append(dra.resource_slice(name, uid, devices))
            else:
                out += [dra.resource_slice(name, uid, devices, index=0, count=2),
                        dra.resource_slice(name, uid, [duplicate], index=1, count=2)]
        return out


def dra_faults_applied(devices: list[dict], faults: list[Fault]) -> tuple[list[dict], dict | None]:
    """A slice's devices with the faults' DRA changes, and the device to publish a second time (or None)."""
    duplicate = None
    for fault in faults:
        devices = [dev for dev in devices if dev["name"] not in fault.dra_drop_devices]
        for dev in devices:
            for key, value in fault.dra_set_attributes.items():
                kind = next(iter(dev["attributes"].get(key) or {"string": None}))
                dev["attributes"][key] = {kind: value}
        if fault.dra_duplicate_device and devices:
            duplicate = copy.deepcopy(devices[0])
    return devices, duplicate


def kwok_managed(node: dict) -> bool:
    """Whether kwok keeps this Node object Ready (the others play dead or sick kubelets)."""
    return node["metadata"]["annotations"][KWOK_ANNOTATION] == "fake"


def _apply_fault(node: dict, fault: Fault) -> None:
    labels = node["metadata"]["labels"]
    status = node["status"]
    annotations = node["metadata"]["annotations"]
    touched = {LABELS_BY: [k for k in [*fault.set_labels, *fault.drop_labels] if k.startswith("nvidia.com/")],
               RESOURCES_BY: [k for k in [*fault.set_capacity, *fault.drop_capacity, *fault.set_allocatable,
                                          *fault.drop_allocatable] if k.startswith("nvidia.com/")]}
    for key, names in touched.items():
        if names:
            before = annotations.get(key, "")
            annotations[key] = (before + " + " if before else "") + f"gpuproof model (fleet fault: {', '.join(names)})"
    labels.update(fault.set_labels)
    for key in fault.drop_labels:
        labels.pop(key, None)
    status["capacity"].update(fault.set_capacity)
    for key in fault.drop_capacity:
        status["capacity"].pop(key, None)
    status["allocatable"].update(fault.set_allocatable)
    for key in fault.drop_allocatable:
        status["allocatable"].pop(key, None)
    if fault.unschedulable:
        node["spec"]["unschedulable"] = True
    node["spec"]["taints"] += [t.as_dict() for t in fault.add_taints]
    if fault.unmanaged:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        wanted = {"Ready": "False" if fault.ready is False else "True", "MemoryPressure": "False",
                  "DiskPressure": "False", "PIDPressure": "False", **fault.conditions}
        reasons = {"Ready": "KubeletNotReady" if wanted["Ready"] == "False" else "KubeletReady"}
        status["conditions"] = [{"type": k, "status": v, "reason": reasons.get(k, f"Kubelet{k}" if v == "True"
                                                                               else f"KubeletHasNo{k}"),
                                 "message": f"simulated by gpuproof's fleet fault ({k}={v})",
                                 "lastHeartbeatTime": now, "lastTransitionTime": now} for k, v in wanted.items()]
        node["metadata"]["annotations"][KWOK_ANNOTATION] = "unmanaged"


@dataclasses.dataclass
class ControlPlane:
    """Deliberately broken control-plane settings (gpuproof's own tests use them to show that
    the quota, preemption, taint and affinity checks fail on a cluster where those features are off)."""

    disable_admission_plugins: list[str] = dataclasses.field(default_factory=list)
    disable_scheduler_plugins: list[str] = dataclasses.field(default_factory=list)

    def key(self) -> str:
        return ",".join(sorted(self.disable_admission_plugins)) + "|" + ",".join(sorted(self.disable_scheduler_plugins))


@dataclasses.dataclass
class Fleet:
    name: str
    pools: list[Pool]
    source: str = ""
    control_plane: ControlPlane = dataclasses.field(default_factory=ControlPlane)
    # DeviceClasses NVIDIA's chart installs, published when any pool offers DRA (None: both of them)
    device_classes: list[str] | None = None
    # what NVIDIA's GFD and device plugin said, per (pool, node index), once node_objects() ran them
    views: dict | None = None

    def dra_objects(self, node_uids: dict[str, str]) -> list[dict]:
        """DeviceClasses and ResourceSlices of the fleet's DRA pools (nothing if none offers DRA)."""
        from . import dra

        if not any(p.dra for p in self.pools):
            return []
        classes = list(dra.CLASS_TYPES) if self.device_classes is None else self.device_classes
        return [dra.device_class(c) for c in classes] + \
            [s for p in self.pools for s in p.resource_slices(node_uids)]

    def node_objects(self, views: dict | None = None, progress=lambda m: None) -> list[dict]:
        """Every pool's Node objects. ``views`` ((pool, index) -> NodeView) default to running NVIDIA's
        GFD and device plugin now (built on first use; their device-plugin answers are cached)."""
        if views is None:
            views = {}
            if any(p.needs_nvidia() for p in self.pools):
                from .sim import gpunodes, nvidia

                views = gpunodes.observe(nvidia.locate(progress=progress), self, progress=progress)
        self.views = views
        return [n for p in self.pools if p.backend == "kwok"       # kubelet nodes register themselves
                for n in p.node_objects({i: views[(p.name, i)] for i in range(p.count) if (p.name, i) in views})]


    @property
    def node_count(self) -> int:
        return sum(p.count for p in self.pools)

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)


# --------------------------------------------------------------------------- parsing


class _Fields:
    """Reads one mapping of the fleet file, tracking the field path for error messages."""

    def __init__(self, data: Any, path: str, source: str):
        self.path, self.source = path, source
        if not isinstance(data, dict):
            self.fail("", f"must be a mapping, got {_kind(data)}")
        self.data = data
        self.used: set[str] = set()

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str):
        raise FleetError(self.source, self.field(key) if key else (self.path or "(top level)"), problem)

    def get(self, key: str, default: Any = None, required: bool = False) -> Any:
        self.used.add(key)
        if key not in self.data or self.data[key] is None:
            if required:
                self.fail(key, "is required")
            return default
        return self.data[key]

    def str(self, key: str, default: str | None = None, required: bool = False, pattern: re.Pattern | None = None,
            hint: str = "") -> str | None:
        value = self.get(key, default, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            self.fail(key, f"must be a string, got {_kind(value)}")
        value = str(value)
        if pattern and not pattern.match(value):
            self.fail(key, f"{value!r} is not valid" + (f": {hint}" if hint else ""))
        return value

    def int(self, key: str, default: int | None = None, required: bool = False, minimum: int = 0,
            maximum: int = 10**6) -> int | None:
        value = self.get(key, default, required)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(key, f"must be a whole number, got {_kind(value)} {value!r}")
        if not minimum <= value <= maximum:
            self.fail(key, f"must be between {minimum} and {maximum}, got {value}")
        return value

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_kind(value)} {value!r}")
        return value

    def mapping(self, key: str) -> "_Fields | None":
        value = self.get(key)
        return None if value is None else _Fields(value, self.field(key), self.source)

    def str_map(self, key: str) -> dict[str, str]:
        value = self.get(key, {})
        if not isinstance(value, dict):
            self.fail(key, f"must be a mapping of strings, got {_kind(value)}")
        out = {}
        for k, v in value.items():
            if isinstance(v, bool):
                v = "true" if v else "false"
            if not isinstance(k, str) or not isinstance(v, (str, int, float)):
                self.fail(f"{key}.{k}", f"must be a string, got {_kind(v)}")
            out[k] = str(v)
        return out

    def str_list(self, key: str) -> list[str]:
        value = self.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.fail(key, f"must be a list of strings, got {_kind(value)}")
        return list(value)

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used, key=str)
        if unknown:
            self.fail(str(unknown[0]), f"unknown field; expected one of: {', '.join(sorted(self.used))}")


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__)


def _parse_taint(text: str, fields: _Fields, key: str) -> Taint:
    m = re.match(r"^([^=:\s]+)(?:=([^:\s]*))?:(\S+)$", text)
    if not m or m.group(3) not in _EFFECTS:
        fields.fail(key, f"{text!r} is not a taint; write key=value:Effect with Effect one of {', '.join(_EFFECTS)}")
    return Taint(m.group(1), m.group(2) or "", m.group(3))


def _merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _parse_gpu(f: _Fields) -> GpuSpec:
    product = f.str("product", required=True)
    known = catalog.lookup(product)
    count = f.int("count", required=True, minimum=1, maximum=64)
    if count > MOCK_MAX_GPUS:
        f.fail("count", f"the embedded cluster's GPUs are NVIDIA's mock NVML, which shows at most {MOCK_MAX_GPUS} "
                        f"GPUs per node, got {count}")
    memory = f.int("memoryMiB", known.memory_mib if known else None, minimum=1, maximum=10**7)
    family = f.str("family", known.family if known else None)
    compute = f.str("computeCapability", f"{known.compute[0]}.{known.compute[1]}" if known else None,
                    pattern=re.compile(r"^\d+\.\d+$"), hint="write major.minor, e.g. 9.0")
    missing = [k for k, v in (("memoryMiB", memory), ("family", family), ("computeCapability", compute)) if v is None]
    if missing:
        f.fail(missing[0], f"is required for product {product!r}, which gpuproof does not know "
                           f"(known: {', '.join(sorted(catalog.PRODUCTS))})")
    driver = f.str("driverVersion", "550.54.15", pattern=_VERSION, hint="write e.g. 550.54.15")
    cuda = f.str("cudaVersion", "12.4", pattern=_VERSION, hint="write e.g. 12.4")
    f.done()
    major, minor = compute.split(".")
    return GpuSpec(product, count, memory, family, (int(major), int(minor)), driver, cuda)


def _parse_mig(f: _Fields, gpu: GpuSpec | None) -> Mig:
    strategy = f.str("strategy", "mixed")
    if strategy not in MIG_STRATEGIES:
        f.fail("strategy", f"{strategy!r} is not one of {', '.join(MIG_STRATEGIES)}")
    raw = f.get("profiles")
    f.done()
    if strategy == "none":
        return None  # type: ignore[return-value]
    if gpu is None:
        f.fail("", "MIG needs a gpu section in the pool")
    if raw is None:          # the device plugin's strategy is set, and MIG mode is off on every GPU
        return Mig(strategy, {})
    if not isinstance(raw, dict) or not raw:
        f.fail("profiles", "must map MIG profile names to instances per GPU, e.g. {1g.10gb: 7}")
    known = catalog.lookup(gpu.product)
    if known is not None and not known.mig:
        f.fail("", f"{gpu.product} does not support MIG")
    profiles: dict[str, int] = {}
    slices = 0
    for name, per_gpu in raw.items():
        key = f"profiles.{name}"
        if not isinstance(name, str) or not catalog.MIG_NAME.match(name):
            f.fail(key, "is not a MIG profile name; write <g>g.<mem>gb, e.g. 1g.10gb")
        if isinstance(per_gpu, bool) or not isinstance(per_gpu, int) or per_gpu < 1:
            f.fail(key, f"instances per GPU must be a whole number >= 1, got {per_gpu!r}")
        prof = known.mig_profile(name) if known else None
        if known is not None and prof is None:
            f.fail(key, f"{gpu.product} has no MIG profile {name}; it has {', '.join(p.name for p in known.mig)}")
        if prof is not None and per_gpu > prof.max_per_gpu:
            f.fail(key, f"at most {prof.max_per_gpu} instances of {name} fit on one {gpu.product}, got {per_gpu}")
        slices += int(name[0]) * per_gpu
        profiles[name] = per_gpu
    if slices > 7:
        f.fail("profiles", f"the profiles need {slices} compute slices per GPU; a GPU has 7")
    if strategy == "single" and len(profiles) != 1:
        f.fail("profiles", f"single strategy uses one profile on every GPU, got {len(profiles)}")
    return Mig(strategy, profiles)


def _parse_fault(f: _Fields) -> Fault:
    fault = Fault(
        node=f.int("node", minimum=0),
        set_labels=f.str_map("setLabels"),
        drop_labels=f.str_list("dropLabels"),
        set_capacity=f.str_map("setCapacity"),
        drop_capacity=f.str_list("dropCapacity"),
        set_allocatable=f.str_map("setAllocatable"),
        drop_allocatable=f.str_list("dropAllocatable"),
        unschedulable=f.bool("unschedulable"),
        conditions=f.str_map("conditions"),
        add_taints=[_parse_taint(t, f, f"addTaints[{i}]") for i, t in enumerate(f.str_list("addTaints"))],
        dra_drop_devices=f.str_list("draDropDevices"),
        dra_set_attributes=f.str_map("draSetAttributes"),
        dra_duplicate_device=f.bool("draDuplicateDevice"),
    )
    for gpu, mode in f.str_map("nvmlFailures").items():
        if not gpu.isdigit():
            f.fail(f"nvmlFailures.{gpu}", "keys are GPU indexes (0, 1, ...)")
        if mode not in NVML_FAILURES:
            f.fail(f"nvmlFailures.{gpu}", f"{mode!r} is not one of the mock's failure modes: {', '.join(NVML_FAILURES)}")
        fault.nvml_failures[int(gpu)] = mode
    for i, cmd in enumerate(f.str_list("nvmlCtl")):
        word = cmd.split()[0] if cmd.split() else ""
        if word not in NVML_CTL_COMMANDS:
            f.fail(f"nvmlCtl[{i}]", f"{word or cmd!r} is not an nvml-mock-ctl fault command: "
                                    f"{', '.join(NVML_CTL_COMMANDS)}")
        if "--gpu" not in cmd.split():
            f.fail(f"nvmlCtl[{i}]", "name the GPU: --gpu <index|all|uuid>")
        fault.nvml_ctl.append(cmd)
    fault.device_plugin_config = f.get("devicePluginConfig", {})
    if not isinstance(fault.device_plugin_config, dict):
        f.fail("devicePluginConfig", f"must be a mapping of device-plugin config sections, got "
                                     f"{_kind(fault.device_plugin_config)}")
    for section, value in fault.device_plugin_config.items():
        if section not in PLUGIN_CONFIG_SECTIONS or not isinstance(value, dict):
            f.fail(f"devicePluginConfig.{section}", "NVIDIA's device-plugin config has the mapping sections "
                                                    f"{', '.join(PLUGIN_CONFIG_SECTIONS)}")
    for i, image in enumerate(f.str_list("missingImages")):
        if image not in NODE_IMAGES:
            f.fail(f"missingImages[{i}]", f"{image!r} is not an image a kubelet node can lack: "
                                          f"{', '.join(NODE_IMAGES)}")
        fault.missing_images.append(image)
    ready = f.get("ready")
    if ready is not None and not isinstance(ready, bool):
        f.fail("ready", f"must be true or false, got {_kind(ready)} {ready!r}")
    fault.ready = ready
    for kind, value in fault.conditions.items():
        if value not in ("True", "False", "Unknown"):
            f.fail(f"conditions.{kind}", f"must be True, False or Unknown, got {value!r}")
    f.done()
    return fault


def _parse_pool(f: _Fields) -> Pool:
    name = f.str("name", required=True, pattern=_DNS_LABEL, hint="use lowercase letters, digits and '-'")
    count = f.int("count", 1, minimum=0, maximum=5000)
    pool = Pool(name=name, count=count)
    pool.cpu = f.str("cpu", "32", pattern=_QUANTITY, hint="a Kubernetes quantity such as 32 or 3500m")
    pool.memory = f.str("memory", "256Gi", pattern=_QUANTITY, hint="a Kubernetes quantity such as 256Gi")
    pool.pods = f.int("pods", 110, minimum=1, maximum=10000)
    pool.instance_type = f.str("instanceType", "")
    gpu_f = f.mapping("gpu")
    pool.gpu = _parse_gpu(gpu_f) if gpu_f else None
    pool.taints = [_parse_taint(t, f, f"taints[{i}]") for i, t in enumerate(f.str_list("taints"))]
    pool.labels = f.str_map("labels")
    for key, strategy in (("timeSlicing", "time-slicing"), ("mps", "mps")):
        ts_f = f.mapping(key)
        if not ts_f:
            continue
        if pool.time_slicing:
            f.fail(key, "a pool shares its GPUs one way: timeSlicing or mps, not both")
        pool.time_slicing = TimeSlicing(
            replicas=ts_f.int("replicas", required=True, minimum=1, maximum=256),
            rename_by_default=ts_f.bool("renameByDefault"),
            fail_requests_greater_than_one=ts_f.bool("failRequestsGreaterThanOne") if key == "timeSlicing" else True,
            strategy=strategy,
        )
        ts_f.done()
        if pool.gpu is None:
            f.fail(key, f"{strategy} needs a gpu section in the pool")
    mig_f = f.mapping("mig")
    if mig_f:
        pool.mig = _parse_mig(mig_f, pool.gpu)
        if pool.mig_enabled and pool.time_slicing:
            f.fail("mig", "sharing of MIG devices is not modelled; use one or the other in a pool")
    pool.label_scheme = f.str("labelScheme", "gfd")
    if pool.label_scheme not in LABEL_SCHEMES:
        f.fail("labelScheme", f"{pool.label_scheme!r} is not one of {', '.join(LABEL_SCHEMES)}")
    _check_scheme(pool, f)
    pool.offer = f.str("offer", "device-plugin")
    if pool.offer not in OFFERS:
        f.fail("offer", f"{pool.offer!r} is not one of {', '.join(OFFERS)}")
    if pool.offer != "device-plugin":
        if pool.gpu is None:
            f.fail("offer", "a pool without GPUs offers nothing through DRA")
        if pool.time_slicing:
            f.fail("offer", "time-slicing through DRA (claim sharing configs) is not modelled; "
                            "use offer: device-plugin for time-sliced pools")
        if pool.mig_enabled:
            from .dra import placements

            try:
                placements(pool.mig.profiles, pool.gpu.product)
            except ValueError as exc:
                f.fail("mig.profiles", str(exc))
    pool.backend = f.str("backend", "kwok")
    if pool.backend not in BACKENDS:
        f.fail("backend", f"{pool.backend!r} is not one of {', '.join(BACKENDS)}")
    faults = f.get("faults", [])
    if not isinstance(faults, list):
        f.fail("faults", f"must be a list, got {_kind(faults)}")
    pool.faults = [_parse_fault(_Fields(x, f.field(f"faults[{i}]"), f.source)) for i, x in enumerate(faults)]
    for i, fault in enumerate(pool.faults):
        if fault.node is not None and fault.node >= count:
            f.fail(f"faults[{i}].node", f"pool has {count} nodes, so the index must be below {count}")
        for key, (attr, why) in KUBELET_NODE_FAULTS.items():
            if getattr(fault, attr) and pool.backend != "kubelet":
                f.fail(f"faults[{i}].{key}", why)
    if pool.backend == "kubelet":
        _check_kubelet_pool(pool, f)
    f.done()
    return pool


# fault fields only kubelet nodes take (Fault attribute, why a kwok node cannot)
KUBELET_NODE_FAULTS = {
    "nvmlCtl": ("nvml_ctl", "is for kubelet nodes, where pods read NVML; on kwok nodes only NVIDIA's GFD and device "
                            "plugin read it once: use nvmlFailures"),
    "devicePluginConfig": ("device_plugin_config", "is for kubelet nodes, where NVIDIA's device plugin runs as the "
                                                   "node's pod; on kwok nodes it runs once, with the pool's config"),
    "missingImages": ("missing_images", "is for kubelet nodes, whose containerd holds images; kwok nodes run no "
                                        "container"),
}


def _check_kubelet_pool(pool: Pool, f: _Fields) -> None:
    """What kubelet nodes cannot be yet: each refusal says why."""
    if pool.mig_enabled:
        f.fail("backend", "MIG pools stay on kwok: NVIDIA's mock NVML enumerates no MIG devices")
    if pool.offer == "both":
        f.fail("backend", "a kubelet pool offers its GPUs one way, device-plugin or dra: `both` is the "
                          "misconfiguration dra-not-offered-twice fails, and stays a kwok pool's")
    if pool.label_scheme != "gfd" or (pool.time_slicing and pool.time_slicing.strategy == "mps"):
        f.fail("backend", "kubelet nodes run NVIDIA's own software only: labelScheme gfd, no MPS")
    for i, fault in enumerate(pool.faults):      # NVIDIA's software writes the node: only its NVML can be broken
        if fault != Fault(node=fault.node, nvml_failures=fault.nvml_failures,
                          **{attr: getattr(fault, attr) for attr, _ in KUBELET_NODE_FAULTS.values()}):
            f.fail(f"faults[{i}]", "kubelet nodes take NVML faults only (nvmlFailures, nvmlCtl), a node's own "
                                   "devicePluginConfig and missingImages: their labels, resources and state are what "
                                   "NVIDIA's software and the kubelet make of them")


def _check_scheme(pool: Pool, f: _Fields) -> None:
    """A managed offering's scheme must be able to say what the pool has, as that offering would."""
    scheme = pool.label_scheme
    if scheme in ("gfd", "openshift") or pool.gpu is None:
        return
    known = catalog.lookup(pool.gpu.product)
    it = catalog.instance_type(pool.instance_type)
    if scheme in ("gke", "eks", "aks"):
        if it is None:
            f.fail("instanceType", f"labelScheme {scheme} reads the GPUs from the instance type, and "
                                   f"{pool.instance_type or '(none)'!r} is not in gpuproof's catalog")
        if (it.product, it.count) != (pool.gpu.product, pool.gpu.count):
            f.fail("gpu", f"instance type {it.name} has {it.count}x {it.product}, not "
                          f"{pool.gpu.count}x {pool.gpu.product}")
    if scheme in ("gke", "karpenter") and (known is None or not dict(known.aliases).get(scheme)):
        f.fail("gpu.product", f"labelScheme {scheme} has no name for {pool.gpu.product}")
    if scheme == "gke":
        if pool.time_slicing:
            if pool.time_slicing.rename_by_default:
                f.fail("timeSlicing.renameByDefault", "GKE's device plugin does not rename shared GPUs")
            pool.time_slicing.fail_requests_greater_than_one = True   # GKE refuses more than 1 shared GPU
        if pool.mig_enabled:
            (profile, per_gpu), = list(pool.mig.profiles.items())[:1]
            prof = known.mig_profile(profile)
            if pool.mig.strategy != "single" or per_gpu != prof.max_per_gpu:
                f.fail("mig", f"GKE partitions every GPU of a pool into one size, as many as fit "
                              f"(strategy single, {prof.max_per_gpu} of {profile})")
    elif pool.mig or pool.time_slicing:
        f.fail("labelScheme", f"sharing and MIG are modelled for gfd, openshift and gke pools, not {scheme}")


def parse_fleet(data: Any, source: str = "") -> Fleet:
    top = _Fields(data, "", source)
    name = top.str("name", Path(source).stem if source else "fleet", pattern=_DNS_LABEL,
                   hint="use lowercase letters, digits and '-'")
    defaults = top.get("defaults", {})
    if not isinstance(defaults, dict):
        top.fail("defaults", f"must be a mapping, got {_kind(defaults)}")
    pools_raw = top.get("pools", required=True)
    cp = ControlPlane()
    device_classes = None
    dra_f = top.mapping("dra")
    if dra_f:
        from .dra import CLASS_TYPES

        device_classes = dra_f.str_list("deviceClasses")
        for i, c in enumerate(device_classes):
            if c not in CLASS_TYPES:
                dra_f.fail(f"deviceClasses[{i}]", f"{c!r} is not one of NVIDIA's DeviceClasses "
                                                  f"({', '.join(CLASS_TYPES)})")
        dra_f.done()
    cp_f = top.mapping("controlPlane")
    if cp_f:
        cp.disable_admission_plugins = cp_f.str_list("disableAdmissionPlugins")
        cp.disable_scheduler_plugins = cp_f.str_list("disableSchedulerPlugins")
        cp_f.done()
        for i, name in enumerate(cp.disable_admission_plugins + cp.disable_scheduler_plugins):
            if not re.match(r"^[A-Za-z][A-Za-z0-9]*$", name):
                cp_f.fail("disableAdmissionPlugins" if i < len(cp.disable_admission_plugins)
                          else "disableSchedulerPlugins", f"{name!r} is not a plugin name")
    top.done()
    if not isinstance(pools_raw, list) or not pools_raw:
        top.fail("pools", "must be a non-empty list of node pools")
    pools: list[Pool] = []
    seen: set[str] = set()
    for i, raw in enumerate(pools_raw):
        if not isinstance(raw, dict):
            top.fail(f"pools[{i}]", f"must be a mapping, got {_kind(raw)}")
        merged = _merge(defaults, raw)
        if "gpu" not in raw:          # defaults.gpu only refines pools that have GPUs
            merged.pop("gpu", None)
        pool = _parse_pool(_Fields(merged, f"pools[{i}]", source))
        if pool.name in seen:
            top.fail(f"pools[{i}].name", f"{pool.name!r} is used by an earlier pool")
        seen.add(pool.name)
        pools.append(pool)
    if sum(p.count for p in pools) == 0:
        top.fail("pools", "the fleet has no nodes (every count is 0)")
    return Fleet(name=name, pools=pools, source=source, control_plane=cp, device_classes=device_classes)


def load_fleet(path: str | os.PathLike) -> Fleet:
    """Read and validate a fleet file. A bare name like ``mixed`` means a shipped fleet."""
    p = resolve_fleet_path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise FleetError(str(p), "", f"cannot read the fleet file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise FleetError(str(p), "", f"not valid YAML: {where}{getattr(exc, 'problem', exc)}") from None
    if data is None:
        raise FleetError(str(p), "", "the file is empty")
    return parse_fleet(data, str(p))


def resolve_fleet_path(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.exists() and p.suffix == "" and (FLEETS_DIR / f"{p}.yaml").exists():
        return FLEETS_DIR / f"{p}.yaml"
    return p


def shipped_fleets() -> list[str]:
    return sorted(p.stem for p in FLEETS_DIR.glob("*.yaml"))

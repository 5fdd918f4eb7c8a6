"""The fleet file: which simulated nodes the embedded cluster has, and what they advertise.

Long: the model's node rendering is methods of Pool and Fleet (its parser is fleet_file, its slices slices).

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
import time
from typing import Any

from .. import catalog
from .. import vocab as d
from ..vocab import KWOK_ANNOTATION
from ..vocab import LABELS_BY, NFD_PCI_LABEL, RESOURCES_BY

POOL_LABEL = "node.kubernetes.io/instance-type"
REPLAY_NODE_LABEL = "gpuproof.dev/replay-node"     # replay nodes: where the device plugin's stand-in goes

# images every kubelet node imports, which a fault can leave out of one node's containerd (gpuproof.sim.kubelet.faults)
NODE_IMAGES = ("workloads",)
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
    # kubelet nodes: the share of one CPU core (percent) the node's pods may use together, set as the CFS quota of
    # the kubelet's kubepods cgroup: a slow node made real (the workloads take their CPU path on these nodes)
    cpu_percent: int | None = None
    # kubelet nodes: NVIDIA's container toolkit (nvidia-container-runtime) as the node's runtime, with these settings
    # of its config.toml over NVIDIA's recommended ones (gpuproof.sim.kubelet.toolkit); None: plain runc
    container_toolkit: dict | None = None
    # kubelet nodes: labels set over GFD's once NFD's master has applied them, as a hand's `kubectl label --overwrite`
    # or a node-labelling job would (NFD leaves them until its hourly resync): a lying label on a real node
    labels_over_gfd: dict[str, str] = dataclasses.field(default_factory=dict)
    # replay nodes (gpuproof.sim.replay): the node's census pod returns the census recorded under a CPU quota
    replay_slow: bool = False
    # replay nodes: the fabric suite's pair of this node and the pool's node of this index returns the pair workload
    # recorded over a link really slowed (gpuproof.sim.replay): a slow link between two healthy nodes
    replay_slow_link: int | None = None
    # kubelet nodes: the node's network shaped to this many Mbit/s each way by the kernel's tc (its eth0 in its
    # namespace and its veth on the host): a slow node's NIC; and links to other nodes of the pool (node index ->
    # Mbit/s) shaped the same way on both nodes' eth0 for traffic to each other only: a slow link between healthy nodes
    net_rate_mbit: int | None = None
    slow_links: dict[int, int] = dataclasses.field(default_factory=dict)

    @property
    def unmanaged(self) -> bool:
        """kwok would rewrite the node's conditions: such a node is left to nobody, like a dead kubelet."""
        return self.ready is False or bool(self.conditions)


@dataclasses.dataclass(frozen=True)
class ReplayLatency:
    """A replay pool's pod latencies (fleet field ``replayLatency: {startS, runS}``): each pod on its nodes becomes
    Running ``start_s`` after it is bound, and its workload ends ``run_s`` later; each delay is drawn uniformly up to
    ``JITTER`` longer, as real pods do not all take the same time."""
    start_s: float = 0.0
    run_s: float = 0.0
    JITTER = 0.1


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
    host_driver: Any = None     # gpuhost.HostDriver: the gpu-host fleet's node runs over this machine's own driver
    # replay nodes: how long each pod takes to start (image pull, container start) and its workload to run, in
    # seconds, as kwok's Stage delays (gpuproof.sim.stages); None: at once
    replay_latency: "ReplayLatency | None" = None

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
            config = deep_merge(config, fault.device_plugin_config)
        return config

    def cpu_percent(self, index: int) -> int | None:
        """The CPU share (percent of one core) node ``index``'s pods are held to (kubelet nodes), None: no limit."""
        limits = [fault.cpu_percent for fault in self.faults_for(index) if fault.cpu_percent is not None]
        return min(limits) if limits else None

    def net_rate_mbit(self, index: int) -> int | None:
        """The rate node ``index``'s network is shaped to (kubelet nodes), None: not shaped."""
        rates = [f.net_rate_mbit for f in self.faults_for(index) if f.net_rate_mbit is not None]
        return min(rates) if rates else None

    def slow_links(self, index: int) -> dict[int, int]:
        """Node ``index``'s links shaped by a fault, either side's: other node index -> Mbit/s (kubelet nodes)."""
        out: dict[int, int] = {}
        for i in range(self.count):
            for fault in self.faults_for(i):
                for other, rate in fault.slow_links.items():
                    if index in (i, other) and i != other:
                        peer = other if i == index else i
                        out[peer] = min(rate, out.get(peer, rate))
        return out

    def container_toolkit(self, index: int) -> dict | None:
        """Node ``index``'s settings for NVIDIA's container toolkit as its runtime (kubelet nodes); None: runc."""
        found = [f.container_toolkit for f in self.faults_for(index) if f.container_toolkit is not None]
        return {k: v for settings in found for k, v in settings.items()} if found else None

    def labels_over_gfd(self, index: int) -> dict[str, str]:
        """Labels set over GFD's on node ``index`` once it is labelled (kubelet nodes)."""
        return {k: v for f in self.faults_for(index) for k, v in f.labels_over_gfd.items()}

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
                **({REPLAY_NODE_LABEL: "true"} if self.backend == "replay" else {}),
                **gpu_labels,
                **self.labels,
            }
            # replay nodes: kwok plays their kubelet too, but gpuproof places its pods there (gpuproof.sim.replay)
            annotations = {KWOK_ANNOTATION: "replay" if self.backend == "replay" else "fake",
                           "node.alpha.kubernetes.io/ttl": "0"}
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
        from . import slices

        if not self.dra:
            return []
        out = []
        for i, name in enumerate(self.node_names()):
            devices = slices.gpu_devices(name, self.gpu, self.mig if self.mig_enabled else None)
            devices, duplicate = dra_faults_applied(devices, self.faults_for(i))
            uid = node_uids.get(name, "")
            if duplicate is None:
                out.append(slices.resource_slice(name, uid, devices))
            else:
                out += [slices.resource_slice(name, uid, devices, index=0, count=2),
                        slices.resource_slice(name, uid, [duplicate], index=1, count=2)]
        return out


def deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in override.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
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


KWOK_MANAGED = ("fake", "replay")        # the annotation values of the nodes kwok manages


def kwok_managed(node: dict) -> bool:
    """Whether kwok keeps this Node object Ready (the others play dead or sick kubelets)."""
    return node["metadata"]["annotations"][KWOK_ANNOTATION] in KWOK_MANAGED


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
    # the API server's --max-requests-inflight (and mutating), with API priority and fairness off, so that the limit
    # itself answers 429 to what is over it (0: Kubernetes' defaults); the components run as system:masters, which
    # the limit exempts: only other users are throttled (issue #41 item 6)
    max_requests_inflight: int = 0
    # Kubernetes feature gates of kube-apiserver, kube-scheduler and kube-controller-manager (name -> on), e.g.
    # {GenericWorkload: true, GangScheduling: true}: Kubernetes' own gang scheduling (the Workload API
    # scheduling.k8s.io/v1alpha1, which the API server then serves: WORKLOAD_API)
    feature_gates: dict[str, bool] = dataclasses.field(default_factory=dict)

    def key(self) -> str:
        key = ",".join(sorted(self.disable_admission_plugins)) + "|" + ",".join(sorted(self.disable_scheduler_plugins))
        key += "".join(f"|{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return key + (f"|inflight={self.max_requests_inflight}" if self.max_requests_inflight else "")

    def gates_flag(self) -> list[str]:
        """``--feature-gates=A=true,B=false`` for the components, or nothing."""
        gates = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))
        return [f"--feature-gates={gates}"] if gates else []

    def runtime_config(self) -> list[str]:
        """The API server's ``--runtime-config`` for the alpha APIs the gates need served (the Workload API)."""
        return [f"--runtime-config={WORKLOAD_API}=true"] if self.feature_gates.get("GenericWorkload") else []


# the Workload API of Kubernetes' own gang scheduling (1.35, alpha: the GenericWorkload feature gate)
WORKLOAD_API = "scheduling.k8s.io/v1alpha1"


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
    # the platform's operators the embedded cluster builds and runs on kubelet nodes (gpuproof.sim.platform)
    platform: list[str] = dataclasses.field(default_factory=list)

    def dra_objects(self, node_uids: dict[str, str]) -> list[dict]:
        """DeviceClasses and ResourceSlices of the fleet's DRA pools (nothing if none offers DRA)."""
        from . import slices

        if not any(p.dra for p in self.pools):
            return []
        classes = list(d.CLASS_TYPES) if self.device_classes is None else self.device_classes
        return [slices.device_class(c) for c in classes] + \
            [s for p in self.pools for s in p.resource_slices(node_uids)]

    def node_objects(self, views: dict | None = None, progress=lambda m: None) -> list[dict]:
        """Every pool's Node objects. ``views`` ((pool, index) -> NodeView) default to running NVIDIA's
        GFD and device plugin now (built on first use; their device-plugin answers are cached)."""
        if views is None:
            views = {}
            if any(p.needs_nvidia() for p in self.pools):
                from . import gpunodes, nvidia

                # replay nodes are Node objects as kwok's are: NVIDIA's GFD and device plugin write them alike
                seen = dataclasses.replace(self, pools=[dataclasses.replace(p, backend="kwok") if
                                                        p.backend == "replay" else p for p in self.pools])
                views = gpunodes.observe(nvidia.locate(progress=progress), seen, progress=progress)
        self.views = views
        return [n for p in self.pools if p.backend in ("kwok", "replay")     # kubelet nodes register themselves
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



"""The fleet file: YAML in, a checked :class:`~gpuproof.sim.fleet.Fleet` out, every mistake named by file and field.

Long: one validator per section of the fleet file, each naming the file and the field it refuses.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import yaml

from .. import catalog
from ..errors import FleetError
from .fleet import (NODE_IMAGES, ControlPlane, Fault, Fleet, GpuSpec, Mig, Pool, ReplayLatency, Taint, TimeSlicing,
                    deep_merge)
from .nvidia import MOCK_MAX_GPUS

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
# how a pool's nodes are labelled: GPU Feature Discovery, or a managed offering's own scheme
LABEL_SCHEMES = ("gfd", "gke", "eks", "karpenter", "aks", "openshift")
# how a pool's GPUs reach pods: the device plugin (extended resources), DRA (ResourceSlices), or both
OFFERS = ("device-plugin", "dra", "both")
# what plays a pool's nodes: kwok (Node objects only), real kubelets with containerd (gpuproof.sim.kubelet), or
# kwok nodes whose workload pods return recorded results of gpuproof's workloads as their logs (gpuproof.sim.replay)
BACKENDS = ("kwok", "kubelet", "replay")



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
            f.fail(f"nvmlFailures.{gpu}",
                   f"{mode!r} is not one of the mock's failure modes: {', '.join(NVML_FAILURES)}")
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
    cpu = f.get("cpuPercent")
    if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, int) or not 1 <= cpu <= 10000):
        f.fail("cpuPercent", f"must be a whole number of percent of one CPU core, 1 to 10000, got {_kind(cpu)} {cpu!r}")
    fault.cpu_percent = cpu
    rate = f.get("netRateMbit")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int) or not 1 <= rate <= 100_000):
        f.fail("netRateMbit", f"must be a whole number of Mbit/s, 1 to 100000, got {_kind(rate)} {rate!r}")
    fault.net_rate_mbit = rate
    links = f.get("slowLinks") or []
    if not isinstance(links, list):
        f.fail("slowLinks", f"must be a list of {{to: <node index>, rateMbit: <n>}}, got {_kind(links)}")
    for i, link in enumerate(links):
        to, mbit = (link.get("to"), link.get("rateMbit")) if isinstance(link, dict) else (None, None)
        if set(link if isinstance(link, dict) else ()) != {"to", "rateMbit"} or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (to, mbit)) or not mbit:
            f.fail(f"slowLinks[{i}]", f"must be {{to: <node index of the pool>, rateMbit: <1 or more>}}, got {link!r}")
        fault.slow_links[to] = mbit
    fault.labels_over_gfd = f.str_map("labelsOverGfd")
    toolkit = f.get("containerToolkit")
    if toolkit is not None:
        if not isinstance(toolkit, dict):
            f.fail("containerToolkit", f"must be a mapping of NVIDIA container toolkit config.toml settings ({{}}: "
                                       f"as NVIDIA recommends), got {_kind(toolkit)}")
        for key, value in toolkit.items():
            kind = TOOLKIT_SETTINGS.get(key)
            if kind is None:
                f.fail(f"containerToolkit.{key}", "not a top-level setting of NVIDIA's config.toml gpuproof knows: "
                                                  + ", ".join(TOOLKIT_SETTINGS))
            if not isinstance(value, kind):
                f.fail(f"containerToolkit.{key}", f"must be {'true or false' if kind is bool else 'a string'}, got "
                                                  f"{_kind(value)} {value!r}")
        fault.container_toolkit = dict(toolkit)
    fault.replay_slow = f.bool("replaySlow")
    link = f.get("replaySlowLink")
    if link is not None and (isinstance(link, bool) or not isinstance(link, int) or link < 0):
        f.fail("replaySlowLink", f"must be the index of another node of the pool, got {_kind(link)} {link!r}")
    fault.replay_slow_link = link
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
            from .slices import placements

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
        for to in fault.slow_links:
            if fault.node is None or to >= count or to == fault.node:
                f.fail(f"faults[{i}].slowLinks", f"a link joins this fault's node to another of the pool's {count} "
                                                 f"nodes: name the fault's node, and a `to` below {count} and not it")
        for key, (attr, why) in KUBELET_NODE_FAULTS.items():
            given = getattr(fault, attr) is not None if attr == "container_toolkit" else getattr(fault, attr)
            if given and pool.backend != "kubelet":
                f.fail(f"faults[{i}].{key}", why)
        if fault.container_toolkit is not None and (pool.gpu is None or pool.dra):
            f.fail(f"faults[{i}].containerToolkit", "is for GPU nodes that offer their GPUs through NVIDIA's device "
                                                    "plugin (DRA nodes run containerd 1.7 with CDI)")
        if fault.replay_slow and pool.backend != "replay":
            f.fail(f"faults[{i}].replaySlow", "is for replay nodes, whose census pod returns a recording")
        if fault.replay_slow_link is not None:
            _check_replay_link(pool, i, fault, f)
    if pool.backend == "kubelet":
        _check_kubelet_pool(pool, f)
    lat_f = f.mapping("replayLatency")
    if lat_f:
        if pool.backend != "replay":
            f.fail("replayLatency", "is for replay nodes, whose pods kwok completes; kubelet nodes' pods take the "
                                    "time they take")
        pool.replay_latency = ReplayLatency(_seconds(lat_f, "startS"), _seconds(lat_f, "runS"))
        lat_f.done()
    if pool.backend == "replay":
        _check_replay_pool(pool, f)
    f.done()
    return pool


# top-level settings of NVIDIA's container toolkit config.toml a fleet may give a kubelet node (api/config/v1/config.go
# of the toolkit; gpuproof.sim.kubelet.toolkit writes the rest)
TOOLKIT_SETTINGS = {"accept-nvidia-visible-devices-envvar-when-unprivileged": bool,
                    "accept-nvidia-visible-devices-as-volume-mounts": bool, "disable-require": bool,
                    "supported-driver-capabilities": str}

# fault fields only kubelet nodes take (Fault attribute, why a kwok node cannot)
KUBELET_NODE_FAULTS = {
    "nvmlCtl": ("nvml_ctl", "is for kubelet nodes, where pods read NVML; on kwok nodes only NVIDIA's GFD and device "
                            "plugin read it once: use nvmlFailures"),
    "devicePluginConfig": ("device_plugin_config", "is for kubelet nodes, where NVIDIA's device plugin runs as the "
                                                   "node's pod; on kwok nodes it runs once, with the pool's config"),
    "missingImages": ("missing_images", "is for kubelet nodes, whose containerd holds images; kwok nodes run no "
                                        "container"),
    "cpuPercent": ("cpu_percent", "is for kubelet nodes, whose pods run on this machine's CPU; kwok nodes run no "
                                  "container"),
    "containerToolkit": ("container_toolkit", "is for kubelet nodes, whose containerd runs NVIDIA's container "
                                              "toolkit; kwok nodes run no container"),
    "labelsOverGfd": ("labels_over_gfd", "is for kubelet nodes, which GFD labels; on kwok nodes use setLabels"),
    "netRateMbit": ("net_rate_mbit", "is for kubelet nodes, whose network the kernel carries; kwok nodes have none"),
    "slowLinks": ("slow_links", "is for kubelet nodes, whose network the kernel carries; kwok nodes have none"),
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
                                   "devicePluginConfig, missingImages, cpuPercent, containerToolkit, "
                                   "labelsOverGfd, netRateMbit and slowLinks: their labels, resources and state are "
                                   "what NVIDIA's software and the kubelet make of them")


def _seconds(f: _Fields, key: str) -> float:
    value = f.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 3600:
        f.fail(key, f"must be a number of seconds from 0 to 3600, got {_kind(value)} {value!r}")
    return float(value)


def _check_replay_pool(pool: Pool, f: _Fields) -> None:
    """Replay nodes return recordings of one node shape: the pool must be that shape, offered as recorded."""
    from . import replay

    recs = replay.load()
    if recs is None:
        f.fail("backend", f"replay pools need recordings in {replay.RECORDINGS}; record them with "
                          "`python -m gpuproof.sim.replay_record`")
    if pool.gpu is None or (pool.gpu.product, pool.gpu.count) != (recs.product, recs.gpus):
        f.fail("gpu", f"replay nodes return what was recorded on {recs.gpus}x {recs.product} "
                      f"({replay.RECORDINGS}); give the pool that gpu, or record another shape")
    if pool.offer != "device-plugin" or pool.time_slicing or pool.mig_enabled or pool.label_scheme != "gfd":
        f.fail("backend", "replay nodes are whole GPUs through NVIDIA's device plugin, labelled by GFD (as "
                          "recorded): no DRA, sharing, MIG or other label scheme")


def _check_replay_link(pool: Pool, i: int, fault: Fault, f: _Fields) -> None:
    """A slow link of replay nodes joins the fault's node to another that the fabric suite's default pair schedule
    pairs it with (the replay nodes hold logs for those pairs: gpuproof.sim.replay)."""
    field = f"faults[{i}].replaySlowLink"
    if pool.backend != "replay":
        f.fail(field, "is for replay nodes, whose fabric pods return a recording; on kubelet nodes a link is shaped "
                      "by the kernel: slowLinks")
    to = fault.replay_slow_link
    if fault.node is None or to >= pool.count or to == fault.node:
        f.fail(field, f"a link joins this fault's node to another of the pool's {pool.count} nodes: name the "
                      f"fault's node, and an index below {pool.count} and not it")
    from ..vocab import pair_rounds

    names = pool.node_names()
    me = names[fault.node]
    partners = sorted({b if a == me else a for r in pair_rounds(names) for a, b in r if me in (a, b)},
                      key=names.index)
    if names[to] not in partners:
        f.fail(field, f"the fabric suite's default pair schedule never pairs {me} with {names[to]}: name one of its "
                      f"partners, " + ", ".join(f"{names.index(p)} ({p})" for p in partners))


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
    operators = top.str_list("platform")
    cp = ControlPlane()
    device_classes = None
    dra_f = top.mapping("dra")
    if dra_f:
        from ..vocab import CLASS_TYPES

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
        cp.max_requests_inflight = cp_f.int("maxRequestsInflight", 0, minimum=0, maximum=100000)
        gates_f = cp_f.mapping("featureGates")
        if gates_f:
            cp.feature_gates = {str(gate): gates_f.bool(gate) for gate in list(gates_f.data)}
            for gate in cp.feature_gates:
                if not re.match(r"^[A-Z][A-Za-z0-9]*$", gate):
                    gates_f.fail(gate, "is not a feature gate's name (e.g. GangScheduling)")
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
        merged = deep_merge(defaults, raw)
        if "gpu" not in raw:          # defaults.gpu only refines pools that have GPUs
            merged.pop("gpu", None)
        pool = _parse_pool(_Fields(merged, f"pools[{i}]", source))
        if pool.name in seen:
            top.fail(f"pools[{i}].name", f"{pool.name!r} is used by an earlier pool")
        seen.add(pool.name)
        pools.append(pool)
    if sum(p.count for p in pools) == 0:
        top.fail("pools", "the fleet has no nodes (every count is 0)")
    _check_platform(top, operators, pools)
    return Fleet(name=name, pools=pools, source=source, control_plane=cp, device_classes=device_classes,
                 platform=operators)


def _check_platform(top: _Fields, operators: list[str], pools: list[Pool]) -> None:
    """``platform``: operators gpuproof builds (:mod:`gpuproof.sim.platform`), each with what it needs, each on a
    kubelet node without GPUs."""
    from .platform import OPERATORS

    for i, name in enumerate(operators):
        if name not in OPERATORS:
            top.fail(f"platform[{i}]", f"{name!r} is not one gpuproof builds ({', '.join(OPERATORS)})")
        if operators.index(name) != i:
            top.fail(f"platform[{i}]", f"{name!r} is named twice")
        for need in OPERATORS[name].needs:
            if need not in operators:
                top.fail(f"platform[{i}]", f"{name} needs {need} (add it to the list)")
    hosts = sum(p.count for p in pools if p.backend == "kubelet" and p.gpu is None)
    if len(operators) > hosts:
        top.fail("platform", f"{len(operators)} operator(s) need as many kubelet nodes without GPUs (each serves "
                             f"its webhooks on its node's network: backend: kubelet, no gpu); the fleet has {hosts}")


def load_fleet(path: str | os.PathLike) -> Fleet:
    """Read and validate a fleet file. A bare name like ``mixed`` means a shipped fleet; ``gpu-host`` is this
    machine's own GPUs (:mod:`gpuproof.sim.gpuhost`)."""
    if str(path) == "gpu-host" and not Path(path).exists():
        from .gpuhost import fleet_data

        data, driver, source = fleet_data()
        parsed = parse_fleet(data, source)
        return dataclasses.replace(parsed, pools=[dataclasses.replace(p, host_driver=driver) for p in parsed.pools])
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

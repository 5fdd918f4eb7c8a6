"""What NVIDIA's software says the embedded cluster's GPU nodes look like.

For each pool of a fleet, the pool's GPUs become a mock NVML config (one of NVIDIA's own GPU
profiles, with the pool's product, memory, compute capability, count, driver and CUDA versions),
and its sharing and MIG settings become a real device-plugin config file. Then, over NVIDIA's mock
NVML:

- GPU Feature Discovery runs one-shot and writes the pool's ``nvidia.com/*`` labels;
- the device plugin runs under ``dprelay``, which records the resources and devices it advertises
  (and its answer to a request for 2 devices); that is the nodes' capacity and allocatable.

gpuproof models only what NVIDIA's software cannot show over this mock, and says so in each
node's provenance (annotations below, read back by the inventory):

- MIG devices: the mock enumerates none, so a MIG-enabled pool's MIG labels and resources are
  gpuproof's, named and valued as GFD's and the device plugin's source write them
  (``internal/lm/mig-strategy.go``, ``internal/lm/resource.go``, ``nvml-mig-device.go``);
- MPS: the device plugin needs a running ``nvidia-cuda-mps-control`` to serve MPS, so MPS pools get
  GFD's labels and resources by the plugin's documented rule (count x replicas);
- fleet ``faults`` that set capacity, allocatable or labels (a plugin's reaction to a failing GPU
  cannot be shown: the plugin's health check never sees the mock's faults).

Faults the mock itself can inject (``nvmlFailures``: a GPU lost, fallen off the bus, an ECC error)
go into the node's mock config, and whatever NVIDIA's software then does is what the node shows.
"""

from __future__ import annotations

import concurrent.futures as cf
import copy
import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import yaml

from .. import catalog
from ..errors import ControlPlaneError
from ..vocab import LABELS_BY, RESOURCES_BY
from .nvidia import MOCK_MAX_GPUS, NodeSoftware, klog_error

MODEL = "gpuproof model"
# NVIDIA's mock GPU profile each product family starts from (the values that matter are then set), for a product
# whose catalog entry names none (catalog.yaml's mockNvml)
_BASE_PROFILE = {"turing": "t4", "volta": "t4", "ampere": "a100", "ada-lovelace": "l40s", "hopper": "h100",
                 "blackwell": "b200"}
_MOCK_ARCH = {"ada-lovelace": "ada_lovelace"}


@dataclasses.dataclass
class NodeView:
    """One node's GPU labels and resources, and which software produced each."""

    labels: dict[str, str]
    labels_by: str
    resources: dict[str, str]                  # capacity
    resources_by: str
    gfd_error: str = ""
    plugin: dict | None = None                 # dprelay's record (devices, health, the request for 2)
    healthy: dict[str, str] | None = None      # allocatable, where the plugin's device health says (else = capacity)

    @property
    def allocatable(self) -> dict[str, str]:
        return self.resources if self.healthy is None else self.healthy

    def annotations(self) -> dict[str, str]:
        return {LABELS_BY: self.labels_by, RESOURCES_BY: self.resources_by}


# ----------------------------------------------------------------------------- inputs


def mock_config(sw: NodeSoftware, gpu, *, seed: str, failures: dict[int, str] | None = None) -> dict:
    """A mock NVML config for ``gpu`` (a fleet GpuSpec), from the closest of NVIDIA's profiles."""
    if gpu.count > MOCK_MAX_GPUS:
        raise ControlPlaneError(f"NVIDIA's mock NVML shows at most {MOCK_MAX_GPUS} GPUs per node; "
                                f"{gpu.count}x {gpu.product} cannot be simulated")
    from .slices import nvml_name

    known = catalog.lookup(gpu.product)
    profile = (known.mock_nvml if known is not None else "") or _BASE_PROFILE.get(gpu.family, "h100")
    cfg = yaml.safe_load((sw.profiles / f"mock-nvml-config-{profile}.yaml").read_text())
    cmaj, cmin = (gpu.cuda_version.split(".") + ["0"])[:2]
    cfg["system"].update({"driver_version": gpu.driver_version, "nvml_version": f"{cmaj}.{gpu.driver_version}",
                          "cuda_version": f"{cmaj}.{cmin}", "cuda_version_major": int(cmaj),
                          "cuda_version_minor": int(cmin)})
    dd = cfg["device_defaults"]
    dd["name"] = nvml_name(gpu.product)
    dd["brand"] = "tesla" if gpu.product.startswith("Tesla") else "nvidia"
    dd["architecture"] = _MOCK_ARCH.get(gpu.family, gpu.family)
    dd["compute_capability"] = {"major": gpu.compute[0], "minor": gpu.compute[1]}
    total = gpu.memory_mib * 2**20
    mem = dd.setdefault("memory", {})
    reserved = min(int(mem.get("reserved_bytes", 0)), total // 64)
    mem.update({"total_bytes": total, "reserved_bytes": reserved, "free_bytes": total - reserved, "used_bytes": 0})
    dd.setdefault("mig", {}).update({"mode_current": "disabled", "mode_pending": "disabled"})
    if "gsp_firmware" in dd:
        dd["gsp_firmware"]["version"] = gpu.driver_version
    template = cfg["devices"][0]
    devices = []
    for i in range(gpu.count):
        dev = copy.deepcopy(cfg["devices"][i] if i < len(cfg["devices"]) else template)
        digest = hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()
        dev.update({"index": i, "minor_number": i, "serial": str(int(digest[:12], 16))[:13],
                    "uuid": f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"})
        if i >= len(cfg["devices"]):
            dev["pci"] = {"bus_id": f"0000:{0x10 + 0x10 * i:02X}:00.0"}
        if failures and i in failures:
            dev["failure"] = {"mode": failures[i]}
        devices.append(dev)
    cfg["devices"] = devices
    buses = {d["pci"]["bus_id"].lower() for d in devices}
    topo = cfg.get("pcie_topology") or {}
    roots = []
    for rc in topo.get("root_complexes", []):
        kept = [b for b in rc.get("devices", []) if b.lower() in buses]
        if kept:
            roots.append({**rc, "devices": kept})
    if topo:
        topo["root_complexes"] = roots
    return cfg


def plugin_config(pool) -> dict:
    """The pool's device-plugin config file (the one GFD and the plugin read), in the plugin's own format."""
    cfg: dict = {"version": "v1", "flags": {"migStrategy": pool.mig.strategy if pool.mig else "none"}}
    ts = pool.time_slicing
    if ts and ts.replicas > 1:
        shared = {"resources": [{"name": "nvidia.com/gpu", "replicas": ts.replicas}]}
        if ts.rename_by_default:
            shared["renameByDefault"] = True
        if ts.fail_requests_greater_than_one:
            shared["failRequestsGreaterThanOne"] = True
        cfg["sharing"] = {"mps" if ts.strategy == "mps" else "timeSlicing": shared}
    return cfg


# ----------------------------------------------------------------------------- running NVIDIA's software


def run_gfd(sw: NodeSoftware, config: Path, plugin_cfg: Path, machine_type: str, work: Path) -> tuple[dict, str]:
    """GFD one-shot over the mock: (labels, "") or ({}, why it wrote none)."""
    out, machine = work / "gfd-labels.txt", work / "machine-type"
    machine.write_text(machine_type + "\n")
    cmd = [str(sw.exe("gpu-feature-discovery")), "--oneshot", "--use-node-feature-api=false",
           f"--output-file={out}", f"--machine-type-file={machine}", f"--config-file={plugin_cfg}"]
    proc = subprocess.run(cmd, env=sw.mock_env(config), capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not out.exists():
        return {}, f"GFD exited {proc.returncode}: {klog_error(proc.stderr)}"
    labels = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return labels, ""


def run_device_plugin(sw: NodeSoftware, config: Path, plugin_cfg: Path, work: Path) -> dict:
    """NVIDIA's device plugin over the mock, as recorded by dprelay (cached: it depends only on its inputs).

    The plugin serves on /var/lib/kubelet/device-plugins whatever it is told, so it runs in a
    private mount namespace with an empty folder bound over /var/lib: the host's is never touched.
    """
    key = hashlib.sha256(sw.root.as_posix().encode() + config.read_bytes() + plugin_cfg.read_bytes()).hexdigest()[:24]
    cached = sw.root / "runs" / f"device-plugin-{key}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    unshare = shutil.which("unshare")
    if not unshare:
        raise ControlPlaneError("running NVIDIA's device plugin needs `unshare` (util-linux) for a private "
                                "mount namespace")
    priv = work / "var-lib"
    priv.mkdir(exist_ok=True)
    script = ('mount --bind "$1" /var/lib && shift && exec "$@"')
    cmd = [unshare, "--mount", "--propagation", "private", "sh", "-c", script, "sh", str(priv),
           str(sw.exe("dprelay")), "-dir", "/var/lib/kubelet/device-plugins", "-allocate", "2", "-timeout", "60s",
           "--", str(sw.exe("nvidia-device-plugin")), f"--config-file={plugin_cfg}"]
    proc = subprocess.run(cmd, env=sw.mock_env(config), capture_output=True, text=True, timeout=120)
    if not proc.stdout.strip() and ("unshare failed" in proc.stderr or "mount:" in proc.stderr):
        raise ControlPlaneError("running NVIDIA's device plugin needs root (a private mount namespace over "
                                f"/var/lib): {proc.stderr.strip().splitlines()[-1]}")
    try:
        record = json.loads(proc.stdout)
    except ValueError:
        raise ControlPlaneError(f"dprelay gave no record (exit {proc.returncode}): "
                                f"{(proc.stderr.strip().splitlines() or ['no output'])[-1]}") from None
    if record.get("error"):
        log = "\n  ".join(record.get("log", [])[-8:])
        raise ControlPlaneError(f"NVIDIA's device plugin over the mock: {record['error']}\n  {log}")
    cached.parent.mkdir(exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(cached)
    return record


def advertised(record: dict) -> tuple[dict[str, str], dict[str, str]]:
    """(capacity, allocatable) a kubelet makes of the plugin's registrations: every device, and its Healthy ones."""
    resources = record.get("resources", [])
    return ({r["name"]: str(len(r["devices"])) for r in resources},
            {r["name"]: str(sum(d["health"] == "Healthy" for d in r["devices"])) for r in resources})


# ----------------------------------------------------------------------------- what gpuproof models


def mig_labels(pool, base: dict[str, str]) -> dict[str, str]:
    """GFD's MIG labels for a MIG-enabled pool (the mock enumerates no MIG devices), as GFD writes them."""
    from .. import catalog

    g, mig = pool.gpu, pool.mig
    known = catalog.lookup(g.product)
    labels = dict(base)
    labels["nvidia.com/mig.strategy"] = mig.strategy

    def attrs(resource: str, profile: str, count: int) -> dict[str, str]:
        prof = known.mig_profile(profile) if known else None
        g_slices = int(profile.split("g.")[0])
        memory = prof.memory_mib if prof else g.memory_mib * g_slices // 7
        return {f"{resource}.product": f"{base.get('nvidia.com/gpu.product', g.product)}-MIG-{profile}",
                f"{resource}.count": str(count), f"{resource}.replicas": "1",
                f"{resource}.sharing-strategy": "none", f"{resource}.memory": str(memory),
                f"{resource}.multiprocessors": str((known.sms if known else 0) * g_slices // 7),
                f"{resource}.slices.gi": str(g_slices), f"{resource}.slices.ci": str(g_slices),
                f"{resource}.engines.copy": str(g_slices), f"{resource}.engines.decoder": "0",
                f"{resource}.engines.encoder": "0", f"{resource}.engines.jpeg": "0", f"{resource}.engines.ofa": "0"}

    if mig.strategy == "single":
        (profile, per_gpu), = mig.profiles.items()
        labels.update(attrs("nvidia.com/gpu", profile, per_gpu * g.count))
    else:
        for profile, per_gpu in mig.profiles.items():
            labels.update(attrs(f"nvidia.com/mig-{profile}", profile, per_gpu * g.count))
    return labels


def mig_resources(pool) -> dict[str, str]:
    """What the device plugin advertises for a MIG-enabled pool: one device per MIG instance."""
    g, mig = pool.gpu, pool.mig
    if mig.strategy == "single":
        return {"nvidia.com/gpu": str(sum(mig.profiles.values()) * g.count)}
    return {f"nvidia.com/mig-{p}": str(n * g.count) for p, n in mig.profiles.items()}


def mps_resources(pool, count: int) -> dict[str, str]:
    ts = pool.time_slicing
    name = "nvidia.com/gpu.shared" if ts.rename_by_default else "nvidia.com/gpu"
    return {name: str(count * ts.replicas)}


# ----------------------------------------------------------------------------- one pool


def _view(sw: NodeSoftware, pool, work: Path, seed: str, failures: dict[int, str]) -> NodeView:
    work.mkdir(parents=True, exist_ok=True)
    cfg_path, plugin_path = work / "mock-nvml.yaml", work / "device-plugin-config.yaml"
    cfg_path.write_text(yaml.safe_dump(mock_config(sw, pool.gpu, seed=seed, failures=failures), sort_keys=False))
    pcfg = plugin_config(pool)
    mig_enabled = pool.mig_enabled
    mps = bool(pool.time_slicing and pool.time_slicing.strategy == "mps" and pool.time_slicing.replicas > 1)
    if mig_enabled:          # the mock has no MIG devices: GFD and the plugin see whole GPUs, the MIG part is ours
        pcfg["flags"]["migStrategy"] = "none"
    plugin_path.write_text(yaml.safe_dump(pcfg, sort_keys=False))
    labels, gfd_error = {}, ""
    labels_by = resources_by = ""
    if pool.label_scheme in ("gfd", "openshift"):
        labels, gfd_error = run_gfd(sw, cfg_path, plugin_path, pool.instance_type or pool.name, work)
        labels_by = sw.gfd if not gfd_error else f"{sw.gfd} (failed: {gfd_error})"
        if mig_enabled and labels:
            labels = mig_labels(pool, labels)
            labels_by += f" + {MODEL} (MIG devices: the mock enumerates none)"
    record = healthy = None
    if not pool.device_plugin:
        resources = {}
    elif mig_enabled:
        resources, resources_by = mig_resources(pool), f"{MODEL} (MIG devices: the mock enumerates none)"
    elif mps:
        resources = mps_resources(pool, pool.gpu.count)
        resources_by = f"{MODEL} (MPS: the device plugin needs nvidia-cuda-mps-control, which cannot run here)"
    else:
        record = run_device_plugin(sw, cfg_path, plugin_path, work)
        (resources, healthy), resources_by = advertised(record), sw.device_plugin
    return NodeView(labels=labels, labels_by=labels_by, resources=resources, resources_by=resources_by,
                    gfd_error=gfd_error, plugin=record, healthy=healthy)


def observe(sw: NodeSoftware, fleet, progress=lambda m: None) -> dict[tuple[str, int], NodeView]:
    """Run NVIDIA's software for every GPU pool; one view per (pool, node index).

    Nodes of a pool share one run, except nodes whose mock has an injected failure, which get their own.
    """
    jobs: dict[tuple[str, tuple], tuple] = {}
    wanted: dict[tuple[str, int], tuple[str, tuple]] = {}
    for pool in fleet.pools:
        if pool.gpu is None or pool.backend != "kwok" or not (pool.device_plugin or
                                                              pool.label_scheme in ("gfd", "openshift")):
            continue
        for i in range(pool.count):
            failures = pool.nvml_failures(i)
            key = (pool.name, tuple(sorted(failures.items())))
            seed = f"{fleet.name}/{pool.name}" + (f"/{i}" if failures else "")
            jobs.setdefault(key, (pool, seed, failures))
            wanted[(pool.name, i)] = key
    if not jobs:
        return {}
    progress(f"running NVIDIA's GFD and device plugin over the mock NVML for {len(jobs)} pool configuration(s)")
    views: dict[tuple[str, tuple], NodeView] = {}
    with tempfile.TemporaryDirectory(prefix="gpuproof-nvidia-") as tmp:
        def one(item):
            key, (pool, seed, failures) = item
            sub = Path(tmp) / hashlib.sha1(repr(key).encode()).hexdigest()[:12]
            return key, _view(sw, pool, sub, seed, failures)

        with cf.ThreadPoolExecutor(max_workers=4) as ex:
            for key, view in ex.map(one, jobs.items()):
                views[key] = view
    return {node: views[key] for node, key in wanted.items()}

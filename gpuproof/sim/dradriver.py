"""NVIDIA's DRA driver publishes the embedded cluster's ResourceSlices.

For each node of a DRA pool, NVIDIA's ``gpu-kubelet-plugin`` runs over a mock NVML config of its own
(so every node's GPUs have their own UUIDs), against the embedded API server, and publishes the
node's ResourceSlice as it would on a real node: it needs no kubelet to publish. Once the slice is
there the plugin is stopped; the slice stays (it is owned by its Node). The DeviceClasses are the
driver chart's templates, rendered with the API version the cluster serves.

What the mock cannot show stays gpuproof's model, published beside them and marked: MIG devices
(the mock enumerates none), and fleet faults that change a published slice.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import re
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from ..errors import WaitTimeout
from .nvidia import DEVICE_CLASS_TEMPLATES, NodeSoftware, klog_error

DRIVER = "gpu.nvidia.com"
PARALLEL = 4          # plugin processes at once (each briefly takes ~100 MB and some CPU)


def device_classes(sw: NodeSoftware, api_version: str = "resource.k8s.io/v1") -> list[dict]:
    """The chart's DeviceClass templates, rendered as Helm would with GPU resources enabled."""
    out = []
    for name in DEVICE_CLASS_TEMPLATES:
        text = (sw.chart / name).read_text()
        text = re.sub(r'\{\{\s*include "[^"]*resourceApiVersion" \.\s*\}\}', api_version, text)
        text = text.replace("{{ $resourceApiVersion }}", api_version)
        lines = []
        for line in text.splitlines():
            if re.match(r"^\s*\{\{-?\s*(if|end|\$)", line):
                continue      # the template's only conditions are "GPUs enabled" and "API is resource.k8s.io/v1"
            lines.append(line)
        out += [doc for doc in yaml.safe_load_all("\n".join(lines)) if doc]
    return out


def _driver_root(sw: NodeSoftware, into: Path) -> Path:
    """What the plugin reads NVML from: usr/lib64/libnvidia-ml.so.1 (the mock) and a usr/bin/nvidia-smi it
    only checks exists."""
    root = into / "driver-root"
    (root / "usr" / "lib64").mkdir(parents=True, exist_ok=True)
    (root / "usr" / "bin").mkdir(parents=True, exist_ok=True)
    lib = root / "usr" / "lib64" / "libnvidia-ml.so.1"
    if not lib.exists():
        lib.symlink_to((sw.lib / "libnvidia-ml.so.1").resolve())
    (root / "usr" / "bin" / "nvidia-smi").touch()
    return root


def _start(sw: NodeSoftware, kubeconfig: str, node: str, config: Path, work: Path) -> subprocess.Popen:
    work.mkdir(parents=True, exist_ok=True)
    root = _driver_root(sw, work)
    for d in ("cdi", "registrar", "plugins"):
        (work / d).mkdir(exist_ok=True)
    env = sw.mock_env(config, library_path=False)     # it loads NVML from under the driver root
    cmd = [str(sw.exe("gpu-kubelet-plugin")), f"--kubeconfig={kubeconfig}", f"--node-name={node}",
           f"--container-driver-root={root}", f"--nvidia-driver-root={root}",
           f"--nvidia-cdi-hook-path={work / 'nvidia-cdi-hook'}", "--image-name=gpuproof.dev/sim-dra-driver",
           f"--cdi-root={work / 'cdi'}", f"--kubelet-registrar-directory-path={work / 'registrar'}",
           f"--kubelet-plugins-directory-path={work / 'plugins'}", "--healthcheck-port=-1"]
    log = open(work / "plugin.log", "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _last_error(work: Path) -> str:
    return klog_error((work / "plugin.log").read_text(errors="replace"))


def publish(sw: NodeSoftware, client, kubeconfig: str, nodes: list[tuple[str, dict]], progress=lambda m: None,
            timeout: float = 90.0) -> dict[str, str]:
    """Run NVIDIA's kubelet plugin for each (node, mock config) until its slice is published.

    Returns node -> "" (published) or why it published nothing (the plugin's own error).
    """
    from ..cluster.api import watch_until
    from ..vocab import DRA_GROUP, DRA_VERSION

    if not nodes:
        return {}
    progress(f"DRA: NVIDIA's gpu-kubelet-plugin publishes the ResourceSlices of {len(nodes)} node(s)")
    outcome: dict[str, str] = {}
    custom = client.custom
    with tempfile.TemporaryDirectory(prefix="gpuproof-dra-") as tmp:
        def one(item: tuple[str, dict]) -> tuple[str, str]:
            node, cfg = item
            work = Path(tmp) / node
            work.mkdir()
            config = work / "mock-nvml.yaml"
            config.write_text(yaml.safe_dump(cfg, sort_keys=False))
            proc = _start(sw, kubeconfig, node, config, work)
            deadline = time.monotonic() + timeout
            try:
                while True:
                    try:
                        watch_until(custom.list_cluster_custom_object, lambda cache: bool(cache),
                                    timeout=min(2.0, max(0.5, deadline - time.monotonic())),
                                    what=f"NVIDIA's DRA driver to publish node {node}'s ResourceSlice",
                                    group=DRA_GROUP, version=DRA_VERSION, plural="resourceslices",
                                    field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")
                        return node, ""
                    except WaitTimeout:
                        if proc.poll() is not None:
                            return node, f"gpu-kubelet-plugin exited {proc.returncode}: {_last_error(work)}"
                        if time.monotonic() > deadline:
                            return node, f"gpu-kubelet-plugin published nothing in {timeout:.0f}s: {_last_error(work)}"
            finally:
                _stop(proc)

        with cf.ThreadPoolExecutor(max_workers=PARALLEL) as ex:
            for node, why in ex.map(one, nodes):
                outcome[node] = why
    return outcome


def delete_all(client) -> None:
    """Remove every slice of NVIDIA's driver (the embedded cluster's only) and the chart's classes."""
    from kubernetes.client.exceptions import ApiException

    from ..vocab import CLASS_TYPES, DRA_GROUP, DRA_VERSION

    custom = client.custom
    with contextlib.suppress(ApiException):
        for sl in custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices",
                                                    field_selector=f"spec.driver={DRIVER}")["items"]:
            with contextlib.suppress(ApiException):
                custom.delete_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", sl["metadata"]["name"])
    for name in CLASS_TYPES:
        with contextlib.suppress(ApiException):
            custom.delete_cluster_custom_object(DRA_GROUP, DRA_VERSION, "deviceclasses", name)


def apply_faults(client, node: str, faults) -> bool:
    """Fleet faults in the slice NVIDIA's driver published for ``node`` (gpuproof's own tests use them).
    Returns whether any changed it."""
    from ..vocab import DRA_GROUP, DRA_VERSION
    from .fleet import dra_faults_applied

    faults = [f for f in faults if f.dra_drop_devices or f.dra_set_attributes or f.dra_duplicate_device]
    if not faults:
        return False
    custom = client.custom
    slices = custom.list_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices",
                                               field_selector=f"spec.nodeName={node},spec.driver={DRIVER}")["items"]
    if not slices:
        return False
    sl = slices[0]
    devices, duplicate = dra_faults_applied(sorted(sl["spec"]["devices"], key=lambda d: d["name"]), faults)
    sl["spec"]["devices"] = devices
    if duplicate is not None:
        sl["spec"]["pool"]["resourceSliceCount"] = 2
    sl.update({"apiVersion": f"{DRA_GROUP}/{DRA_VERSION}", "kind": "ResourceSlice"})
    custom.replace_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", sl["metadata"]["name"], sl)
    if duplicate is not None:
        second = {"apiVersion": f"{DRA_GROUP}/{DRA_VERSION}", "kind": "ResourceSlice",
                  "metadata": {"name": sl["metadata"]["name"] + "-dup",
                               "ownerReferences": sl["metadata"].get("ownerReferences", [])},
                  "spec": {**sl["spec"], "devices": [duplicate]}}
        custom.create_cluster_custom_object(DRA_GROUP, DRA_VERSION, "resourceslices", second)
    return True

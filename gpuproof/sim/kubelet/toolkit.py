"""NVIDIA's container toolkit as a kubelet node's runtime (fleet fault ``containerToolkit``).

A node with ``containerToolkit: {...}`` runs NVIDIA's ``nvidia-container-runtime`` (NVIDIA Container Toolkit v1.19.0,
built from the module ``controlplane/cdihook`` pins) as its containerd's default runtime, as the GPU operator's
toolkit container configures a node (``nvidia-ctk runtime configure --set-as-default``: a runc-v2 runtime named
``nvidia`` whose ``BinaryName`` is the toolkit's runtime). It reads its ``config.toml`` (through
``NVIDIA_CTK_CONFIG_FILE_PATH``, which NVIDIA's installer sets in its wrapper), then hands every container to runc.
The config is the toolkit's own defaults (``config.GetDefault``) with what NVIDIA recommends for Kubernetes:

- ``accept-nvidia-visible-devices-envvar-when-unprivileged = false``: an unprivileged container's
  ``NVIDIA_VISIBLE_DEVICES`` is ignored (the toolkit's default is ``true``, the variable a pod sets in its own env
  then hands it GPUs no one granted: NVIDIA's security guidance and the GPU operator turn it off);
- the driver root, where the node's driver is (``nvidia-container-cli.root``): the node's ``DEV_ROOT``, laid out
  as on DRA nodes (``kubelet.dra.driver_root``: NVIDIA's mock NVML as ``libnvidia-ml.so.<version>``, the GPUs'
  ``dev/nvidia<N>``);
- ``nvidia-ctk.path``: the ``nvidia-cdi-hook`` the DRA nodes use, for the hooks of the CDI edits it makes.

The fault's mapping is merged over that (``{}``: as NVIDIA recommends; ``{accept-nvidia-visible-devices-envvar-
when-unprivileged: true}``: the toolkit's own default, a node that honours the variable from unprivileged pods).
In its default mode (``auto``, which is ``jit-cdi`` in v1.19) the runtime turns a container's
``NVIDIA_VISIBLE_DEVICES`` (when it honours it) into CDI devices ``runtime.nvidia.com/gpu=<id>`` of a spec it
generates over the driver root with NVML (here NVIDIA's mock NVML: every ``/dev/nvidia<N>`` and the library).

Differences from NVIDIA's installer, each said: the wrapper skips the installer's check that the ``nvidia``
kernel module is loaded (this host has none: the wrapper would otherwise run runc directly), and sets
``MOCK_NVML_CONFIG`` (the node's mock config, as for every process on the node that reads NVML).
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Callable

Progress = Callable[[str], None]
RUNTIME = ("cdihook", "github.com/NVIDIA/nvidia-container-toolkit")
RUNTIME_NAME = "nvidia"                    # the containerd runtime name NVIDIA's installer gives it
ENVVAR_SWITCH = "accept-nvidia-visible-devices-envvar-when-unprivileged"
# NVIDIA's recommendation for Kubernetes: the variable from unprivileged pods is not honoured
RECOMMENDED = {ENVVAR_SWITCH: False, "accept-nvidia-visible-devices-as-volume-mounts": False}


def _quiet(msg: str) -> None:
    pass


def runtime_binaries(progress: Progress = _quiet) -> Path:
    """The folder holding ``nvidia-container-runtime`` and ``nvidia-cdi-hook`` (v1.19.0), built on first use."""
    from .. import binaries as _binaries
    from .dra import TOOLKIT_LDFLAGS, cdi_hook

    hook = cdi_hook(progress)                  # the same module, ldflags and cache folder
    module, path = RUNTIME
    folder = _binaries.go_build(module, {"nvidia-container-runtime": f"{path}/cmd/nvidia-container-runtime"},
                                ldflags=TOOLKIT_LDFLAGS, progress=progress)
    assert hook.parent == folder, (hook, folder)
    return folder


def _toml(value) -> str:
    return json.dumps(value) if not isinstance(value, bool) else ("true" if value else "false")


def config_toml(settings: dict, driver_root: str, hook: Path, log: Path) -> str:
    """config.toml: the toolkit's defaults, NVIDIA's recommendation, then ``settings``."""
    top = {**RECOMMENDED, "disable-require": False,
           "supported-driver-capabilities": "compat32,compute,display,graphics,ngx,utility,video", **settings}
    lines = [f"{k} = {_toml(v)}" for k, v in top.items()]
    lines += ["", "[nvidia-container-cli]", f"root = {_toml(driver_root)}", "load-kmods = true",
              'ldconfig = "@/sbin/ldconfig"',
              "", "[nvidia-container-runtime]", f"debug = {_toml(str(log))}", 'log-level = "debug"', 'mode = "auto"',
              'runtimes = ["runc", "crun"]',
              "", "[nvidia-container-runtime.modes.cdi]", 'annotation-prefixes = ["cdi.k8s.io/"]',
              'default-kind = "nvidia.com/gpu"', 'spec-dirs = ["/etc/cdi", "/var/run/cdi"]',
              "", "[nvidia-container-runtime.modes.csv]",
              'mount-spec-path = "/etc/nvidia-container-runtime/host-files-for-container.d"',
              "", "[nvidia-container-runtime-hook]", 'path = "nvidia-container-runtime-hook"',
              "skip-mode-detection = false",
              "", "[nvidia-ctk]", f"path = {_toml(str(hook))}", ""]
    return "\n".join(lines)


def wrapper(folder: Path, config: Path, mock_config: str) -> str:
    """The runtime's wrapper, as NVIDIA's installer writes one (``installer/executables.go``) less its kernel-module
    check, plus the node's mock NVML config."""
    env = {"NVIDIA_CTK_CONFIG_FILE_PATH": str(config), "MOCK_NVML_CONFIG": mock_config}
    lines = ["#! /bin/sh"] + [f"{k}={shlex.quote(v)} \\" for k, v in env.items()]
    lines.append(f'PATH="{folder}:$PATH" \\')
    lines.append(f'exec {shlex.quote(str(folder / "nvidia-container-runtime"))} "$@"')
    return "\n".join(lines) + "\n"


def setup(etc: Path, settings: dict, driver_root: str, mock_config: str, folder: Path) -> Path:
    """Write the node's toolkit config and wrapper under its ``etc``; returns the wrapper (the runtime's binary)."""
    d = etc / "nvidia-container-runtime"
    d.mkdir(parents=True, exist_ok=True)
    config = d / "config.toml"
    config.write_text(config_toml(settings, driver_root, folder / "nvidia-cdi-hook",
                                  etc.parent / "logs" / "nvidia-container-runtime.log"))
    exe = d / "nvidia-container-runtime"
    exe.write_text(wrapper(folder, config, mock_config))
    os.chmod(exe, 0o755)
    return exe


def containerd_config(text: str, binary: Path) -> str:
    """The node's containerd config with the toolkit's runtime added and made the default, as
    ``nvidia-ctk runtime configure --runtime=containerd --set-as-default`` writes it."""
    text = text.replace('default_runtime_name = "runc"', f'default_runtime_name = "{RUNTIME_NAME}"', 1)
    runtimes = '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes'
    section = (f'    {runtimes}.{RUNTIME_NAME}]\n      runtime_type = "io.containerd.runc.v2"\n'
               f'      {runtimes}.{RUNTIME_NAME}.options]\n        BinaryName = "{binary}"\n'
               '        SystemdCgroup = false\n')
    anchor = '  [plugins."io.containerd.grpc.v1.cri".cni]'
    assert anchor in text, "containerd config without its cni section"
    return text.replace(anchor, section + anchor, 1)


def node_runtime(etc: Path, settings: dict, driver_root: Path, node_files: Path, containerd_text: str) -> str:
    """Make a kubelet node's runtime NVIDIA's toolkit: lay out its driver root (``driver_root``, the host path of
    its ``DEV_ROOT``), write the toolkit's config and wrapper; returns its containerd config with the runtime."""
    from .dra import driver_root as lay_out
    from .host import DEV_ROOT, MOCK_CONFIG_IN_POD, NODE_FILES, NODE_FILES_IN_POD

    lay_out(driver_root, node_files / "mock-nvml.yaml")
    mock = MOCK_CONFIG_IN_POD.replace(NODE_FILES_IN_POD, f"/var/lib/{NODE_FILES}")   # as the node sees it
    binary = setup(etc, settings, DEV_ROOT, mock, runtime_binaries())
    return containerd_config(containerd_text, binary)

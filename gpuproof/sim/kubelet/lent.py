"""The image gpuproof's workload pods run in on the kubelet GPU nodes (the nodes lend it: :func:`workload_image`),
kept beside the nodes' state so a run that reaches the cluster by its kubeconfig finds it (:func:`lent_image`)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from .host import HOST_DRIVER_IN_POD, MOCK_CONFIG_IN_POD, NODE_FILES, NODE_FILES_IN_POD
from .layout import state_dir

WORKLOAD_IMAGE_FILE = "workload-image.json"


def workload_image(name: str, host_driver=None):
    """How gpuproof's workload pods run on kubelet nodes: the workloads image (NVIDIA's mock NVML), the host's
    ``/usr``, Python and virtualenv read-only at their own paths (the interpreter this process runs, so the pods
    have torch, nvidia-ml-py and locust exactly as this host does), and the node's mock NVML config, where the
    NVIDIA container toolkit would give a real node's driver (the host's ``/usr`` at ``/host/usr``: the image's
    own ``/usr`` takes what NVIDIA's CDI injection mounts there). The workloads take their CPU path (``device``):
    NVML answers for the node's GPUs, CUDA has none.

    On the gpu-host node (``host_driver``, a :class:`gpuproof.sim.gpuhost.HostDriver`) the pods are lent the driver's
    library folder too, first on ``LD_LIBRARY_PATH`` (its NVML before the image's mock), and compute on CUDA where the
    driver has it."""
    from ...images import Image

    import sysconfig

    from ..images import HOST_USR

    python = [sys.base_prefix, sys.prefix]
    if os.path.realpath(sys.base_prefix).startswith("/usr"):    # a distribution's Python: its files under /usr
        python = [sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib"),
                  os.path.realpath(sys.executable), sys.prefix]
    paths = list(dict.fromkeys(os.path.realpath(p) for p in python))
    host = [("/usr", HOST_USR)] + [(p, p) for p in paths if not any(p.startswith(q + "/") for q in paths)]
    env = [("PATH", f"{os.path.realpath(sys.prefix)}/bin:/usr/bin:/bin"), ("MOCK_NVML_CONFIG", MOCK_CONFIG_IN_POD),
           ("PYTHONNOUSERSITE", "1")]
    if host_driver is not None:
        from ..images import WORKLOADS_LIB

        host.append((host_driver.lib_dir, HOST_DRIVER_IN_POD))
        env.append(("LD_LIBRARY_PATH", f"{HOST_DRIVER_IN_POD}:{WORKLOADS_LIB}"))
    return Image(name, host_paths=tuple(host), node_paths=((f"/var/lib/{NODE_FILES}", NODE_FILES_IN_POD),),
                 env=tuple(env), pull_policy="Never",
                 device="cuda" if host_driver is not None and host_driver.cuda else "cpu")


def save(sim_dir: Path, image: str, host_driver=None) -> None:
    """Keep the workload image of image ``image`` beside the nodes' state (:func:`lent_image` reads it)."""
    (state_dir(Path(sim_dir)) / WORKLOAD_IMAGE_FILE).write_text(json.dumps(workload_image(image, host_driver)
                                                                           .to_json()))


def lent_image(sim_dir: Path):
    """The workload image this cluster's kubelet nodes lend (None: no kubelet GPU nodes)."""
    from ...images import Image

    f = state_dir(Path(sim_dir)) / WORKLOAD_IMAGE_FILE
    return Image.from_json(json.loads(f.read_text())) if f.exists() else None


def lent_image_of_kubeconfig(kubeconfig: str | None):
    """The workload image of the embedded cluster whose kubeconfig this is (``gpuproof sim up`` writes it into the
    cluster's folder, beside its kubelet nodes' state), so a run that reaches it through ``--kubeconfig`` runs its
    pods as ``--fleet`` does; None for any other cluster's kubeconfig."""
    path = kubeconfig or (os.environ.get("KUBECONFIG") or "").split(os.pathsep)[0] or "~/.kube/config"
    try:
        folder = Path(path).expanduser().resolve().parent
        return lent_image(folder)
    except (OSError, ValueError, KeyError):
        return None

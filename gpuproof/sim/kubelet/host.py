"""What the pieces of a kubelet node share (this package's modules and ``gpuproof.sim.clusternet``): commands and
processes on the host, objects created in the cluster, client kubeconfigs, and the node's own files as its pods see
them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Callable

import yaml

from ...errors import ControlPlaneError


def _sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and proc.returncode != 0:
        raise ControlPlaneError(f"kubelet nodes: `{' '.join(cmd)}` exited {proc.returncode}: "
                                f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def client_kubeconfig(sim_dir: Path, state, out: Path, user: str, group: str | None = None) -> Path:
    """A kubeconfig in ``out`` for ``user`` (in ``group``) to the API server through the node bridge, with a
    client certificate signed by the cluster's CA."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID

    from ..pki import _key, _name, _sign, _write_cert, _write_key

    pki = Path(sim_dir) / "pki"
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    key = _key()
    cert = _sign(_name(user, group), key.public_key(), ca.subject, ca_key, ca=False,
                 usages=[ExtendedKeyUsageOID.CLIENT_AUTH])
    _write_key(out / "client.key", key)
    _write_cert(out / "client.crt", cert)
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "node",
           "clusters": [{"name": "sim", "cluster": {"server": f"https://{state.gateway}:{state.api_port}",
                                                    "certificate-authority": str(pki / "ca.crt"),
                                                    "tls-server-name": "127.0.0.1"}}],
           "users": [{"name": "node", "user": {"client-certificate": str(out / "client.crt"),
                                               "client-key": str(out / "client.key")}}],
           "contexts": [{"name": "node", "context": {"cluster": "sim", "user": "node"}}]}
    path = out / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _spawn(log: Path, preexec: Callable[[], None], *cmd: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, preexec_fn=preexec, env=env)
NVIDIA_NODE_LABEL = "gpuproof.dev/nvidia-node"          # where the NVIDIA DaemonSets run (gpuproof's own label)
DRA_NODE_LABEL = "gpuproof.dev/dra-node"                # where NVIDIA's DRA driver runs, not the device plugin
PLUGIN_NAMESPACE = "nvidia-device-plugin"
NFD_NAMESPACE = "node-feature-discovery"
GFD_ACCOUNT = "nvidia-device-plugin-service-account"   # as NVIDIA's chart names it
NODE_FILES = "gpuproof"                                  # under the node's /var/lib: its mock NVML and plugin config
NODE_FILES_IN_POD = "/etc/gpuproof"                      # where NVIDIA's pods and gpuproof's read the node's files
MOCK_CONFIG_IN_POD = f"{NODE_FILES_IN_POD}/mock-nvml.yaml"
DEV_ROOT = f"/var/lib/{NODE_FILES}/driver"               # the node's /dev/nvidia<N> are under <DEV_ROOT>/dev
NVIDIA_MAJOR = 195                                       # the major number of NVIDIA's /dev/nvidia<N>
HOST_DRIVER_IN_POD = "/opt/nvidia/host-driver"           # the gpu-host node's driver library folder, in its pods


def with_node_files(container: dict, volumes: list[dict]) -> tuple[dict, list[dict]]:
    """The container (and the pod's volumes) reading the node's files (mock NVML config, plugin config) from
    /etc/gpuproof, NVIDIA's mock NVML over the node's config."""
    container = {**container, "env": [{"name": "MOCK_NVML_CONFIG", "value": MOCK_CONFIG_IN_POD},
                                      *container.get("env", [])],
                 "volumeMounts": [*container.get("volumeMounts", []),
                                  {"name": "node-files", "mountPath": NODE_FILES_IN_POD, "readOnly": True}]}
    return container, [*volumes, {"name": "node-files", "hostPath": {"path": f"/var/lib/{NODE_FILES}",
                                                                     "type": "Directory"}}]


def _create(client, manifests: list[dict]) -> None:
    """Create the objects; one already there (from an earlier fleet) is kept."""
    from kubernetes import utils as k8s_utils

    for m in manifests:
        try:
            k8s_utils.create_from_dict(client.api, m)
        except k8s_utils.FailToCreateError as exc:
            if any(e.status != 409 for e in exc.api_exceptions):
                raise ControlPlaneError(f"kubelet nodes: creating {m['kind']} {m['metadata']['name']}: "
                                        f"{exc.api_exceptions[0].reason}") from None

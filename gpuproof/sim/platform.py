"""The platform's operators on the embedded cluster (issue #53): Kueue, JobSet and Kubeflow Trainer, for fleets
that name them (``platform: [kueue, jobset, kubeflow-trainer]``), built from pinned modules and installed as a
platform team installs them.

- **Built** with Go from ``controlplane/platform`` (Kueue v0.17.0, Kubeflow Trainer v2.2.0, kustomize v5.7.1) and
  ``controlplane/jobset`` (JobSet v0.11.1: its own module, since its webhooks are written against controller-runtime
  v0.22 and the other two need v0.23), static (``CGO_ENABLED=0``), each into an image as its Dockerfile has it
  (:func:`gpuproof.sim.images.operator_image`). Only when a fleet names them: the default setup never builds them.
- **Installed** from the modules' own kustomizations, rendered by the pinned kustomize as ``kubectl apply -k``
  renders them (Kueue's and JobSet's ``config/default``, Kubeflow Trainer's ``manifests/overlays/manager`` without
  the JobSet release it downloads, JobSet coming from its own module, and its ``overlays/runtimes``). The rendered
  manifests are kept beside the binaries, so a cluster's start needs no Go module cache.
- **Changed** from upstream's manifests, and only this: the image is gpuproof's import (``imagePullPolicy: Never``:
  the nodes reach no registry), and each controller runs on a kubelet node of its own without GPUs on the node's
  network (``hostNetwork``). Why: the embedded API server runs on the host, which routes no pod network (every
  cluster on a host has the same pod ranges), as on managed control planes with a custom CNI, where these
  operators' docs ask for host-network webhooks; the API server reaches each webhook through its Service's
  endpoints (``--enable-aggregator-routing``), at the node's address. The three controllers listen on the same
  ports (8081, 8443, 9443), hence a node each.
- Their certificates are the operators' own (each one's internal cert management writes its Secret and the
  webhook configurations' ``caBundle``), so a webhook's CA and a rejected object are real.

The Kueue admin's part, which a platform team does once: a ResourceFlavor and a ClusterQueue ``gpuproof-gpus``
whose quota is every GPU the fleet's kubelet nodes advertise (through NVIDIA's device plugin), open to every
namespace. A run makes its own LocalQueue in its namespace.

What the cluster holds of them is recorded in ``<sim>/platform.json``; :func:`unload` removes it when the next fleet
has none (a webhook left behind with ``failurePolicy: Fail`` would refuse every Job of the next fleet).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

import yaml

from ..errors import ControlPlaneError
from . import binaries as _binaries

Progress = Callable[[str], None]
ENV = {"CGO_ENABLED": "0"}
LDFLAGS = "-s -w"
KUSTOMIZE = ("platform", "sigs.k8s.io/kustomize/kustomize/v5")
STATE_FILE = "platform.json"
CLUSTER_QUEUE, FLAVOR = "gpuproof-gpus", "gpuproof-default"
GPU = "nvidia.com/gpu"


def _quiet(msg: str) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class Operator:
    name: str               # as a fleet file names it
    module: str             # controlplane/<module>
    package: str            # its controller manager's main package
    version: str
    source: str             # the Go module whose kustomization installs it
    kustomizations: tuple[str, ...]     # folders of that module, rendered in this order
    namespace: str
    needs: tuple[str, ...] = ()         # operators it cannot work without

    @property
    def exe(self) -> str:
        return self.package.rstrip("/").rsplit("/", 1)[-1]


OPERATORS = {o.name: o for o in (
    Operator("kueue", "platform", "sigs.k8s.io/kueue/cmd/kueue", "v0.17.0", "sigs.k8s.io/kueue",
             ("config/default",), "kueue-system"),
    Operator("jobset", "jobset", "sigs.k8s.io/jobset", "v0.11.1", "sigs.k8s.io/jobset", ("config/default",),
             "jobset-system"),
    # a TrainJob's pods are a JobSet's Jobs
    Operator("kubeflow-trainer", "platform", "github.com/kubeflow/trainer/v2/cmd/trainer-controller-manager",
             "v2.2.0", "github.com/kubeflow/trainer/v2", ("manifests/overlays/manager", "manifests/overlays/runtimes"),
             "kubeflow-system", needs=("jobset",)),
)}


def ordered(names: list[str]) -> list[str]:
    """The operators in install order: each after those it needs."""
    out: list[str] = []
    for name in names:
        out += [n for n in OPERATORS[name].needs if n in names and n not in out]
        if name not in out:
            out.append(name)
    return out


# ---------------------------------------------------------------------------- build


def binary(op: Operator, progress: Progress = _quiet) -> Path:
    return _binaries.go_build(op.module, {op.exe: op.package}, LDFLAGS, ENV, progress=progress) / op.exe


def _module_dir(op: Operator) -> Path:
    from .kubelet.host import _sh

    go = shutil.which("go") or "go"
    return Path(_sh(go, "list", "-m", "-f", "{{.Dir}}", op.source, cwd=_binaries.modules_dir() / op.module,
                    env={**os.environ, "GOFLAGS": "-mod=mod"}).stdout.strip())


def _without_downloads(root: Path, kustomization: str, tmp: Path) -> Path:
    """A copy of the module's folder holding ``kustomization`` (its first path part: ``config``, ``manifests``),
    so its relative paths hold, in which that kustomization's resources are all local: a resource that is a URL,
    or a folder whose own resources are (Kubeflow Trainer's ``third-party/jobset`` downloads JobSet's release
    manifests), is left out. Returns the kustomization's folder in the copy."""
    top = Path(kustomization).parts[0]
    shutil.copytree(root / top, tmp / top)
    folder = tmp / kustomization
    k = yaml.safe_load((folder / "kustomization.yaml").read_text())

    def remote(r: str) -> bool:
        inner = folder / r / "kustomization.yaml"
        return "://" in r or (inner.is_file() and any("://" in x for x in
                                                      yaml.safe_load(inner.read_text()).get("resources", [])))

    kept = [r for r in k.get("resources", []) if not remote(r)]
    if kept != k.get("resources", []):
        (folder / "kustomization.yaml").unlink()        # the module cache's files are read-only
        (folder / "kustomization.yaml").write_text(yaml.safe_dump({**k, "resources": kept}, sort_keys=False))
    return folder


def manifests(op: Operator, progress: Progress = _quiet) -> list[dict]:
    """The operator's install manifests as its kustomizations render them (rendered once, kept with the binary)."""
    out = binary(op, progress).parent / f"{op.name}-{op.version}.yaml"
    if not out.exists():
        kustomize = _binaries.go_build(KUSTOMIZE[0], {"kustomize": KUSTOMIZE[1]}, LDFLAGS, ENV,
                                       progress=progress) / "kustomize"
        from .kubelet.host import _sh

        root, texts = _module_dir(op), []
        for k in op.kustomizations:
            with tempfile.TemporaryDirectory() as tmp:
                folder = _without_downloads(root, k, Path(tmp))
                texts.append(_sh(str(kustomize), "build", str(folder)).stdout)
                subprocess.run(["chmod", "-R", "u+w", tmp], check=False)      # for the folder's removal
        tmp_out = out.with_suffix(f".{os.getpid()}.tmp")
        tmp_out.write_text("---\n".join(texts))
        tmp_out.replace(out)
    return [d for d in yaml.safe_load_all(out.read_text()) if d]


def prepare(names: list[str], nodes: list[str], progress: Progress = _quiet) -> dict[str, tuple[str, tuple[Path, str]]]:
    """Build each operator, its image and its manifests; returns name -> (the node it runs on, its image).
    ``nodes``: the fleet's kubelet nodes without GPUs, one per operator."""
    from . import images

    if len(nodes) < len(names):
        raise ControlPlaneError(f"platform {', '.join(names)}: needs {len(names)} kubelet node(s) without GPUs, one "
                                f"per operator (each serves its webhooks on its node's network); the fleet has "
                                f"{len(nodes)}")
    out = {}
    for name, node in zip(ordered(names), nodes):
        op = OPERATORS[name]
        exe = binary(op, progress)
        manifests(op, progress)
        out[name] = (node, images.operator_image(exe, name, op.version))
    return out


# ---------------------------------------------------------------------------- install


def _ref(d: dict) -> dict:
    return {"apiVersion": d["apiVersion"], "kind": d["kind"], "name": d["metadata"]["name"],
            **({"namespace": d["metadata"]["namespace"]} if d["metadata"].get("namespace") else {})}


def placed(docs: list[dict], image: str, node: str) -> list[dict]:
    """Upstream's manifests with the two changes of the module's doc: our image, on ``node``'s network."""
    for d in docs:
        if d["kind"] == "Deployment":
            spec = d["spec"]["template"]["spec"]
            for c in spec["containers"]:
                c.update(image=image, imagePullPolicy="Never")
            spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
            spec["nodeSelector"] = {**spec.get("nodeSelector", {}), "kubernetes.io/hostname": node}
    return docs


def _apply(dyn, docs: list[dict], record: list[dict]) -> None:
    """Create each object by server-side apply, as ``kubectl apply --server-side`` installs these (Kueue's CRDs
    are too large for the last-applied annotation), recording it for :func:`unload`."""
    for d in docs:
        kind = dyn.resources.get(api_version=d["apiVersion"], kind=d["kind"])
        dyn.server_side_apply(kind, body=d, field_manager="gpuproof-sim", force_conflicts=True)
        record.append(_ref(d))


def _dynamic(client):
    from kubernetes.dynamic import DynamicClient

    return DynamicClient(client.api)


FIRST = ("Namespace", "CustomResourceDefinition")
AFTER_WEBHOOKS = ("ClusterTrainingRuntime", "TrainingRuntime")


def deploy(client, sim_dir: Path, placement: dict[str, tuple[str, tuple[Path, str]]], timeout: float,
           progress: Progress = _quiet) -> None:
    """Install each operator on its node and wait until it serves: its Deployment Available, its webhook
    configurations and APIServices holding its CA. Then Kueue's admin objects (the module's doc)."""
    record: list[dict] = []
    dyn = _dynamic(client)
    t0 = time.monotonic()
    try:
        for name, (node, (_, image)) in placement.items():
            op = OPERATORS[name]
            docs = placed(manifests(op), image, node)
            later = [d for d in docs if d["kind"] in AFTER_WEBHOOKS]     # its own webhook judges them
            now = [d for d in docs if d not in later]
            _apply(dyn, [d for d in now if d["kind"] in FIRST], record)
            _wait_crds(client, [d["metadata"]["name"] for d in now if d["kind"] == "CustomResourceDefinition"],
                       timeout)
            dyn = _dynamic(client)      # discovery again: the new CRDs' kinds
            _apply(dyn, [d for d in now if d["kind"] not in FIRST], record)
            _wait_serving(client, name, op.namespace, docs, timeout)
            _apply(dyn, later, record)
            progress(f"platform: {name} {op.version} serving on {node} ({time.monotonic() - t0:.0f}s)")
        if "kueue" in placement:
            _apply(dyn, kueue_admin(client), record)
    finally:
        (Path(sim_dir) / STATE_FILE).write_text(json.dumps(record, indent=1))


def kueue_admin(client) -> list[dict]:
    """A ResourceFlavor and a ClusterQueue holding every GPU the kubelet nodes' device plugins advertise."""
    gpus = sum(int((n.status.allocatable or {}).get(GPU, "0")) for n in client.core.list_node().items)
    cover = [{"name": "cpu", "nominalQuota": "1000"}, {"name": "memory", "nominalQuota": "10Ti"},
             {"name": GPU, "nominalQuota": str(gpus)}]
    return [{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": CLUSTER_QUEUE},
             "spec": {"namespaceSelector": {}, "resourceGroups": [{
                 "coveredResources": [r["name"] for r in cover],
                 "flavors": [{"name": FLAVOR, "resources": cover}]}]}}]


def _wait_crds(client, names: list[str], timeout: float) -> None:
    from ..cluster.api import watch_until

    if not names:
        return
    from kubernetes import client as k8s

    ext = k8s.ApiextensionsV1Api(client.api)

    def established(cache) -> bool:
        ok = {c.metadata.name for c in cache.values()
              if any(x.type == "Established" and x.status == "True" for x in c.status.conditions or [])}
        return set(names) <= ok

    watch_until(ext.list_custom_resource_definition, established, timeout,
                f"{len(names)} CustomResourceDefinition(s) to be Established")


def _wait_serving(client, name: str, namespace: str, docs: list[dict], timeout: float) -> None:
    """The operator's Deployment Available, then its webhook configurations holding its CA (its own cert management
    puts it there), then its APIServices Available (Kueue's visibility API: until then every client's discovery of
    the API server's groups is incomplete)."""
    from ..cluster.api import watch_until

    deployments = [d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"]

    def available(cache) -> bool:
        ok = {d.metadata.name for d in cache.values()
              if any(c.type == "Available" and c.status == "True" for c in d.status.conditions or [])}
        return set(deployments) <= ok

    def describe(cache) -> str:
        pods = client.core.list_namespaced_pod(namespace).items
        return "; ".join(f"{p.metadata.name} on {p.spec.node_name}: {p.status.phase}" + "".join(
            f", {s.name} {'ready' if s.ready else 'not ready'} ({s.restart_count} restarts)"
            for s in p.status.container_statuses or []) for p in pods) or "no pod"

    watch_until(client.apps.list_namespaced_deployment, available, timeout,
                f"{name}'s controller manager ({', '.join(deployments)}) to be Available", describe=describe,
                namespace=namespace)
    from kubernetes import client as k8s

    adm = k8s.AdmissionregistrationV1Api(client.api)
    for kind, lister in (("MutatingWebhookConfiguration", adm.list_mutating_webhook_configuration),
                         ("ValidatingWebhookConfiguration", adm.list_validating_webhook_configuration)):
        names = {d["metadata"]["name"] for d in docs if d["kind"] == kind}
        if not names:
            continue

        def with_ca(cache, names=names) -> bool:
            return all(n in cache and all(w.client_config.ca_bundle for w in cache[n].webhooks or []) for n in names)

        def without(cache, names=names, kind=kind) -> str:
            return "; ".join(f"{kind} {n}: {w.name} has no CA" for n in sorted(names) if n in cache
                             for w in cache[n].webhooks or [] if not w.client_config.ca_bundle) or "not there"

        watch_until(lister, with_ca, timeout, f"{name} to put its CA into its {kind}s ({', '.join(sorted(names))})",
                    describe=without)
    services = {d["metadata"]["name"] for d in docs if d["kind"] == "APIService"}
    if services:
        def available(cache) -> bool:
            return all(n in cache and any(c.type == "Available" and c.status == "True"
                                          for c in cache[n].status.conditions or []) for n in services)

        def why(cache) -> str:
            return "; ".join(f"{n}: " + (", ".join(f"{c.type}={c.status} ({c.message})"
                                                   for c in cache[n].status.conditions or [])
                                         if n in cache else "not there") for n in sorted(services))

        watch_until(k8s.ApiregistrationV1Api(client.api).list_api_service, available, timeout,
                    f"{name}'s APIServices ({', '.join(sorted(services))}) to be Available", describe=why)


def unload(client, sim_dir: Path) -> None:
    """Delete what :func:`deploy` recorded, webhooks first (they would refuse the next fleet's objects)."""
    path = Path(sim_dir) / STATE_FILE
    if not path.exists():
        return
    record = json.loads(path.read_text())
    order = {"MutatingWebhookConfiguration": 0, "ValidatingWebhookConfiguration": 0, "APIService": 0,
             "CustomResourceDefinition": 2, "Namespace": 3}
    dyn = _dynamic(client)
    for ref in sorted(record, key=lambda r: order.get(r["kind"], 1)):
        with contextlib.suppress(Exception):       # gone already, or its kind with its CRD
            dyn.resources.get(api_version=ref["apiVersion"], kind=ref["kind"]).delete(
                name=ref["name"], namespace=ref.get("namespace"))
    path.unlink()

"""Kubernetes manifests (plain dicts) that run the workloads of ``workloads/`` in a cluster.

The workload files travel as one ConfigMap (keys = file names) mounted at
``/gpuproof/workloads`` in a stock PyTorch CUDA image, so no custom image is needed;
gpuproof's product catalog travels with them as ``catalog.json`` (the datasheet peaks the
benchmarks compare with: ``workloads/datasheet.py``).
``pynvml.py`` from the local nvidia-ml-py is added to the ConfigMap when available,
because stock PyTorch images do not ship it (the sampler and probe degrade gracefully
without it).

Every function takes ``labels`` and ``namespace`` and puts the labels on every object
and every pod template; pure functions, nothing here talks to a cluster.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
from importlib import resources
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable

from .. import package_folder
from ..vocab import COMPONENT_LABEL  # noqa: F401  (the label is vocabulary: replay nodes read it)
from ..cluster.placement import place, pod_manifest
from ..errors import GpuproofError
from ..images import DEFAULT_IMAGE, DEFAULT_LOADGEN_IMAGE, Image, as_image  # noqa: F401  (wl.Image, ...)


WORKLOADS_DIR = Path(str(resources.files("gpuproof") / "_workloads"))   # where they are; workloads_dir() checks it
MOUNT_PATH = "/gpuproof/workloads"
CONFIGMAP_NAME = "gpuproof-workloads"
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
WORKLOAD_LABEL = "gpuproof.dev/workload"
RDZV_PORT = 29500
INFERENCE_PORT = 8000
HEALTH_PATH = "/healthz"          # the inference server's readiness endpoint
SHIPPED_SUFFIXES = (".py", ".md")
CATALOG_JSON = "catalog.json"     # the product catalog beside the workloads (workloads/datasheet.py reads it)
MAX_CONFIGMAP_BYTES = 1_000_000   # the API server refuses objects over ~1 MiB

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# ------------------------------------------------------------------ the image


# ------------------------------------------------------------------ the workload files


def workloads_dir() -> Path:
    """The workload programs (``workloads/`` in the repository, ``gpuproof/_workloads`` installed)."""
    return package_folder("_workloads")


def import_workload(name: str) -> ModuleType:
    """Import a workload module (e.g. ``nvml_sampler``, ``matmul``) in this process.

    The folder is appended to sys.path (lowest priority), which is also how the
    workloads import each other. Do not import ``loadgen`` or ``locustfile`` this way:
    locust monkey-patches the standard library for gevent on import.
    """
    if name in ("loadgen", "locustfile"):
        raise ValueError(f"{name} monkey-patches the process (gevent); run it as a subprocess")
    d = str(workloads_dir())
    if d not in sys.path:
        sys.path.append(d)
    return importlib.import_module(name)


def catalog_json(path: str | Path | None = None) -> str:
    """gpuproof's product catalog (``gpuproof/catalog.yaml``, or ``path``) as the workloads read it in a pod:
    JSON (workloads/datasheet.py), since a stock PyTorch image need not have PyYAML."""
    import yaml

    from .. import catalog

    data = yaml.safe_load(Path(path or catalog.CATALOG_FILE).read_text(encoding="utf-8"))
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


def workload_files(include_pynvml: bool = True, catalog: str | Path | None = None) -> dict[str, str]:
    """File name -> text of every shipped workload file, the product catalog as ``catalog.json`` (its datasheet
    peaks; ``catalog``: another catalog file than gpuproof's), and pynvml.py when asked and found."""
    files = {p.name: p.read_text(encoding="utf-8") for p in sorted(workloads_dir().iterdir())
             if p.is_file() and p.suffix in SHIPPED_SUFFIXES}
    files[CATALOG_JSON] = catalog_json(catalog)
    if include_pynvml:
        try:
            import pynvml

            src = Path(pynvml.__file__)
            if src.suffix == ".py" and src.stat().st_size < MAX_CONFIGMAP_BYTES // 2:
                files.setdefault("pynvml.py", src.read_text(encoding="utf-8"))
        except ImportError:
            pass
    return files


# ------------------------------------------------------------------ helpers


def _check_name(name: str, max_len: int = 63) -> str:
    if len(name) > max_len or not _DNS1123.match(name):
        raise ValueError(f"{name!r} is not a valid Kubernetes name (lower-case letters, digits and '-', "
                         f"at most {max_len} characters)")
    return name


def _meta(name: str, namespace: str, labels: dict, extra: dict | None = None) -> dict:
    return {"name": name, "namespace": namespace, "labels": {**(extra or {}), **labels}}


def _own_labels(name: str, component: str) -> dict:
    return {WORKLOAD_LABEL: name, COMPONENT_LABEL: component}


def _tolerations() -> list[dict]:
    return [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]


def _node_selector(product: str | None, node: str | None) -> dict:
    """Any node of the product, when no node is named (a named node is pinned by affinity: placement.pin_to)."""
    return {PRODUCT_LABEL: product} if product and not node else {}


def _volumes(configmap_name: str, shm: bool, image: "str | Image" = "") -> tuple[list[dict], list[dict]]:
    vols, mounts = as_image(image).volumes()
    vols.append({"name": "workloads", "configMap": {"name": configmap_name}})
    mounts.append({"name": "workloads", "mountPath": MOUNT_PATH, "readOnly": True})
    if shm:  # NCCL and torch data loaders need more than the container's 64 MiB /dev/shm
        vols.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}})
        mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    return vols, mounts


def _env(extra: dict | None) -> list[dict]:
    env = {"PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", **(extra or {})}
    return [{"name": k, "value": str(v)} for k, v in env.items()]


def script_path(script: str) -> str:
    script = script if script.endswith(".py") else script + ".py"
    return f"{MOUNT_PATH}/{script}"


def _container(name: str, image: "str | Image", command: list[str], gpus: int, resource: str, mounts: list[dict],
               env: dict | None, cpu: str | None = None, memory: str | None = None) -> dict:
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if gpus:
        limits[resource] = gpus
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    image = as_image(image)
    c = {"name": name, "image": image.name, "command": command, "env": _env({**dict(image.env), **(env or {})}),
         "volumeMounts": mounts}
    if image.pull_policy:
        c["imagePullPolicy"] = image.pull_policy
    if limits or requests:
        c["resources"] = {k: v for k, v in (("limits", limits), ("requests", requests)) if v}
    return c


def _pod_spec(container: dict, volumes: list[dict], gpus: int, product: str | None, node: str | None,
              restart: str = "Never", deadline_s: int | None = None, tolerations: list[dict] | None = None) -> dict:
    """``tolerations``: those of the node(s) the pod is meant for (placement.tolerate over their taints); without
    them a GPU pod tolerates ``nvidia.com/gpu`` only."""
    spec: dict[str, Any] = {"restartPolicy": restart, "containers": [container], "volumes": volumes,
                            "enableServiceLinks": False}
    if tolerations is None and gpus:
        tolerations = _tolerations()
    place(spec, node=node, tolerations=tolerations, node_selector=_node_selector(product, node))
    if deadline_s:
        spec["activeDeadlineSeconds"] = int(deadline_s)
    return spec


# ------------------------------------------------------------------ objects


def configmap(*, labels: dict, namespace: str, name: str = CONFIGMAP_NAME, include_pynvml: bool = True) -> dict:
    """The ConfigMap holding every workload file (keys = file names)."""
    data = workload_files(include_pynvml)
    size = sum(len(v.encode()) for v in data.values())
    if size > MAX_CONFIGMAP_BYTES:
        raise GpuproofError(f"the workload files are {size} bytes, over the ConfigMap limit; "
                            "build it with include_pynvml=False")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(_check_name(name), namespace, labels, {COMPONENT_LABEL: "workloads"}),
            "data": data}


def workload_pod(name: str, script: str, args: Iterable[str] = (), *, labels: dict, namespace: str,
                 image: str = DEFAULT_IMAGE, gpus: int = 1, resource: str = GPU_RESOURCE,
                 product: str | None = None, node: str | None = None, configmap_name: str = CONFIGMAP_NAME,
                 env: dict | None = None, torchrun: bool = False, deadline_s: int = 3600,
                 tolerations: list[dict] | None = None) -> dict:
    """A Pod running ``python /gpuproof/workloads/<script> <args>`` once.

    ``torchrun=True`` starts one rank per GPU with ``torchrun --standalone``
    (several GPUs in one pod, e.g. the all-reduce).
    """
    _check_name(name)
    path = script_path(script)
    if torchrun:
        cmd = ["torchrun", "--standalone", f"--nproc-per-node={max(1, gpus)}", path, *map(str, args)]
    else:
        cmd = ["python", path, *map(str, args)]
    vols, mounts = _volumes(configmap_name, shm=torchrun or gpus > 1, image=image)
    container = _container("workload", image, cmd, gpus, resource, mounts, env)
    return pod_manifest(_meta(name, namespace, labels, _own_labels(name, script.removesuffix(".py"))),
                        _pod_spec(container, vols, gpus, product, node, deadline_s=deadline_s, tolerations=tolerations))


def workload_job(name: str, script: str, args: Iterable[str] = (), *, labels: dict, namespace: str,
                 ttl_s: int = 3600, **pod_kwargs) -> dict:
    """The same as :func:`workload_pod`, as a Job (no retries; removed ``ttl_s`` after finishing)."""
    pod = workload_pod(name, script, args, labels=labels, namespace=namespace, **pod_kwargs)
    spec = pod["spec"]
    deadline = spec.pop("activeDeadlineSeconds", None)
    job_spec: dict[str, Any] = {"backoffLimit": 0, "ttlSecondsAfterFinished": ttl_s,
                                "template": {"metadata": {"labels": dict(pod["metadata"]["labels"])}, "spec": spec}}
    if deadline:
        job_spec["activeDeadlineSeconds"] = deadline
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": pod["metadata"], "spec": job_spec}


def inference_manifests(name: str, *, labels: dict, namespace: str, image: str = DEFAULT_IMAGE,
                        gpus: int = 1, resource: str = GPU_RESOURCE, product: str | None = None,
                        node: str | None = None, server_args: Iterable[str] = (), port: int = INFERENCE_PORT,
                        configmap_name: str = CONFIGMAP_NAME, env: dict | None = None,
                        tolerations: list[dict] | None = None) -> list[dict]:
    """Deployment (1 replica, readiness probe on /healthz) and a ClusterIP Service."""
    _check_name(name)
    own = _own_labels(name, "inference-server")
    vols, mounts = _volumes(configmap_name, shm=False, image=image)
    cmd = ["python", script_path("inference_server"), "--host", "0.0.0.0", "--port", str(port),
           *map(str, server_args)]
    container = _container("server", image, cmd, gpus, resource, mounts, env)
    container["ports"] = [{"containerPort": port, "name": "http"}]
    container["readinessProbe"] = {"httpGet": {"path": HEALTH_PATH, "port": port}, "periodSeconds": 2,
                                   "timeoutSeconds": 2, "failureThreshold": 3}
    container["startupProbe"] = {"httpGet": {"path": HEALTH_PATH, "port": port}, "periodSeconds": 2,
                                 "failureThreshold": 300}  # image pull excluded; model load up to 10 min
    spec = _pod_spec(container, vols, gpus, product, node, restart="Always", tolerations=tolerations)
    spec["terminationGracePeriodSeconds"] = 30
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": _meta(name, namespace, labels, own),
        "spec": {"replicas": 1, "selector": {"matchLabels": own},
                 "template": {"metadata": {"labels": {**own, **labels}}, "spec": spec}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": _meta(name, namespace, labels, own),
        "spec": {"selector": own, "ports": [{"name": "http", "port": port, "targetPort": port}]},
    }
    return [deployment, service]


def service_url(name: str, namespace: str, port: int = INFERENCE_PORT) -> str:
    return f"http://{name}.{namespace}.svc:{port}"


def loadgen_pod(name: str, url: str, args: Iterable[str] = (), *, labels: dict, namespace: str,
                image: str = DEFAULT_LOADGEN_IMAGE, configmap_name: str = CONFIGMAP_NAME,
                cpu: str = "2", deadline_s: int = 3600) -> dict:
    """A Pod running the locust load generator (no GPU) against ``url`` inside the cluster."""
    _check_name(name)
    vols, mounts = _volumes(configmap_name, shm=False, image=image)
    cmd = ["python", script_path("loadgen"), "--url", url, *map(str, args)]
    container = _container("loadgen", image, cmd, 0, GPU_RESOURCE, mounts, None, cpu=cpu, memory="1Gi")
    return pod_manifest(_meta(name, namespace, labels, _own_labels(name, "loadgen")),
                        _pod_spec(container, vols, 0, None, None, deadline_s=deadline_s))


def wait_for_name(host: str, seconds: int = 600) -> str:
    """Shell that waits (a second at a time, up to ``seconds``) until ``host`` resolves: rank 0's name in the cluster
    DNS, which a headless Service publishes once the pod exists; torchrun's rendezvous needs it at its start."""
    return (f'i=0; until getent hosts {host} >/dev/null; do i=$((i+1)); if [ $i -gt {seconds} ]; then '
            f'echo "no DNS for {host} after {seconds}s" >&2; exit 1; fi; sleep 1; done; ')


def _shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# ------------------------------------------------------------------ results


# a workload's progress line on stderr (workload_common.log): "[HH:MM:SS] ..."
_PROGRESS = re.compile(r"\[\d\d:\d\d:\d\d\] ")


def _json_object(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def last_json(logs: str) -> dict | None:
    """The last line of ``logs`` that is a JSON object, or None.

    A pod's log interleaves its stdout and stderr as the runtime stored them, and the runtime stores a line longer
    than its limit (containerd: 16 KiB) in pieces: a stderr line that arrives between two pieces of a long result
    lands inside it (the piece, the stderr line and its newline, then the rest). Such a result is read by joining
    the lines from the last one that opens an object, each cut where a workload's progress line begins
    (:func:`_rejoined`); a result that was never printed whole stays None."""
    lines = (logs or "").splitlines()
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{") and line.endswith("}") and (value := _json_object(line)) is not None:
            return value
    return _rejoined(lines)


def _rejoined(lines: list[str]) -> dict | None:
    starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("{")]
    for start in reversed(starts):
        text = ""
        for line in lines[start:]:
            cut = _PROGRESS.search(line)
            text += line[:cut.start()] if cut else line
            if text.rstrip().endswith("}") and (value := _json_object(text.strip())) is not None:
                return value
    return None


def parse_result(logs: str, what: str = "workload") -> dict:
    """The workload's result: the last line of ``logs`` that is a JSON object."""
    value = last_json(logs)
    if value is None:
        raise no_result(logs, what)
    return value


def no_result(logs: str, what: str, ended: str = "") -> GpuproofError:
    """The error for a workload that printed no JSON result: ``ended`` says how it ended, then the log's
    last lines."""
    tail = "\n".join((logs or "").splitlines()[-15:]) or "(empty)"
    return GpuproofError(f"{what} printed no JSON result" + (f" ({ended})" if ended else "")
                         + f"; last lines of its log:\n{tail}")


def pod_result(run, name: str, what: str, container: str | None = None) -> dict:
    """The JSON result of a finished pod, read from its log once the log holds it (see
    :meth:`gpuproof.cluster.api.Run.finished_log`); without one, the error says how the pod's container
    ended and shows the log's last lines."""
    logs = run.finished_log(name, lambda text: last_json(text) is not None, container)
    value = last_json(logs)
    if value is None:
        raise no_result(logs, what, ended=run.describe_exit(name))
    return value

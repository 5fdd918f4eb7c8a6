"""The load generator in a cluster when one pod is not enough: locust's distributed mode.

- :func:`calibration_pod`: one pod of the load generator's image and CPU size that measures
  its requests per CPU-second against a local stand-in endpoint with answers of the real
  shape (``loadgen.py --calibrate-only``; nothing leaves the pod);
- :func:`size_workers`: N = ceil(target / (per-core rate x headroom)) (``workloads/loadclient.py``);
- :func:`distributed_manifests`: the locust master pod (``loadgen.py --master --expect-workers N``:
  it runs the capacity search and steers), a Service in front of its port, and a Job of N
  worker pods (``loadgen.py --worker``), each with one CPU request and limit, so each worker
  is the one-core process the calibration measured. The master's JSON result (with every
  worker's CPU per step) is in its log; each worker pod logs its own totals.

Pure functions, like :mod:`gpuproof.bench.workloads`: nothing here talks to a cluster.
"""

from __future__ import annotations

from typing import Iterable

from ..cluster.placement import pod_manifest
from . import workloads as wl

MASTER_PORT = 5557      # locust's default master port
WORKER_CPU = "1"        # a locust process uses one core at most (one Python thread)
CALIBRATION_FLAGS = ("--input-tokens", "--output-tokens", "--seed", "--no-ignore-eos", "--calibrate-s",
                     "--calibrate-users", "--calibrate-token-gap-ms", "--target-rps", "--headroom", "--max-workers",
                     "--rates")
DISTRIBUTION_FLAGS = ("--workers", "--per-core-rps", "--calibrate-s", "--calibrate-users", "--calibrate-token-gap-ms",
                      "--target-rps", "--headroom", "--max-workers")


def size_workers(target_rps: float, per_core_rps: float, headroom: float | None = None,
                 max_workers: int | None = None) -> dict:
    """Workers for ``target_rps`` from a measured per-core rate (the workload's own rule)."""
    rules = wl.import_workload("loadclient")
    return rules.size_workers(target_rps, per_core_rps, headroom or rules.HEADROOM, max_workers or rules.MAX_WORKERS)


def pick_flags(args: list[str], keep: Iterable[str] = (), drop: Iterable[str] = ()) -> list[str]:
    """The flags of ``args`` (``--flag value`` pairs and bare switches) named in ``keep`` / not in ``drop``."""
    keep, drop = set(keep), set(drop)
    out, i = [], 0
    while i < len(args):
        flag = args[i]
        has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        pair = args[i:i + 2] if has_value else args[i:i + 1]
        if (keep and flag in keep) or (not keep and flag not in drop):
            out += pair
        i += len(pair)
    return out


def master_service(name: str) -> str:
    return f"{name}-master"


def _pod(name: str, component: str, cmd: list[str], *, labels: dict, namespace: str, image: str,
         configmap_name: str, cpu: str, memory: str, limit_cpu: bool, deadline_s: int,
         own_labels: dict | None = None) -> dict:
    vols, mounts = wl._volumes(configmap_name, shm=False, image=image)
    container = wl._container(component, image, cmd, 0, wl.GPU_RESOURCE, mounts, None, cpu=cpu, memory=memory)
    if limit_cpu:
        container["resources"]["limits"] = {"cpu": cpu}
    return pod_manifest(wl._meta(name, namespace, labels, own_labels or wl._own_labels(name, component)),
                        wl._pod_spec(container, vols, 0, None, None, deadline_s=deadline_s))


def calibration_pod(name: str, load_args: Iterable[str] = (), *, labels: dict, namespace: str,
                    image: str = wl.DEFAULT_LOADGEN_IMAGE, configmap_name: str = wl.CONFIGMAP_NAME,
                    cpu: str = WORKER_CPU, deadline_s: int = 600) -> dict:
    """A pod sized like one worker that measures the client's per-core rate (and the sizing)."""
    wl._check_name(name)
    args = pick_flags([str(a) for a in load_args], keep=CALIBRATION_FLAGS)
    cmd = ["python", wl.script_path("loadgen"), "--calibrate-only", *args]
    return _pod(name, "loadgen-calibration", cmd, labels=labels, namespace=namespace, image=image,
                configmap_name=configmap_name, cpu=cpu, memory="1Gi", limit_cpu=True, deadline_s=deadline_s)


def distributed_manifests(name: str, url: str, load_args: Iterable[str], workers: int, *, labels: dict,
                          namespace: str, image: str = wl.DEFAULT_LOADGEN_IMAGE,
                          configmap_name: str = wl.CONFIGMAP_NAME, worker_cpu: str = WORKER_CPU,
                          port: int = MASTER_PORT, deadline_s: int = 3600, wait_workers_s: int = 600) -> list[dict]:
    """Service + master Pod + Job of ``workers`` worker pods. The master's result is in its log."""
    wl._check_name(name, max_len=50)   # room for "-master" / "-workers-<suffix>"
    if workers < 1:
        raise ValueError("workers must be >= 1")
    master_labels = wl._own_labels(name, "loadgen-master")
    args = pick_flags([str(a) for a in load_args], drop=DISTRIBUTION_FLAGS)
    master_cmd = ["python", wl.script_path("loadgen"), "--url", url, "--master", "--expect-workers", str(workers),
                  "--master-port", str(port), "--wait-workers-s", str(wait_workers_s), *args]
    master = _pod(f"{name}-master", "loadgen-master", master_cmd, labels=labels, namespace=namespace, image=image,
                  configmap_name=configmap_name, cpu="1", memory="2Gi", limit_cpu=False, deadline_s=deadline_s,
                  own_labels=master_labels)
    master["spec"]["containers"][0]["ports"] = [{"containerPort": port, "name": "locust-master"}]
    service = {"apiVersion": "v1", "kind": "Service",
               "metadata": wl._meta(master_service(name), namespace, labels, master_labels),
               "spec": {"selector": master_labels,
                        "ports": [{"name": "locust-master", "port": port, "targetPort": port}]}}
    host = f"{master_service(name)}.{namespace}.svc"
    worker_labels = wl._own_labels(name, "loadgen-worker")
    worker_cmd = ["python", wl.script_path("loadgen"), "--worker", "--master-host", host, "--master-port", str(port)]
    pod = _pod(f"{name}-workers", "loadgen-worker", worker_cmd, labels=labels, namespace=namespace, image=image,
               configmap_name=configmap_name, cpu=worker_cpu, memory="1Gi", limit_cpu=True, deadline_s=deadline_s,
               own_labels=worker_labels)
    spec = pod["spec"]
    spec.pop("activeDeadlineSeconds", None)
    # workers spread over nodes where they can: one node's NIC or CPUs should not be the client's limit
    spec["affinity"] = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": worker_labels},
                                            "topologyKey": "kubernetes.io/hostname"}}]}}
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": wl._meta(f"{name}-workers", namespace, labels, worker_labels),
           "spec": {"completions": workers, "parallelism": workers, "backoffLimit": 0,
                    "activeDeadlineSeconds": deadline_s, "ttlSecondsAfterFinished": 3600,
                    "template": {"metadata": {"labels": {**worker_labels, **labels}}, "spec": spec}}}
    return [service, master, job]


def worker_selector(name: str) -> str:
    return f"{wl.WORKLOAD_LABEL}={name},{wl.COMPONENT_LABEL}=loadgen-worker"

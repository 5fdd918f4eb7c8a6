"""What the operators suite does to an operator (``suites/test_operators.py``): wait for its pods, ask its webhook
to refuse an object, and give its controller a small distributed job on GPU nodes.

The job is gpuproof's all-reduce workload (``workloads/allreduce.py``) under ``torchrun``, one rank per node on
two GPU nodes (one where the cluster has one), each pod asking one GPU: Kubeflow Trainer gets a TrainJob on the
ClusterTrainingRuntime the catalog names (``torch-distributed``: Trainer sets torchrun's ``PET_*`` environment),
JobSet a JobSet of one indexed Job whose pods find rank 0 by JobSet's own DNS names. It completes only where the
controller made the pods, the scheduler placed them on GPU nodes and the pods found each other.
"""

from __future__ import annotations

import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from ..bench import workloads as wl
from ..cluster.api import WaitTimeout, api_message, watch_until
from ..discovery import operators as ops
from . import bench_checks

JOBS = {"kubeflow-trainer": "op-trainjob", "jobset": "op-jobset"}    # the suite's job of each (a TrainJob's JobSet
# has the TrainJob's name)
MANAGER = "gpuproof.dev/operators"    # a TrainJob's runtimePatches' manager
ALLREDUCE_ARGS = ["--sizes", "64K", "--iters", "2", "--warmup", "1", "--no-per-node"]


def find(cluster) -> list[ops.Operator] | str:
    """The operators the cluster has, or why they cannot be read (the credentials may not list CRDs or webhooks)."""
    try:
        return ops.find(cluster.api, cluster.core)
    except ApiException as exc:
        if exc.status in (401, 403):
            return f"cannot read the cluster's CRDs, webhooks or Services: {exc.status} {api_message(exc)}"
        raise


def wait_ready(cluster, op: ops.Operator, timeout: float) -> ops.Operator:
    """The operator again once every pod behind its selectors is Ready (at least one), or at ``timeout``."""
    deadline = time.monotonic() + timeout
    for where in op.selectors:
        ns, _, selector = where.partition("/")
        if ns == "*" or " (" in where:
            continue

        def ready(cache: dict) -> bool:
            pods = [p for p in cache.values() if p.metadata.deletion_timestamp is None]
            return bool(pods) and all(any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
                                      for p in pods)

        try:
            watch_until(cluster.core.list_namespaced_pod, ready, max(1.0, deadline - time.monotonic()),
                        f"{op.known.title}'s pods ({where}) to be Ready", namespace=ns, label_selector=selector)
        except WaitTimeout:
            break
    again = find(cluster)
    return next((o for o in again if o.name == op.name), op) if isinstance(again, list) else op


NO_DRY_RUN = "does not support dry run"      # the API server's words for a webhook with side effects


def try_invalid(cluster, run, known: ops.Known) -> tuple[bool | None, str]:
    """Create the catalog's invalid object in the run namespace as a dry run; (refused by the webhook, what the API
    said), None where a webhook on it does not take dry runs (its ``sideEffects`` say it has some): no verdict.
    Nothing is stored either way."""
    body = dict(known.invalid or {})
    group, _, version = body["apiVersion"].partition("/")
    body["metadata"] = {"name": "gpuproof-invalid", "namespace": run.namespace, "labels": dict(run.labels)}
    plural = body["kind"].lower() + "s"
    try:
        cluster.custom.create_namespaced_custom_object(group, version, run.namespace, plural, body, dry_run="All")
    except ApiException as exc:
        message = api_message(exc)
        if NO_DRY_RUN in message:
            return None, message
        return ops.refusal_matches(known, message), message
    return False, "accepted: no webhook refused it (dry run, nothing stored)"


# ---------------------------------------------------------------------------- the distributed job


def _command(run) -> list[str]:
    dev = bench_checks.device(run)
    args = [*ALLREDUCE_ARGS, "--device", dev]
    return ["torchrun", wl.script_path("allreduce"), *args]


def trainjob(run, known: ops.Known, nodes: int) -> dict:
    """A TrainJob on the catalog's runtime: ``nodes`` nodes of one GPU each, running the all-reduce."""
    image = wl.as_image(bench_checks.image(run))
    vols, mounts = wl._volumes(wl.CONFIGMAP_NAME, shm=True, image=image)
    env = [{"name": k, "value": str(v)} for k, v in {**dict(image.env), "PYTHONUNBUFFERED": "1",
                                                      "GLOO_SOCKET_IFNAME": "eth0"}.items()]
    return {"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
            "metadata": {"name": JOBS["kubeflow-trainer"], "namespace": run.namespace, "labels": dict(run.labels)},
            "spec": {"runtimeRef": {"name": known.runtime},
                     "trainer": {"image": image.name, "command": _command(run), "numNodes": nodes, "env": env,
                                 "resourcesPerNode": {"limits": {wl.GPU_RESOURCE: 1}}},
                     "runtimePatches": [{"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {
                         "replicatedJobs": [{"name": "node", "template": {"spec": {"template": {
                             "metadata": {"labels": dict(run.labels)},
                             "spec": {"volumes": vols,
                                      "tolerations": [{"key": wl.GPU_RESOURCE, "operator": "Exists"}],
                                      "containers": [{"name": "node", "volumeMounts": mounts}]}}}}}]}}}}]}}


def jobset(run, nodes: int) -> dict:
    """A JobSet of one indexed Job of ``nodes`` pods, one GPU each, running the all-reduce with rank 0 found by
    JobSet's DNS name (``<jobset>-<job>-0-0.<jobset>``)."""
    image = bench_checks.image(run)
    name = JOBS["jobset"]
    master = f"{name}-workers-0-0.{name}"
    torchrun = " ".join(["exec", *_command(run)[:1], f"--nnodes={nodes}", "--nproc-per-node=1",
                         '--node-rank="$JOB_COMPLETION_INDEX"', f"--master-addr={master}",
                         f"--master-port={wl.RDZV_PORT}", *_command(run)[1:]])
    wait_dns = wl.wait_for_name(master)
    pod = wl.workload_pod(name, "allreduce", labels=dict(run.labels), namespace=run.namespace, image=image, gpus=1,
                          env={"GLOO_SOCKET_IFNAME": "eth0"})
    spec = pod["spec"]
    spec["containers"][0]["command"] = ["sh", "-c", wait_dns + torchrun]
    spec.pop("activeDeadlineSeconds", None)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "namespace": run.namespace, "labels": dict(run.labels)},
            "spec": {"replicatedJobs": [{"name": "workers", "replicas": 1, "template": {"spec": {
                "parallelism": nodes, "completions": nodes, "completionMode": "Indexed", "backoffLimit": 0,
                "template": {"metadata": {"labels": dict(run.labels)}, "spec": spec}}}}]}}


DONE = {"TrainJob": ("Complete", "Failed"), "JobSet": ("Completed", "Failed")}


def submit(cluster, run, body: dict) -> str:
    """Create the job; "" or the API's refusal (a webhook that cannot be reached, ...)."""
    group, _, version = body["apiVersion"].partition("/")
    try:
        cluster.custom.create_namespaced_custom_object(group, version, run.namespace, body["kind"].lower() + "s",
                                                       body)
    except ApiException as exc:
        return f"creating {body['kind']} {body['metadata']['name']} refused: {api_message(exc)}"
    return ""


def wait_done(cluster, run, body: dict, timeout: float) -> tuple[bool, str]:
    """(completed, what it came to): its Complete/Completed condition True, or Failed, or how it stood at the
    deadline, with its pods."""
    group, _, version = body["apiVersion"].partition("/")
    good, bad = DONE[body["kind"]]

    def cond(obj: dict, kind: str) -> dict | None:
        return next((c for c in (obj.get("status") or {}).get("conditions") or []
                     if c.get("type") == kind and c.get("status") == "True"), None)

    def done(cache: dict) -> Any:
        obj = cache.get(body["metadata"]["name"])
        if obj is None:
            return None
        for kind in (good, bad):
            c = cond(obj, kind)
            if c:
                return kind, f"{kind}: {c.get('reason', '')} {c.get('message', '')}".strip()
        return None

    def describe(cache: dict) -> str:
        obj = cache.get(body["metadata"]["name"]) or {}
        conds = ", ".join(f"{c.get('type')}={c.get('status')}" for c in (obj.get("status") or {}).get("conditions")
                          or []) or "no conditions"
        return f"{body['kind']} {body['metadata']['name']}: {conds}; pods: {pods_of(run)}"

    try:
        kind, said = watch_until(cluster.custom.list_namespaced_custom_object, done, timeout,
                                 f"{body['kind']} {body['metadata']['name']} to complete", describe=describe,
                                 group=group, version=version, namespace=run.namespace,
                                 plural=body["kind"].lower() + "s")
    except WaitTimeout as exc:
        return False, str(exc)
    return kind == good, said + ("" if kind == good else f"; pods: {pods_of(run)}")


def pods_of(run) -> str:
    pods = run.pods()
    return "; ".join(f"{p.metadata.name} on {p.spec.node_name or 'no node'}: {p.status.phase}"
                     + (f" ({run.describe_exit(p.metadata.name)})" if p.status.phase == "Failed" else "")
                     for p in pods) or "none"

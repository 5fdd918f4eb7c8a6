"""The fabric between GPU nodes, measured (issue #50): pairs of nodes side by side, one ring over all, what NCCL used.

Each pair is two pods pinned to its two nodes (a headless Service gives pod 0 a DNS name; torchrun on each joins
rank 0's store), running ``workloads/allreduce.py`` over every GPU of both nodes; the ring is the same over every node
of a pool, with the collectives users run. The pods ask for the fabric resources their nodes advertise (RDMA device
plugins' ``rdma/*``, ``nvidia.com/hostdev``, ``vpc.amazonaws.com/efa``) with ``IPC_LOCK``, and log NCCL's init and
network lines, which the workload reads per rank (``workloads/nccl_log.py``). ``$GPUPROOF_FABRIC_POD`` names a YAML
fragment merged into every fabric pod (a user's own NCCL settings, volumes or resources).

What the figures mean is :mod:`gpuproof.bench.fabric_plan`'s (pure); :func:`findings` turns a pool's outcome into
the suite's checks, each naming node or pair, figure and reference.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import yaml

from ..errors import GpuproofError
from ..vocab import fabric_job
from . import fabric_plan as plan
from . import workloads as wl
from .base import applied, ensure_configmap, flag_args

POD_ENV = "GPUPROOF_FABRIC_POD"                 # a YAML pod fragment merged into every fabric pod
LABEL = "gpuproof.dev/fabric"
# resources through which a node offers an RDMA fabric to pods: prefix -> how many a pod asks for ("all": every one
# the node has, as the EFA and host-device plugins expect of a pod that owns the node's GPUs; 1: a shared device)
FABRIC_RESOURCES = {"rdma/": 1, "nvidia.com/hostdev": "all", "vpc.amazonaws.com/efa": "all"}
NCCL_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
CPU_NOTE = ("gloo over TCP between the nodes' network namespaces (the embedded cluster's kubelet nodes: no NCCL, no "
            "RDMA; the pairs, their judgement and the faults are real, the bandwidths are this machine's)")
Say = Callable[[str], None]


def _quiet(_msg: str) -> None:
    pass


# ------------------------------------------------------------------ what a node offers


def offers(node) -> list[str]:
    """The RDMA fabric a GPU node offers pods through its resources of :data:`FABRIC_RESOURCES` (allocatable > 0; a
    discovery ``GpuNode``, or anything with ``allocatable``). The HCAs a pod sees are added from its job's result."""
    return [f"{name}: {count}" for name, count in sorted((getattr(node, "allocatable", None) or {}).items())
            if any(name.startswith(p) for p in FABRIC_RESOURCES) and str(count) not in ("0", "")]


def fabric_limits(node) -> dict[str, Any]:
    """What a fabric pod on ``node`` asks for besides its GPUs (see :data:`FABRIC_RESOURCES`)."""
    out: dict[str, Any] = {}
    for name, count in (getattr(node, "allocatable", None) or {}).items():
        for prefix, want in FABRIC_RESOURCES.items():
            if name.startswith(prefix) and str(count) not in ("0", ""):
                out[name] = count if want == "all" else want
    return out


# ------------------------------------------------------------------ pods


def merge(base: Any, patch: Any) -> Any:
    """A pod fragment over a pod: mappings merged key by key, ``containers`` element by element, other lists
    appended (env, volumes, volumeMounts)."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        if base and all(isinstance(x, dict) and "image" in x for x in base):          # containers
            return [merge(b, p) for b, p in zip(base, patch)] + base[len(patch):]
        return base + copy.deepcopy(patch)
    return copy.deepcopy(patch)


def pod_patch(environ=None) -> dict:
    """``$GPUPROOF_FABRIC_POD``'s fragment ({} when unset); a file that is not a YAML mapping is one line."""
    path = (os.environ if environ is None else environ).get(POD_ENV, "").strip()
    if not path:
        return {}
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise GpuproofError(f"{POD_ENV}={path}: cannot be read as YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise GpuproofError(f"{POD_ENV}={path}: must be a YAML mapping, a fragment of a Pod (e.g. spec.containers)")
    return data


@dataclasses.dataclass
class PodPlan:
    """What every fabric pod of a pool gets."""

    image: Any
    gpus: int                          # GPUs a pod asks for (every one of its node's on GPUs)
    resource: str = wl.GPU_RESOURCE
    tolerations: list[dict] | None = None
    limits: dict[str, dict] = dataclasses.field(default_factory=dict)       # node -> fabric resources
    patch: dict = dataclasses.field(default_factory=dict)
    device: str = "cuda"
    deadline_s: int = 1800


def fabric_pods(name: str, nodes: list[str], args: list[str], pp: PodPlan, *, labels: dict,
                namespace: str, port: int = wl.RDZV_PORT) -> list[dict]:
    """A headless Service and one pod per node, pinned, ``<name>-<i>`` running rank group ``i`` of torchrun."""
    own = {wl.WORKLOAD_LABEL: name, wl.COMPONENT_LABEL: "fabric"}
    master = f"{name}-0.{name}"
    nproc = pp.gpus if pp.device == "cuda" else 1
    objs: list[dict] = [{
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {**own, **labels}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {wl.WORKLOAD_LABEL: name},
                 "ports": [{"name": "rendezvous", "port": port, "targetPort": port}]}}]
    wait_dns = wl.wait_for_name(master)
    for i, node in enumerate(nodes):
        torchrun = " ".join(["exec torchrun", f"--nnodes={len(nodes)}", f"--nproc-per-node={nproc}",
                             f"--node-rank={i}", f"--master-addr={master}", f"--master-port={port}",
                             wl.script_path("allreduce"), *(wl._shell_quote(a) for a in args)])
        vols, mounts = wl._volumes(wl.CONFIGMAP_NAME, shm=True, image=pp.image)
        env = dict(NCCL_ENV) if pp.device == "cuda" else {"GLOO_SOCKET_IFNAME": "eth0"}
        container = wl._container("fabric", pp.image, ["sh", "-c", wait_dns + torchrun], pp.gpus, pp.resource,
                                  mounts, env)
        container["ports"] = [{"containerPort": port, "name": "rendezvous"}]
        container["env"].append({"name": "GPUPROOF_NODE_NAME",
                                 "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
        extra = pp.limits.get(node) or {}
        if extra:
            container["resources"]["limits"].update(extra)
            container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}   # RDMA registers pinned memory
        spec = wl._pod_spec(container, vols, pp.gpus, None, node, deadline_s=pp.deadline_s,
                            tolerations=pp.tolerations)
        spec.update(hostname=f"{name}-{i}", subdomain=name)
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"{name}-{i}", "namespace": namespace, "labels": {**own, **labels},
                            "annotations": {LABEL: ",".join(nodes) if len(nodes) > 2 else plan.SEP.join(nodes)}},
               "spec": spec}
        objs.append(merge(pod, pp.patch) if pp.patch else pod)
    return objs


# ------------------------------------------------------------------ one job (a pair, a retest or the ring)


@dataclasses.dataclass
class JobRun:
    nodes: tuple[str, ...]
    result: dict | None = None
    error: str | None = None
    retest: bool = False
    seconds: float = 0.0

    @property
    def pair(self) -> plan.Pair:
        return plan.norm((self.nodes[0], self.nodes[1]))

    @property
    def name(self) -> str:
        return plan.pair_name(self.pair) if len(self.nodes) == 2 else f"{len(self.nodes)} nodes"

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.result and self.result.get("ok"))

    def at(self, collective: str = "all_reduce") -> dict:
        return ((self.result or {}).get("at_size") or {}).get(collective) or {}

    @property
    def busbw(self) -> float | None:
        return self.at().get("busbw_gbps") if self.error is None else None

    @property
    def size_bytes(self) -> int | None:
        return self.at().get("size_bytes")

    def transports(self) -> dict[str, dict]:
        """node -> {"transport", "evidence", "warnings", "hcas", "intra"} read from its ranks' NCCL logs (gloo: TCP)."""
        fab = (self.result or {}).get("fabric") or {}
        return fab.get("by_node") or {}

    def why_not_ok(self) -> str:
        if self.error:
            return self.error
        r = self.result or {}
        return f"result not ok: {r.get('error') or ''} {r.get('wrong_total_all', r.get('wrong_total'))} wrong elements"


class Runner:
    """Runs fabric jobs for one run: pairs side by side, at most ``parallel`` pods in flight. Its pods carry the
    label ``gpuproof.dev/fabric=jobs`` (one shared watch), their names come from their nodes (vocab.fabric_job) and
    their annotation names the nodes."""

    def __init__(self, run, pp: PodPlan, parallel: int, say: Say = _quiet, timeout: float = 1800.0):
        self.run, self.pp, self.say, self.timeout = run, pp, say, timeout
        self.parallel = max(1, parallel)
        self.stop = threading.Event()
        self.tag = "jobs"
        self._watch = None

    def watch(self):
        if self._watch is None:
            from ..cluster.podwatch import PodWatch

            self._watch = PodWatch(self.run, f"{LABEL}={self.tag}")
        return self._watch

    def close(self) -> None:
        self.stop.set()
        if self._watch is not None:
            self._watch.close()

    def one(self, nodes: list[str], params: dict, retest: bool = False) -> JobRun:
        """One job over ``nodes`` (its pods gone when this returns); errors are kept, never raised."""
        from ..cluster.podconditions import pod_done, pod_started

        t0 = time.monotonic()
        job = JobRun(tuple(nodes), retest=retest)
        name = fabric_job(nodes, again=retest)
        args = flag_args({k: v for k, v in params.items() if k not in ("nproc", "ranks_per_node")}, FLAGS)
        objs = fabric_pods(name, nodes, args + ["--no-per-node"], self.pp,
                           labels={**self.run.labels, LABEL: self.tag}, namespace=self.run.namespace)
        watch = self.watch()
        pods = [f"{name}-{i}" for i in range(len(nodes))]
        try:
            with applied(self.run, objs):
                for pod in pods[1:]:        # a pod that can never start ends the job now, not at rank 0's deadline
                    watch.wait_for(pod, pod_started, self.timeout, self.stop)

                def failed_peer() -> str:
                    for pod in pods[1:]:
                        seen = watch.cache.get(pod)
                        if seen is not None and seen.status and seen.status.phase == "Failed":
                            return pod
                    return ""

                watch.wait(pods[0], lambda p: pod_done(p) or bool(failed_peer()), self.timeout,
                           f"to finish ({job.name})", self.stop)
                peer = failed_peer()
                try:
                    job.result = wl.pod_result(self.run, pods[0], what=f"fabric pod {pods[0]} ({job.name})")
                except GpuproofError as exc:
                    job.error = str(exc) if not peer else f"{peer} failed: {self.run.describe_exit(peer)}"
        except Exception as exc:  # noqa: BLE001  a pair that cannot run is a finding about that pair
            job.error = " ".join(str(exc).split())[:2000]
        job.seconds = time.monotonic() - t0
        return job

    def rounds(self, rounds: list[list[plan.Pair]], params: dict, what: str, retest: bool = False) -> list[JobRun]:
        """Each round's pairs side by side (at most ``parallel`` pods: 2 a pair), one round after another."""
        out: list[JobRun] = []
        width = max(1, self.parallel // 2)
        for i, pairs in enumerate(rounds, 1):
            t0 = time.monotonic()
            with ThreadPoolExecutor(max_workers=min(width, len(pairs)), thread_name_prefix="gpuproof-fabric") as ex:
                done = list(ex.map(lambda p: self.one(list(p), params, retest), pairs))
            out += done
            bad = [j.name for j in done if not j.ok]
            self.say(f"{what}: round {i}/{len(rounds)}: {len(pairs)} pair(s) side by side in "
                     f"{time.monotonic() - t0:.0f}s" + (f"; did not run cleanly: {', '.join(bad)}" if bad else ""))
        return out


# the workload's flags (gpuproof.bench.allreduce.AllReduce.flags, plus what the fabric adds)
FLAGS = {"device": "--device", "sizes": "--sizes", "dtype": "--dtype", "iters": "--iters", "warmup": "--warmup",
         "threads": "--threads", "sample_hz": "--sample-hz", "collectives": "--collectives",
         "report_size": "--report-size"}


def params_for(device: str, quick: bool = False) -> tuple[dict, dict]:
    """(pair parameters, ring parameters): pairs time all-reduce at the judged size; the ring runs the collectives.
    On GPUs 1 GiB messages (the floors' size); on the CPU 1 MiB, where a shaped veth shows in a second."""
    if device == "cuda":
        pair = {"device": "cuda", "sizes": "256M,1G", "report_size": "1G", "iters": 20, "warmup": 5,
                "collectives": "all_reduce", "sample_hz": 0}
        ring = {**pair, "sizes": "1M,64M,1G", "collectives": "all_reduce,all_gather,reduce_scatter,alltoall,sendrecv"}
        if quick:
            pair.update(sizes="64M", report_size="64M", iters=5, warmup=1)
            ring.update(sizes="1M", report_size="1M", iters=5, warmup=1)
    else:
        pair = {"device": "cpu", "sizes": "1M", "report_size": "1M", "iters": 4, "warmup": 1, "threads": 1,
                "collectives": "all_reduce", "sample_hz": 0}
        ring = {**pair, "sizes": "64K,1M", "collectives": "all_reduce,all_gather,sendrecv"}
    return pair, ring


# ------------------------------------------------------------------ a pool's outcome and its checks


@dataclasses.dataclass
class PoolOutcome:
    """Everything measured on one pool (one product in one node shape)."""

    product: str
    gpus: int
    nodes: list[str]
    rounds: list[list[plan.Pair]]
    pairs: list[JobRun]
    retests: list[JobRun]
    judgement: plan.Judgement
    verdicts: plan.Verdicts
    offers: dict[str, list[str]]
    device: str = "cuda"
    wall_s: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.product} x{self.gpus}"


def measure_pool(runner: Runner, product: str, gpus: int, nodes: list[str], offered: dict[str, list[str]],
                 params: dict, pct: float, every_pair: bool = False, rounds: int | None = None) -> PoolOutcome:
    """The pool's rounds, its pairs judged, the slow ones' nodes measured again with known-good nodes, verdicts."""
    t0 = time.monotonic()
    schedule = plan.pair_rounds(nodes, every_pair, rounds)
    what = f"fabric {product} x{gpus}"
    runner.say(f"{what}: {len(nodes)} nodes, {sum(map(len, schedule))} pairs in {len(schedule)} round(s)"
               + (" (every pair)" if every_pair else ""))
    pairs = runner.rounds(schedule, params, what)
    judgement = plan.judge({j.pair: j.busbw for j in pairs}, pct)
    again = plan.retests(judgement)
    if again:
        runner.say(f"{what}: {len(judgement.slow)} slow pair(s): their nodes measured again with known-good nodes")
    retests = runner.rounds(again, params, f"{what} (again)", retest=True)
    verdicts = plan.verdicts(judgement, {j.pair: j.busbw for j in retests})
    return PoolOutcome(product, gpus, sorted(nodes), schedule, pairs, retests, judgement, verdicts, offered,
                       device=params.get("device", "cuda"), wall_s=time.monotonic() - t0)


@contextlib.contextmanager
def runner(run, pp: PodPlan, parallel: int, say: Say = _quiet, timeout: float = 1800.0):
    ensure_configmap(run)
    r = Runner(run, pp, parallel, say, timeout)
    try:
        yield r
    finally:
        r.close()

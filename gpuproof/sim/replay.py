"""Replay nodes: kwok nodes whose gpuproof workload pods return a recorded result of gpuproof's own workloads.

A fleet pool with ``backend: replay`` is a pool of kwok-managed nodes (annotation ``kwok.x-k8s.io/node: replay``)
that look like real GPU nodes to gpuproof's discovery: its per-node pod checks (health, census, the topology probe, the
driver suite's probe, the access suite's pods) place their pods there. kwok plays the kubelet: a Stage completes each
workload pod (phase Succeeded, each container terminated with exit code 0), and kwok serves each container's log
from a ``ClusterLogs`` document of its config, as the kubelet serves a container's log: gpuproof reads it through
the API server's ``pods/log``, exactly as on a real cluster (kwok started with a serving certificate; the Node
carries ``status.addresses`` 127.0.0.1 and ``status.daemonEndpoints.kubeletEndpoint.Port`` = kwok's port).

What each pod's log holds is a recording (``recordings/``, its README says how it was made): the real output of
gpuproof's workloads run over NVIDIA's mock NVML on this machine's CPU. Per node, only identifiers are rewritten:
the recording's GPU UUIDs become the node's (the UUIDs NVIDIA's mock gives the node's GPUs, seeded ``<fleet>/<node>``
as a kubelet node's mock is) and the recording's host name becomes the pod's name (a pod's host name).
A node with the fault ``replaySlow`` gets the census recorded under a CPU quota (really measured slower).

The access suite's pods (suites/test_access.py: ``access-pos-<node>``, ``-neg-``, ``-env-``, ``-two-``, by
vocab.name_on; :data:`ACCESS_PODS`): each container's log is the recording of its own kind of container
(``workloads/access.py`` run as the container runtime starts it on a node with NVIDIA's device plugin and container
toolkit: ``granted`` with one GPU's ``/dev/nvidia0`` and ``NVIDIA_VISIBLE_DEVICES`` that GPU's UUID, ``ungranted``
and ``ungranted-env-all`` with no GPU device file), so access-two's two containers get two logs. The node's GPU 0
is the granted container's GPU (the recording's becomes the node's UUID, as everywhere): its device file, NVML's one
GPU and the device plugin's ``NVIDIA_VISIBLE_DEVICES``, from which the suite reads what was allocated.

The fabric suite's pairs (gpuproof.bench.fabric: a headless Service and pods ``<vocab.fabric_job(pair)>-0`` and
``-1``, container ``fabric``; gpuproof reads pod ``-0``'s log): pod names follow from the nodes alone, so the pairs
the suite's default schedule will measure (``vocab.pair_rounds``) are known when the fleet loads. Pod ``-0`` of
each returns a recording of the real pair workload (``workloads/allreduce.py`` between two network namespaces under
torchrun, as the suite runs it on the CPU path), its two nodes' names rewritten to the pair's; pod ``-1`` completes
as its rank's container would. A node's fault ``replaySlowLink: <index>`` makes its pair with that node return the
pair recorded over a link really shaped by the kernel (``tc``: 20 Mbit/s); every pair that the suite may then measure
again (either node of the slow link with any other node: ``-again``) returns a normal recording. Other schedules
(``GPUPROOF_FABRIC_PAIRS``) and the ring over all nodes have no recording.
A gpuproof workload pod (label ``gpuproof.dev/component``) that no recording serves fails at once, reason
``NoRecording`` (gpuproof.sim.stages): a check that starts one on replay nodes fails, naming why, instead of waiting
out its deadline. Other pods on replay nodes run on, as on any kwok node. A pool's ``replayLatency`` makes its pods
take real time to start and to finish (kwok Stage delays).

The device plugin's pod: a replay node's GPU labels and resources are what NVIDIA's GFD and device plugin wrote over
the mock NVML (as for every kwok GPU node), and like the GPU operator's stand-ins of gpuproof.sim.operator, a
DaemonSet puts a stand-in pod of NVIDIA's device plugin (its chart's names and labels, a pause container that kwok
runs, annotated as a stand-in) on each replay node, so the stack check finds it Ready as on a real node. It serves
nothing: it only stands where the plugin's pod stands.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from pathlib import Path

from ..vocab import fabric_job, name_on, pair_rounds
from .fleet import REPLAY_NODE_LABEL

RECORDINGS = Path(__file__).parent / "recordings"
INDEX = RECORDINGS / "index.json"
ANNOTATION_VALUE = "replay"
CONTAINER = "workload"           # the container gpuproof's workload pods run in (gpuproof.bench.workloads)
FABRIC_CONTAINER = "fabric"     # ... and the fabric suite's (gpuproof.bench.fabric), pods named fab-<hex>-<i>
PROBE_GPUS = 2                   # the topology check's probe asks for 2 GPUs (gpuproof/suites/test_topology.py)
# the access suite's pods (suites/test_access.py PODS): name prefix -> its containers, in order; each container's
# name is the kind of access recording it gets (tests/test_scale_replay.py holds them equal to the suite's)
ACCESS_PODS = {"access-pos": ("granted",), "access-neg": ("ungranted",), "access-env": ("ungranted-env-all",),
               "access-two": ("granted", "ungranted")}


def pod_names(node: str) -> dict[str, str]:
    """workload -> the name of gpuproof's pod of it on ``node``: gpuproof.bench.base.pod_name(bench, node) for the
    node benchmarks, ``nvlink-probe-<node>-0`` for the topology probe and ``driver-probe-<node>-0`` for the driver
    suite's (gpuproof.plugin.checks.probe_on: both by vocab.name_on); the simulator cannot import those layers,
    tests/test_scale_replay.py holds the benchmarks' rule equal."""
    slug = re.sub(r"[^a-z0-9]+", "-", node.lower()).strip("-")
    return {"health": f"bench-health-{slug}"[:50].rstrip("-"),
            "census": f"bench-census-{slug}"[:50].rstrip("-"),
            "probe": name_on(node, "nvlink-probe", 0),
            "driver": name_on(node, "driver-probe", 0)}


def access_pods(node: str) -> dict[str, tuple[str, ...]]:
    """The access suite's pods on ``node`` (vocab.name_on(node, prefix), as the suite names them) -> their
    containers."""
    return {name_on(node, prefix): containers for prefix, containers in ACCESS_PODS.items()}


def log_key(pod: str, container: str) -> str:
    """The key of one container's log in :func:`node_logs`' answer, for pods whose containers each have their own
    (``<pod>/<container>``: neither name can hold a ``/``)."""
    return f"{pod}/{container}"


def mock_uuids(seed: str, count: int) -> list[str]:
    """The UUIDs NVIDIA's mock NVML gives a node's GPUs in gpuproof's mock config (gpuproof.sim.gpunodes.mock_config,
    the same rule; tests/test_scale_replay.py holds them equal)."""
    out = []
    for i in range(count):
        h = hashlib.sha256(f"{seed}/{i}".encode()).hexdigest()
        out.append(f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}")
    return out


@dataclasses.dataclass(frozen=True)
class Recording:
    file: str
    workload: str             # health | census | probe | fabric | access
    kind: str                 # normal | slow; access: the container's (granted | ungranted | ungranted-env-all)
    uuids: tuple[str, ...]    # the recording's GPU UUIDs, in NVML index order
    host: str                 # the host name the workload wrote
    nodes: tuple[str, ...] = ()   # fabric: the node names the ranks wrote (node_names, fabric.by_node), in order

    @property
    def path(self) -> Path:
        return RECORDINGS / self.file


@dataclasses.dataclass(frozen=True)
class Recordings:
    product: str
    gpus: int
    items: tuple[Recording, ...]

    def of(self, workload: str, kind: str = "normal") -> list[Recording]:
        return [r for r in self.items if r.workload == workload and r.kind == kind]


def load(index: Path = INDEX) -> Recordings | None:
    """The recordings' index (None when there is none)."""
    try:
        data = json.loads(index.read_text())
    except (OSError, ValueError):
        return None
    return Recordings(data["product"], data["gpus"],
                      tuple(Recording(r["file"], r["workload"], r["kind"], tuple(r["uuids"]), r["host"],
                                      tuple(r.get("nodes") or ()))
                            for r in data["recordings"]))


def node_endpoint(node: dict, port: int) -> dict:
    """The Node object with the address and port at which the API server reaches its kubelet: kwok's server."""
    status = node.setdefault("status", {})
    status["addresses"] = [{"type": "InternalIP", "address": "127.0.0.1"},
                           {"type": "Hostname", "address": node["metadata"]["name"]}]
    status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": port}}
    return node


NODE_LABEL = REPLAY_NODE_LABEL     # on replay nodes: where the device plugin's stand-in goes
NAMESPACE = "nvidia-device-plugin-replay"    # not gpuproof-<run id>: a run's own namespace
PLUGIN_APP = "nvidia-device-plugin"
PAUSE = "registry.k8s.io/pause:3.10"


def plugin_daemonset() -> dict:
    """The device plugin's stand-in DaemonSet on replay nodes (NVIDIA's chart's labels and container name)."""
    labels = {"app.kubernetes.io/name": PLUGIN_APP, "app.kubernetes.io/instance": "replay"}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": f"{PLUGIN_APP}-replay", "namespace": NAMESPACE, "labels": labels,
                         "annotations": {"gpuproof.dev/stand-in": "a pause container kwok runs on replay nodes; the "
                                                                  "nodes' resources are NVIDIA's device plugin's"}},
            "spec": {"selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"nodeSelector": {NODE_LABEL: "true"},
                                           "tolerations": [{"operator": "Exists"}],
                                           "terminationGracePeriodSeconds": 0,
                                           "containers": [{"name": "nvidia-device-plugin-ctr", "image": PAUSE}]}}}}


def apply_stand_ins(client, nodes: list[dict], timeout: float, progress=lambda msg: None) -> None:
    """Replace the previous fleet's device-plugin stand-ins with this one's; wait until each replay node's is Ready."""
    from kubernetes.client.exceptions import ApiException

    from ..cluster.api import watch_until

    core, apps = client.core, client.apps
    try:
        apps.delete_namespaced_daemon_set(f"{PLUGIN_APP}-replay", NAMESPACE, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise
    wanted = {n["metadata"]["name"] for n in nodes if is_replay(n)}
    if not wanted:
        return
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as exc:
        if exc.status != 409:
            raise
    apps.create_namespaced_daemon_set(NAMESPACE, plugin_daemonset())
    progress(f"replay nodes: waiting for {len(wanted)} device-plugin stand-in pods")

    judged: dict[str, tuple[str, str | None]] = {}      # pod -> (its resourceVersion, its node if Ready)

    def ready(cache: dict) -> bool:
        # asked at every event: only pods that changed are looked at again (at 5,000 nodes a whole pass per event
        # made the wait quadratic: minutes after every stand-in was Running)
        for name, p in cache.items():
            rv = p.metadata.resource_version
            if judged.get(name, ("",))[0] != rv:
                up = p.metadata.deletion_timestamp is None and any(
                    c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))
                judged[name] = (rv, p.spec.node_name if up else None)
        for name in [n for n in judged if n not in cache]:
            del judged[name]
        return wanted <= {node for _, node in judged.values() if node}

    watch_until(core.list_namespaced_pod, ready, timeout, f"{len(wanted)} device-plugin stand-in pods to be Ready",
                namespace=NAMESPACE)


def is_replay(node: dict) -> bool:
    from ..vocab import KWOK_ANNOTATION

    return (node["metadata"].get("annotations") or {}).get(KWOK_ANNOTATION) == ANNOTATION_VALUE


def _rewrite(text: str, rec: Recording, uuids: list[str], host: str) -> str:
    for old, new in zip(rec.uuids, uuids):
        text = text.replace(old, new)
    return text.replace(f'"host": {json.dumps(rec.host)}', f'"host": {json.dumps(host)}')


def _rename_nodes(text: str, rec: Recording, nodes: tuple[str, ...]) -> str:
    """The recording's node names (whole words: in JSON strings and log lines alike) become ``nodes``, in order."""
    names = dict(zip(rec.nodes, nodes))
    if not names:
        return text
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")(?![\w.-])")
    return pattern.sub(lambda m: names[m.group(1)], text)


def slow_links(pool) -> set[tuple[str, str]]:
    """The pool's links (node pairs, sorted) with the fault ``replaySlowLink``."""
    names = pool.node_names()
    return {tuple(sorted((names[i], names[f.replay_slow_link]))) for i in range(pool.count)
            for f in pool.faults_for(i) if f.replay_slow_link is not None}


def fabric_pairs(pool) -> dict[str, tuple[tuple[str, str], str]]:
    """Pod ``-0`` of each fabric pair the suite's default schedule measures on ``pool``, and of each pair it may
    measure again after a slow link (either node with any other): pod name -> (the pair, sorted, as the suite orders
    its pods; ``slow`` or ``normal``)."""
    names = pool.node_names()
    slow = slow_links(pool)
    out: dict[str, tuple[tuple[str, str], str]] = {}
    for pairs in pair_rounds(names):
        for pair in pairs:
            out[f"{fabric_job(pair)}-0"] = (pair, "slow" if pair in slow else "normal")
    for link in sorted(slow):
        out.setdefault(f"{fabric_job(link)}-0", (link, "slow"))
        for node in link:
            for other in names:
                if other not in link:
                    pair = tuple(sorted((node, other)))
                    out.setdefault(f"{fabric_job(pair, again=True)}-0", (pair, "normal"))
    return out


def is_fabric(pod: str) -> bool:
    return pod.startswith("fab-")


def _pod_of(key: str) -> tuple[str, str | None]:
    """A :func:`node_logs` key -> (pod, its container, None for the pod's only one: ``workload`` or ``fabric``)."""
    pod, _, container = key.partition("/")
    return pod, container or None


def replayed(logs: dict[str, Path]) -> list[str]:
    """The pods kwok completes on replay nodes: those with a log, and rank 1's pod of each fabric pair."""
    pods = {_pod_of(k)[0] for k in logs}
    return sorted(pods | {p[:-2] + "-1" for p in pods if is_fabric(p) and p.endswith("-0")})


def node_logs(fleet, out: Path) -> dict[str, Path]:
    """Write every replay node's pod logs under ``out`` (the recordings with the node's identifiers), and the fabric
    pairs' (:func:`fabric_pairs`); pod name -> its log file, and for the access suite's pods, whose containers each
    have their own, :func:`log_key` (``<pod>/<container>``) -> the container's (under ``out/<pod>/``). Empty for a
    fleet without replay pools."""
    pools = [p for p in fleet.pools if p.backend == ANNOTATION_VALUE]
    if not pools:
        return {}
    recs = load()
    if recs is None:
        from ..errors import ControlPlaneError

        raise ControlPlaneError(f"replay pools need the recordings in {RECORDINGS}: record them with "
                                "`python -m gpuproof.sim.replay_record`")
    out.mkdir(parents=True, exist_ok=True)
    texts = {r.file: r.path.read_text() for r in recs.items}
    logs: dict[str, Path] = {}
    access = {kind: recs.of("access", kind) for kinds in ACCESS_PODS.values() for kind in kinds}
    for pool in pools:
        normal = recs.of("census")
        for i, node in enumerate(pool.node_names()):
            uuids = mock_uuids(f"{fleet.name}/{node}", pool.gpu.count)       # as a kubelet node's mock
            slow = any(f.replay_slow for f in pool.faults_for(i))
            chosen = {"health": recs.of("health")[i % len(recs.of("health"))],
                      "census": recs.of("census", "slow")[0] if slow else normal[i % len(normal)],
                      "probe": recs.of("probe")[i % len(recs.of("probe"))]}
            chosen["driver"] = chosen["probe"]          # the driver suite's probe: the same workload, probe.py
            for workload, pod in pod_names(node).items():
                rec = chosen[workload]
                path = out / f"{pod}.log"
                path.write_text(_rewrite(texts[rec.file], rec, uuids, pod))
                logs[pod] = path
            if not all(access.values()):        # recorded by `replay_record --access`
                continue
            for pod, containers in access_pods(node).items():
                (out / pod).mkdir(exist_ok=True)
                for container in containers:
                    rec = access[container][i % len(access[container])]
                    path = out / pod / f"{container}.log"
                    path.write_text(_rewrite(texts[rec.file], rec, uuids, pod))   # the containers share its host name
                    logs[log_key(pod, container)] = path
        fabric = {"normal": recs.of("fabric"), "slow": recs.of("fabric", "slow")}
        if not fabric["normal"] or pool.count < 2:
            continue
        for k, (pod, (pair, kind)) in enumerate(sorted(fabric_pairs(pool).items())):
            choice = fabric[kind] or fabric["normal"]
            rec = choice[k % len(choice)]
            uuids = mock_uuids(f"{fleet.name}/{pair[0]}", pool.gpu.count)       # rank 0's node's
            path = out / f"{pod}.log"
            path.write_text(_rename_nodes(_rewrite(texts[rec.file], rec, uuids, pod), rec, pair))
            logs[pod] = path
    return logs


def cluster_logs(logs: dict[str, Path]) -> list[dict]:
    """kwok's ClusterLogs documents, one per pod: its ``workload`` (fabric pods: ``fabric``) container's log is its
    file; a pod whose containers each have their own log (:func:`log_key`) gets a ``logs`` entry per container."""
    by_pod: dict[str, list[dict]] = {}
    for key, path in sorted(logs.items()):
        pod, container = _pod_of(key)
        by_pod.setdefault(pod, []).append(
            {"containers": [container or (FABRIC_CONTAINER if is_fabric(pod) else CONTAINER)],
             "logsFile": str(path), "follow": False})
    return [{"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs", "metadata": {"name": pod},
             "spec": {"selector": {"matchNames": [pod]}, "logs": entries}}
            for pod, entries in sorted(by_pod.items())]

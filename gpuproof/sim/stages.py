"""kwok Stage configuration: how pods on simulated nodes move through their lifecycle.

Pods become Running once bound, pods owned by a Job then complete, and deleted pods
go away (kwok plays the kubelet). One more stage relays the device plugin's refusals: where
NVIDIA's device plugin, asked over the mock NVML for 2 devices, refused (``failRequestsGreaterThanOne``),
a container asking for more than one of that resource fails admission as the kubelet fails it, with
the pod Failed, reason ``UnexpectedAdmissionError`` and the plugin's own error in the message. (MPS
pools, whose plugin cannot run here, get the refusal the plugin documents for MPS, marked as modelled.)

On replay nodes (gpuproof.sim.replay) gpuproof's workload pods whose recorded logs kwok serves (and rank 1's pod of
each replayed fabric pair) then complete as their container would: phase Succeeded, container terminated with exit
code 0; kwok's ``ClusterLogs`` documents (in the same config file) serve each such pod's log. A replay pool's
``replayLatency`` delays each of its pods' start and each replayed pod's end (kwok's Stage ``delay``), as a kubelet
and a workload take time. A gpuproof workload pod (label ``COMPONENT_LABEL``) no recording serves fails at once,
reason ``NoRecording``; other pods there run on, as on any kwok node.

Node stages are left to kwok's defaults (initialise, heartbeat).
"""

from __future__ import annotations

import json

import yaml

from .fleet import Fleet, ReplayLatency
from ..vocab import COMPONENT_LABEL, GPU, GPU_SHARED

_POD = {"apiGroup": "v1", "kind": "Pod"}
_NOT_DELETED = {"key": ".metadata.deletionTimestamp", "operator": "DoesNotExist"}
_NOT_STARTED = {"key": ".status.podIP", "operator": "DoesNotExist"}
_NOT_FINISHED = {"key": ".status.phase", "operator": "NotIn", "values": ["Failed", "Succeeded"]}

_RUNNING = """\
{{ $now := Now }}
conditions:
{{ range list "PodReadyToStartContainers" "Initialized" "Ready" "ContainersReady" }}
- type: {{ . }}
  status: "True"
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  started: true
  restartCount: 0
  state:
    running:
      startedAt: {{ $now | Quote }}
{{ end }}
initContainerStatuses:
{{ range .spec.initContainers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: true
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
phase: Running
startTime: {{ $now | Quote }}
"""

_SUCCEEDED = """\
{{ $now := Now }}
containerStatuses:
{{ range .spec.containers }}
- name: {{ .name | Quote }}
  image: {{ .image | Quote }}
  ready: false
  started: false
  restartCount: 0
  state:
    terminated:
      exitCode: 0
      reason: Completed
      startedAt: {{ $now | Quote }}
      finishedAt: {{ $now | Quote }}
{{ end }}
conditions:
- type: Ready
  status: "False"
  reason: PodCompleted
  lastTransitionTime: {{ $now | Quote }}
phase: Succeeded
"""


def _stage(name: str, match: list[dict], nxt: dict, weight: int = 0, delay_s: float = 0.0) -> dict:
    spec = {"resourceRef": _POD, "selector": {"matchExpressions": match}, "next": nxt}
    if weight:
        spec["weight"] = weight
    if delay_s > 0:         # kwok draws each pod's delay uniformly from [duration, jitter duration]
        ms = int(delay_s * 1000)
        spec["delay"] = {"durationMilliseconds": ms, "jitterDurationMilliseconds": int(ms * (1 + ReplayLatency.JITTER))}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def admission_refusal_message(plugin_error: str) -> str:
    """The kubelet's admission error for a device plugin's Allocate error (pkg/kubelet/cm/devicemanager)."""
    return f"Allocate failed due to {plugin_error}, which is unexpected"


# The device plugin's refusal for MPS (it always refuses more than one shared device there), in its words:
# internal/rm/allocate.go; the plugin itself cannot serve MPS here (it needs nvidia-cuda-mps-control).
_MPS_REFUSAL = ('rpc error: code = Unknown desc = invalid allocation request for "{resource}": invalid request: '
                'maximum request size for shared resources is 1; found 2 (gpuproof model: MPS)')


def _refusals(fleet: Fleet) -> dict[tuple[str, str], list[str]]:
    """(resource, kubelet message) -> nodes, from what NVIDIA's device plugin answered a request for 2."""
    out: dict[tuple[str, str], list[str]] = {}
    views = fleet.views or {}
    for pool in fleet.pools:
        ts = pool.time_slicing
        for i, name in enumerate(pool.node_names()):
            view = views.get((pool.name, i))
            for res in ((view.plugin or {}).get("resources", []) if view else []):
                error = (res.get("allocate") or {}).get("error")
                if error:
                    out.setdefault((res["name"], admission_refusal_message(error)), []).append(name)
            if view and view.plugin is None and ts and ts.strategy == "mps" and ts.replicas > 1:
                resource = GPU_SHARED if ts.rename_by_default else GPU
                message = admission_refusal_message(_MPS_REFUSAL.format(resource=resource))
                out.setdefault((resource, message), []).append(name)
    return out


# a gpuproof workload pod on a replay node that no recording serves: it fails at once, saying so (issue #52)
UNSERVED_REASON = "NoRecording"
UNSERVED_MESSAGE = ("replay node: no recording of this pod's workload (gpuproof.sim.replay serves gpuproof's per-node "
                    "workloads by their pod names; record this one, or keep its check off replay nodes)")


def _replay_pools(fleet: Fleet | None) -> list:
    return [p for p in (fleet.pools if fleet else []) if p.backend == "replay"]


def replay_stages(fleet: Fleet | None, replayed: list[str]) -> list[dict]:
    """Per replay pool: its pods start after the pool's start latency (weight 1: over ``pod-ready``), the replayed
    ones complete after its run latency, and a gpuproof workload pod (``COMPONENT_LABEL``) without a recording fails
    at once, naming why (weight 1: over ``pod-complete``, were it a Job's)."""
    out = []
    names = set(replayed)
    for pool in _replay_pools(fleet):
        nodes = pool.node_names()
        on_pool = {"key": ".spec.nodeName", "operator": "In", "values": nodes}
        lat = pool.replay_latency or ReplayLatency()
        if lat.start_s > 0:
            out.append(_stage(f"pod-replay-start-{pool.name}", [_NOT_DELETED, _NOT_STARTED, _NOT_FINISHED, on_pool],
                              {"statusTemplate": _RUNNING}, weight=1, delay_s=lat.start_s))
        running = [_NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Running"]}, on_pool]
        if names:
            out.append(_stage(f"pod-replay-complete-{pool.name}",
                              [*running, {"key": ".metadata.name", "operator": "In", "values": sorted(names)}],
                              {"statusTemplate": _SUCCEEDED}, weight=1, delay_s=lat.run_s))
        message = json.dumps(UNSERVED_MESSAGE)
        out.append(_stage(f"pod-replay-unserved-{pool.name}",
                          [*running, {"key": f'.metadata.labels.["{COMPONENT_LABEL}"]', "operator": "Exists"},
                           *([{"key": ".metadata.name", "operator": "NotIn", "values": sorted(names)}] if names
                             else [])],
                          {"statusTemplate": f"phase: Failed\nreason: {UNSERVED_REASON}\nmessage: {message}\n",
                           "event": {"type": "Warning", "reason": UNSERVED_REASON, "message": UNSERVED_MESSAGE}},
                          weight=1))
    return out


def pod_stages(fleet: Fleet | None, replayed: list[str] | None = None) -> list[dict]:
    """The pod Stages; ``replayed``: the pods whose recorded logs kwok serves (they complete once Running)."""
    stages = []
    for n, ((resource, message), nodes) in enumerate(sorted(_refusals(fleet).items()) if fleet else []):
        stages.append(_stage(
            f"refuse-shared-{resource.replace('/', '-').replace('.', '-')}-{n}",
            [_NOT_DELETED, _NOT_STARTED, _NOT_FINISHED,
             {"key": ".spec.nodeName", "operator": "In", "values": sorted(nodes)},
             {"key": f'.spec.containers.[].resources.limits.["{resource}"]', "operator": "In",
              "values": [str(n) for n in range(2, 257)]}],
            {"statusTemplate": f"phase: Failed\nreason: UnexpectedAdmissionError\nmessage: {json.dumps(message)}\n",
             "event": {"type": "Warning", "reason": "UnexpectedAdmissionError", "message": message}},
            weight=1,
        ))
    stages.append(_stage("pod-ready", [_NOT_DELETED, _NOT_STARTED, _NOT_FINISHED], {"statusTemplate": _RUNNING}))
    stages.append(_stage(
        "pod-complete",
        [_NOT_DELETED, {"key": ".status.phase", "operator": "In", "values": ["Running"]},
         {"key": ".metadata.ownerReferences.[].kind", "operator": "In", "values": ["Job"]}],
        {"statusTemplate": _SUCCEEDED},
    ))
    stages += replay_stages(fleet, replayed or [])
    stages.append(_stage("pod-delete", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
                         {"finalizers": {"empty": True}, "delete": True}))
    return stages


KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
    # kwok's default of 4 workers makes a 1,000-node fleet wait ~50 s for Ready; 64 brings it to ~11 s
    "options": {"nodePlayStageParallelism": 64, "podPlayStageParallelism": 16, "nodeLeaseParallelism": 64},
}


def kwok_config(fleet: Fleet | None, logs: dict | None = None) -> str:
    """kwok's --config: its options, the pod Stages, and a ClusterLogs per replayed pod (``logs``: pod -> file)."""
    from .replay import cluster_logs, replayed

    logs = logs or {}
    return yaml.safe_dump_all([KWOK_OPTIONS, *pod_stages(fleet, replayed(logs)), *cluster_logs(logs)],
                              sort_keys=False)

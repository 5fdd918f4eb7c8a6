"""kwok Stage configuration: how pods on simulated nodes move through their lifecycle.

Pods become Running once bound, pods owned by a Job then complete, and deleted pods
go away (kwok plays the kubelet). One more stage plays the device plugin: on nodes
whose time-slicing has ``failRequestsGreaterThanOne``, a container asking for more
than one shared GPU is refused at admission, as the real plugin does, with the pod
Failed and reason ``UnexpectedAdmissionError``.

Node stages are left to kwok's defaults (initialise, heartbeat).
"""

from __future__ import annotations

import json

import yaml

from ..fleet import GPU, GPU_SHARED, Fleet

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


def _stage(name: str, match: list[dict], nxt: dict, weight: int = 0) -> dict:
    spec = {"resourceRef": _POD, "selector": {"matchExpressions": match}, "next": nxt}
    if weight:
        spec["weight"] = weight
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def admission_refusal_message(resource: str, requested: str = "more than 1") -> str:
    return (f"Allocate failed due to rpc error: request for '{resource}: {requested}' too large: "
            "maximum request size for shared resources is 1, which is unexpected")


def pod_stages(fleet: Fleet | None) -> list[dict]:
    stages = []
    # nodes whose device plugin refuses shared requests > 1, by resource name
    refusing: dict[str, list[str]] = {}
    for pool in (fleet.pools if fleet else []):
        ts = pool.time_slicing
        if ts and ts.replicas > 1 and ts.fail_requests_greater_than_one:
            resource = GPU_SHARED if ts.rename_by_default else GPU
            refusing.setdefault(resource, []).extend(pool.node_names())
    for resource, nodes in sorted(refusing.items()):
        message = admission_refusal_message(resource)
        stages.append(_stage(
            f"refuse-shared-{resource.replace('/', '-').replace('.', '-')}",
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
    stages.append(_stage("pod-delete", [{"key": ".metadata.deletionTimestamp", "operator": "Exists"}],
                         {"finalizers": {"empty": True}, "delete": True}))
    return stages


KWOK_OPTIONS = {
    "apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
    # kwok's default of 4 workers makes a 1,000-node fleet wait ~50 s for Ready; 64 brings it to ~11 s
    "options": {"nodePlayStageParallelism": 64, "podPlayStageParallelism": 16, "nodeLeaseParallelism": 64},
}


def kwok_config(fleet: Fleet | None) -> str:
    return yaml.safe_dump_all([KWOK_OPTIONS, *pod_stages(fleet)], sort_keys=False)

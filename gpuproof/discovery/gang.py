"""The cluster's gang schedulers, found from its API, and what a gang may ask of them.

A gang scheduler is found by the API groups and resources the API server serves (API discovery: any authenticated
user may read it, no CRD list needed):

- ``kueue``: Kueue (``kueue.x-k8s.io`` ``clusterqueues`` and ``localqueues``, v1beta2 or v1beta1);
- ``volcano``: Volcano (``scheduling.volcano.sh`` ``podgroups``);
- ``kai``: NVIDIA's KAI scheduler (``scheduling.run.ai`` ``queues`` and ``podgroups``);
- ``workload-api``: Kubernetes' own gang scheduling, the Workload API (``scheduling.k8s.io/v1alpha1``
  ``workloads``, served where the API server runs with the ``GenericWorkload`` feature gate and that API enabled;
  kube-scheduler's ``GangScheduling`` plugin keeps a gang's pods at its Permit stage until ``minCount`` of them fit).

Where several are found the first of that order is taken, unless the user names one (``--gang-scheduler``). For
Kueue a run submits its Jobs to a LocalQueue of its own that points at a ClusterQueue: the user's
(``--gang-queue``), or the one the cluster has that admits the run's namespace (its ``namespaceSelector``; a
missing selector admits none) and has quota for the GPU resource (:func:`pick_cluster_queue`). gpuproof never
creates a ClusterQueue. :func:`admissible` is the most GPUs a ClusterQueue can admit at once: its nominal quota,
plus what it may borrow from its cohort.

Layer 2: kubernetes is imported only where the API is read (:func:`served`), so the names here are cheap to import.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .values import quantity

KUEUE, VOLCANO, KAI, WORKLOAD_API = "kueue", "volcano", "kai", "workload-api"
NAMES = (KUEUE, VOLCANO, KAI, WORKLOAD_API)          # the order one is taken in where several are found
TITLES = {KUEUE: "Kueue", VOLCANO: "Volcano", KAI: "NVIDIA's KAI scheduler",
          WORKLOAD_API: "Kubernetes' Workload API (GangScheduling)"}
# name -> (API group, the resources that show it, the versions gpuproof can write, newest first; () = any)
SIGNS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    KUEUE: ("kueue.x-k8s.io", ("clusterqueues", "localqueues"), ("v1beta2", "v1beta1")),
    VOLCANO: ("scheduling.volcano.sh", ("podgroups",), ()),
    KAI: ("scheduling.run.ai", ("queues", "podgroups"), ()),
    WORKLOAD_API: ("scheduling.k8s.io", ("workloads",), ("v1alpha1",)),
}
# the label that puts a Job in a Kueue LocalQueue (sigs.k8s.io/kueue pkg/controller/constants QueueLabel)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclasses.dataclass(frozen=True)
class Found:
    """One gang scheduler the API server shows."""

    name: str                 # one of NAMES
    version: str              # the group/version gpuproof writes to (or the first that shows it)
    evidence: str             # what was seen: "kueue.x-k8s.io/v1beta2 serves clusterqueues, localqueues"

    @property
    def title(self) -> str:
        return TITLES[self.name]

    def __str__(self) -> str:
        return f"{self.title} ({self.evidence})"


def served(cluster) -> dict[str, set[str]]:
    """group/version -> the resources it serves, for the API groups of the gang schedulers gpuproof knows (one
    discovery request per version of those groups; no permission needed beyond being authenticated)."""
    from kubernetes import client as k8s
    from kubernetes.client.exceptions import ApiException

    groups = {sign[0] for sign in SIGNS.values()}
    out: dict[str, set[str]] = {}
    for g in k8s.ApisApi(cluster.api).get_api_versions().groups or []:
        if g.name not in groups:
            continue
        for v in g.versions or []:
            try:
                found = k8s.CustomObjectsApi(cluster.api).get_api_resources(g.name, v.version)
            except ApiException as exc:
                if exc.status in (404, 503):        # listed, but not served now (an aggregated API away)
                    continue
                raise
            out[v.group_version] = {r.name for r in found.resources or [] if "/" not in r.name}
    return out


def find(served_apis: dict[str, set[str]]) -> list[Found]:
    """The gang schedulers the served APIs show, in the order of :data:`NAMES`: each one's resources served by its
    group, in one version or across several (the KAI scheduler serves its queues at v2, its podgroups at v2alpha2).
    Its version is the newest gpuproof writes that serves them all, else the first that does, else the first."""
    out = []
    for name in NAMES:
        group, resources, versions = SIGNS[name]
        gvs = {gv: set(res) & set(resources) for gv, res in sorted(served_apis.items()) if gv.split("/")[0] == group}
        if not set(resources) <= set().union(*gvs.values()):
            continue
        whole = [gv for gv, res in gvs.items() if res == set(resources)]
        usable = [f"{group}/{v}" for v in versions if f"{group}/{v}" in whole]
        gv = (usable or whole or [g for g, res in gvs.items() if res])[0]
        out.append(Found(name, gv, "; ".join(f"{g} serves {', '.join(r for r in resources if r in res)}"
                                             for g, res in gvs.items() if res)))
    return out


def choose(found: list[Found], wanted: str | None) -> tuple[Found | None, str]:
    """(the gang scheduler to test, '') or (None, why none): the one named by ``wanted`` (``--gang-scheduler``), or
    the first found."""
    if wanted and wanted != "auto":
        hit = next((f for f in found if f.name == wanted), None)
        if hit is None:
            group, resources, _ = SIGNS[wanted]
            return None, (f"--gang-scheduler={wanted}: the API server does not serve {group} "
                          f"{', '.join(resources)} ({TITLES[wanted]} is not installed)")
        return hit, ""
    if not found:
        return None, ("no gang scheduler in the cluster: the API server serves none of Kueue's, Volcano's or the KAI "
                      "scheduler's APIs, nor Kubernetes' Workload API (scheduling.k8s.io/v1alpha1 workloads)")
    return found[0], ""


def check_name(value: str) -> None:
    """``--gang-scheduler``'s check: auto or one of :data:`NAMES` (raises ValueError naming them)."""
    if value not in ("auto", *NAMES):
        raise ValueError(f"--gang-scheduler takes auto, {', '.join(NAMES)}; got {value!r}")


def version_supported(f: Found) -> bool:
    """Whether gpuproof writes the version the scheduler is found at (Kueue v1beta2/v1beta1, Workload v1alpha1)."""
    versions = SIGNS[f.name][2]
    return not versions or f.version.split("/")[1] in versions


# ---------------------------------------------------------------------------- Kueue's ClusterQueues


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """Whether a label selector (``matchLabels``, ``matchExpressions``) selects these labels; a missing selector
    selects nothing (Kueue's namespaceSelector), an empty one everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
            return False
    return True


def _quotas(cq: dict, resource: str) -> list[dict]:
    """The ``resources`` entries naming ``resource`` in every flavor of the ClusterQueue's resource groups."""
    return [r for group in (cq.get("spec") or {}).get("resourceGroups") or []
            for flavor in group.get("flavors") or [] for r in flavor.get("resources") or []
            if r.get("name") == resource]


def nominal_quota(cq: dict, resource: str) -> int | None:
    """The ClusterQueue's nominal quota of ``resource``, summed over its flavors; None where it covers none."""
    quotas = _quotas(cq, resource)
    if not quotas:
        return None
    return int(sum(quantity(r.get("nominalQuota", 0)) or 0 for r in quotas))


def cohort(cq: dict) -> str:
    """The cohort a ClusterQueue borrows in (v1beta2 ``cohortName``, v1beta1 ``cohort``); '' for none."""
    spec = cq.get("spec") or {}
    return str(spec.get("cohortName") or spec.get("cohort") or "")


def admissible(cq: dict, all_cqs: list[dict], resource: str) -> int:
    """The most of ``resource`` the ClusterQueue can admit at once: its nominal quota, plus what its cohort's other
    ClusterQueues hold (bounded by its ``borrowingLimit`` where one is set). An upper bound: lending limits and
    other workloads' usage can only make it less."""
    own = nominal_quota(cq, resource) or 0
    team = cohort(cq)
    if not team:
        return own
    others = sum(nominal_quota(o, resource) or 0 for o in all_cqs
                 if o is not cq and o["metadata"]["name"] != cq["metadata"]["name"] and cohort(o) == team)
    limits = [quantity(r["borrowingLimit"]) for r in _quotas(cq, resource) if r.get("borrowingLimit") is not None]
    borrow = min(others, int(sum(x or 0 for x in limits))) if limits and len(limits) == len(_quotas(cq, resource)) \
        else others
    return own + borrow


def _stopped(cq: dict) -> str:
    spec = cq.get("spec") or {}
    if spec.get("stopPolicy") not in (None, "", "None"):
        return f"stopped (stopPolicy {spec['stopPolicy']})"
    for c in (cq.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Active" and c.get("status") == "False":
            return f"not active ({c.get('reason')}: {c.get('message')})"
    return ""


def pick_cluster_queue(cqs: list[dict], namespace_labels: dict[str, str], resource: str,
                       wanted: str | None = None) -> tuple[dict | None, str]:
    """(the ClusterQueue a run's LocalQueue points at, '') or (None, why none fits): ``wanted`` by name, or the
    first by name that admits a namespace with these labels, is active and has nominal quota for ``resource``."""
    if wanted:
        cq = next((c for c in cqs if c["metadata"]["name"] == wanted), None)
        if cq is None:
            return None, f"--gang-queue={wanted}: no ClusterQueue of that name (the cluster has " \
                         f"{', '.join(sorted(c['metadata']['name'] for c in cqs)) or 'none'})"
        why = _unfit(cq, namespace_labels, resource)
        return (None, f"--gang-queue={wanted}: {why}") if why else (cq, "")
    reasons = []
    for cq in sorted(cqs, key=lambda c: c["metadata"]["name"]):
        why = _unfit(cq, namespace_labels, resource)
        if not why:
            return cq, ""
        reasons.append(f"{cq['metadata']['name']}: {why}")
    return None, ("no Kueue ClusterQueue takes the run's Jobs" + (f" ({'; '.join(reasons)})" if reasons
                                                                  else ": the cluster has none"))


def _unfit(cq: dict, namespace_labels: dict[str, str], resource: str) -> str:
    """Why the ClusterQueue cannot take the run's gang ('' when it can)."""
    if not selector_matches((cq.get("spec") or {}).get("namespaceSelector"), namespace_labels):
        return "its namespaceSelector does not admit the run's namespace"
    if not nominal_quota(cq, resource):
        return f"no quota for {resource}"
    return _stopped(cq)


def job_state(job: Any) -> dict[str, Any]:
    """What a batch/v1 Job's spec and status say, from API JSON or the client's model: suspend, active, succeeded,
    failed, and its conditions that hold (type -> message)."""
    if not isinstance(job, dict):
        job = job.to_dict()
        spec, status = job.get("spec") or {}, job.get("status") or {}
    else:
        spec, status = job.get("spec") or {}, job.get("status") or {}
    conditions = {c.get("type"): c.get("message") or c.get("reason") or "" for c in status.get("conditions") or []
                  if c.get("status") == "True"}
    return {"suspend": bool(spec.get("suspend")), "active": int(status.get("active") or 0),
            "succeeded": int(status.get("succeeded") or 0), "failed": int(status.get("failed") or 0),
            "conditions": conditions}

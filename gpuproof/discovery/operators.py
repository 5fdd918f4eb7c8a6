"""The cluster's training operators (Kubeflow Trainer, JobSet, KubeRay), found from its API, and what the
``operators`` suite judges of each: its pods, its CRDs, its webhooks.

Which operators gpuproof knows, and the one thing it cannot read from a cluster (an object each one's webhook
refuses), is data: ``operators.yaml`` beside this module. The rest comes from the cluster: an operator is
installed where its CRD is; its CRDs are every CRD of that CRD's API group; its webhooks are those on that group of the
Mutating- and ValidatingWebhookConfigurations about that group (most of their webhooks name it: Kueue's also name
JobSet's and Trainer's groups, and are Kueue's); its pods are those the webhooks'
Services select (the catalog's label selector where no webhook names a Service), so a controller in any namespace,
installed by any chart, is found.

Layer 2: reads the API through the client it is given; imports nothing of the pytest side.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

CATALOG_FILE = Path(__file__).with_name("operators.yaml")


@dataclasses.dataclass(frozen=True)
class Known:
    """An operator of the catalog."""

    name: str
    title: str
    crd: str                          # the CRD that shows it is installed
    pods: str = ""                    # label selector of its pods where no webhook Service names them
    invalid: dict | None = None       # an object its webhook refuses (dry run)
    reason: tuple[str, ...] = ()      # words of that refusal, each of them
    runtime: str = ""                 # Kubeflow Trainer: the ClusterTrainingRuntime a TrainJob uses
    upstream: bool = False            # the operator upstream's conformance test names

    @property
    def group(self) -> str:
        return self.crd.split(".", 1)[1]


@lru_cache(maxsize=1)
def catalog() -> tuple[Known, ...]:
    fields = {f.name for f in dataclasses.fields(Known)}
    return tuple(Known(**{k: tuple(v) if k == "reason" else v for k, v in raw.items() if k in fields})
                 for raw in yaml.safe_load(CATALOG_FILE.read_text()))


def catalog_by_name() -> dict[str, Known]:
    return {k.name: k for k in catalog()}


@dataclasses.dataclass(frozen=True)
class Webhook:
    configuration: str                # "ValidatingWebhookConfiguration kubeflow-trainer-validating-..."
    name: str                         # the webhook's own name
    service: str                      # "namespace/name", or "url <url>"
    has_ca: bool
    rules: tuple[str, ...]            # "trainer.kubeflow.org/trainjobs CREATE,UPDATE"
    validating: bool
    side_effects: str = "None"
    failure_policy: str = "Fail"

    def __str__(self) -> str:
        return f"{self.name} ({self.configuration}, service {self.service})"


@dataclasses.dataclass(frozen=True)
class Pod:
    name: str
    namespace: str
    node: str
    phase: str
    ready: bool
    restarts: int
    waiting: str = ""                 # a container's waiting reason (CrashLoopBackOff ...)

    def __str__(self) -> str:
        state = "Ready" if self.ready else f"{self.phase}, not Ready" + (f" ({self.waiting})" if self.waiting else "")
        return f"{self.namespace}/{self.name} on {self.node or 'no node'}: {state}" + \
            (f", {self.restarts} restart(s)" if self.restarts else "")


@dataclasses.dataclass(frozen=True)
class Crd:
    name: str
    established: bool
    why: str = ""                     # the Established condition's message where it is not True
    versions: tuple[str, ...] = ()    # served versions


@dataclasses.dataclass
class Operator:
    """One installed operator, as the cluster shows it."""

    known: Known
    crds: list[Crd]
    webhooks: list[Webhook]
    pods: list[Pod]
    selectors: list[str]              # where its pods were looked for ("kubeflow-system/app=...")

    @property
    def name(self) -> str:
        return self.known.name

    def version_of(self, kind_crd: str) -> str:
        """The newest served version of one of its CRDs (by name)."""
        crd = next((c for c in self.crds if c.name == kind_crd), None)
        return crd.versions[0] if crd and crd.versions else ""


def _established(crd) -> tuple[bool, str]:
    cond = next((c for c in (crd.status.conditions or []) if c.type == "Established"), None) if crd.status else None
    return (cond is not None and cond.status == "True",
            "no Established condition" if cond is None else f"Established={cond.status}: {cond.message or ''}")


def _own_group(groups: list[set[str]]) -> str:
    """The API group a webhook configuration is about: the one most of its webhooks name, Kubernetes' own groups
    left out ("", apps, batch, ``*.k8s.io`` but ``*.x-k8s.io``), or "" on a tie. Kueue's configuration names
    JobSet's and Trainer's groups too (it queues their jobs), but most of its webhooks are on Kueue's own."""
    counts: dict[str, int] = {}
    for gs in groups:
        for g in gs:
            if "." in g and not (g.endswith(".k8s.io") and not g.endswith(".x-k8s.io")):
                counts[g] = counts.get(g, 0) + 1
    if not counts:
        return ""
    top = max(counts.values())
    best = [g for g, n in counts.items() if n == top]
    return best[0] if len(best) == 1 else ""


def _webhooks(adm, group: str) -> list[Webhook]:
    """The webhooks on ``group`` of the configurations that are about it (:func:`_own_group`)."""
    out = []
    for validating, lister in ((False, adm.list_mutating_webhook_configuration),
                               (True, adm.list_validating_webhook_configuration)):
        kind = "ValidatingWebhookConfiguration" if validating else "MutatingWebhookConfiguration"
        for cfg in lister().items:
            hooks = cfg.webhooks or []
            if _own_group([{g for r in w.rules or [] for g in r.api_groups or []} for w in hooks]) != group:
                continue
            for w in hooks:
                rules = [r for r in w.rules or [] if group in (r.api_groups or [])]
                if not rules:
                    continue
                cc = w.client_config
                where = f"{cc.service.namespace}/{cc.service.name}" if cc.service else f"url {cc.url}"
                out.append(Webhook(
                    f"{kind} {cfg.metadata.name}", w.name, where, bool(cc.ca_bundle),
                    tuple(f"{group}/{','.join(r.resources or [])} {','.join(r.operations or [])}" for r in rules),
                    validating, w.side_effects or "", w.failure_policy or "Fail"))
    return out


def _pod(p) -> Pod:
    statuses = p.status.container_statuses or []
    waiting = next((s.state.waiting.reason for s in statuses if s.state and s.state.waiting), "") or ""
    ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
    return Pod(p.metadata.name, p.metadata.namespace, p.spec.node_name or "", p.status.phase or "", ready,
               sum(s.restart_count or 0 for s in statuses), waiting)


def _pods(core, webhooks: list[Webhook], fallback: str) -> tuple[list[Pod], list[str]]:
    """The pods behind the webhooks' Services (each Service's selector), else those of ``fallback`` anywhere."""
    pods: dict[tuple[str, str], Pod] = {}
    selectors = []
    from kubernetes.client.exceptions import ApiException

    for svc in sorted({w.service for w in webhooks if not w.service.startswith("url ")}):
        ns, name = svc.split("/", 1)
        try:
            spec = core.read_namespaced_service(name, ns).spec
        except ApiException as exc:
            if exc.status == 404:
                selectors.append(f"{svc} (no such Service)")
                continue
            raise
        selector = ",".join(f"{k}={v}" for k, v in sorted((spec.selector or {}).items()))
        selectors.append(f"{ns}/{selector}" if selector else f"{svc} (a Service without a selector)")
        if selector:
            for p in core.list_namespaced_pod(ns, label_selector=selector).items:
                pods[(ns, p.metadata.name)] = _pod(p)
    if not selectors and fallback:
        selectors.append(f"*/{fallback}")
        for p in core.list_pod_for_all_namespaces(label_selector=fallback).items:
            pods[(p.metadata.namespace, p.metadata.name)] = _pod(p)
    return [pods[k] for k in sorted(pods)], selectors


def find(api: Any, core: Any) -> list[Operator]:
    """The catalog's operators the cluster has (``api``: a kubernetes ApiClient; ``core``: its CoreV1Api)."""
    from kubernetes import client as k8s

    crds = k8s.ApiextensionsV1Api(api).list_custom_resource_definition().items
    names = {c.metadata.name for c in crds}
    adm = k8s.AdmissionregistrationV1Api(api)
    found = []
    for known in catalog():
        if known.crd not in names:
            continue
        mine = []
        for c in sorted((c for c in crds if c.spec.group == known.group), key=lambda c: c.metadata.name):
            ok, why = _established(c)
            served = tuple(v.name for v in c.spec.versions if v.served)
            mine.append(Crd(c.metadata.name, ok, "" if ok else why, served))
        hooks = _webhooks(adm, known.group)
        pods, selectors = _pods(core, hooks, known.pods)
        found.append(Operator(known, mine, hooks, pods, selectors))
    return found


def refusal_matches(known: Known, message: str) -> bool:
    """Whether an API error's message is the webhook's own refusal (upstream: "denied the request"; gpuproof also
    wants the operator's words, so a refusal by the CRD's schema or another webhook does not count)."""
    return "denied the request" in message and all(words in message for words in known.reason)

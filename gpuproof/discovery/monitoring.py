"""Does a node's DCGM exporter publish every GPU the node has? Judged from its ``/metrics`` text (no cluster access:
``gpuproof/cluster/dcgm.py`` reads it, ``gpuproof/plugin/monitoring_checks.py`` runs the suite's work).

The exporter's output is read by ``workloads/dcgm_series.py`` (both host label spellings, classic and DCGM 4.7 names
with their units, blank sentinels as absent, pod attribution); here it is held against what gpuproof knows of the node
(:class:`NodeFacts`: its name, its GPUs by count or by UUID in NVML index order, MIG or not). The rules, each a check
of the monitoring suite (facts and sources: the project's reference ``dcgm-exporter.md`` §2.2-2.6):

- ``dcgm-gpu-utilization``: every GPU has a utilization series: ``DCGM_FI_DEV_GPU_UTIL`` (or 4.9's
  ``..._GPU_UTIL_RATIO``; ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` where a counters file leaves GPU_UTIL out). A GPU in MIG
  mode has no GPU_UTIL by design: each of its instances (``GPU_I_ID``) needs the profiling series
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` instead, and a node whose MIG devices gpuproof counted needs that many;
- ``dcgm-gpu-memory``: every GPU has a framebuffer series (``FB_USED`` or ``FB_FREE``, MiB or 4.9's bytes); on a MIG
  GPU, on the GPU or any of its instances;
- ``dcgm-host-label``: the host label (``hostname``, before 4.6.0-4.8.3 ``Hostname``) equals the node name. The
  exporter writes its pod's name there when ``NODE_NAME`` is not set (a hand-rolled DaemonSet, pre-3.1.6 charts);
- ``dcgm-metrics-parse``: the text parses strictly (a malformed line fails, naming it).

GPUs are named ``GPU <index> (<UUID>)``: by the UUIDs gpuproof knows (DRA's ResourceSlices), else by index
``0..count-1`` as the exporter's ``gpu`` label numbers them. Through Prometheus (:func:`judge_prometheus`): each GPU
the exporter published reaches it, and a GPU the exporter attributes to a pod carries that ``pod`` there too (a
ServiceMonitor without ``honorLabels: true`` leaves it as ``exported_pod``, with ``pod`` the exporter's own).

``ai_service_metrics`` (:func:`judge_service_metrics`, check ``ai-service-metrics``): gpuproof's inference server
(``workloads/inference_server.py``, whose ``/metrics`` speaks the Prometheus text format to a scraper) reaches the
cluster's Prometheus, and after N requests its ``gpuproof_inference_requests_total`` reads N there; when it has no
series, the reason is Prometheus' own word on its target (down with its scrape error, or no target at all).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from types import ModuleType

from .. import package_folder

CHECKS = ("dcgm-metrics-parse", "dcgm-gpu-utilization", "dcgm-gpu-memory", "dcgm-host-label")
PROMETHEUS_CHECKS = ("prometheus-gpu-series", "prometheus-pod-label")
WORK_CHECKS = ("dcgm-pod-attribution", "dcgm-utilization-moves")
UTILIZATION = ("gpu_util_pct", "gr_engine_active")        # dcgm_series quantities, the first preferred
MIG_UTILIZATION = ("gr_engine_active",)
MEMORY = ("fb_used_mib", "fb_free_mib")
EXPORTED = ("exported_pod", "exported_namespace", "exported_container")


def series() -> ModuleType:
    """``workloads/dcgm_series.py``, the one module every reader of the exporter uses (the same module object as
    ``gpuproof.bench.workloads.import_workload('dcgm_series')``: the folder is appended to sys.path the same way)."""
    folder = str(package_folder("_workloads"))
    if folder not in sys.path:
        sys.path.append(folder)
    return importlib.import_module("dcgm_series")


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What gpuproof knows of a node's GPUs."""
    name: str
    gpus: int | None = None                 # physical GPUs (None: unknown)
    uuids: tuple[str, ...] = ()             # their UUIDs in NVML index order, where known
    mig: bool = False                       # the node partitions GPUs with MIG
    mig_instances: int | None = None        # MIG devices the node advertises (None: unknown)


def facts_of(node) -> NodeFacts:
    """What gpuproof knows of a GpuNode's GPUs: their UUIDs where DRA's ResourceSlices name them (in NVML index
    order), else their count (GFD's gpu.count counts MIG devices under the single strategy: not GPUs then)."""
    whole = sorted((d for d in node.dra_devices if d.type == "gpu" and d.uuid),
                   key=lambda d: int(d.attributes.get("index", 0) or 0))
    gpus = node.physical_count
    if gpus is None and node.mig_strategy != "single":
        gpus = node.count_label
    mig = node.mig_strategy != "none"
    instances = sum(node.mig_resources.values()) if node.mig_resources else (
        node.count_label if node.mig_strategy == "single" else None)
    return NodeFacts(node.name, gpus, tuple(d.uuid for d in whole), mig, instances if mig else None)


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    verdict: str            # pass, fail or skip
    node: str
    gpu: str = ""           # "GPU 0 (GPU-...)", "" for the whole node
    expected: str = ""
    actual: str = ""
    reason: str = ""

    @property
    def detail(self) -> str:
        where = f"{self.gpu}: " if self.gpu else ""
        if self.verdict == "skip":
            return f"{where}{self.reason}"
        text = f"{where}{self.check}: expected {self.expected}, actual {self.actual}"
        return f"{text} ({self.reason})" if self.reason else text

    @property
    def message(self) -> str:
        return f"{self.node}: {self.detail}"


@dataclasses.dataclass
class _Gpu:
    index: str
    uuid: str | None
    readings: list = dataclasses.field(default_factory=list)

    def has(self, quantities, mig: bool | None = None) -> list:
        return [r for r in self.readings if r.quantity in quantities and (mig is None or bool(r.mig) == mig)]

    @property
    def instances(self) -> list[str]:
        return sorted({r.mig[1] for r in self.readings if r.mig}, key=lambda i: (len(i), i))


def _gpus(readings) -> dict[tuple[str, str | None], _Gpu]:
    out: dict[tuple[str, str | None], _Gpu] = {}
    for r in readings:
        out.setdefault((r.gpu, r.uuid), _Gpu(r.gpu, r.uuid)).readings.append(r)
    return out


def _name(index: str | None, uuid: str | None) -> str:
    return f"GPU {index if index not in (None, '') else '?'} ({uuid or 'UUID not published'})"


def _expected(facts: NodeFacts, seen: dict) -> list[tuple[str, str | None, _Gpu | None]]:
    """(index, uuid, the GPU in the output or None) for every GPU the node has."""
    by_uuid = {g.uuid: g for g in seen.values() if g.uuid}
    by_index = {g.index: g for g in seen.values() if g.index != ""}
    if facts.uuids:
        out = []
        for i, uuid in enumerate(facts.uuids):
            g = by_uuid.get(uuid)
            out.append((g.index if g else str(i), uuid, g))
        return out
    if facts.gpus is not None:
        return [(str(i), by_index[str(i)].uuid if str(i) in by_index else None, by_index.get(str(i)))
                for i in range(facts.gpus)]
    return [(g.index, g.uuid, g) for g in sorted(seen.values(), key=lambda g: (len(g.index), g.index))]


def _unplaced(samples) -> str:
    """What the output holds that names no GPU (a label left empty), for a missing GPU's actual."""
    n = sum(1 for s in samples if not s.labels.get("gpu") and not (s.labels.get("UUID") or s.labels.get("uuid")))
    return f"; {n} series name no GPU (labels gpu and UUID empty)" if n else ""


def judge(facts: NodeFacts, text: str, exporter_pod: str = "") -> list[Finding]:
    """Every finding on one node's exporter output: a parse failure alone, else utilization and memory per GPU and
    the host label. ``exporter_pod``: the exporter pod's name, said when the host label is it."""
    dcgm = series()
    node = facts.name
    try:
        samples = dcgm.parse(text)
    except dcgm.MetricsError as exc:
        return [Finding("dcgm-metrics-parse", "fail", node, expected="the Prometheus text format",
                        actual=str(exc))]
    readings = dcgm.readings(samples)
    out = [Finding("dcgm-metrics-parse", "pass", node, expected="the Prometheus text format",
                   actual=f"{len(samples)} samples")]
    seen = _gpus(r for r in readings if r.gpu or r.uuid)
    expected = _expected(facts, seen)
    if not expected:
        out += [Finding(c, "fail", node, expected="series of at least one GPU",
                        actual=f"none in {len(samples)} samples{_unplaced(samples)}")
                for c in ("dcgm-gpu-utilization", "dcgm-gpu-memory")]
    mig_found = 0
    for index, uuid, g in expected:
        name = _name(index, uuid)
        if g is None:
            actual = f"no series for this GPU{_unplaced(samples)}"
            out += [Finding("dcgm-gpu-utilization", "fail", node, name, "a utilization series", actual),
                    Finding("dcgm-gpu-memory", "fail", node, name, "a framebuffer series", actual)]
            continue
        out.append(_utilization(facts, g, name))
        mig_found += len({r.mig[1] for r in g.has(MIG_UTILIZATION, True)})
        mem = sorted(g.has(MEMORY), key=lambda r: MEMORY.index(r.quantity))      # FB_USED first
        out.append(Finding("dcgm-gpu-memory", "pass" if mem else "fail", node, name,
                           "a framebuffer series (FB_USED or FB_FREE)",
                           f"{mem[0].name} = {mem[0].value:g} MiB" if mem else
                           f"none among {sorted({r.name for r in g.readings})}",
                           "" if mem or not g.instances else "DCGM publishes no FB_* per MIG instance on some GPUs "
                                                             "(dcgm-exporter #512)"))
    if facts.mig and facts.mig_instances is not None and expected:
        ok = mig_found >= facts.mig_instances
        out.append(Finding("dcgm-gpu-utilization", "pass" if ok else "fail", node, "",
                           f"{facts.mig_instances} MIG instances with DCGM_FI_PROF_GR_ENGINE_ACTIVE (the node's MIG "
                           "devices)", f"{mig_found}"))
    out.append(_host(facts, readings, exporter_pod))
    return out


def _utilization(facts: NodeFacts, g: _Gpu, name: str) -> Finding:
    node = facts.name
    if g.instances:          # a GPU in MIG mode: a profiling series per instance
        have = {r.mig[1] for r in g.has(MIG_UTILIZATION, True)}
        lacking = [i for i in g.instances if i not in have]
        return Finding("dcgm-gpu-utilization", "fail" if lacking else "pass", node, name,
                       "DCGM_FI_PROF_GR_ENGINE_ACTIVE per MIG instance (GPU_I_ID)",
                       f"instances {', '.join(g.instances)}: lacking on {', '.join(lacking)}" if lacking else
                       f"instances {', '.join(g.instances)}", "GPU_UTIL is not published per MIG instance")
    for quantity in UTILIZATION:
        if rs := g.has((quantity,), False):
            return Finding("dcgm-gpu-utilization", "pass", node, name, "a utilization series",
                           f"{rs[0].name} = {rs[0].value:g}" + (" %" if quantity == "gpu_util_pct" else ""))
    why = "a MIG node whose GPU publishes no instance series" if facts.mig else ""
    return Finding("dcgm-gpu-utilization", "fail", node, name,
                   "a utilization series (DCGM_FI_DEV_GPU_UTIL or _RATIO, or DCGM_FI_PROF_GR_ENGINE_ACTIVE)",
                   f"none among {sorted({r.name for r in g.readings})}", why)


def _host(facts: NodeFacts, readings, exporter_pod: str) -> Finding:
    hosts = sorted({r.host or "" for r in readings})
    expected = f"hostname (or Hostname) = {facts.name!r} on every series"
    if hosts == [facts.name]:
        return Finding("dcgm-host-label", "pass", facts.name, expected=expected, actual=repr(facts.name))
    shown = ", ".join(repr(h) if h else "(missing or empty)" for h in hosts) or "(no series)"
    reason = ""
    if exporter_pod and exporter_pod in hosts:
        reason = "the exporter pod's own name: its NODE_NAME is not set from spec.nodeName"
    elif "" in hosts:
        reason = "no host label: the exporter runs with -n/DCGM_EXPORTER_NO_HOSTNAME, or writes it empty"
    return Finding("dcgm-host-label", "fail", facts.name, expected=expected, actual=shown, reason=reason)


def exporter_info(text: str) -> dict:
    """What the output says of the exporter: its name set, host label spelling, the releases those fit, and the
    driver label's value (empty when it does not parse)."""
    dcgm = series()
    try:
        samples = dcgm.parse(text)
    except dcgm.MetricsError:
        return {}
    drivers = sorted({d for s in samples if (d := dcgm.label(s.labels, "driver"))})
    return {**dcgm.flavour(samples), "driver": ",".join(drivers)}


def attributed(text: str) -> dict[str, tuple[str, str, str]]:
    """GPU UUID -> (namespace, pod, container) the exporter attributes it to (GPUs no pod holds left out)."""
    dcgm = series()
    return {r.uuid: r.pod for r in dcgm.readings(dcgm.parse(text)) if r.uuid and r.pod}


def published(text: str) -> list[str]:
    """The UUIDs of the GPUs the exporter publishes a utilization series for."""
    dcgm = series()
    return sorted({r.uuid for r in dcgm.readings(dcgm.parse(text)) if r.uuid and r.quantity in UTILIZATION})


def samples_from_query(result: list[dict]) -> list:
    """A Prometheus instant query's ``data.result`` (vector) as dcgm_series samples."""
    dcgm = series()
    out = []
    for i, row in enumerate(result):
        metric = dict(row["metric"])
        name = metric.pop("__name__", "")
        out.append(dcgm.Sample(name, metric, float(row["value"][1]), i + 1))
    return out


def judge_prometheus(node: str, exporter_text: str, stored: list) -> list[Finding]:
    """The exporter's series as Prometheus stores them (``stored``: dcgm_series samples of this node's exporter,
    from a query or a federate text) against what the exporter itself published (``exporter_text``): every GPU
    with a utilization series reaches Prometheus, and where the exporter attributes a GPU to a pod, Prometheus has
    that pod in ``pod`` (not in ``exported_pod``, which a ServiceMonitor without ``honorLabels: true`` leaves)."""
    dcgm = series()
    mine = dcgm.readings(dcgm.parse(exporter_text))
    theirs = dcgm.readings(stored)
    pods = attributed(exporter_text)
    out = []
    gpus = sorted({(r.gpu, r.uuid) for r in mine if r.quantity in UTILIZATION}, key=lambda g: (len(g[0]), g))
    for index, uuid in gpus:
        name = _name(index, uuid)
        rows = [r for r in theirs if r.uuid == uuid and r.quantity in UTILIZATION]
        out.append(Finding("prometheus-gpu-series", "pass" if rows else "fail", node, name,
                           "the exporter's utilization series in Prometheus",
                           f"{len(rows)} series" if rows else "none"))
        want = pods.get(uuid)
        if want is None or not rows:
            continue
        r = rows[0]
        got = (dcgm.label(r.labels, "namespace") or "", r.labels.get("pod", ""), r.labels.get("container", ""))
        exported = {k: r.labels[k] for k in EXPORTED if k in r.labels}
        ok = got[:2] == want[:2] and not exported
        shown = f"pod={got[0]}/{got[1]}" + (f", {', '.join(f'{k}={v}' for k, v in sorted(exported.items()))}"
                                            if exported else "")
        out.append(Finding("prometheus-pod-label", "pass" if ok else "fail", node, name,
                           f"pod={want[0]}/{want[1]} (the pod the exporter attributes the GPU to)", shown,
                           "" if ok or not exported else
                           "the scrape does not honor the exporter's labels: a ServiceMonitor without "
                           "honorLabels: true (kube-prometheus-stack's default for dcgm-exporter)"))
    return out


# ------------------------------------------------------------------ the numbers move with the work

def holding(readings, namespace: str, pod: str) -> list[tuple[str, str | None]]:
    """(index, UUID) of the GPUs whose series the exporter attributes to the pod ``namespace/pod``."""
    return sorted({(r.gpu, r.uuid) for r in readings if r.pod and r.pod[:2] == (namespace, pod)},
                  key=lambda g: (len(g[0]), g))


def _util(readings, gpu: tuple[str, str | None]) -> tuple[str, float] | None:
    """The GPU's whole-GPU utilization reading (quantity, value), the first of UTILIZATION it publishes."""
    index, uuid = gpu
    mine = [r for r in readings if not r.mig and ((uuid and r.uuid == uuid) or (not uuid and r.gpu == index))]
    for quantity in UTILIZATION:
        if rs := [r for r in mine if r.quantity == quantity]:
            return quantity, rs[0].value
    return None


def _shown_util(reading: tuple[str, float] | None) -> str:
    if reading is None:
        return "no utilization series"
    quantity, value = reading
    return f"{value:g} %" if quantity == "gpu_util_pct" else f"{value:g} ({quantity}, 0-1)"


def judge_work(node: str, before: str, during: str, namespace: str, pod: str) -> list[Finding]:
    """While gpuproof's pod ``namespace/pod`` keeps one GPU busy: exactly that one GPU's series carry the pod
    (``dcgm-pod-attribution``: no GPU, or several, is a fault; a GPU idle or held by another pod carries none of
    ours), and its utilization is above what the exporter read before the pod started (``dcgm-utilization-moves``).
    ``before`` and ``during``: the node's exporter output before the pod and while it runs."""
    dcgm = series()
    try:
        idle, busy = dcgm.readings(dcgm.parse(before)), dcgm.readings(dcgm.parse(during))
    except dcgm.MetricsError as exc:
        return [Finding("dcgm-pod-attribution", "fail", node, expected="the Prometheus text format",
                        actual=str(exc))]
    want = f"exactly one GPU's series labelled pod={namespace}/{pod} (the pod holds one GPU)"
    held = holding(busy, namespace, pod)
    if len(held) != 1:
        gpus = sorted({(r.gpu, r.uuid) for r in busy if r.gpu or r.uuid}, key=lambda g: (len(g[0]), g))
        owners = {(r.gpu, r.uuid): "/".join(r.pod[:2]) for r in busy if r.pod}
        shown = ", ".join(f"{_name(*g)} {('pod=' + owners[g]) if g in owners else 'no pod'}" for g in gpus)
        reason = ("" if held or owners else "the exporter attributes no GPU to any pod: it runs without the kubelet's "
                  "pod-resources socket (/var/lib/kubelet/pod-resources) or with DCGM_EXPORTER_KUBERNETES=false")
        return [Finding("dcgm-pod-attribution", "fail", node, expected=want,
                        actual=f"{len(held)} GPUs: {shown or 'no GPU series'}", reason=reason)]
    gpu = held[0]
    name = _name(*gpu)
    out = [Finding("dcgm-pod-attribution", "pass", node, name, want, f"{name} pod={namespace}/{pod}")]
    then, now = _util(idle, gpu), _util(busy, gpu)
    if then is not None and now is not None and then[0] != now[0]:
        then = None                             # a different quantity: not comparable
    floor = then[1] if then is not None else 0.0
    ok = now is not None and now[1] > floor
    out.append(Finding("dcgm-utilization-moves", "pass" if ok else "fail", node, name,
                       f"utilization above {'its idle reading ' + _shown_util(then) if then else '0'} while the pod "
                       "runs", _shown_util(now),
                       "" if ok or now is None else "the exporter's reading did not move with the work: DCGM sampled "
                       "before the work began, or its field watches are stale"))
    return out


# ------------------------------------------------------------------ ai_service_metrics: an AI server's own metrics

SERVICE_CHECKS = ("ai-service-metrics",)
SERVICE_COUNTER = "gpuproof_inference_requests_total"     # workloads/inference_server.py's PROM_SERIES


def service_query(pod: str, namespace: str) -> str:
    """The PromQL that reads the inference server pod's request counter (every job that scrapes it)."""
    return f'{SERVICE_COUNTER}{{namespace="{namespace}",pod="{pod}"}}'


def _target_state(targets) -> str:
    """Why Prometheus holds no series of the pod, from its targets for the pod (``/api/v1/targets`` entries)."""
    if not targets:
        return ("Prometheus has no target for the pod: no PodMonitor or ServiceMonitor selects it, or this "
                "Prometheus does not select the monitor")
    shown = []
    for t in targets:
        health = t.get("health", "unknown")
        error = " ".join(str(t.get("lastError") or "").split())[:200]
        shown.append(f"target {t.get('scrapeUrl', '?')} is {health}" + (f": {error}" if error else ""))
        if "valid start token" in error or "content type" in error.lower():
            shown.append("its answer is not the Prometheus text format (a server that answers only JSON?)")
    if any(t.get("health") == "up" for t in targets):
        shown.append(f"it is scraped, but its answer has no {SERVICE_COUNTER}")
    return "; ".join(shown)


def judge_service_metrics(node: str, pod: str, expected: int, result: list[dict], targets=None,
                          before: int = 0) -> list[Finding]:
    """ai_service_metrics: the inference server pod ``pod`` ("namespace/name"), sent ``expected`` requests, has its
    request counter in Prometheus and it reads ``expected``. ``result``: the ``data.result`` of an instant query
    (:func:`service_query`); ``targets``: Prometheus' active targets for the pod, said when no series came back
    (a scrape that fails, a format it cannot read, no monitor that selects the pod). One finding, check
    ``ai-service-metrics``, naming the node, the pod, the expected and the actual. ``before``: the counter at
    Prometheus' first scrape, before the requests (0 for a fresh server)."""
    namespace, _, name = pod.rpartition("/")
    want = f"{SERVICE_COUNTER} of pod {pod} = {expected} " + (
        f"({before} at the first scrape + the {expected - before} requests sent)" if before else "(the requests sent)")
    rows = [r for r in result if r.get("metric", {}).get("pod") == name
            and r.get("metric", {}).get("namespace", namespace) == namespace]
    others = sorted({f"{r['metric'].get('namespace', '?')}/{r['metric'].get('pod', '?')}" for r in result} - {pod})
    if not rows:
        actual = "no series of the pod" + (f" (series of {', '.join(others)})" if others else "")
        return [Finding("ai-service-metrics", "fail", node, "", want, actual, _target_state(targets or []))]
    values = {r["metric"].get("job", "?"): float(r["value"][1]) for r in rows}
    shown = ", ".join(f"{v:g} (job {job})" for job, v in sorted(values.items()))
    ok = all(v == expected for v in values.values())
    reason = ("" if ok else
              "more requests than were sent: another client sent the pod requests"
              if any(v > expected for v in values.values()) else
              "Prometheus has not scraped the pod since the requests, or the server lost count")
    return [Finding("ai-service-metrics", "pass" if ok else "fail", node, "", want, shown, reason)]


def pod_targets(active: list[dict], pod: str) -> list[dict]:
    """Prometheus' active targets (``/api/v1/targets``' ``data.activeTargets``) whose labels name this pod
    ("namespace/name"), as a PodMonitor's or ServiceMonitor's relabelling labels them."""
    namespace, _, name = pod.rpartition("/")
    return [t for t in active if (t.get("labels") or {}).get("pod") == name
            and (t.get("labels") or {}).get("namespace", namespace) == namespace]

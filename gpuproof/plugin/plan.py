"""What a run would create, on which nodes, with which priorities: without creating anything.

Long: a dry run of every suite's pods: the collector, its placement model and the text belong together.

``gpuproof plan`` (and ``gpuproof run --dry-run``) collects the suites as a run would, with
discovery reading the target cluster, and lists per check:

- the nodes or pools it targets: its ``gpu_node``/``gpu_pool``/``gpu_product`` parameter
  (one test per discovered node, pool or product), or the node its own selection function
  picks from the cluster as it is now;
- the objects it creates, as its suite declares them with the ``creates`` marker::

      @pytest.mark.creates("Pod", "share-{node}-<i>", "{free}", on="first", requests="1 {resource}")
      @pytest.mark.creates("PriorityClass", "gpuproof-{run}-low", value=LOW)
      @pytest.mark.creates(benchmark="matmul")          # the benchmark's own manifests, per product

  ``kind, name, count`` (``count`` may be a number or words; ``name``, ``count``, ``requests``
  and ``note`` take ``{run}``, ``{node}``, ``{pool}``, ``{product}``, ``{slug}``, ``{resource}``,
  ``{device}`` and ``{free}``) and the keywords ``on`` (where its pods go: ``"first"`` node of
  the pool, ``"any"`` node the scheduler likes, or a function of ``pool``/``node``/``product``/
  ``discovery``/``cluster``/``run`` returning the node, as the check itself picks it),
  ``requests``, ``priority`` (a PriorityClass name), ``value`` and ``policy`` (of a
  PriorityClass), ``namespace``, ``note`` and ``env`` (an environment variable without which
  the check skips). ``benchmark=NAME`` (with ``per="product"`` or
  ``"node"``, ``all_gpus``, ``prefix``) lists what ``Benchmark.manifests`` builds, so the plan
  shows the benchmark's real pods, requests and node selectors;
- the priorities: the PriorityClasses and which pods use them.

A check that uses the run but declares nothing is listed as such (the plan never guesses).
Nothing is created: the suites are only collected; on a named cluster discovery reads its
nodes with the target's credentials and no run lease is taken; on the embedded cluster a
private one is started to read its nodes and stopped again, as a run would.
"""

from __future__ import annotations

import inspect
import os
import re
import types
from typing import Any

import pytest

from ..cluster.placement import pinned_node
from ..errors import GpuproofError

MARKER = "creates"
RUN_PLACEHOLDER = "<run-id>"
USES_RUN = {"run", "scratch"}

MARKER_HELP = ("creates(kind, name, count=1, *, on=None, requests=None, priority=None, value=None, policy=None, "
               "namespace=None, note=None) or creates(benchmark=NAME, per='product', all_gpus=False): what the check "
               "creates in the cluster, for `gpuproof plan` (see gpuproof/plugin/plan.py)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", MARKER_HELP)


class Collector:
    """pytest plugin object for ``gpuproof plan``: builds the plan once the suites are collected."""

    def __init__(self, run_id: str | None = None, kubeconfig: str | None = None, context: str | None = None):
        self.run_id = run_id
        self.kubeconfig, self.context = kubeconfig, context
        self.plan: dict | None = None
        self.errors: list[str] = []

    @pytest.hookimpl(trylast=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        if self.kubeconfig or self.context:
            # discovery reads through this client: the target then never takes the run lease or checks
            # the run's permissions (which only creating needs), so nothing in the cluster is written
            from ..cluster.api import connect
            from .target import get_target

            get_target(config).cluster = connect(self.kubeconfig, self.context)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            text = str(report.longrepr or "").strip().splitlines()
            last = next((ln.strip() for ln in reversed(text) if ln.strip()), "")
            self.errors.append(f"cannot collect {report.nodeid or 'the suites'}: {last.removeprefix('E ').strip()}")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.errors:
            return
        from .target import get_target

        try:
            self.plan = build(session.items, get_target(session.config), self.run_id)
        except GpuproofError as exc:        # the target cannot start (pytest has stopped collecting)
            self.errors.append(f"gpuproof cannot use its target cluster: {exc}")


# ------------------------------------------------------------------------------ building


class _Fill(dict):
    """str.format_map values: computed when asked for, '<name>' when unknown."""

    def __init__(self, fns: dict):
        super().__init__()
        self.fns = fns

    def __missing__(self, key):
        fn = self.fns.get(key)
        value = fn() if callable(fn) else fn
        if value is None:
            value = f"<{key}>"
        self[key] = value
        return value


def _fill(template: Any, values: _Fill) -> Any:
    if not isinstance(template, str):
        return template
    try:
        return template.format_map(values)
    except (ValueError, IndexError, AttributeError):
        return template


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", (text or "").lower()).strip("-")


def _declared(item) -> list:
    # iter_markers gives the nearest first; within a function, the decorator written lowest comes first
    return list(reversed(list(item.iter_markers(MARKER))))


def _skip_reason(item, discovery) -> str:
    from .target import REAL_GPU_REASON

    for mark in item.iter_markers("skip"):
        return mark.kwargs.get("reason") or (mark.args[0] if mark.args else "skipped")
    for mark in item.iter_markers("skipif"):
        if mark.args and all(isinstance(c, bool) for c in mark.args) and any(mark.args):
            return mark.kwargs.get("reason") or "skipped"
    needs_gpus = item.get_closest_marker("gpu") is not None or "needs_real_gpus" in getattr(item, "fixturenames", ())
    if needs_gpus and discovery.simulated:
        return REAL_GPU_REASON
    return ""


def _as_node(value):
    if isinstance(value, tuple):
        value = value[0] if value else None
    return value if hasattr(value, "name") and hasattr(value, "gpu_resource") else None


class _Context:
    """What one check's declarations are filled from."""

    def __init__(self, item, target, discovery, run_id: str, namespace: str):
        self.item, self.target, self.discovery = item, target, discovery
        self.run_id, self.namespace = run_id, namespace
        params = item.callspec.params if hasattr(item, "callspec") else {}
        self.node = params.get("gpu_node")
        self.pool = params.get("gpu_pool")
        self.product = params.get("gpu_product")
        self._stub = types.SimpleNamespace(run_id=run_id, namespace=namespace,
                                           labels={"gpuproof.dev/run": run_id})   # read-only stand-in: no apply

    def lent(self):
        """A stand-in run holding the image the cluster's nodes lend workload pods (None: the stock image)."""
        lent = getattr(self.target, "lent_image", None)
        return types.SimpleNamespace(workload_image=lent() if callable(lent) else None)

    def targets(self) -> list[str]:
        if self.node is not None:
            return [self.node.name]
        if self.pool is not None:
            return [n.name for n in self.pool.nodes]
        if self.product is not None:
            return list(self.discovery.products.get(self.product, []))
        return []

    def place(self, on) -> tuple[Any, str, Any]:
        """(node or None, how it is chosen, the chooser's extra value) for a declaration's ``on``."""
        if callable(on):
            names = inspect.signature(on).parameters
            given = {"pool": self.pool, "node": self.node, "product": self.product, "discovery": self.discovery,
                     "cluster": self.target.cluster, "run": self._stub, "target": self.target}
            missing = [n for n in names if given.get(n) is None]
            if missing:
                return None, f"chosen at run time (needs {', '.join(missing)})", None
            try:
                result = on(**{n: given[n] for n in names})
            except Exception as exc:      # the chooser failed: say so rather than guess
                return None, f"chosen at run time (not known now: {type(exc).__name__}: {exc})", None
            node = _as_node(result)
            extra = result[1] if isinstance(result, tuple) and len(result) > 1 else None
            if node is None:
                return None, "no node fits now: the check would skip", None
            doc = (inspect.getdoc(on) or "").split("\n")[0].rstrip(".")
            return node, f"pinned to {node.name}" + (f" (chosen now: {doc})" if doc else " (chosen now)"), extra
        if on == "any":
            return None, "the scheduler's choice", None
        if self.node is not None:
            return self.node, f"pinned to {self.node.name}", None
        if self.pool is not None and self.pool.nodes:
            first = self.pool.nodes[0]
            return first, f"pinned to {first.name} (first node of pool {self.pool.name})", None
        if self.product is not None:
            nodes = self.discovery.products.get(self.product, [])
            some = next((n for n in self.discovery.placeable if n.product == self.product), None)
            return some, f"the scheduler's choice among the {self.product} nodes ({', '.join(nodes)})", None
        return None, "the scheduler's choice", None

    def values(self, node, extra) -> _Fill:
        from .checks import free_on, one_device

        product = self.product or (node.product if node is not None else None)
        resource = node.gpu_resource if node is not None else None

        def device():
            if node is None:
                return None
            (res, amount), = one_device(node).items()
            return f"{amount} {res}"

        def free():
            if extra is not None:
                return extra
            if node is None or self.target.cluster is None:
                return None
            return free_on(self.target.cluster, node, resource)

        return _Fill({"run": self.run_id, "ns": self.namespace, "node": node.name if node is not None else None,
                      "pool": self.pool.name if self.pool is not None else (node.pool if node is not None else None),
                      "product": product, "slug": slug(product) if product else None, "resource": resource,
                      "device": device, "free": free})


def _count(value: Any) -> Any:
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return value


def _object(mark, ctx: _Context) -> dict:
    kw = dict(mark.kwargs)
    args = list(mark.args) + [None] * 3
    kind, name, count = args[0], args[1], args[2] if args[2] is not None else kw.pop("count", 1)
    node, how, extra = ctx.place(kw.get("on"))
    values = ctx.values(node, extra)
    cluster_scoped = kind in ("PriorityClass", "Namespace")
    obj: dict[str, Any] = {"kind": kind, "name": _fill(name, values),
                           "namespace": None if cluster_scoped else _fill(kw.get("namespace"), values) or ctx.namespace,
                           "count": _count(_fill(count, values))}
    if kind in ("Pod", "Job", "Deployment"):
        obj["node"] = node.name if node is not None else None
        obj["placement"] = how
        obj["requests"] = _fill(kw.get("requests"), values) or "no GPU"
        if kw.get("priority"):
            obj["priorityClass"] = _fill(kw["priority"], values)
    if kind == "PriorityClass":
        obj["value"] = kw.get("value")
        obj["preemptionPolicy"] = kw.get("policy") or "PreemptLowerPriority"
    if kw.get("note"):
        obj["note"] = _fill(kw["note"], values)
    return obj


def _from_manifest(m: dict) -> dict:
    """kind, name, requests and placement of a manifest the code would apply."""
    kind, meta = m["kind"], m.get("metadata") or {}
    obj: dict[str, Any] = {"kind": kind, "name": meta.get("name"), "namespace": meta.get("namespace"), "count": 1}
    spec = m.get("spec") or {}
    pod_spec = (spec.get("template") or {}).get("spec") if kind in ("Job", "Deployment") else spec
    if kind in ("Pod", "Job", "Deployment") and pod_spec:
        limits: dict[str, int] = {}
        for c in pod_spec.get("containers") or []:
            for res, amount in ((c.get("resources") or {}).get("limits") or {}).items():
                limits[res] = limits.get(res, 0) + int(str(amount)) if str(amount).isdigit() else amount
        gpu = {k: v for k, v in limits.items() if "nvidia.com/" in k}
        obj["requests"] = ", ".join(f"{v} {k}" for k, v in sorted(gpu.items())) or "no GPU"
        sel = pod_spec.get("nodeSelector") or {}
        host = pinned_node(pod_spec)
        obj["node"] = host
        selector = "nodeSelector " + ", ".join(f"{k}={v}" for k, v in sorted(sel.items())) if sel else ""
        obj["placement"] = f"pinned to {host}" if host else (selector or "the scheduler's choice")
        images = sorted({c.get("image") for c in pod_spec.get("containers") or [] if c.get("image")})
        if images:
            obj["image"] = ", ".join(images)
        if kind == "Job":
            obj["count"] = spec.get("completions") or spec.get("parallelism") or 1
    return obj


def _benchmark(mark, ctx: _Context) -> list[dict]:
    """What ``Benchmark.run_in_cluster`` would apply, from the benchmark's own ``manifests``."""
    from ..bench import workloads as wl
    from ..bench import get
    from . import bench_checks as bench_suite
    from ..bench.base import pod_name
    from ..cluster.api import run_labels

    kw = mark.kwargs
    bench = get(kw["benchmark"])
    if kw.get("per", "product") == "node":
        pairs = [(ctx.node.product, ctx.node.name)] if ctx.node is not None else []
    else:
        pairs = [(product, sorted(nodes)[0]) for product, nodes in sorted(ctx.discovery.products.items()) if nodes]
    objs = [{"kind": "ConfigMap", "name": wl.CONFIGMAP_NAME, "namespace": ctx.namespace, "count": 1,
             "note": "the workload scripts, shared by every workload pod of the run"}]
    for product, node in pairs:
        resource, gpus = bench_suite.node_gpus(ctx.discovery, node, bool(kw.get("all_gpus")))
        name = pod_name(kw.get("prefix") or bench.name, bench.pod_key(product, node))
        manifests = bench.manifests(bench.params({}, device="cuda"), labels=run_labels(ctx.run_id),
                                    namespace=ctx.namespace, name=name, product=product, node=node,
                                    image=bench_suite.image(ctx.lent()), gpus=gpus, resource=resource)
        for m in manifests:
            obj = _from_manifest(m)
            if kw.get("note"):
                obj["note"] = _fill(kw["note"], ctx.values(None, None))
            objs.append(obj)
    return objs


def plan_check(item, target, discovery, run_id: str, namespace: str) -> dict:
    module = getattr(item, "module", None)
    feature = getattr(module, "FEATURE", None) or re.sub(r"^test_", "", item.nodeid.split("::")[0].rsplit("/", 1)[-1]
                                                          .removesuffix(".py"))
    ctx = _Context(item, target, discovery, run_id, namespace)
    entry: dict[str, Any] = {"id": item.nodeid, "feature": feature, "targets": ctx.targets(), "skip": "",
                             "creates": [], "uses_run": bool(USES_RUN & set(getattr(item, "fixturenames", ()))),
                             "undeclared": False}
    entry["skip"] = _skip_reason(item, discovery)
    needed = [m.kwargs["env"] for m in _declared(item) if m.kwargs.get("env") and not os.environ.get(m.kwargs["env"])]
    if needed and not entry["skip"]:
        entry["skip"] = f"{needed[0]} is not set"
    if entry["skip"]:
        return entry
    for mark in _declared(item):
        if "benchmark" in mark.kwargs:
            entry["creates"] += _benchmark(mark, ctx)
        elif len(mark.args) >= 2:
            entry["creates"].append(_object(mark, ctx))
    entry["undeclared"] = entry["uses_run"] and not entry["creates"]
    # a pod's priority value, from the PriorityClass the same check declares
    values = {o["name"]: o.get("value") for o in entry["creates"] if o["kind"] == "PriorityClass"}
    for o in entry["creates"]:
        if o.get("priorityClass") in values:
            o["priority"] = values[o["priorityClass"]]
    return entry


def build(items, target, run_id: str | None = None) -> dict:
    """The plan for collected suite items against ``target`` (a pytest_plugin.Target)."""
    discovery = target.discovery()
    run_id = run_id or RUN_PLACEHOLDER
    namespace = f"gpuproof-{run_id}"
    checks = [plan_check(item, target, discovery, run_id, namespace) for item in items]
    run_wide: list[dict] = []
    if target.real:
        from ..cluster.lease import NAME, NAMESPACE

        run_wide.append({"kind": "Lease", "name": NAME, "namespace": NAMESPACE, "count": 1,
                         "note": "one run at a time; renewed while the run lasts, deleted at its end "
                                 f"(namespace {NAMESPACE} is created if missing, else 'default'; --no-lease: none)"})
    if any(c["uses_run"] and not c["skip"] for c in checks):
        run_wide.append({"kind": "Namespace", "name": namespace, "namespace": None, "count": 1,
                         "note": "the run's namespace: every namespaced object below lives in it unless named; "
                                 "deleted with all it holds at the end of the run"})
    priorities: list[dict] = []
    for c in checks:
        for o in c["creates"]:
            if o["kind"] == "PriorityClass":
                users = [f"{p['name']}" for p in c["creates"] if p.get("priorityClass") == o["name"]]
                priorities.append({"name": o["name"], "value": o.get("value"),
                                   "preemptionPolicy": o.get("preemptionPolicy"), "check": c["id"], "pods": users})
    pools = []
    for name, nodes in sorted(discovery.pools.items()):
        pools.append({"pool": name, "nodes": [n.name for n in nodes],
                      "products": sorted({n.product for n in nodes if n.product}),
                      "unfit": {n.name: n.unfit_for_placement for n in nodes if n.unfit_for_placement}})
    return {"target": "embedded" if not target.real else f"cluster {target.cluster.name} ({target.cluster.server})",
            "run_id": run_id, "namespace": namespace, "simulated": discovery.simulated, "pools": pools,
            "other_nodes": len(discovery.other_nodes), "run_wide": run_wide, "priorities": priorities,
            "checks": checks}


# ------------------------------------------------------------------------------ text


def _count_text(count: Any) -> str:
    if count == 1 or count is None:
        return ""
    return f" x {count}"


def _object_line(o: dict) -> str:
    where = f"{o['namespace']}/" if o.get("namespace") else ""
    line = f"{o['kind']} {where}{o['name']}{_count_text(o.get('count'))}"
    details = []
    if o["kind"] in ("Pod", "Job", "Deployment"):
        details.append(f"requests {o['requests']}" if o.get("requests") != "no GPU" else "no GPU")
        details.append(o.get("placement") or "the scheduler's choice")
        if o.get("priorityClass"):
            value = f" ({o['priority']})" if o.get("priority") is not None else ""
            details.append(f"priorityClassName {o['priorityClass']}{value}")
    if o["kind"] == "PriorityClass":
        details.append(f"value {o.get('value')}")
        if o.get("preemptionPolicy") == "Never":
            details.append("preemptionPolicy Never")
    if o.get("image"):
        details.append(f"image {o['image']}")
    if o.get("note"):
        details.append(o["note"])
    return line + (": " + "; ".join(details) if details else "")


def render_text(plan: dict, selection: str = "") -> str:
    checks = plan["checks"]
    creating = [c for c in checks if c["creates"] or c["undeclared"]]
    skipped = [c for c in checks if c["skip"]]
    reading = [c for c in checks if not c["skip"] and not c["creates"] and not c["undeclared"]]
    out = [f"gpuproof plan: {len(checks)} checks against {plan['target']}{selection}; "
           f"run namespace {plan['namespace']}",
           "Nothing has been created. A run would create what follows and delete it at its end."]
    if plan["target"] == "embedded":
        out.append("(the embedded cluster is private to the run: started for it, stopped after it)")
    for warning in plan.get("warnings") or []:
        out.append(f"warning: {warning}")
    out += ["", "GPU nodes (discovery):"]
    for p in plan["pools"]:
        unfit = "".join(f"; {n} left out: {why}" for n, why in sorted(p["unfit"].items()))
        out.append(f"  pool {p['pool']}: {', '.join(p['nodes'])} ({', '.join(p['products']) or 'no product label'})"
                   f"{unfit}")
    if not plan["pools"]:
        out.append("  none")
    if plan["run_wide"]:
        out += ["", "For the whole run:"] + [f"  {_object_line(o)}" for o in plan["run_wide"]]
    out += ["", "Priorities:"]
    if plan["priorities"]:
        for p in plan["priorities"]:
            policy = ", preemptionPolicy Never" if p["preemptionPolicy"] == "Never" else ""
            used = f"; used by {', '.join(p['pods'])}" if p["pods"] else ""
            out.append(f"  PriorityClass {p['name']}: value {p['value']}{policy} ({p['check']}{used})")
        out.append("  every other pod: no priorityClassName (the cluster's default priority)")
    else:
        out.append("  no PriorityClasses; pods carry no priorityClassName (the cluster's default priority)")
    out += ["", f"Checks that create objects ({len(creating)}):"]
    for c in creating:
        on = f"  [{', '.join(c['targets'])}]" if c["targets"] else ""
        out.append(f"  {c['id']}{on}")
        if c["undeclared"]:
            out.append("    creates objects in the run namespace that its suite does not declare "
                       "(no @pytest.mark.creates): see the check's code")
        for o in c["creates"]:
            out.append(f"    {_object_line(o)}")
    if not creating:
        out.append("  none")
    if skipped:
        reasons: dict[str, int] = {}
        for c in skipped:
            reasons[c["skip"]] = reasons.get(c["skip"], 0) + 1
        out += ["", f"Checks that would skip here, creating nothing ({len(skipped)}):"]
        out += [f"  {n} x {why}" for why, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
    if reading:
        features: dict[str, int] = {}
        for c in reading:
            features[c["feature"]] = features.get(c["feature"], 0) + 1
        out += ["", f"Checks that create nothing in the cluster ({len(reading)}): "
                + ", ".join(f"{f} {n}" for f, n in sorted(features.items()))]
    return "\n".join(out) + "\n"

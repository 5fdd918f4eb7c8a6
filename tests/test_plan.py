"""`gpuproof plan` / `gpuproof run --dry-run`: what a run would create, where, with which priorities.

The plan is made against the embedded cluster as against any named cluster (--kubeconfig), while
an audit follows the API: every namespace, pod, PriorityClass, Lease and ConfigMap added from just
before the first plan command until sentinel objects the test creates after the last one. Watches
deliver each kind's changes in order, so anything a plan created shows up before the sentinel.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import types
from pathlib import Path

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from gpuproof.discovery.nodes import discover
from gpuproof.sim.fleet_file import load_fleet
from gpuproof.plugin.plan import plan_check, render_text

# suites whose checks create objects without declaring them yet: each entry is a to-do
# (add @pytest.mark.creates to its checks, then remove it here)
NOT_YET_DECLARED: set[str] = set()


def gpuproof(*argv: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTEST_ADDOPTS", "GPUPROOF_DEBUG", "GPUPROOF_INFERENCE_URL")}
    return subprocess.run([sys.executable, "-m", "gpuproof", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=env)


# ------------------------------------------------------------------------------ the audit


def _kinds(api):
    core, sched, coord = k8s.CoreV1Api(api), k8s.SchedulingV1Api(api), k8s.CoordinationV1Api(api)
    return {
        "PriorityClass": (sched.list_priority_class,
                          lambda n: sched.create_priority_class({"metadata": {"name": n}, "value": -1000}),
                          lambda n: sched.delete_priority_class(n)),
        "Pod": (core.list_pod_for_all_namespaces, lambda n: core.create_namespaced_pod("default", {
            "metadata": {"name": n}, "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
                lambda n: core.delete_namespaced_pod(n, "default", grace_period_seconds=0)),
        "Lease": (coord.list_lease_for_all_namespaces,
                  lambda n: coord.create_namespaced_lease("default", {"metadata": {"name": n}}),
                  lambda n: coord.delete_namespaced_lease(n, "default")),
        "ConfigMap": (core.list_config_map_for_all_namespaces,
                      lambda n: core.create_namespaced_config_map("default", {"metadata": {"name": n}}),
                      lambda n: core.delete_namespaced_config_map(n, "default")),
        "Namespace": (core.list_namespace, lambda n: core.create_namespace({"metadata": {"name": n}}),
                      lambda n: core.delete_namespace(n)),
    }   # the Namespace sentinel last: its own kube-root-ca.crt ConfigMap comes after the ConfigMap audit


def _added_since(list_fn, resource_version: str, sentinel: str) -> list[str]:
    """'namespace/name' of every object of a kind added after resource_version, up to the sentinel."""
    added = []
    w = watch.Watch()
    for ev in w.stream(list_fn, resource_version=resource_version, timeout_seconds=120):
        obj = ev["object"]
        assert ev["type"] != "ERROR", f"the audit's watch failed: {obj}"
        if ev["type"] != "ADDED":
            continue
        if obj.metadata.name == sentinel:
            w.stop()
            return added
        added.append(f"{obj.metadata.namespace or ''}/{obj.metadata.name}")
    raise AssertionError(f"the audit never saw its sentinel {sentinel}")


@pytest.fixture(scope="module")
def planned(embedded, tmp_path_factory):
    """Plan commands run against the embedded cluster, and what the API saw added meanwhile."""
    cwd = tmp_path_factory.mktemp("plan")
    kinds = _kinds(embedded.client.api)
    rv = embedded.client.core.list_namespace().metadata.resource_version
    k = ["--kubeconfig", embedded.kubeconfig]
    results = {
        "json": gpuproof("plan", *k, "--run-id", "plantest", "--format", "json", cwd=cwd),
        "text": gpuproof("plan", *k, "-k", "preemption or taints", cwd=cwd),
        "dry-run": gpuproof("run", *k, "-k", "preemption or taints", "--dry-run", cwd=cwd),
        "bench": gpuproof("plan", *k, "--only-bench", cwd=cwd),
    }
    sentinel = "plan-audit-" + secrets.token_hex(3)
    added = {}
    for kind, (list_fn, create, delete) in kinds.items():
        create(sentinel)
        try:
            added[kind] = _added_since(list_fn, rv, sentinel)
        finally:
            delete(sentinel)
    return types.SimpleNamespace(results=results, added=added, cwd=cwd, embedded=embedded)


def test_plan_creates_nothing(planned):
    for name, proc in planned.results.items():
        assert proc.returncode == 0, f"{name}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}"
    assert planned.added == {kind: [] for kind in planned.added}, planned.added
    assert sorted(p.name for p in planned.cwd.iterdir()) == [], "the plan wrote files (a report folder?)"


def test_plan_lists_objects_nodes_and_priorities(planned):
    plan = json.loads(planned.results["json"].stdout)
    nodes = {n for p in plan["pools"] for n in p["nodes"]}
    assert nodes == {"a100-0", "a100-1", "h100-mig-0", "a100-mig-single-0", "l4-shared-0"}
    assert plan["namespace"] == "gpuproof-plantest"
    run_wide = {(o["kind"], o["name"]) for o in plan["run_wide"]}
    assert run_wide == {("Lease", "gpuproof-run"), ("Namespace", "gpuproof-plantest")}

    checks = {c["id"]: c for c in plan["checks"]}
    pre = checks["suites/test_preemption.py::test_preemption_evicts_just_enough_and_never_foreign"]
    classes = {o["name"]: (o["value"], o["preemptionPolicy"]) for o in pre["creates"] if o["kind"] == "PriorityClass"}
    assert classes == {"gpuproof-plantest-low": (-100, "PreemptLowerPriority"),
                       "gpuproof-plantest-high": (-10, "PreemptLowerPriority"),
                       "gpuproof-plantest-never": (-10, "Never")}
    assert [(p["name"], p["value"]) for p in plan["priorities"]] == \
        [("gpuproof-plantest-low", -100), ("gpuproof-plantest-high", -10), ("gpuproof-plantest-never", -10)]
    pods = {o["name"]: o for o in pre["creates"] if o["kind"] == "Pod"}
    assert set(pods) == {"low-<i>", "preemptor", "no-preempt"}
    # the node the check would pick now (fewest free GPUs): the time-sliced L4, with its 4 free replicas
    assert {p["node"] for p in pods.values()} == {"l4-shared-0"} and pods["low-<i>"]["count"] == 4
    assert pods["low-<i>"]["priority"] == -100 and pods["preemptor"]["priority"] == -10
    assert all(p["namespace"] == "gpuproof-plantest" for p in pods.values())

    taint = checks["suites/test_taints.py::test_pod_without_toleration_is_kept_off[p4de.24xlarge]"]
    assert taint["targets"] == ["a100-0", "a100-1"]
    assert [(o["kind"], o["name"], o["node"]) for o in taint["creates"]] == \
        [("Pod", "no-toleration-a100-0", "a100-0")]
    quota = checks["suites/test_quota.py::test_resource_quota_limits_gpu_requests"]
    assert [(o["kind"], o["namespace"]) for o in quota["creates"]][:2] == \
        [("Namespace", None), ("ResourceQuota", "gpuproof-plantest-quota")]
    # checks that only read create nothing; checks that need real GPUs would skip on kwok nodes
    assert checks["suites/test_labels.py::test_inventory_entry[a100-0]"]["creates"] == []
    mig_probe = [c for i, c in checks.items() if "test_each_pod_gets_its_own_mig_device" in i]
    assert mig_probe and all(c["skip"].startswith("needs real GPUs") and not c["creates"] for c in mig_probe)


def test_every_check_that_uses_the_run_declares_what_it_creates(planned):
    plan = json.loads(planned.results["json"].stdout)
    undeclared = [c["id"] for c in plan["checks"] if c["undeclared"]
                  and c["id"].split("::")[0] not in NOT_YET_DECLARED]
    assert undeclared == [], "checks that create objects without @pytest.mark.creates (see gpuproof/plugin/plan.py)"


def test_text_plan_and_run_dry_run_agree(planned):
    text = planned.results["text"].stdout
    assert planned.results["dry-run"].stdout == text
    assert text.startswith("gpuproof plan: 19 checks against cluster ") and "Nothing has been created" in text
    for line in ["  PriorityClass gpuproof-<run-id>-never: value -10, preemptionPolicy Never",
                 "  Lease gpuproof-system/gpuproof-run: one run at a time",
                 "    Pod gpuproof-<run-id>/low-<i> x 4: requests 1 nvidia.com/gpu; pinned to l4-shared-0 (chosen now",
                 "    Pod gpuproof-<run-id>/no-toleration-h100-mig-0: no GPU; pinned to h100-mig-0",
                 "  pool p4de.24xlarge: a100-0, a100-1 (NVIDIA-A100-SXM4-80GB)"]:
        assert any(ln.startswith(line) for ln in text.splitlines()), f"{line!r} not in:\n{text}"
    bench = planned.results["bench"].stdout
    assert "needs real GPUs" in bench and "Checks that create objects (0)" in bench


# ------------------------------------------------------------------------------ benchmarks, from their manifests


def _discovery(simulated: bool):
    nodes = load_fleet("mixed").node_objects()
    for n in nodes:
        if not simulated:
            n["metadata"]["annotations"].pop("kwok.x-k8s.io/node", None)
        n["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return discover(nodes)


class _Item:
    """The little of a pytest item the plan reads."""

    def __init__(self, nodeid, marks, fixtures=("target", "run", "run_dir", "gpu_products", "discovery")):
        self.nodeid, self.marks, self.fixturenames = nodeid, marks, list(fixtures)
        self.module = types.SimpleNamespace(FEATURE="bench")

    def iter_markers(self, name=None):
        return iter([m for m in reversed(self.marks) if name is None or m.name == name])

    def get_closest_marker(self, name):
        return next(self.iter_markers(name), None)


@pytest.mark.server  # tier: GFD run under the mock NVML
def test_benchmark_checks_are_planned_from_the_benchmarks_own_manifests():
    from gpuproof.plugin import bench_checks

    d = _discovery(simulated=False)
    assert not d.simulated
    item = _Item("suites/test_bench_matmul.py::test_matmul_per_product",
                 [pytest.mark.gpu.mark, pytest.mark.creates(benchmark="matmul").mark])
    target = types.SimpleNamespace(real=True, cluster=None)
    entry = plan_check(item, target, d, "r1", "gpuproof-r1")
    assert entry["skip"] == "" and not entry["undeclared"]
    objs = {o["name"]: o for o in entry["creates"]}
    assert objs["gpuproof-workloads"]["kind"] == "ConfigMap"
    a100 = objs["bench-matmul-nvidia-a100-sxm4-80gb"]
    assert (a100["kind"], a100["node"], a100["requests"], a100["namespace"]) == \
        ("Pod", "a100-0", "1 nvidia.com/gpu", "gpuproof-r1")
    assert a100["image"] == bench_checks.image()
    h100 = objs["bench-matmul-nvidia-h100-80gb-hbm3"]
    resource, gpus = bench_checks.node_gpus(d, "h100-mig-0")              # the largest MIG slice the node has
    assert resource.startswith("nvidia.com/mig-") and (h100["node"], h100["requests"]) == \
        ("h100-mig-0", f"{gpus} {resource}")
    # one pod per product, on the first node of each
    assert len([o for o in entry["creates"] if o["kind"] == "Pod"]) == len(d.products)

    inference = plan_check(_Item("suites/test_bench_inference.py::test_inference_per_product",
                                 [pytest.mark.creates(benchmark="inference", prefix="infer").mark]),
                           target, d, "r1", "gpuproof-r1")
    kinds = {(o["kind"], o["name"]) for o in inference["creates"]}
    assert {("Deployment", "bench-infer-nvidia-l4-shared"), ("Service", "bench-infer-nvidia-l4-shared"),
            ("Pod", "bench-infer-nvidia-l4-shared-load")} <= kinds

    # on kwok nodes the same check would skip: nothing is listed for it
    skipped = plan_check(item, target, _discovery(simulated=True), "r1", "gpuproof-r1")
    assert skipped["skip"].startswith("needs real GPUs") and skipped["creates"] == []
    assert "would skip here" in render_text({"target": "embedded", "namespace": "gpuproof-r1", "pools": [],
                                             "run_wide": [], "priorities": [], "checks": [skipped]})


@pytest.mark.server  # tier: GFD run under the mock NVML
def test_a_check_that_uses_the_run_without_declaring_is_listed_as_such():
    item = _Item("suites/test_new.py::test_x", [], fixtures=("run", "scratch", "check"))
    entry = plan_check(item, types.SimpleNamespace(real=False, cluster=None), _discovery(False), "r1", "ns")
    assert entry["undeclared"] and entry["creates"] == []
    text = render_text({"target": "embedded", "namespace": "ns", "pools": [], "run_wide": [], "priorities": [],
                        "checks": [entry]})
    assert "does not declare" in text


# ------------------------------------------------------------------------------ the command line


@pytest.mark.server  # tier: gpuproof's CLI as a process
def test_plan_help_explains(tmp_path):
    proc = gpuproof("plan", "--help", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: gpuproof plan"), proc.stderr
    for words in ("without creating anything", "on which nodes", "priorities", "PriorityClasses", "Lease",
                  "--kubeconfig", "--bench", "-k", "--format", "gpuproof run --context gpu-prod --dry-run"):
        assert words in proc.stdout, words
    run_help = gpuproof("run", "--help", cwd=tmp_path, timeout=60).stdout
    assert "--dry-run" in run_help and "--progress-after" in run_help and "time left" in run_help


@pytest.mark.parametrize("argv,word", [
    (["plan", "--kubeconfig", "no-such.kubeconfig"], "no-such.kubeconfig"),
    (["plan", "--fleet", "no-such-fleet.yaml"], "no-such-fleet.yaml"),
    (["plan", "--format", "xml"], "--format"),
    (["plan", "--run-id", "../x"], "--run-id"),
    (["run", "--dry-run", "--kubeconfig", "k", "--fleet", "minimal"], "--fleet"),
], ids=["missing-kubeconfig", "missing-fleet", "bad-format", "unsafe-run-id", "dry-run-fleet-and-kubeconfig"])
@pytest.mark.server  # tier: gpuproof's CLI as a process
def test_plan_mistakes_are_one_line(tmp_path, argv, word):
    proc = gpuproof(*argv, cwd=tmp_path, timeout=60)
    err = proc.stderr.strip()
    assert proc.returncode != 0 and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert word in err, err


def test_plan_selecting_nothing_is_one_line(embedded, tmp_path):
    proc = gpuproof("plan", "--kubeconfig", embedded.kubeconfig, "-k", "no_such_check", cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 5 and err == "gpuproof: error: no checks selected by -k 'no_such_check'; " \
                                           "nothing would run", err

"""The gang suite (suites/test_gang.py) and the embedded cluster's own gang scheduling (issue #53 item 1).

- unit: the gang schedulers found from what the API server serves; Kueue's ClusterQueue chosen by its
  namespaceSelector and GPU quota, and what it can admit with its cohort; the gang's Job and Workload as the Workload
  API and Kueue want them; the fleet file's ``controlPlane.featureGates`` and the flags they give the components;
- cluster: on an embedded cluster whose control plane runs Kubernetes 1.35's gang scheduling (feature gates
  ``GenericWorkload`` and ``GangScheduling``, the API server serving ``scheduling.k8s.io/v1alpha1``) the suite passes
  by name, and ``gpuproof conformance`` marks ``gang_scheduling`` Implemented from its JUnit cases; each fault of
  :data:`FAULTS` fails its check, naming the pods that were bound and their nodes; the mixed fleet, which has no gang
  scheduler, skips with that reason.
"""

from __future__ import annotations

import copy
import re

import pytest

from gpuproof.discovery import gang as g
from gpuproof.sim.fleet_file import parse_fleet

GATES = {"GenericWorkload": True, "GangScheduling": True}
WINDOW = 3                    # seconds of the negative window in these tests (upstream's default is 30)
FAST = "--timeout-scale=0.1"  # the positive gang's 2 minutes made 12 s, where the fault keeps it from binding
POD = r"gang-(?:pos|neg)-[a-z0-9]{5}"


def gang_fleet() -> dict:
    """The shipped fleet ``gang``: two A100 nodes of 2 GPUs each (4 free GPUs: the negative gang is 5 pods) and a CPU
    node, with Kubernetes' gang scheduling on."""
    import yaml

    from gpuproof.sim.fleet_file import FLEETS_DIR

    fleet = yaml.safe_load((FLEETS_DIR / "gang.yaml").read_text())
    assert fleet["controlPlane"]["featureGates"] == GATES
    return fleet


def with_fault(control_plane: dict | None = None, pool_fault: dict | None = None) -> dict:
    fleet = gang_fleet()
    fleet["controlPlane"].update(control_plane or {})
    if pool_fault:
        fleet["pools"][0]["faults"] = [pool_fault]
    return fleet


# id: (fleet, suite args, [(check, target, expected, actual)] that must fail)
FAULTS = {
    # kube-scheduler without its GangScheduling plugin: the Workload is there, its pods bind one by one
    "gang-plugin-off": (
        with_fault({"disableSchedulerPlugins": ["GangScheduling"]}), ["-k", "Negative"],
        [("gang-oversize-held", "cluster", f"no pod of the 5-pod gang bound or running for {WINDOW} s",
          re.compile(rf"[1-5] bound: {POD} on a100-[01](; {POD} on a100-[01])*"))]),
    # GPUs free, but the GPU nodes take no more pods: the gang never binds, its Job never completes
    "no-room-for-pods": (
        with_fault(pool_fault={"setAllocatable": {"pods": "0"}}), ["-k", "Positive", FAST],
        [("gang-bound-together", "cluster", "2 of 2 pods bound within 12 s",
          re.compile(rf"0 of 2 bound: {POD}: Pending, 0/3 nodes are available: .*Too many pods.*")),
         ("gang-runs", "cluster", "Complete", re.compile(r"suspend=false, 2 active, 0 succeeded, 0 failed.*"))]),
}


# ---------------------------------------------------------------------------- finding the gang scheduler

KUEUE_API = {"kueue.x-k8s.io/v1beta2": {"clusterqueues", "localqueues", "workloads", "resourceflavors"},
             "kueue.x-k8s.io/v1beta1": {"clusterqueues", "localqueues", "workloads"}}
WORKLOADS = {"scheduling.k8s.io/v1": {"priorityclasses"}, "scheduling.k8s.io/v1alpha1": {"workloads"}}


def test_each_gang_scheduler_is_found_by_the_api_it_serves_and_kueue_first():
    assert g.find({"scheduling.k8s.io/v1": {"priorityclasses"}}) == []
    [wl] = g.find(WORKLOADS)
    assert (wl.name, wl.version) == (g.WORKLOAD_API, "scheduling.k8s.io/v1alpha1")
    assert str(wl) == "Kubernetes' Workload API (GangScheduling) (scheduling.k8s.io/v1alpha1 serves workloads)"
    found = g.find({**WORKLOADS, **KUEUE_API, "scheduling.volcano.sh/v1beta1": {"podgroups", "queues"},
                    "scheduling.run.ai/v2": {"queues"}, "scheduling.run.ai/v2alpha2": {"podgroups"}})
    assert [(f.name, f.version) for f in found] == [(g.KUEUE, "kueue.x-k8s.io/v1beta2"),
                                                     (g.VOLCANO, "scheduling.volcano.sh/v1beta1"),
                                                     (g.KAI, "scheduling.run.ai/v2"),
                                                     (g.WORKLOAD_API, "scheduling.k8s.io/v1alpha1")]
    assert found[0].evidence == "kueue.x-k8s.io/v1beta1 serves clusterqueues, localqueues; " \
                                "kueue.x-k8s.io/v1beta2 serves clusterqueues, localqueues"
    # a Workload API at a version gpuproof does not write: found, and said so
    [later] = g.find({"scheduling.k8s.io/v1beta1": {"workloads"}})
    assert later.version == "scheduling.k8s.io/v1beta1" and not g.version_supported(later)
    assert g.version_supported(found[0]) and g.version_supported(found[1])
    # KAI serves its queues and its podgroups in two versions of its group; a group with one of them shows nothing
    [kai] = g.find({"scheduling.run.ai/v2": {"queues"}, "scheduling.run.ai/v2alpha2": {"podgroups"}})
    assert (kai.name, kai.version) == (g.KAI, "scheduling.run.ai/v2")
    assert kai.evidence == "scheduling.run.ai/v2 serves queues; scheduling.run.ai/v2alpha2 serves podgroups"
    assert g.find({"scheduling.run.ai/v2": {"queues"}}) == []
    assert g.find({"kueue.x-k8s.io/v1beta1": {"clusterqueues", "localqueues"}})[0].version == "kueue.x-k8s.io/v1beta1"


def test_the_choice_is_the_users_or_the_first_and_none_is_a_reason():
    found = g.find({**WORKLOADS, **KUEUE_API})
    assert g.choose(found, None)[0].name == g.KUEUE and g.choose(found, "auto")[0].name == g.KUEUE
    assert g.choose(found, "workload-api")[0].name == g.WORKLOAD_API
    assert g.choose(found, "volcano") == (None, "--gang-scheduler=volcano: the API server does not serve "
                                                "scheduling.volcano.sh podgroups (Volcano is not installed)")
    none, why = g.choose([], None)
    assert none is None and why.startswith("no gang scheduler in the cluster: the API server serves none of Kueue's")
    with pytest.raises(ValueError, match="takes auto, kueue, volcano, kai, workload-api; got 'slurm'"):
        g.check_name("slurm")


def test_the_gang_options_are_checked_when_given():
    from gpuproof.errors import GpuproofError
    from gpuproof.plugin import options

    options.check_value(options.BY_NAME["gang-scheduler"], "kueue")
    with pytest.raises(GpuproofError, match="--gang-scheduler takes auto"):
        options.check_value(options.BY_NAME["gang-scheduler"], "yunikorn")
    with pytest.raises(GpuproofError, match="--gang-negative-window must be more than 0 seconds, got 0"):
        options.check_value(options.BY_NAME["gang-negative-window"], 0.0)
    assert options.BY_NAME["gang-negative-window"].default == 30.0


# ---------------------------------------------------------------------------- Kueue's ClusterQueues


def cq(name: str, gpus: str | None = "4", selector: dict | None = None, cohort: str = "", borrow: str | None = None,
       status: dict | None = None, **spec) -> dict:
    """A ClusterQueue as Kueue's v1beta2 API serves it (a flavor with cpu quota, and GPU quota when ``gpus``)."""
    resources = [{"name": "cpu", "nominalQuota": "10"}]
    if gpus is not None:
        resources.append({"name": "nvidia.com/gpu", "nominalQuota": gpus,
                          **({"borrowingLimit": borrow} if borrow is not None else {})})
    body = {"namespaceSelector": selector, "resourceGroups": [
        {"coveredResources": [r["name"] for r in resources], "flavors": [{"name": "default", "resources": resources}]}],
        **({"cohortName": cohort} if cohort else {}), **spec}
    return {"metadata": {"name": name}, "spec": {k: v for k, v in body.items() if v is not None},
            "status": status or {}}


RUN_NS = {"app.kubernetes.io/managed-by": "gpuproof", "kubernetes.io/metadata.name": "gpuproof-r1"}


def test_label_selectors_as_kueue_reads_a_namespace_selector():
    assert not g.selector_matches(None, RUN_NS)                    # no selector: no namespace
    assert g.selector_matches({}, RUN_NS)                          # empty: every namespace
    assert g.selector_matches({"matchLabels": {"app.kubernetes.io/managed-by": "gpuproof"}}, RUN_NS)
    assert not g.selector_matches({"matchLabels": {"team": "ml"}}, RUN_NS)
    expr = [{"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["gpuproof-r1", "x"]},
            {"key": "team", "operator": "DoesNotExist"}]
    assert g.selector_matches({"matchExpressions": expr}, RUN_NS)
    assert not g.selector_matches({"matchExpressions": [{"key": "team", "operator": "Exists"}]}, RUN_NS)
    assert not g.selector_matches({"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                         "values": ["gpuproof-r1"]}]}, RUN_NS)


def test_the_cluster_queue_is_the_users_or_the_first_that_admits_the_run_with_gpu_quota():
    queues = [cq("a-closed", selector=None), cq("b-cpu-only", gpus=None, selector={}),
              cq("c-stopped", selector={}, stopPolicy="Hold"), cq("d-open", selector={}), cq("e-open", selector={})]
    picked, why = g.pick_cluster_queue(queues, RUN_NS, "nvidia.com/gpu")
    assert picked["metadata"]["name"] == "d-open" and why == ""
    none, why = g.pick_cluster_queue(queues[:3], RUN_NS, "nvidia.com/gpu")
    assert none is None and why == (
        "no Kueue ClusterQueue takes the run's Jobs (a-closed: its namespaceSelector does not admit the run's "
        "namespace; b-cpu-only: no quota for nvidia.com/gpu; c-stopped: stopped (stopPolicy Hold))")
    assert g.pick_cluster_queue([], RUN_NS, "nvidia.com/gpu")[1] == "no Kueue ClusterQueue takes the run's Jobs: " \
                                                                   "the cluster has none"
    assert g.pick_cluster_queue(queues, RUN_NS, "nvidia.com/gpu", "e-open")[0]["metadata"]["name"] == "e-open"
    assert g.pick_cluster_queue(queues, RUN_NS, "nvidia.com/gpu", "a-closed")[1] == \
        "--gang-queue=a-closed: its namespaceSelector does not admit the run's namespace"
    assert g.pick_cluster_queue(queues, RUN_NS, "nvidia.com/gpu", "zz")[1].startswith(
        "--gang-queue=zz: no ClusterQueue of that name (the cluster has a-closed, b-cpu-only")
    inactive = cq("f", selector={}, status={"conditions": [{"type": "Active", "status": "False",
                                                            "reason": "FlavorNotFound", "message": "no flavor"}]})
    assert g.pick_cluster_queue([inactive], RUN_NS, "nvidia.com/gpu")[1].endswith(
        "f: not active (FlavorNotFound: no flavor))")


def test_what_a_cluster_queue_can_admit_counts_its_cohort():
    two = cq("two", gpus="4")
    two["spec"]["resourceGroups"][0]["flavors"].append({"name": "spot", "resources": [
        {"name": "nvidia.com/gpu", "nominalQuota": "2"}]})
    assert g.nominal_quota(two, "nvidia.com/gpu") == 6 and g.nominal_quota(cq("x", gpus=None), "nvidia.com/gpu") is None
    assert g.admissible(two, [two], "nvidia.com/gpu") == 6
    team = [cq("a", gpus="4", cohort="ml"), cq("b", gpus="8", cohort="ml"), cq("c", gpus="16", cohort="other")]
    assert g.admissible(team[0], team, "nvidia.com/gpu") == 12                # 4 of its own, 8 it may borrow
    limited = [cq("a", gpus="4", cohort="ml", borrow="2"), team[1]]
    assert g.admissible(limited[0], limited, "nvidia.com/gpu") == 6
    v1beta1 = {"metadata": {"name": "old"}, "spec": {"cohort": "ml", "resourceGroups": []}}
    assert g.cohort(v1beta1) == "ml"


def test_a_jobs_state_from_api_json_or_the_clients_model():
    from kubernetes import client as k8s

    json_job = {"spec": {"suspend": True}, "status": {"conditions": [
        {"type": "Suspended", "status": "True", "reason": "JobSuspended"}, {"type": "Failed", "status": "False"}]}}
    assert g.job_state(json_job) == {"suspend": True, "active": 0, "succeeded": 0, "failed": 0,
                                     "conditions": {"Suspended": "JobSuspended"}}
    model = k8s.V1Job(spec=k8s.V1JobSpec(template=k8s.V1PodTemplateSpec(), suspend=False),
                      status=k8s.V1JobStatus(active=2, conditions=[k8s.V1JobCondition(type="Complete", status="True",
                                                                                      message="done")]))
    assert g.job_state(model) == {"suspend": False, "active": 2, "succeeded": 0, "failed": 0,
                                  "conditions": {"Complete": "done"}}


# ---------------------------------------------------------------------------- the gang's objects


class _Run:
    namespace, labels, workload_image = "gpuproof-r1", {"gpuproof.dev/run": "r1"}, None


def _gang(name: str):
    from gpuproof.plugin import gang_checks as gc

    found = g.find(KUEUE_API if name == g.KUEUE else WORKLOADS)[0]
    return gc.Gang(found, [], [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                   cq("gpus", selector={}) if name == g.KUEUE else None)


def test_the_workload_apis_gang_is_a_workload_and_a_job_whose_pods_name_it():
    from gpuproof.plugin import gang_checks as gc

    gang = _gang(g.WORKLOAD_API)
    job = gc.job_manifest(gang, _Run(), "gang-neg", 5)
    assert job["spec"]["parallelism"] == job["spec"]["completions"] == 5 and job["metadata"]["labels"] == {}
    pod = job["spec"]["template"]["spec"]
    assert pod["workloadRef"] == {"name": "gang-neg", "podGroup": "gang"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    [c] = pod["containers"]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": "1"}} and c["command"] == ["sleep", "5"]
    assert job["spec"]["template"]["metadata"]["labels"] == {gc.GANG_LABEL: "gang-neg"}
    assert gc.workload_manifest("gang-neg", 5)["spec"] == {
        "controllerRef": {"apiGroup": "batch", "kind": "Job", "name": "gang-neg"},
        "podGroups": [{"name": "gang", "policy": {"gang": {"minCount": 5}}}]}


def test_kueues_gang_is_a_job_in_the_runs_local_queue_in_the_lent_image():
    from gpuproof.images import Image
    from gpuproof.plugin import gang_checks as gc

    gang = _gang(g.KUEUE)
    run = _Run()
    run.workload_image = Image("gpuproof-workloads:lent", host_paths=(("/usr", "/usr"),), env=(("A", "1"),),
                               pull_policy="Never", device="cpu")
    job = gc.job_manifest(gang, run, "gang-pos", 2)
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "gpuproof-gang"}
    pod = job["spec"]["template"]["spec"]
    assert "workloadRef" not in pod and pod["volumes"] == [{"name": "lent-0", "hostPath": {"path": "/usr", "type": ""}}]
    [c] = pod["containers"]
    assert c["image"] == "gpuproof-workloads:lent" and c["imagePullPolicy"] == "Never"
    assert c["command"] == ["python", "-c", "import time; time.sleep(5)"] and c["env"] == [{"name": "A", "value": "1"}]
    assert gang.quota() == 4 and gang.where() == "Kueue, LocalQueue gpuproof-gang -> ClusterQueue gpus"
    gang.queue_state = "no conditions yet (is Kueue's controller running?)"      # Kueue never made it Active
    assert gang.where().endswith("ClusterQueue gpus (never Active: no conditions yet (is Kueue's controller running?))")


# ---------------------------------------------------------------------------- the control plane's gates


def test_feature_gates_reach_the_components_and_the_workload_api_is_served():
    from gpuproof.sim.fleet import ControlPlane

    fleet = parse_fleet(gang_fleet(), "test:gang")
    cp = fleet.control_plane
    assert cp.feature_gates == GATES
    assert cp.gates_flag() == ["--feature-gates=GangScheduling=true,GenericWorkload=true"]
    assert cp.runtime_config() == ["--runtime-config=scheduling.k8s.io/v1alpha1=true"]
    assert cp.key() != ControlPlane().key() == "|"
    assert ControlPlane().gates_flag() == [] and ControlPlane().runtime_config() == []
    bad = gang_fleet()
    bad["controlPlane"]["featureGates"] = {"GangScheduling": "yes"}
    with pytest.raises(Exception, match="controlPlane.featureGates.GangScheduling: must be true or false"):
        parse_fleet(bad, "test:bad")
    bad["controlPlane"]["featureGates"] = {"gang-scheduling": True}
    with pytest.raises(Exception, match="featureGates.gang-scheduling: is not a feature gate's name"):
        parse_fleet(bad, "test:bad")


# ---------------------------------------------------------------------------- the suite on embedded clusters


def _run_gang(fleet: dict, tmp_path, run_id: str, *args: str):
    from conftest import private_cluster

    with private_cluster(copy.deepcopy(fleet), tmp_path / "sim", f"test:{run_id}") as cluster:
        return cluster.run_suite("suites/test_gang.py", f"--gang-negative-window={WINDOW}", *args,
                                 report_dir=tmp_path / "reports", run_id=run_id)


@pytest.mark.cluster
def test_kubernetes_gang_scheduling_passes_the_suite_and_makes_the_requirement_implemented(tmp_path):
    from conftest import private_cluster
    from gpuproof.report.conformance import checklist, judge
    from gpuproof.report.data import load_run

    with private_cluster(gang_fleet(), tmp_path / "sim", "test:gang") as cluster:
        res = cluster.run_suite("suites/test_gang.py", f"--gang-negative-window={WINDOW}",
                                f"--junitxml={tmp_path / 'reports' / 'gang' / 'junit.xml'}",   # as gpuproof run
                                report_dir=tmp_path / "reports", run_id="gang")
        named = cluster.run_suite("suites/test_gang.py", "--gang-scheduler=kueue", report_dir=tmp_path / "reports",
                                  run_id="gang-kueue")
    assert res.code == 0 and "2 passed" in res.output, res
    verdicts = {c["check"]: (c["verdict"], c["actual"]) for c in res.checks}
    assert verdicts == {
        "gang-bound-together": ("pass", verdicts["gang-bound-together"][1]), "gang-runs": ("pass", "Complete"),
        "gang-oversize-held": ("pass", f"no pod of the 5-pod gang bound or running for {WINDOW} s")}, res
    assert re.fullmatch(r"2 of 2 bound to a100-[01], a100-[01]", verdicts["gang-bound-together"][1])
    [gang] = [j for j in judge(load_run(res.run_path), checklist("1.37")[1]) if j.requirement.id == "gang_scheduling"]
    assert gang.status == "Implemented", [p.summary() for p in gang.parts]
    assert {a for p in gang.parts for a in p.anchors} == {"TestGangScheduling/Positive", "TestGangScheduling/Negative"}
    # the user's choice of a scheduler the cluster does not have: a skip that says so
    assert named.code == 0 and {c["verdict"] for c in named.checks} == {"skip"}, named
    assert "--gang-scheduler=kueue: the API server does not serve kueue.x-k8s.io clusterqueues, localqueues" \
        in named.output


@pytest.mark.cluster
@pytest.mark.parametrize("case", list(FAULTS))
def test_gang_check_fails_on_its_fault(tmp_path, case):
    from test_suite_faults import assert_failed

    fleet, args, expectations = FAULTS[case]
    assert_failed(_run_gang(fleet, tmp_path, case, *args), expectations)


def test_a_cluster_without_a_gang_scheduler_skips_saying_so(embedded, tmp_path):
    res = embedded.run_suite("suites/test_gang.py", report_dir=tmp_path, run_id="no-gang")
    assert res.code == 0, res
    skips = {c["check"]: c["message"] for c in res.checks}
    assert set(skips) == {"gang-bound-together", "gang-oversize-held"} and {c["verdict"] for c in res.checks} == \
        {"skip"}
    assert all(m.startswith("no gang scheduler in the cluster: the API server serves none of Kueue's, Volcano's or "
                            "the KAI scheduler's APIs, nor Kubernetes' Workload API") for m in skips.values()), skips

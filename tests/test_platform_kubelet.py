"""The platform fleet (issue #53): Kueue, JobSet and Kubeflow Trainer built from their pinned modules and running on
kubelet nodes, and the operators suite against them through ``gpuproof run --kubeconfig``: green as installed, then
each check failing on a fault made the way it happens on a real cluster (a controller scaled to nothing, a webhook
configuration without its CA, a CRD whose names clash).

One private cluster for the module: its start (about 150 s on 2 cores, the operators' images built once before) is
the bulk of the cost.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import private_cluster
from test_kubelet_pods import NEEDS

from gpuproof.sim.fleet_file import FLEETS_DIR

needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
pytestmark = [pytest.mark.sim, pytest.mark.kubelet, needs_kubelet]

CONFLICT = "trainjobzs.trainer.kubeflow.org"       # a second CRD claiming kind TrainJob: its names are refused
FAST = ["--operator-ready-timeout", "3", "--operator-job-timeout", "30"]
# case: (what is done to the cluster, [(check, operator, expected, words of the actual)]): tests/test_check_coverage.py
FAULTS = {
    "jobset-controller-stopped": ("jobset's Deployment scaled to 0", [
        ("operator-pods-ready", "jobset", "every pod of jobset-system/", "no pod"),
        ("operator-webhook-rejects-invalid", "jobset", "refused by JobSet's webhook", "failed calling webhook"),
        ("operator-job-completes", "jobset", "JobSet op-jobset complete", "failed calling webhook"),
        # Trainer's controller cannot make the TrainJob's JobSet: the TrainJob never completes
        ("operator-job-completes", "kubeflow-trainer", "TrainJob op-trainjob complete", "timed out after 30s"),
    ]),
    "trainer-down-without-ca-and-a-clashing-crd": ("Trainer's Deployment scaled to 0, its webhooks' caBundle "
                                                   f"emptied, CRD {CONFLICT} claiming kind TrainJob", [
        ("operator-pods-ready", "kubeflow-trainer", "every pod of kubeflow-system/", "no pod"),
        ("operator-crds-established", "kubeflow-trainer", "CRD(s) of trainer.kubeflow.org Established", CONFLICT),
        ("operator-webhooks-have-ca", "kubeflow-trainer", "each with a CA bundle", "no CA bundle"),
        ("operator-webhook-rejects-invalid", "kubeflow-trainer", "refused by Kubeflow Trainer's webhook",
         "failed calling webhook"),
    ]),
}
CHECKS = ("operator-pods-ready", "operator-crds-established", "operator-webhooks-have-ca",
          "operator-webhook-rejects-invalid", "operator-job-completes")


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    fleet = yaml.safe_load((FLEETS_DIR / "platform.yaml").read_text())
    with private_cluster(fleet, tmp_path_factory.mktemp("platform") / "s", "platform.yaml") as c:
        yield c.sim, c.client


def run_operators(sim, tmp_path, *extra: str, keyword: str = "TestRobustCRDControllerOperation"
                  ) -> tuple[subprocess.CompletedProcess, dict]:
    from test_kubelet_pods import records

    reports = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--kubeconfig", str(sim.kubeconfig),
                           "--report-dir", str(reports), "-k", keyword, *extra,
                           "--", "--no-lease"], capture_output=True, text=True, timeout=900)
    run = sorted(p for p in reports.iterdir() if p.is_dir())[-1]
    got = {(r["check"], r["target"]): r for r in records(run, "checks.jsonl") if r["feature"] == "operators"}
    return proc, got


def scale(client, namespace: str, replicas: int) -> None:
    from gpuproof.cluster.api import watch_until

    for d in client.apps.list_namespaced_deployment(namespace).items:
        client.apps.patch_namespaced_deployment_scale(d.metadata.name, namespace, {"spec": {"replicas": replicas}})
    def settled(cache: dict) -> bool:
        if replicas == 0:
            return not cache
        return len(cache) == replicas and all(any(c.type == "Ready" and c.status == "True"
                                                  for c in p.status.conditions or []) for p in cache.values())

    watch_until(client.core.list_namespaced_pod, settled, 180,
                f"{replicas} Ready pod(s) in namespace {namespace}", namespace=namespace)


def test_the_operators_pass_as_installed_and_fail_on_their_faults(platform, tmp_path):
    from kubernetes import client as k8s

    from gpuproof.discovery.operators import _own_group

    sim, client = platform
    proc, got = run_operators(sim, tmp_path / "healthy")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert {k for k, r in got.items() if r["verdict"] == "pass"} == {
        (c, o) for c in CHECKS for o in ("kubeflow-trainer", "jobset")}, sorted(got)
    assert all(r["verdict"] == "skip" for k, r in got.items() if k[1] == "kuberay"), got
    junit = (sorted((tmp_path / "healthy" / "reports").iterdir())[-1] / "junit.xml").read_text()
    for sub in ("OperatorPodsRunning", "CRDRegistered", "WebhookOperational", "WebhookRejectsInvalidCR",
                "ControllerReconcilesCR"):
        assert f'TestRobustCRDControllerOperation" name="test_{sub}[kubeflow-trainer]"' in junit, sub

    # a stopped JobSet controller: its webhook gone with it, and Trainer cannot make its TrainJobs' JobSets
    scale(client, "jobset-system", 0)
    proc, got = run_operators(sim, tmp_path / "jobset", *FAST)
    assert proc.returncode == 1
    failed = {k for k, r in got.items() if r["verdict"] == "fail"}
    _, rows = FAULTS["jobset-controller-stopped"]
    assert failed == {(c, o) for c, o, _, _ in rows}, (sorted(failed), (proc.stdout + proc.stderr)[-3000:])
    for check, op, expected, words in rows:
        assert expected in str(got[(check, op)]["expected"]) and words in str(got[(check, op)]["actual"]), \
            got[(check, op)]
    scale(client, "jobset-system", 1)

    # Trainer's controller down, its webhooks without CA, and a CRD in its group whose names clash
    adm = k8s.AdmissionregistrationV1Api(client.api)
    scale(client, "kubeflow-system", 0)
    for lister, patch in ((adm.list_validating_webhook_configuration, adm.patch_validating_webhook_configuration),
                          (adm.list_mutating_webhook_configuration, adm.patch_mutating_webhook_configuration)):
        for cfg in lister().items:
            hooks = cfg.webhooks or []
            if _own_group([{g for r in w.rules or [] for g in r.api_groups or []} for w in hooks]) == \
                    "trainer.kubeflow.org":       # Trainer's configurations, not Kueue's (it names the group too)
                patch(cfg.metadata.name, [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle",
                                           "value": ""} for i in range(len(hooks))])
    ext = k8s.ApiextensionsV1Api(client.api)
    ext.create_custom_resource_definition({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": CONFLICT},
        "spec": {"group": "trainer.kubeflow.org", "scope": "Namespaced",
                 "names": {"plural": "trainjobzs", "singular": "trainjobz", "kind": "TrainJob",
                           "listKind": "TrainJobList"},
                 "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}})
    proc, got = run_operators(sim, tmp_path / "trainer", *FAST,
                              keyword="TestRobustCRDControllerOperation and not ControllerReconcilesCR")
    failed = {k for k, r in got.items() if r["verdict"] == "fail" and k[1] == "kubeflow-trainer"}
    _, rows = FAULTS["trainer-down-without-ca-and-a-clashing-crd"]
    assert failed == {(c, o) for c, o, _, _ in rows}, (sorted(failed), (proc.stdout + proc.stderr)[-3000:])
    for check, op, expected, words in rows:
        assert expected in str(got[(check, op)]["expected"]) and words in str(got[(check, op)]["actual"]), \
            got[(check, op)]
    assert all(r["verdict"] == "pass" for k, r in got.items() if k[1] == "jobset"), got

"""Training operators: Kubeflow Trainer, JobSet and KubeRay, as the cluster runs them.

Kubernetes AI Conformance's ``robust_controller`` (MUST; upstream ``TestRobustCRDControllerOperation``, which tests
Kubeflow Trainer only). gpuproof knows these operators from a catalog (``gpuproof/discovery/operators.yaml``: the
CRD that shows one is installed, and an object its webhook refuses); everything else is read from the cluster: its
CRDs (every CRD of its API group), its webhooks (the webhook configurations whose rules name that group) and its pods
(those the webhooks' Services select), wherever and however it was installed. A cluster without any of them skips,
saying so; so does each operator the cluster lacks.

For each operator found, five cases, named after upstream's subtests:

- ``OperatorPodsRunning``: every pod behind its webhooks' Services is Ready within ``--operator-ready-timeout``
  (300 s, as upstream) (``operator-pods-ready``; the failure lists each pod, its node and state);
- ``CRDRegistered``: each of its CRDs is Established (``operator-crds-established``);
- ``WebhookOperational``: it has webhooks, each with a CA bundle (``operator-webhooks-have-ca``: an operator that
  makes its own certificate and failed to put its CA in fails here);
- ``WebhookRejectsInvalidCR``: the catalog's invalid object (Kubeflow Trainer: upstream's TrainJob on the runtime
  ``does-not-exist-runtime``), created as a dry run in the run namespace (nothing is stored), is refused by the
  operator's webhook in its own words (``operator-webhook-rejects-invalid``; a webhook that cannot be reached fails
  with the API server's ``failed calling webhook`` error as the actual value);
- ``ControllerReconcilesCR``: a small distributed job on GPU nodes completes within ``--operator-job-timeout``
  (``operator-job-completes``): Kubeflow Trainer a TrainJob on ``torch-distributed``, JobSet a JobSet, each two pods
  of one GPU on two GPU nodes running gpuproof's all-reduce under torchrun, so the pods must find each other by the
  names the operator gave them. KubeRay's needs a Ray image: skipped, saying so.
"""

from __future__ import annotations

import pytest

from gpuproof.discovery import operators as ops
from gpuproof.plugin import operator_checks as oc

FEATURE = "operators"
NAMES = [k.name for k in ops.catalog()]


@pytest.fixture(scope="module")
def installed(target):
    found = oc.find(target.cluster)
    return found if isinstance(found, str) else {o.name: o for o in found}


def _operator(installed, name: str, check, check_name: str) -> ops.Operator:
    if isinstance(installed, str):
        check.skip(check_name, installed)
    if not installed:
        check.skip(check_name, "no training operator installed: the cluster has none of the CRDs "
                               + ", ".join(k.crd for k in ops.catalog()))
    if name not in installed:
        check.skip(check_name, f"{ops.catalog_by_name()[name].title} is not installed (no CRD "
                               f"{ops.catalog_by_name()[name].crd}); installed: {', '.join(sorted(installed))}")
    return installed[name]


@pytest.mark.conformance("robust_controller", guard=True)
@pytest.mark.parametrize("operator", NAMES)
class TestRobustCRDControllerOperation:
    """Named after the upstream test, so its JUnit cases read TestRobustCRDControllerOperation/<subtest>."""

    @pytest.mark.conformance("robust_controller", checks=("operator-pods-ready",))
    def test_OperatorPodsRunning(self, operator, installed, target, check, request):
        op = _operator(installed, operator, check, "operator-pods-ready")
        op = oc.wait_ready(target.cluster, op, request.config.getoption("operator_ready_timeout"))
        not_ready = [str(p) for p in op.pods if not p.ready]
        check.true("operator-pods-ready", bool(op.pods) and not not_ready,
                   f"every pod of {', '.join(op.selectors) or 'its selectors'} Ready (at least one)",
                   "; ".join(not_ready) if not_ready else (f"{len(op.pods)} Ready" if op.pods else "no pod"),
                   what=f"{op.known.title}'s controller pods", target=operator)

    @pytest.mark.conformance("robust_controller", checks=("operator-crds-established",))
    def test_CRDRegistered(self, operator, installed, check):
        op = _operator(installed, operator, check, "operator-crds-established")
        bad = [f"{c.name}: {c.why}" for c in op.crds if not c.established]
        check.true("operator-crds-established", not bad, f"{len(op.crds)} CRD(s) of {op.known.group} Established",
                   "; ".join(bad) or f"{len(op.crds)} Established", what=f"{op.known.title}'s CRDs", target=operator)

    @pytest.mark.conformance("robust_controller", checks=("operator-webhooks-have-ca",))
    def test_WebhookOperational(self, operator, installed, check):
        op = _operator(installed, operator, check, "operator-webhooks-have-ca")
        if not op.webhooks and not op.known.invalid:
            check.skip("operator-webhooks-have-ca", f"{op.known.title} has no webhook on {op.known.group} (optional "
                                                    "for it) and gpuproof knows no object one would refuse")
        bad = [str(w) for w in op.webhooks if not w.has_ca and not w.service.startswith("url ")]
        check.true("operator-webhooks-have-ca", bool(op.webhooks) and not bad,
                   f"webhooks on {op.known.group}, each with a CA bundle",
                   f"no CA bundle: {'; '.join(bad)}" if bad else
                   (f"{len(op.webhooks)} webhooks with a CA" if op.webhooks else "no webhook names the group"),
                   what=f"{op.known.title}'s webhooks", target=operator)

    @pytest.mark.conformance("robust_controller", checks=("operator-webhook-rejects-invalid",))
    @pytest.mark.creates("TrainJob", "gpuproof-invalid", note="a dry run: refused by the webhook, never stored")
    @pytest.mark.creates("JobSet", "gpuproof-invalid", note="a dry run: refused by the webhook, never stored")
    def test_WebhookRejectsInvalidCR(self, operator, installed, run, check):
        op = _operator(installed, operator, check, "operator-webhook-rejects-invalid")
        if not op.known.invalid:
            check.skip("operator-webhook-rejects-invalid", f"gpuproof knows no object {op.known.title}'s webhook "
                                                           "refuses")
        refused, said = oc.try_invalid(run.cluster, run, op.known)
        if refused is None:
            check.skip("operator-webhook-rejects-invalid", f"not judged: a webhook on {op.known.group} does not take "
                                                           f"dry runs, and gpuproof stores no invalid object: {said}")
        check.true("operator-webhook-rejects-invalid", refused,
                   f"refused by {op.known.title}'s webhook: " + ", ".join(
                       f'"{w}"' for w in ("denied the request", *op.known.reason)), said,
                   what=f"a {op.known.invalid['kind']} its webhook must refuse (dry run)", target=operator)

    @pytest.mark.conformance("robust_controller", checks=("operator-job-completes",))
    @pytest.mark.creates("ConfigMap", "gpuproof-workloads")
    @pytest.mark.creates("TrainJob", oc.JOBS["kubeflow-trainer"], requests="1 nvidia.com/gpu a pod, 2 pods",
                         note="all-reduce under torchrun")
    @pytest.mark.creates("JobSet", oc.JOBS["jobset"], requests="1 nvidia.com/gpu a pod, 2 pods",
                         note="all-reduce under torchrun")
    def test_ControllerReconcilesCR(self, operator, installed, run, discovery, check, request):
        op = _operator(installed, operator, check, "operator-job-completes")
        gpu_nodes = [n for n in discovery.placeable if n.gpu_resource == oc.wl.GPU_RESOURCE]
        if not gpu_nodes:
            check.skip("operator-job-completes", "no schedulable GPU node offers nvidia.com/gpu")
        if operator == "kubeflow-trainer":
            body = oc.trainjob(run, op.known, min(2, len(gpu_nodes)))
        elif operator == "jobset":
            body = oc.jobset(run, min(2, len(gpu_nodes)))
        else:
            check.skip("operator-job-completes", f"gpuproof has no job for {op.known.title} (a RayJob needs a Ray "
                                                 "image)")
        from gpuproof.bench.base import ensure_configmap

        ensure_configmap(run)
        refused = oc.submit(run.cluster, run, body)
        done, said = (False, refused) if refused else \
            oc.wait_done(run.cluster, run, body, request.config.getoption("operator_job_timeout"))
        check.true("operator-job-completes", done, f"{body['kind']} {body['metadata']['name']} complete", said,
                   what=f"{op.known.title}'s controller driving a distributed job", target=operator)

"""The operators suite's reading of a cluster (gpuproof/discovery/operators.py) on objects shaped as the API returns
them: which webhook configuration is an operator's, which refusal is its webhook's, and what the catalog holds. The
suite against real Kueue, JobSet and Kubeflow Trainer is tests/test_platform_kubelet.py."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from gpuproof.discovery import operators as ops

pytestmark = pytest.mark.unit

# the refusals seen from the platform fleet (Kueue v0.17.0, Kubeflow Trainer v2.2.0, JobSet v0.11.1)
TRAINER = ('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: spec.RuntimeRef: Invalid '
           'value: {"name":"does-not-exist-runtime","apiGroup":"trainer.kubeflow.org","kind":"ClusterTrainingRuntime"}'
           ': ClusterTrainingRuntime.trainer.kubeflow.org "does-not-exist-runtime" not found: specified '
           'clusterTrainingRuntime must be created before the TrainJob is created')
KUEUE = "admission webhook \"vtrainjob.kb.io\" denied the request: runtime 'does-not-exist-runtime' not found"
UNREACHABLE = ('Internal error occurred: failed calling webhook "mjobset.kb.io": failed to call webhook: Post '
               '"https://jobset-webhook-service.jobset-system.svc:443/mutate-jobset-x-k8s-io-v1alpha2-jobset?timeout='
               '10s": no endpoints available for service "jobset-webhook-service"')
JOBSET = ("admission webhook \"vjobset.kb.io\" denied the request: invalid replicatedJob name 'does-not-exist' does "
          "not appear in .spec.ReplicatedJobs")


def test_the_catalog_names_each_operator_once_with_an_object_and_words_for_its_webhook():
    cat = ops.catalog()
    assert [k.name for k in cat] == ["kubeflow-trainer", "jobset", "kuberay"]
    assert [k.group for k in cat] == ["trainer.kubeflow.org", "jobset.x-k8s.io", "ray.io"]
    for k in cat:
        if k.invalid:
            assert k.invalid["apiVersion"].split("/")[0] == k.group and k.reason, k
    assert [k.name for k in cat if k.upstream] == ["kubeflow-trainer"]
    assert ops.catalog_by_name()["kubeflow-trainer"].runtime == "torch-distributed"


@pytest.mark.parametrize("message, operator, refused", [
    (TRAINER, "kubeflow-trainer", True),
    (KUEUE, "kubeflow-trainer", True),          # Kueue's webhook on TrainJobs answered first: the same words
    (UNREACHABLE, "jobset", False),             # the webhook's pods are gone
    (JOBSET, "jobset", True),
    (JOBSET, "kubeflow-trainer", False),        # another operator's words
    ('TrainJob.trainer.kubeflow.org "x" is invalid: spec.runtimeRef.name: Required value', "kubeflow-trainer",
     False),                                    # the CRD's schema, not a webhook
])
def test_a_refusal_counts_only_as_the_webhooks_own_words(message, operator, refused):
    assert ops.refusal_matches(ops.catalog_by_name()[operator], message) is refused


@pytest.mark.parametrize("groups, owner", [
    # Kueue's validating configuration: most of its webhooks are on Kueue's own kinds
    ([{"kueue.x-k8s.io"}] * 5 + [{"jobset.x-k8s.io"}, {"trainer.kubeflow.org"}, {"batch"}, {""}], "kueue.x-k8s.io"),
    ([{"jobset.x-k8s.io"}, {""}], "jobset.x-k8s.io"),                 # JobSet's: its JobSets and its pods
    ([{"trainer.kubeflow.org"}] * 3, "trainer.kubeflow.org"),
    ([{"jobset.x-k8s.io"}, {"trainer.kubeflow.org"}], ""),           # a tie: no one's
    ([{"apps"}, {"batch"}, {"resource.k8s.io"}], ""),                 # Kubernetes' own groups are no operator's
])
def test_a_webhook_configuration_belongs_to_the_group_most_of_its_webhooks_name(groups, owner):
    assert ops._own_group(groups) == owner


def _hook(name, group, ca=b"ca", service=("kueue-system", "kueue-webhook-service")):
    rule = NS(api_groups=[group], resources=["things"], operations=["CREATE"])
    return NS(name=name, rules=[rule], client_config=NS(service=NS(namespace=service[0], name=service[1]), url=None,
                                                        ca_bundle=ca), side_effects="None", failure_policy="Fail")


def test_an_operators_webhooks_are_those_of_its_own_configurations():
    kueue = NS(metadata=NS(name="kueue-validating-webhook-configuration"),
               webhooks=[_hook(f"v{i}.kb.io", "kueue.x-k8s.io") for i in range(4)] +
               [_hook("vjobset.kb.io", "jobset.x-k8s.io")])
    jobset = NS(metadata=NS(name="jobset-validating-webhook-configuration"),
                webhooks=[_hook("vjobset.kb.io", "jobset.x-k8s.io", ca=None,
                                service=("jobset-system", "jobset-webhook-service"))])
    adm = NS(list_mutating_webhook_configuration=lambda: NS(items=[]),
             list_validating_webhook_configuration=lambda: NS(items=[kueue, jobset]))
    hooks = ops._webhooks(adm, "jobset.x-k8s.io")
    assert [(h.configuration, h.service, h.has_ca) for h in hooks] == [
        ("ValidatingWebhookConfiguration jobset-validating-webhook-configuration",
         "jobset-system/jobset-webhook-service", False)]


def _refusing(status: int, message: str):
    from kubernetes.client.exceptions import ApiException

    def create(*args, **kwargs):
        assert kwargs.get("dry_run") == "All"             # never stored
        exc = ApiException(status=status, reason="Bad")
        exc.body = '{"message": %s}' % __import__("json").dumps(message)
        raise exc
    return NS(custom=NS(create_namespaced_custom_object=create))


def test_the_invalid_object_is_a_dry_run_judged_by_the_webhooks_words_or_not_at_all():
    from gpuproof.plugin import operator_checks as oc

    run = NS(namespace="gpuproof-x", labels={"gpuproof.dev/run": "x"})
    trainer = ops.catalog_by_name()["kubeflow-trainer"]
    assert oc.try_invalid(_refusing(403, TRAINER), run, trainer) == (True, TRAINER)
    assert oc.try_invalid(_refusing(500, UNREACHABLE), run, trainer) == (False, UNREACHABLE)
    side_effects = 'admission webhook "vtrainjob.example.com" does not support dry run'
    assert oc.try_invalid(_refusing(400, side_effects), run, trainer) == (None, side_effects)
    accepted = NS(custom=NS(create_namespaced_custom_object=lambda *a, **k: {}))
    assert oc.try_invalid(accepted, run, trainer) == (
        False, "accepted: no webhook refused it (dry run, nothing stored)")


def test_credentials_that_may_not_read_crds_are_a_reason_not_an_error(monkeypatch):
    from kubernetes.client.exceptions import ApiException

    from gpuproof.plugin import operator_checks as oc

    def forbidden(api, core):
        exc = ApiException(status=403, reason="Forbidden")
        exc.body = ('{"message": "customresourcedefinitions.apiextensions.k8s.io is forbidden: '
                    'User \\"x\\" cannot list"}')
        raise exc
    monkeypatch.setattr(ops, "find", forbidden)
    why = oc.find(NS(api=None, core=None))
    assert why.startswith("cannot read the cluster's CRDs, webhooks or Services: 403 customresourcedefinitions"), why

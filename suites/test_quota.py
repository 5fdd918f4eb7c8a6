"""GPU quotas: a ResourceQuota on requests.nvidia.com/gpu and a LimitRange maximum are enforced.

Each check works in a namespace of its own (labelled with the run), so the quota
cannot affect the rest of the run.
"""

import pytest

from gpuproof.cluster.conditions import wait_quota_computed
from gpuproof.plugin.checks import pod

FEATURE = "quota"
GPU = "nvidia.com/gpu"


def _refused(err) -> str:
    if err is None:
        return "accepted"
    import json

    try:
        return f"refused (HTTP {err.status}): {json.loads(err.body)['message']}"
    except Exception:
        return f"refused (HTTP {err.status})"


@pytest.mark.creates("Namespace", "gpuproof-{run}-quota")
@pytest.mark.creates("ResourceQuota", "gpus", namespace="gpuproof-{run}-quota", note="requests.nvidia.com/gpu: 2")
@pytest.mark.creates("Pod", "gpu-<i>", "3 (the third is refused)", namespace="gpuproof-{run}-quota", on="any",
                      requests="1 nvidia.com/gpu")
def test_resource_quota_limits_gpu_requests(run, target, check):
    ns = run.create_namespace("quota")
    run.apply({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpus", "namespace": ns},
               "spec": {"hard": {f"requests.{GPU}": "2"}}}, namespace=ns)
    # the quota is enforced once its controller has computed the usage
    wait_quota_computed(target.cluster.core, ns, "gpus", f"requests.{GPU}", target.timeouts.quota_ready)
    results = [_refused(run.try_apply(pod(f"gpu-{i}", {GPU: 1}), namespace=ns)[1]) for i in range(3)]
    check.equal("quota-admits-within", ["accepted", "accepted"], results[:2],
                what=f"pods asking 1 {GPU} each under a quota of 2", target=f"namespace/{ns}")
    check.true("quota-refuses-over", results[2].startswith("refused") and "exceeded quota" in results[2],
               expected="refused: exceeded quota", actual=results[2],
               what=f"the third 1-{GPU} pod under a quota of 2", target=f"namespace/{ns}")


@pytest.mark.creates("Namespace", "gpuproof-{run}-limits")
@pytest.mark.creates("LimitRange", "gpus", namespace="gpuproof-{run}-limits", note="max nvidia.com/gpu 1 per container")
@pytest.mark.creates("Pod", "one", namespace="gpuproof-{run}-limits", on="any", requests="1 nvidia.com/gpu")
@pytest.mark.creates("Pod", "two", namespace="gpuproof-{run}-limits", on="any", requests="2 nvidia.com/gpu",
                      note="refused at admission")
def test_limit_range_caps_gpus_per_container(run, target, check):
    ns = run.create_namespace("limits")
    run.apply({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "gpus", "namespace": ns},
               "spec": {"limits": [{"type": "Container", "max": {GPU: "1"}}]}}, namespace=ns)
    ok = _refused(run.try_apply(pod("one", {GPU: 1}), namespace=ns)[1])
    over = _refused(run.try_apply(pod("two", {GPU: 2}), namespace=ns)[1])
    check.equal("limitrange-admits-max", "accepted", ok, what=f"a container asking 1 {GPU} (max 1)",
                target=f"namespace/{ns}")
    check.true("limitrange-refuses-over", over.startswith("refused") and f"maximum {GPU}" in over,
               expected=f"refused: maximum {GPU} usage per Container is 1", actual=over,
               what=f"a container asking 2 {GPU} (max 1)", target=f"namespace/{ns}")

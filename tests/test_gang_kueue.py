"""The gang suite under real Kueue (issue #53 item 1): Kueue v0.17.0 built from its module and run on a kubelet
node of the embedded cluster (``platform: [kueue]``, gpuproof/sim/platform.py), with its ClusterQueue
``gpuproof-gpus`` holding the fleet's 4 GPUs and open to every namespace.

The suite finds Kueue from the API, picks that ClusterQueue, makes its own LocalQueue and passes by name: a gang of 2
admitted, bound and complete; a gang of 5 (one more than the free GPUs and than the queue admits) suspended by
Kueue's webhook with no pod for the window. Then Kueue is stopped (its Deployment scaled to 0) and its webhooks
removed, as an uninstall that left its CRDs: the oversized gang's Job runs unsuspended, its pods bind one by one, and
``gang-oversize-held`` fails naming the Job's state and each pod bound with its node.
"""

from __future__ import annotations

import re

import pytest

from test_kubelet_pods import NEEDS

WINDOW = 3
POD = r"gang-neg-[a-z0-9]{5}"
KUEUE_FLEET = {
    "name": "gang-kueue", "platform": ["kueue"],
    "defaults": {"gpu": {"driverVersion": "550.163.01", "cudaVersion": "12.4"},
                 "taints": ["nvidia.com/gpu=present:NoSchedule"]},
    "pools": [{"name": "a100", "count": 2, "backend": "kubelet", "instanceType": "a2-highgpu-2g",
               "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}},
              {"name": "ops", "count": 1, "backend": "kubelet", "instanceType": "e2-standard-8", "taints": []}]}
HELD = f"no pod of the 5-pod gang bound or running for {WINDOW} s, its Job suspended with no pod active"

# case: (what is done to Kueue, [(check, target, expected, actual)] that must fail)
FAULTS = {
    "kueue-stopped-and-its-webhooks-gone": ("stop_kueue", [
        ("gang-oversize-held", "cluster", HELD,
         re.compile(rf"[1-5] bound: Job admitted: suspend=false, [0-5] active, .*; {POD} on a100-[01]"
                    rf"(; {POD} on a100-[01])*"))]),
}


def stop_kueue(client, timeout: float = 120.0) -> None:
    """Kueue's controller stopped and its webhooks removed (its CRDs, ClusterQueue and LocalQueues stay)."""
    from kubernetes import client as k8s

    from gpuproof.cluster.api import watch_until

    client.apps.patch_namespaced_deployment_scale("kueue-controller-manager", "kueue-system",
                                                  {"spec": {"replicas": 0}})
    admission = k8s.AdmissionregistrationV1Api(client.api)
    admission.delete_mutating_webhook_configuration("kueue-mutating-webhook-configuration")
    admission.delete_validating_webhook_configuration("kueue-validating-webhook-configuration")
    watch_until(client.core.list_namespaced_pod, lambda c: not c, timeout, "Kueue's controller pod to be gone",
                namespace="kueue-system", label_selector="control-plane=controller-manager")


@pytest.mark.kubelet   # tier: a private cluster with kubelet nodes and Kueue on one of them
@pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
@pytest.mark.parametrize("case", list(FAULTS))
def test_kueue_holds_the_oversized_gang_and_stopped_lets_its_pods_bind(tmp_path, case):
    from conftest import private_cluster
    from test_suite_faults import assert_failed

    fault, expectations = FAULTS[case]
    with private_cluster(KUEUE_FLEET, tmp_path / "sim", "test:gang-kueue") as cluster:
        healthy = cluster.run_suite("suites/test_gang.py", f"--gang-negative-window={WINDOW}",
                                    report_dir=tmp_path / "reports", run_id="kueue")
        globals()[fault](cluster.client)
        broken = cluster.run_suite("suites/test_gang.py", "-k", "Negative", f"--gang-negative-window={WINDOW}",
                                   "--timeout-scale=0.1", report_dir=tmp_path / "reports", run_id=case)
    assert healthy.code == 0 and "2 passed" in healthy.output, healthy
    verdicts = {c["check"]: (c["verdict"], c["actual"]) for c in healthy.checks}
    assert verdicts == {"gang-bound-together": ("pass", verdicts["gang-bound-together"][1]),
                        "gang-runs": ("pass", "Complete"), "gang-oversize-held": ("pass", HELD)}, healthy.checks
    assert re.fullmatch(r"2 of 2 bound to a100-[01], a100-[01]", verdicts["gang-bound-together"][1]), verdicts
    assert_failed(broken, expectations)
    assert "under Kueue, LocalQueue gpuproof-gang -> ClusterQueue gpuproof-gpus (never Active" in broken.output

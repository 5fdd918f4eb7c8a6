"""The API server killed and restarted while a whole `gpuproof run` waits on pods of a real kubelet node (issue #41
item 7; tests/test_api_faults.py's harness, whose cases run on kwok nodes): the kubelet, the scheduler and the run's
waits all outlast the restart, and the access suite's pods (real containers) are judged as without it."""

from __future__ import annotations

import pytest

from conftest import private_cluster
from gpuproof.sim import kubelet
from test_api_faults import GpuproofRun, _clean, restarted_once_scheduled

FLEET = {"name": "kapi", "pools": [{"name": "a100", "count": 1, "backend": "kubelet", "instanceType": "a2-highgpu-1g",
                                    "gpu": {"product": "NVIDIA-A100-SXM4-40GB", "count": 1}}]}
ACCESS = ("access-granted-one-gpu", "access-ungranted-none", "access-envvar-none", "access-sibling-none")


@pytest.mark.kubelet   # tier: a private cluster with a kubelet node, `gpuproof run` as a process
@pytest.mark.skipif(bool(kubelet.missing()), reason=kubelet.missing() or "")
def test_an_api_server_restarted_under_a_pod_wait_on_a_kubelet_node_is_outlasted(tmp_path):
    """SIGKILL once the scheduler has put the run's first access pod on the kubelet node (the run is waiting for it
    to run and end), the API server started again at once: exit 0, no cut-short line, the four access checks pass
    on the node, the report whole, and `gpuproof clean` leaves nothing."""
    with private_cluster(FLEET, tmp_path / "cluster", "kapi.yaml") as cluster:
        run = GpuproofRun(cluster, tmp_path, "kubelet-restart", select="TestSecureAcceleratorAccess")
        checks = restarted_once_scheduled(cluster, run)
        passed = {c["check"] for c in checks if c["verdict"] == "pass" and c["target"] == "a100-0"}
        assert passed >= set(ACCESS), checks
        _clean(cluster, run.rid)

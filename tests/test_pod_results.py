"""A finished pod's JSON result is read from its log once the log holds it: the runtime can copy a container's
last lines (the workload's result) after the kubelet has reported the exit. Without a result, the error says how
the container ended and shows the log's last lines."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from gpuproof.bench import workloads as wl
from gpuproof.cluster import api
from gpuproof.errors import GpuproofError


class LateLog(api.Run):
    """A Run whose pod log gains its lines one read at a time (no cluster)."""

    def __init__(self, reads: list[str], exit_code: int = 0, reason: str | None = None):
        self.namespace = "gpuproof-test"
        self.reads, self.count = reads, 0
        self.ended = k8s.V1Pod(status=k8s.V1PodStatus(phase="Failed" if exit_code else "Succeeded", container_statuses=[
            k8s.V1ContainerStatus(name="workload", image="i", image_id="", ready=False, restart_count=0,
                                  state=k8s.V1ContainerState(terminated=k8s.V1ContainerStateTerminated(
                                      exit_code=exit_code, reason=reason)))]))

    def pod_logs(self, name, container=None):
        self.count += 1
        return self.reads[min(self.count, len(self.reads)) - 1]

    def pod(self, name):
        return self.ended


def test_the_result_that_reaches_the_log_late_is_read():
    run = LateLog(["starting\n", "starting\nload: 1.0s\n", 'starting\nload: 1.0s\n{"ok": true, "items": [1]}\n'])
    assert wl.pod_result(run, "bench-health-a100-0", what="health pod") == {"ok": True, "items": [1]}
    assert run.count == 3, "read until the JSON line arrived, and no more"


def test_a_pod_without_a_result_says_how_it_ended(monkeypatch):
    monkeypatch.setattr(api, "LOG_SETTLE_S", 0.3)
    run = LateLog(["Traceback (most recent call last):\n  File x\nRuntimeError: NVML lost\n"], exit_code=137,
                  reason="OOMKilled")
    with pytest.raises(GpuproofError) as err:
        wl.pod_result(run, "bench-health-a100-0", what="health pod gpuproof-test/bench-health-a100-0")
    first, *tail = str(err.value).splitlines()
    assert first == ("health pod gpuproof-test/bench-health-a100-0 printed no JSON result "
                     "(workload: exit code 137 (OOMKilled)); last lines of its log:")
    assert tail[-1] == "RuntimeError: NVML lost"
    assert run.count >= 2, "the log was read again before it was taken as final"

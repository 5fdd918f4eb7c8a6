"""Gang scheduling: a gang's GPU pods are bound all together, or none of them is.

Kubernetes AI Conformance's ``gang_scheduling`` (MUST; upstream ``TestGangScheduling``). The gang scheduler is the
cluster's own, found from its API: Kueue (its ClusterQueues and LocalQueues), or Kubernetes' Workload API
(``scheduling.k8s.io/v1alpha1`` ``workloads``, the scheduler's GangScheduling plugin); Volcano and NVIDIA's KAI
scheduler are recognised and named in the skip, for gpuproof has no backend for them yet. ``--gang-scheduler`` names
one, ``--gang-queue`` a Kueue ClusterQueue (default: the one that admits the run's namespace and has GPU quota; the run
makes its own LocalQueue pointing at it and never makes a ClusterQueue). A cluster without a gang scheduler skips,
saying so.

A gang is a batch/v1 Job with ``parallelism`` = ``completions``, each pod asking one ``nvidia.com/gpu`` and running
``sleep 5``:

- ``Positive``: a gang of 2 is bound, every pod to a node, within 2 minutes (``gang-bound-together``), and the Job
  completes within them (``gang-runs``; under Kueue its queue label still on it);
- ``Negative``: a gang one pod larger than the free GPUs (the GPU nodes' allocatable ``nvidia.com/gpu`` less what
  their pods hold, read from the cluster; under Kueue larger than the ClusterQueue can admit too) has no pod bound to
  a node or running for the whole negative window (``--gang-negative-window``, 30 s as upstream's), and under Kueue
  its Job stays suspended with no pod active, succeeded or failed (``gang-oversize-held``); then it is removed.

A partial admission fails naming each pod that was bound and its node. A verdict reached while other people's pods
came to or left the GPU nodes is a skip with that reason. The JUnit cases are ``TestGangScheduling::test_Positive``
and ``TestGangScheduling::test_Negative``: gpuproof conformance reads them as ``TestGangScheduling/<case>``.
"""

from __future__ import annotations

import time

import pytest

from gpuproof.cluster.churn import ForeignPods
from gpuproof.plugin import gang_checks as gc

FEATURE = "gang"
POSITIVE, NEGATIVE = "gang-pos", "gang-neg"


@pytest.fixture(scope="module")
def gang(target, run, discovery, request):
    """The cluster's gang scheduler (:class:`gpuproof.plugin.gang_checks.Gang`), or why the suite skips."""
    return gc.find(target, run, discovery, request.config)


def _gang_or_skip(gang, check, name: str) -> gc.Gang:
    if isinstance(gang, str):
        check.skip(name, gang)
    return gang


@pytest.mark.creates("LocalQueue", gc.LOCAL_QUEUE, note="Kueue only: points at the cluster's ClusterQueue")
@pytest.mark.conformance("gang_scheduling", guard=True)
class TestGangScheduling:
    """Named after the upstream test, so its JUnit cases read TestGangScheduling/<case>."""

    @pytest.mark.conformance("gang_scheduling", checks=("gang-bound-together", "gang-runs"))
    @pytest.mark.creates("Workload", POSITIVE, note="the Workload API only: one pod group, minCount 2")
    @pytest.mark.creates("Job", POSITIVE, on="any", requests="1 nvidia.com/gpu a pod", note="parallelism 2, sleep 5")
    def test_Positive(self, gang, run, target, check):
        gang = _gang_or_skip(gang, check, "gang-bound-together")
        free = gc.free_gpus(target.cluster, gang.nodes)
        room = min(sum(free.values()), gang.quota() if gang.kueue else sum(free.values()))
        if room < gc.POSITIVE_SIZE:
            check.skip("gang-bound-together", f"a gang of {gc.POSITIVE_SIZE} needs {gc.POSITIVE_SIZE} free GPUs; "
                       f"{'the queue admits' if gang.kueue and room < sum(free.values()) else 'the cluster has'} "
                       f"{room}")
        churn = ForeignPods(target.cluster, run.run_id, gang.node_names)
        size, start = gc.POSITIVE_SIZE, time.monotonic()
        gc.submit(gang, run, POSITIVE, size)
        try:
            pods = gc.watch_bound(run, POSITIVE, size, gc.deadline(target))
            placed = gc.bound(pods)
            ok = len(placed) >= size
            check.true("gang-bound-together", ok, f"{size} of {size} pods bound within {gc.deadline(target):g} s",
                       f"{len(placed)} of {size} bound" + (f" to {', '.join(sorted(placed.values()))}" if ok else
                                                           f": {gc.describe(pods) or 'no pod made'}"),
                       what=f"a gang of {size} GPU pods under {gang.where()}", target="cluster", churn=churn)
            job = gc.watch_job_done(run, POSITIVE, gc.deadline(target) - (time.monotonic() - start))
            lost = sorted(k for k in gang.job_labels() if k not in _labels(run, POSITIVE))
            actual = "Complete" if "Complete" in job.get("conditions", {}) else \
                f"{_job_text(job)}; pods: {gc.describe(gc.pods_of(run, POSITIVE)) or 'none'}"
            if actual == "Complete" and lost:
                actual = f"Complete, but the Job lost its label {', '.join(lost)}"
            check.equal("gang-runs", "Complete", actual, what=f"the gang's Job {POSITIVE} within "
                        f"{gc.deadline(target):g} s of its creation", target="cluster", churn=churn)
        finally:
            gc.remove(gang, run, POSITIVE, target.timeouts.pods_settled)

    @pytest.mark.conformance("gang_scheduling", checks=("gang-oversize-held",))
    @pytest.mark.creates("Workload", NEGATIVE, note="the Workload API only: one pod group, minCount = the gang")
    @pytest.mark.creates("Job", NEGATIVE, on="any", requests="1 nvidia.com/gpu a pod",
                         note="parallelism: the free GPUs + 1 (under Kueue: and its quota + 1)")
    def test_Negative(self, gang, run, target, check, request):
        gang = _gang_or_skip(gang, check, "gang-oversize-held")
        window = float(request.config.getoption("gang_negative_window"))
        free = sum(gc.free_gpus(target.cluster, gang.nodes).values())
        size = max(free, gang.quota() or 0) + 1
        churn = ForeignPods(target.cluster, run.run_id, gang.node_names)
        gc.submit(gang, run, NEGATIVE, size)
        try:
            ever = gc.observe_held(run, NEGATIVE, window)
            wrong = [f"{n} on {node}" for n, node in sorted(ever.items())]
            expected = f"no pod of the {size}-pod gang bound or running for {window:g} s"
            if gang.kueue:
                job = gc.read_job(run, NEGATIVE)
                if not job["suspend"] or job["active"] or job["succeeded"] or job["failed"]:
                    wrong.insert(0, f"Job admitted: {_job_text(job)}")
                expected += ", its Job suspended with no pod active"
            check.equal("gang-oversize-held", expected, f"{len(ever)} bound: {'; '.join(wrong)}" if wrong else expected,
                        what=f"a gang larger than the {free} free GPUs"
                             + (f" and the {gang.quota()} the queue admits" if gang.kueue else "")
                             + f", under {gang.where()}", target="cluster", churn=churn)
        finally:
            gc.remove(gang, run, NEGATIVE, target.timeouts.pods_settled)


def _labels(run, name: str) -> dict:
    return run.cluster.batch.read_namespaced_job(name, run.namespace).metadata.labels or {}


def _job_text(job: dict) -> str:
    if not job:
        return "no Job seen"
    conds = ", ".join(f"{k}: {v}" if v else k for k, v in sorted(job.get("conditions", {}).items()))
    return (f"suspend={str(job['suspend']).lower()}, {job['active']} active, {job['succeeded']} succeeded, "
            f"{job['failed']} failed" + (f" ({conds})" if conds else ""))

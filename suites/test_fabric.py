"""Fabric: NCCL between GPU nodes, every node and pair measured, the transport NCCL really used named and judged.

A GPU cluster is more than its nodes: training jobs live or die on the fabric between them, and that is what breaks
after an upgrade of the driver, OFED, the network operator, NCCL or the image. For every pool of whole-GPU nodes
(one product in one node shape, two nodes or more):

- **Pairs, side by side.** Rounds of disjoint node pairs (the circle method: by default two rounds, three for an odd
  count, so every node meets two partners; ``GPUPROOF_FABRIC_PAIRS=all`` measures every pair, ``=N`` N rounds), each
  pair an all-reduce over every GPU of both nodes at 1 GiB, as many pairs at once as ``--parallel`` pods allow (two
  pods a pair). A pair below 80% of its pool's reference (the median of its nodes' best pairs, which neither a slow
  node nor a slow link moves) is slow; each node of a slow pair is measured again with a known-good node. A node slow
  with a known-good node too fails ``fabric-node``; a pair slow while both its nodes are fine with others fails
  ``fabric-link``. Each failure names the node or pair, its figure, the reference and the limit. A pair whose job
  did not run, or whose result holds a wrong element, fails ``fabric-pair-result`` with the pod's error.
- **Transport truth.** The pods log NCCL's init and network lines (``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,NET``)
  and the workload reads, per rank, the network plugin and transport NCCL used between the nodes (InfiniBand with or
  without GPUDirect RDMA, RoCE, EFA through aws-ofi-nccl, GPUDirect-TCPX/TCPXO, Socket) and within a node (P2P/IPC,
  CUMEM, SHM, NVLS), in the forms NCCL 2.18 to 2.28 print. A node that offers an RDMA fabric (an ``rdma/*``,
  ``nvidia.com/hostdev`` or ``vpc.amazonaws.com/efa`` resource, or a DRA network device) whose NCCL fell back to
  Socket fails ``fabric-transport``, naming the node, what it offers and the line NCCL printed. The pods ask for the
  fabric resources their nodes advertise, with ``IPC_LOCK``; ``GPUPROOF_FABRIC_POD=<file>`` merges a YAML pod
  fragment into every fabric pod (your NCCL settings, volumes, resources).
- **Floors per interconnect.** The catalog's ``fabricFloors`` (each with its source), judged at messages of their
  size or more and only where the transport NCCL used is the floor's (``fabric-floor``).
  ``GPUPROOF_FABRIC_FLOORS=pool=80,ib=45,efa=300`` changes the pool percent and the floors.
- **The ring** over every node of the pool with the collectives users run (all_reduce, all_gather, reduce_scatter,
  alltoall, sendrecv: nccl-tests' bus bandwidths, a wrong-result check each): ``fabric-ring-result``.

Records (benchmark ``fabric``): each pair's bus bandwidth and transport, each node's best pair, the pool's
reference, the slow pairs, bad nodes and links by name, the schedule and its wall time.

On the embedded cluster's kubelet nodes the pairs run gloo over TCP between the nodes' network namespaces (no NCCL,
no RDMA: the records say so), and a fleet fault shapes a node's network or one link with the kernel's ``tc``
(``netRateMbit``, ``slowLink``). Only a real multi-node GPU cluster shows NCCL choosing IB or GDRDMA in a pod,
realistic bandwidths, NVLS and rail-level faults.
"""

from __future__ import annotations

import pytest

from gpuproof.bench import fabric, fabric_checks, fabric_plan
from gpuproof.bench import get as get_bench
from gpuproof.plugin import bench_checks

pytestmark = pytest.mark.bench


def whole_gpu_pools(discovery, gpu_products: dict) -> dict[tuple[str, int], list[str]]:
    """(product, GPUs per node) -> nodes with whole GPUs (not shared, not MIG), pools of two nodes or more."""
    pools: dict[tuple[str, int], list[str]] = {}
    for product, nodes in gpu_products.items():
        for node in nodes:
            resource, gpus = bench_checks.node_gpus(discovery, node, all_gpus=True)
            if resource == "nvidia.com/gpu":
                pools.setdefault((product, gpus), []).append(node)
    return {k: sorted(v) for k, v in sorted(pools.items()) if len(v) >= 2}


def pools_or_skip(target, discovery, gpu_products: dict) -> dict[tuple[str, int], list[str]]:
    bench_checks.require_real_gpus(target, discovery, gpu_products)
    pools = whole_gpu_pools(discovery, gpu_products)
    if not pools:
        pytest.skip("no GPU product has two nodes or more with whole (unshared, non-MIG) GPUs")
    return pools


def pod_plan(run, discovery, nodes: list[str], gpus: int, device: str) -> fabric.PodPlan:
    known = {n: discovery.node(n) for n in nodes}
    return fabric.PodPlan(image=bench_checks.image(run), gpus=gpus if device == "cuda" else 1,
                          tolerations=bench_checks.node_tolerations(discovery, *nodes),
                          limits={n: fabric.fabric_limits(x) for n, x in known.items()},
                          patch=fabric.pod_patch(), device=device)


def record(check, finding: fabric_checks.Finding) -> None:
    if finding.skip and finding.ok:
        check.record(finding.check, "skip", finding.expected, finding.actual, f"{finding.target}: {finding.skip}",
                     target=finding.target)
    else:
        check.true(finding.check, finding.ok, finding.expected, finding.actual, what=finding.what,
                   target=finding.target)


@pytest.mark.gpu
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "fab-<run>-<n>-0, -1", "per pair", on="the pair's two nodes",
                     requests="all GPUs of each node, and the fabric resources it advertises")
@pytest.mark.creates("Service", "fab-<run>-<n>", "per pair", note="headless: pod 0's DNS name for the rendezvous")
def test_fabric_pairs(target, run, run_dir, gpu_products, discovery, fanout, check):
    pools = pools_or_skip(target, discovery, gpu_products)
    device = bench_checks.device(run)
    every, rounds = fabric_plan.schedule_from_env()
    pct, floors = fabric_plan.settings(device=device)
    pair_params, _ = fabric.params_for(device, quick=getattr(run, "quick_bench", False))
    for (product, gpus), nodes in pools.items():
        offered = {n: fabric.offers(discovery.node(n)) for n in nodes}
        with fabric.runner(run, pod_plan(run, discovery, nodes, gpus, device), fanout.parallel,
                           fanout.say) as r:
            outcome = fabric.measure_pool(r, product, gpus, nodes, offered, pair_params, pct, every, rounds)
        run_dir.add_metrics(bench_checks.mark(fabric_checks.records(outcome), run))
        for finding in fabric_checks.findings(outcome, floors):
            record(check, finding)


@pytest.mark.gpu
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "fab-<run>-<n>-<i>", "per pool", on="every node of the pool",
                     requests="all GPUs of each node, and the fabric resources it advertises")
@pytest.mark.creates("Service", "fab-<run>-<n>", "per pool", note="headless")
def test_fabric_ring(target, run, run_dir, gpu_products, discovery, fanout, check):
    pools = pools_or_skip(target, discovery, gpu_products)
    device = bench_checks.device(run)
    _, ring_params = fabric.params_for(device, quick=getattr(run, "quick_bench", False))
    for (product, gpus), nodes in pools.items():
        what = f"fabric {product} x{gpus}: ring over {len(nodes)} nodes"
        fanout.say(f"{what}: {ring_params['collectives']}")
        with fabric.runner(run, pod_plan(run, discovery, nodes, gpus, device), len(nodes) * 2,
                           fanout.say) as r:
            job = r.one(nodes, ring_params)
        if job.result:
            run_dir.add_metrics(bench_checks.mark(
                get_bench("allreduce").to_records(job.result, node=f"{len(nodes)} nodes", product=product), run))
        check.true("fabric-ring-result", job.ok, fabric_checks.PAIR_OK, "ok" if job.ok else job.why_not_ok(), what=what,
                   target=nodes[0])

"""MIG: partitioned GPUs are advertised, labelled and handed out one slice per pod.

Mixed strategy: each ``nvidia.com/mig-<profile>`` resource equals its
``nvidia.com/mig-<profile>.count`` label. Single strategy: ``nvidia.com/gpu`` equals the
instance count and the product ends in ``-MIG-<profile>``. Pods asking for a profile
land only where it exists. On real GPUs each pod sees exactly one MIG device, devices
are distinct across pods, and visible memory is about the profile's.
"""

import pytest

from gpuproof.catalog import MIG_NAME, lookup
from gpuproof.cluster.churn import ForeignPods
from gpuproof.cluster.conditions import wait_for
from gpuproof.plugin.checks import for_nodes
from gpuproof.plugin.checks import (TOLERATE_ALL, free_on, mig_device_checks, pod, pod_outcome, pod_settled, probe_on,
                                    used_on)

FEATURE = "mig"
pytestmark = [pytest.mark.device_plugin,     # DRA-only nodes: see test_dra.py
              pytest.mark.conformance("gpu_sharing", name="MIG", checks=("*",))]


def mixed(n):
    """nodes with the mixed MIG strategy"""
    return n.mig_strategy == "mixed"


def single(n):
    """nodes with the single MIG strategy"""
    return n.mig_strategy == "single"


@for_nodes(mixed)
def test_mixed_resources_match_count_labels(gpu_node, check):
    n = gpu_node
    labels, resources = n.mig_count_labels, n.mig_resources
    if not labels:      # MIG known from the resources alone: no label to hold them against
        check.skip("mig-capacity-matches-count", f"{n.name} advertises {sorted(resources)} but carries no "
                   "nvidia.com/mig-<profile>.count labels to compare them with")
    for profile in sorted(set(labels) | set(resources)):
        res = f"nvidia.com/mig-{profile}"
        expected = labels.get(profile)
        check.equal("mig-capacity-matches-count", expected, n.capacity_of(res),
                    what=f"capacity of {res} vs label {res}.count")
        check.equal("mig-allocatable-matches-count", expected, n.allocatable_of(res),
                    what=f"allocatable of {res} vs label {res}.count")


@for_nodes(mixed)
def test_mixed_profiles_exist_on_product(gpu_node, check):
    product = lookup(gpu_node.product)
    if product is None:
        check.skip("mig-profile-known", f"gpuproof has no MIG table for {gpu_node.product}")
    valid = sorted(p.name for p in product.mig)
    for profile in sorted(set(gpu_node.mig_resources) | set(gpu_node.mig_count_labels)):
        check.true("mig-profile-known", profile in valid, expected=f"a {gpu_node.product} profile: {valid}",
                   actual=f"nvidia.com/mig-{profile}", what="advertised MIG profile")


@for_nodes(single)
def test_single_strategy_advertisement(gpu_node, check):
    n = gpu_node
    if n.count_label is None and not n.gfd:
        check.skip("mig-single-count", f"labelled by {n.scheme}: no source for the GPU count besides the capacity")
    check.equal("mig-single-count", n.count_label, n.allocatable_of("nvidia.com/gpu"),
                what=f"allocatable nvidia.com/gpu vs MIG instances ({n.count_source}"
                     f"{'' if n.gfd else f' x {n.single_mig_profile} per GPU'})")
    if not n.gfd:
        product = n.catalog_product
        check.true("mig-single-product", product is not None and product.mig_profile(n.single_mig_profile)
                   is not None, expected=f"a MIG profile of {n.product}", actual=n.single_mig_profile,
                   what="GPU partition size")
        return
    base, sep, profile = n.product.partition("-MIG-")
    profile = profile.removesuffix("-SHARED")
    known = lookup(base)
    ok = bool(sep) and bool(MIG_NAME.match(profile)) and (known is None or known.mig_profile(profile) is not None)
    check.true("mig-single-product", ok, expected="<product>-MIG-<profile of that product>", actual=n.product,
               what="nvidia.com/gpu.product under the single strategy")


@pytest.mark.places_pods
@pytest.mark.creates("Pod", "mig-<profile>", "one per advertised MIG profile", on="any",
                      requests="1 nvidia.com/mig-<profile>")
@pytest.mark.creates("Pod", "mig-absent", on="any", requests="1 nvidia.com/mig-7g.999gb", note="stays Pending")
def test_profile_pods_land_only_where_the_profile_exists(discovery, run, scratch, target, check):
    where: dict[str, set[str]] = {}
    for n in discovery.placeable:
        for profile, count in n.mig_resources.items():
            if count > 0:
                where.setdefault(profile, set()).add(n.name)
    if not where:
        check.skip("mig-placement", "no node advertises MIG resources (mixed strategy)")
    churn = ForeignPods(target.cluster, run.run_id, sorted({n for nodes in where.values() for n in nodes}))
    for profile, nodes in sorted(where.items()):
        resource = f"nvidia.com/mig-{profile}"
        if not any(free_on(target.cluster, discovery.node(n), resource) for n in nodes) and \
                any(used_on(target.cluster, n, resource) for n in nodes):
            check.record("mig-placement", "skip", message=f"every {resource} is taken by other pods",
                         target=f"profile/{profile}")
            continue
        name = f"mig-{profile.replace('.', '-')}"
        scratch.create(pod(name, {f"nvidia.com/mig-{profile}": 1}, tolerations=TOLERATE_ALL))
        p = wait_for(run, name, pod_settled, target.timeouts.pod_placed)
        check.true("mig-placement", p.status.phase == "Running" and p.spec.node_name in nodes,
                   expected=f"running on one of {sorted(nodes)}", actual=pod_outcome(p),
                   what=f"a pod asking nvidia.com/mig-{profile}", target=f"profile/{profile}", churn=churn)
    absent = "7g.999gb"
    scratch.create(pod("mig-absent", {f"nvidia.com/mig-{absent}": 1}, tolerations=TOLERATE_ALL))
    p = wait_for(run, "mig-absent", pod_settled, target.timeouts.pod_placed)
    check.true("mig-absent-profile-waits", pod_outcome(p).startswith("unschedulable"),
               expected=f"Pending: no node has nvidia.com/mig-{absent}", actual=pod_outcome(p),
               what="a pod asking a profile no node advertises", target="cluster", churn=churn)


@for_nodes(lambda n: n.mig_strategy in ("mixed", "single"))
@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("Pod", "mig-probe-{node}-<i>", "up to 4", requests="1 MIG device", note="probe")
def test_each_pod_gets_its_own_mig_device(gpu_pool, run, target, check, needs_real_gpus):
    node = gpu_pool.nodes[0]
    if node.mig_strategy == "mixed":
        profile = max(node.mig_resources, key=node.mig_resources.get)
        limits, count = {f"nvidia.com/mig-{profile}": 1}, min(node.mig_resources[profile], 4)
    else:
        profile = node.product.partition("-MIG-")[2].removesuffix("-SHARED")
        limits, count = {"nvidia.com/gpu": 1}, min(node.count_label or 1, 4)
    prof = (lookup(node.product.partition("-MIG-")[0]) or lookup(node.product))
    mem_mib = prof.mig_profile(profile).memory_mib if prof and prof.mig_profile(profile) else None
    args = ("--alloc-mib", str(int(mem_mib * 1.1))) if mem_mib else ()
    results = probe_on(run, target, node, count, limits, args=args, prefix="mig-probe")
    for name, (ok, expected, actual, what) in mig_device_checks(results).items():   # NVML MIG UUIDs
        check.true(name, ok, expected, actual, what=f"{what}, asking {limits}", target=node.name)
    if mem_mib:
        mems = [d.get("memory_total_mib") for r in results for d in r.get("torch_devices", [])]
        check.true("mig-memory-capped", all(m and 0.85 * mem_mib <= m <= 1.15 * mem_mib for m in mems),
                   expected=f"about {mem_mib} MiB per device ({profile})", actual=mems,
                   what="memory visible to each pod", target=node.name)
        allocs = [r.get("alloc", {}).get("ok") for r in results]
        check.equal("mig-alloc-beyond-fails", [False] * count, allocs,
                    what=f"allocating {int(mem_mib * 1.1)} MiB (110% of the slice) in each pod", target=node.name)

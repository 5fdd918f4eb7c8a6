"""GPUs through Dynamic Resource Allocation: NVIDIA's DRA driver's DeviceClasses, ResourceSlices and claims.

What the driver publishes must agree with the node (device counts and attributes against GFD's
labels or the product catalog, no device twice, every pool whole at its newest generation: the
scheduler uses only that one, so older generations a restarted driver left behind are not counted),
its DeviceClasses must exist, and the scheduler
must allocate claims the way users write them: one GPU, a CEL selector on product, memory or
compute capability, a claim shared by two pods, one claim per pod from a template, two devices
with ``matchAttribute``, MIG devices by profile, and a node's devices used up and freed again.
Skipped, with the reason, where the cluster serves no ``resource.k8s.io/v1`` or publishes no
``gpu.nvidia.com`` devices.
"""

import pytest

from gpuproof.cluster.churn import ForeignPods, fill_done, taken_away
from gpuproof.discovery import dra
from gpuproof.cluster.api import WaitTimeout
from gpuproof.cluster.conditions import pod_done, pod_running, pod_scheduled, wait_for
from gpuproof.errors import ApiUnreachable
from gpuproof.plugin.checks import for_nodes
from gpuproof.plugin.checks import TOLERATE_ALL, pod, pod_outcome, pod_settled, settled

FEATURE = "dra"
SHARING = "DRA: MIG devices by profile and shared claims"     # the part of gpu_sharing this suite's markers name
GPU_TYPE = f"device.attributes['{dra.DRIVER}'].type"


def _need_dra(discovery, check, what: str = "dra"):
    if discovery.dra_devices is None:
        check.skip(what, "the cluster serves no resource.k8s.io/v1 ResourceSlices, or we may not list them")
    if not discovery.dra_devices:
        check.skip(what, f"no node publishes {dra.DRIVER} devices (NVIDIA's DRA driver is not installed)")


def _devices(discovery) -> dict[tuple[str, str], dra.Device]:
    return {(d.pool, d.name): d for d in discovery.dra_devices or []}


def _free(discovery, target, kind: str = "gpu") -> dict[str, list[dra.Device]]:
    """node -> its devices of a kind ('gpu' or a MIG profile) that no claim holds, on placeable DRA nodes."""
    taken = dra.allocated_devices(target.cluster)
    out = {}
    for n in discovery.dra_placeable:
        free = [d for d in n.dra_devices if (d.type == kind or d.profile == kind) and (d.pool, d.name) not in taken]
        if free:
            out[n.name] = free
    return out


def _churn(discovery, target, run) -> ForeignPods:
    """The churn guard over the DRA nodes pods can land on: started before their free devices are counted, so a
    device other people's pods take meanwhile makes a failed check a skip naming them (issue #41 item 5)."""
    return ForeignPods(target.cluster, run.run_id, [n.name for n in discovery.dra_placeable])


def _claim_pod(name: str, template: str | None = None, claim: str | None = None, node: str | None = None) -> dict:
    return dra.use_claims(pod(name, tolerations=TOLERATE_ALL, node=node), claim=claim, template=template)


def _placed(run, scratch, target, name: str, manifest: dict, seconds: float = 90):
    scratch.create(manifest)
    return wait_for(run, name, pod_settled, target.timeout(seconds))


def _allocation_ok(run, p, devices, want) -> tuple[bool, str]:
    """Pod running, every claim allocated, each device on the pod's node and satisfying ``want``."""
    claims = dra.claims_of_pod(run, p)
    desc = f"{pod_outcome(p)}; {dra.describe_allocation(claims, devices)}"
    if not claims:      # bound before its claim was even made: nothing was allocated for it
        refs = [r.resource_claim_template_name or r.resource_claim_name for r in p.spec.resource_claims or []]
        desc = f"{pod_outcome(p)}; claim from {', '.join(refs)}: not allocated (none made for the pod yet)"
    if p.status.phase != "Running" or not claims:
        return False, desc
    for c in claims:
        got = dra.allocated(c)
        if not got:
            return False, desc
        for _, pool, dev in got:
            d = devices.get((pool, dev))
            if d is None or d.node != p.spec.node_name or not want(d):
                return False, desc
    return True, desc


# ---------------------------------------------------------------------------- what is published


def test_device_classes_exist(discovery, check):
    _need_dra(discovery, check, "dra-deviceclass")
    if discovery.device_classes is None:
        check.skip("dra-deviceclass", "we may not list DeviceClasses")
    types = sorted({d.type for d in discovery.dra_devices})
    admits = {c["metadata"]["name"]: dra.class_selects_type(c) for c in discovery.device_classes}
    for kind in types:
        classes = sorted(name for name, t in admits.items() if t == kind)
        published = sum(d.type == kind for d in discovery.dra_devices)
        check.true("dra-deviceclass", bool(classes),
                   expected=f"a DeviceClass selecting {dra.DRIVER} devices of type {kind!r} "
                            f"(NVIDIA's chart: {next((n for n, t in dra.CLASS_TYPES.items() if t == kind), '-')})",
                   actual=", ".join(classes) or f"none among {sorted(admits) or 'no DeviceClasses'}",
                   what=f"DeviceClass for the {published} published {kind} devices", target=f"type/{kind}")
    for name, kind in sorted(dra.CLASS_TYPES.items()):
        if name in admits:
            check.equal("dra-deviceclass-selector", kind, admits[name],
                        what=f"device type DeviceClass {name} selects", target=f"deviceclass/{name}")


@for_nodes(lambda n: n.dra)
def test_slices_match_node(gpu_node, check):
    expected, source = dra.expected_devices(gpu_node)
    if expected is None:
        check.skip("dra-device-count", f"{gpu_node.name}: {source} says how many GPUs it has")
    check.equal("dra-device-count", expected, dra.published_devices(gpu_node),
                what=f"{dra.DRIVER} devices published by kind, against {source}")


@for_nodes(lambda n: n.dra)
def test_device_attributes_agree(gpu_node, check):
    bad, compared = dra.attribute_mismatches(gpu_node)
    check.true("dra-attributes", not bad, expected=f"every device agrees ({'; '.join(compared) or 'catalog'})",
               actual="; ".join(bad[:6]) + (f"; and {len(bad) - 6} more" if len(bad) > 6 else "") or "agree",
               what=f"attributes of {len(gpu_node.dra_devices)} published devices")


@for_nodes(lambda n: n.dra)
def test_pools_whole(gpu_node, discovery, check):
    """Each of the node's pools has all its resourceSliceCount slices at its newest generation (a torn pool
    is only noticed otherwise when claims fail)."""
    for pool in (p for p in discovery.dra_pools or [] if p.node == gpu_node.name):
        check.true("dra-pool-complete", pool.complete,
                   expected=f"{pool.slice_count} slice(s) at generation {pool.generation} (resourceSliceCount)",
                   actual=f"{len(pool.slices)}: {', '.join(pool.slices) or 'none'}",
                   what=f"ResourceSlices of pool {pool.name} ({pool.driver})")


def test_no_device_published_twice(discovery, check):
    _need_dra(discovery, check, "dra-unique")
    dupes = dra.duplicates(discovery.dra_devices)
    check.true("dra-unique", not dupes, expected="each device (UUID, and name within its pool) once",
               actual="; ".join(dupes[:5]) or f"{len(discovery.dra_devices)} distinct devices",
               what="devices of every ResourceSlice")


@for_nodes(lambda n: n.offers == "both")
def test_not_offered_twice(gpu_node, check):
    gpus = gpu_node.allocatable_of("nvidia.com/gpu") or 0
    check.warn("dra-and-device-plugin",
               f"GPUs offered through both the device plugin ({gpus} nvidia.com/gpu) and DRA "
               f"({len(gpu_node.dra_devices)} {dra.DRIVER} devices): the two do not know of each other's "
               "allocations and can hand out the same GPU twice", expected="one way", actual="both")


# ---------------------------------------------------------------------------- what the scheduler does


@pytest.mark.places_pods
@pytest.mark.creates("ResourceClaimTemplate", "one-<i>", "one per published GPU product",
                     note="1 device of class gpu.nvidia.com with that productName")
@pytest.mark.creates("Pod", "one-gpu-<i>", "one per published GPU product", on="any", requests="its claim")
@pytest.mark.creates("ResourceClaimTemplate", "nothing", note="a productName no device has")
@pytest.mark.creates("Pod", "no-gpu", on="any", requests="the unsatisfiable claim", note="stays Pending")
def test_one_gpu_claim_runs_where_the_gpu_is(discovery, run, scratch, target, check):
    _need_dra(discovery, check, "dra-claim-allocated")
    churn = _churn(discovery, target, run)
    devices = _devices(discovery)
    free = _free(discovery, target)
    products = sorted({d.attributes.get("productName") for ds in free.values() for d in ds})
    if not products:
        check.skip("dra-claim-allocated", "no free whole GPU published through DRA on a node that takes pods")
    for i, product in enumerate(products):
        sel = f"device.attributes['{dra.DRIVER}'].productName == '{product}'"
        scratch.create(dra.claim_template(f"one-{i}", [dra.request("gpu", dra.GPU_CLASS, 1, [sel])]))
        p = _placed(run, scratch, target, f"one-gpu-{i}", _claim_pod(f"one-gpu-{i}", template=f"one-{i}"))
        ok, desc = _allocation_ok(run, p, devices, lambda d, want=product: d.attributes.get("productName") == want)
        check.true("dra-claim-allocated", ok, expected=f"Running, 1 {product} allocated on the pod's node",
                   actual=desc, what=f"a pod with a claim for one {product}",
                   target=f"product/{product.replace(' ', '-')}", churn=churn)
    scratch.create(dra.claim_template("nothing", [dra.request(
        "gpu", dra.GPU_CLASS, 1, [f"device.attributes['{dra.DRIVER}'].productName == 'gpuproof-no-such-gpu'"])]))
    p = _placed(run, scratch, target, "no-gpu", _claim_pod("no-gpu", template="nothing"), 60)
    outcome = pod_outcome(p)
    check.true("dra-unsatisfiable-waits", outcome.startswith("unschedulable") and "claim" in outcome,
               expected="Pending, the scheduler saying it cannot allocate the claim", actual=outcome,
               what="a pod whose claim no device satisfies", target="cluster")


@pytest.mark.places_pods
@pytest.mark.creates("ResourceClaimTemplate", "cel-<product|memory|compute>", 3,
                     note="CEL on productName, memory >= the largest, cudaComputeCapability >= the highest")
@pytest.mark.creates("Pod", "cel-<selector>-<i>", "up to 3 per selector", on="any", requests="a claim from it")
def test_cel_selectors_choose_by_attribute(discovery, run, scratch, target, check):
    _need_dra(discovery, check, "dra-cel")
    churn = _churn(discovery, target, run)
    devices = _devices(discovery)
    free = [d for ds in _free(discovery, target).values() for d in ds]
    if not free:
        check.skip("dra-cel", "no free whole GPU published through DRA on a node that takes pods")
    top_mem = max(d.memory_mib or 0 for d in free)
    top_cc = max(dra.version_key(str(d.attributes.get("cudaComputeCapability", ""))) for d in free)
    product = sorted({d.attributes.get("productName") for d in free})[0]
    cc_text = ".".join(map(str, (top_cc + (0, 0, 0))[:3]))
    cases = [
        ("product", f"device.attributes['{dra.DRIVER}'].productName == '{product}'",
         lambda d: d.attributes.get("productName") == product, f"productName == {product}"),
        ("memory", f"device.capacity['{dra.DRIVER}'].memory.compareTo(quantity('{top_mem}Mi')) >= 0",
         lambda d: (d.memory_mib or 0) >= top_mem, f"memory >= {top_mem}Mi"),
        ("compute", f"device.attributes['{dra.DRIVER}'].cudaComputeCapability.compareTo(semver('{cc_text}')) >= 0",
         lambda d: dra.version_key(str(d.attributes.get("cudaComputeCapability", ""))) >= top_cc,
         f"cudaComputeCapability >= {cc_text}"),
    ]
    for key, expr, want, rule in cases:
        # what is free now: the pods of the cases before still hold their devices
        k = min(3, sum(want(d) for ds in _free(discovery, target).values() for d in ds))
        scratch.create(dra.claim_template(f"cel-{key}", [dra.request("gpu", dra.GPU_CLASS, 1, [expr])]))
        for i in range(k):
            name = f"cel-{key}-{i}"
            p = _placed(run, scratch, target, name, _claim_pod(name, template=f"cel-{key}"))
            ok, desc = _allocation_ok(run, p, devices, want)
            check.true(f"dra-cel-{key}", ok, expected=f"Running on a device with {rule}", actual=desc,
                       what=f"pod {i + 1} of {k} selecting {rule}", target=f"selector/{key}", churn=churn)


@pytest.mark.places_pods
@pytest.mark.creates("ResourceClaim", "shared-gpu", note="1 device of class gpu.nvidia.com")
@pytest.mark.creates("Pod", "share-a, share-b", 2, on="any", requests="the shared claim")
@pytest.mark.creates("ResourceClaimTemplate", "own-gpu")
@pytest.mark.creates("Pod", "own-<i>", "up to 4", on="any", requests="a claim each from own-gpu")
@pytest.mark.conformance("gpu_sharing", name=SHARING, checks=("dra-shared-claim",))
def test_shared_claim_and_per_pod_claims(discovery, run, scratch, target, check):
    _need_dra(discovery, check, "dra-shared-claim")
    churn = _churn(discovery, target, run)
    devices = _devices(discovery)
    free = _free(discovery, target)
    if not free:
        check.skip("dra-shared-claim", "no free whole GPU published through DRA on a node that takes pods")
    scratch.create(dra.claim("shared-gpu", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    pods = [_placed(run, scratch, target, n, _claim_pod(n, claim="shared-gpu")) for n in ("share-a", "share-b")]
    claim = target.cluster.custom.get_namespaced_custom_object(dra.GROUP, dra.VERSION, run.namespace,
                                                              "resourceclaims", "shared-gpu")
    got = dra.allocated(claim)
    nodes = {p.spec.node_name for p in pods}
    ok = all(p.status.phase == "Running" for p in pods) and len(got) == 1 and len(nodes) == 1 and \
        sorted(dra.reserved_for(claim)) == ["share-a", "share-b"]
    check.true("dra-shared-claim", ok, expected="both pods Running on one node, one device, reserved for both",
               actual=f"{'; '.join(pod_outcome(p) for p in pods)}; {dra.describe_allocation([claim], devices)}; "
                      f"reserved for {dra.reserved_for(claim)}", what="one ResourceClaim used by two pods",
               target="cluster", churn=churn)
    k = min(4, sum(len(v) for v in free.values()) - 1)
    scratch.create(dra.claim_template("own-gpu", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    mine = [_placed(run, scratch, target, f"own-{i}", _claim_pod(f"own-{i}", template="own-gpu")) for i in range(k)]
    held = [r for p in mine for c in dra.claims_of_pod(run, p) for r in dra.allocated(c)]
    check.true("dra-template-distinct", all(p.status.phase == "Running" for p in mine) and len(held) == k
               and len(set(held)) == k, expected=f"{k} pods Running on {k} distinct devices",
               actual=f"{sum(p.status.phase == 'Running' for p in mine)} Running, devices "
                      f"{sorted(f'{pool}/{dev}' for _, pool, dev in held)}",
               what="pods each with its own claim from one ResourceClaimTemplate", target="cluster", churn=churn)


@pytest.mark.places_pods
@pytest.mark.creates("ResourceClaimTemplate", "pair", note="2 devices, matchAttribute gpu.nvidia.com/productName")
@pytest.mark.creates("Pod", "pair", on="any", requests="a claim from pair")
def test_two_devices_with_match_attribute(discovery, run, scratch, target, check):
    _need_dra(discovery, check, "dra-match-attribute")
    churn = _churn(discovery, target, run)
    devices = _devices(discovery)
    roomy = {n: ds for n, ds in _free(discovery, target).items() if len(ds) >= 2}
    if not roomy:
        check.skip("dra-match-attribute", "no node with two free whole GPUs published through DRA")
    attr = f"{dra.DRIVER}/productName"
    scratch.create(dra.claim_template("pair", [dra.request("gpus", dra.GPU_CLASS, 2)], match_attribute=attr))
    p = _placed(run, scratch, target, "pair", _claim_pod("pair", template="pair"))
    claims = dra.claims_of_pod(run, p)
    got = [devices.get((pool, dev)) for c in claims for _, pool, dev in dra.allocated(c)]
    ok = p.status.phase == "Running" and len(got) == 2 and all(got) and \
        {d.node for d in got} == {p.spec.node_name} and len({d.attributes.get("productName") for d in got}) == 1
    check.true("dra-match-attribute", ok, expected=f"Running with 2 devices on its node, one {attr}",
               actual=f"{pod_outcome(p)}; {dra.describe_allocation(claims, devices)}",
               what=f"a pod asking 2 GPUs with matchAttribute {attr}", target="cluster", churn=churn)


@pytest.mark.places_pods
@pytest.mark.creates("ResourceClaimTemplate", "mig-<i>", "one per published MIG profile", note="class mig.nvidia.com")
@pytest.mark.creates("Pod", "mig-<i>", "one per published MIG profile", on="any", requests="a claim from mig-<i>")
@pytest.mark.creates("ResourceClaimTemplate", "mig-absent", note="a profile no node has")
@pytest.mark.creates("Pod", "mig-absent", on="any", requests="a claim from mig-absent", note="stays Pending")
@pytest.mark.conformance("gpu_sharing", name=SHARING, checks=("dra-mig-*",))
def test_mig_devices_by_profile(discovery, run, scratch, target, check):
    _need_dra(discovery, check, "dra-mig-placement")
    churn = _churn(discovery, target, run)
    devices = _devices(discovery)
    where: dict[str, set[str]] = {}
    for d in discovery.dra_devices:
        if d.type == "mig":
            where.setdefault(d.profile, set()).add(d.node)
    if not where:
        check.skip("dra-mig-placement", f"no node publishes MIG devices through {dra.DRIVER}")
    taken = dra.allocated_devices(target.cluster)
    for i, (profile, nodes) in enumerate(sorted(where.items())):
        if all((d.pool, d.name) in taken for d in discovery.dra_devices if d.profile == profile):
            check.record("dra-mig-placement", "skip", message=f"every {profile} device is allocated to other claims",
                         target=f"profile/{profile}")
            continue
        sel = f"device.attributes['{dra.DRIVER}'].profile == '{profile}'"
        scratch.create(dra.claim_template(f"mig-{i}", [dra.request("mig", dra.MIG_CLASS, 1, [sel])]))
        p = _placed(run, scratch, target, f"mig-{i}", _claim_pod(f"mig-{i}", template=f"mig-{i}"))
        ok, desc = _allocation_ok(run, p, devices, lambda d, want=profile: d.type == "mig" and d.profile == want)
        check.true("dra-mig-placement", ok and p.spec.node_name in nodes,
                   expected=f"Running on one of {sorted(nodes)} with a {profile} MIG device", actual=desc,
                   what=f"a pod claiming a {profile} device of class {dra.MIG_CLASS}", target=f"profile/{profile}",
                   churn=churn)
    sel = f"device.attributes['{dra.DRIVER}'].profile == '7g.999gb'"
    scratch.create(dra.claim_template("mig-absent", [dra.request("mig", dra.MIG_CLASS, 1, [sel])]))
    p = _placed(run, scratch, target, "mig-absent", _claim_pod("mig-absent", template="mig-absent"), 60)
    check.true("dra-mig-absent-waits", pod_outcome(p).startswith("unschedulable"),
               expected="Pending: no node publishes that profile", actual=pod_outcome(p),
               what="a pod claiming a MIG profile no node has", target="cluster")


@pytest.mark.places_pods
@pytest.mark.creates("ResourceClaimTemplate", "fill")
@pytest.mark.creates("Pod", "fill-<i>", "the node's free DRA GPUs + 1", on="any",
                     requests="a claim each from fill", note="pinned to the DRA node with the fewest free GPUs")
def test_exhausting_a_node_and_freeing_a_claim(discovery, run, scratch, target, check):
    _need_dra(discovery, check, "dra-exhaust")
    churn = _churn(discovery, target, run)
    free = _free(discovery, target)
    if not free:
        check.skip("dra-exhaust", "no free whole GPU published through DRA on a node that takes pods")
    node = min(free, key=lambda n: (len(free[n]), n))
    count = len(free[node])
    scratch.create(dra.claim_template("fill", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    names = [f"fill-{i}" for i in range(count + 1)]
    for name in names:
        scratch.create(_claim_pod(name, template="fill", node=node))
    how, got = run.wait_pods(fill_done(names, settled), target.timeouts.pods_settled,
                             f"{count + 1} pods pinned to {node} to be placed or refused")
    if how == "taken":
        check.skip("dra-exhaust", taken_away(churn, node, got))
    pods = [got[n] for n in names]
    running = [p.metadata.name for p in pods if p.status.phase == "Running"]
    waiting = [p.metadata.name for p in pods if pod_outcome(p).startswith("unschedulable")]
    check.true("dra-exhaust", len(running) == count and len(waiting) == 1,
               expected=f"{count} Running (the node's free devices), 1 Pending",
               actual=f"{len(running)} Running, {len(waiting)} Pending ({'; '.join(pod_outcome(p) for p in pods)})",
               what=f"{count + 1} pods each claiming one GPU on {node}", target=node, churn=churn)
    if len(waiting) != 1 or not running:
        return
    scratch.delete_pod(running[0])
    try:
        p = wait_for(run, waiting[0], pod_running.named(f"to run once pod {running[0]}'s claim is freed"),
                     target.timeouts.pod_running)
    except WaitTimeout as exc:  # still waiting: the check's failure, not the test's error
        if isinstance(exc, ApiUnreachable):     # cut by the API server, not ended by time: nothing to judge on
            raise
        p = run.pod(waiting[0])
    check.true("dra-freed-claim-reused", p.status.phase == "Running", expected="Running after a claim was freed",
               actual=pod_outcome(p), what=f"the waiting pod on {node}", target=node, churn=churn)


@pytest.mark.creates("ConfigMap", "gpuproof-workloads")
@pytest.mark.creates("ResourceClaimTemplate", "probe-one")
@pytest.mark.creates("Pod", "dra-probe", on="any", requests="a claim from probe-one", note="probe, real GPUs only")
def test_container_sees_exactly_its_devices(discovery, run, target, check, needs_real_gpus):
    """On real GPUs: a probe pod with a one-GPU claim sees that GPU's UUID, and only it."""
    _need_dra(discovery, check, "dra-probe-uuid")
    from gpuproof.bench import workloads
    from gpuproof.bench.base import ensure_configmap
    from gpuproof.plugin.bench_checks import image
    from gpuproof.plugin.checks import nvml_device_ids

    devices = _devices(discovery)
    real = {n: ds for n, ds in _free(discovery, target).items() if not discovery.node(n).simulated}
    if not real:
        check.skip("dra-probe-uuid", "no free whole GPU published through DRA on a real (not kwok) node that "
                   "takes pods")
    node = min(real)
    ensure_configmap(run)
    run.apply(dra.claim_template("probe-one", [dra.request("gpu", dra.GPU_CLASS, 1)]))
    manifest = workloads.workload_pod("dra-probe", "probe.py", labels=run.labels, namespace=run.namespace, gpus=0,
                                      node=node, image=image(run))
    manifest["spec"]["tolerations"] = TOLERATE_ALL     # gpus=0 adds no GPU toleration: the GPU comes by the claim
    run.apply(dra.use_claims(manifest, template="probe-one"))
    # the claim made from the template is deleted once the pod ends: read its allocation when the pod is bound
    # (the scheduler allocates before it binds; the kubelet then prepares the claim and starts the container)
    p = wait_for(run, "dra-probe", pod_scheduled, target.timeouts.claim_scheduled)
    want = sorted(devices[(pool, dev)].uuid for c in dra.claims_of_pod(run, p) for _, pool, dev in dra.allocated(c)
                  if (pool, dev) in devices)
    p = wait_for(run, "dra-probe", pod_done.named("to finish (image pull included)"), target.timeouts.pod_done)
    seen = sorted(nvml_device_ids(workloads.pod_result(run, "dra-probe",
                                                        what=f"probe pod dra-probe ({pod_outcome(p)})")))
    check.equal("dra-probe-uuid", want, seen, what="NVML UUIDs in the pod vs the claim's allocated device",
                target=p.spec.node_name)


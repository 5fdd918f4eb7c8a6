"""What a healthy run must show, by name: the checks that must pass and the skips it may have, with why.

A healthy run that ends all skipped is not green. ``assert_healthy`` requires exit 0 and no failed
record, a passing record for every check in ``must_pass``, and every skip (a skip record of the run,
or a pytest ``SKIPPED`` line) to be one ``may_skip`` allows: keyed by the check name, or by the suite
file for pytest's own skips, with a pattern its reason must match. Churn runs bound the skips made
because other people's pods changed under a check (``churn_skips`` records at most).
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class Healthy:
    must_pass: frozenset[str]
    may_skip: dict[str, str]            # check name or suite file -> pattern (re.fullmatch) of the skip's reason
    churn_skips: int = 0                # skip records "pods of others changed on ..." allowed


CHURN = "pods of others changed on "

# why a check may skip on the embedded cluster, as the suites say it
REAL_GPUS = r"needs real GPUs: the target's GPU nodes are simulated \(kwok\)"
KWOK_PLUGIN = r"simulated node: no device-plugin pod runs on kwok nodes"
NO_DRA = r"no node publishes gpu\.nvidia\.com devices \(NVIDIA's DRA driver is not installed\)"
NO_KIND = r"no GPU node of the kind this check is for \(.+\)"
NO_POOLS = r"no GPU pools in the cluster"
NO_MIXED_MIG = r"no node advertises MIG resources \(mixed strategy\)"
NO_EXPORTER = r"no DCGM exporter in the cluster: .+ \(the embedded cluster runs no DCGM\)"
NO_GANG = r"no gang scheduler in the cluster: .+"       # fleets without Kueue or Kubernetes' gang scheduling on
GANG_SKIPS = {"gang-bound-together": NO_GANG, "gang-oversize-held": NO_GANG, "suites/test_gang.py": NO_GANG}
NO_OPERATOR = r"no training operator installed: the cluster has none of the CRDs .+"    # fleets without `platform`
OPERATOR_SKIPS = {**{c: NO_OPERATOR for c in ("operator-pods-ready", "operator-crds-established",
                                              "operator-webhooks-have-ca", "operator-webhook-rejects-invalid",
                                              "operator-job-completes")}, "suites/test_operators.py": NO_OPERATOR}
NOT_GFD = (r"labelled by (gke|karpenter|instance-type), not GPU Feature Discovery: GFD's labels are not expected "
           r"\(product from .+, count from .+\)")
NO_GFD_PEERS = (r"labelled by (gke|karpenter|instance-type): no node of pool \S+ carries GPU Feature Discovery's "
                r"labels, so none are expected")
# capacity other people's pods hold (churn runs, two runs at once)
TAKEN = (r".*(taken by other pods|other pods hold them all|has no free \S+|has fewer than 2 free \S+|"
         r"has -?\d+ free \S+ \(checked for 1-\d+\)|have -?\d+ free GPUs \(checked for 1-16\)|"
         r"needs two GPU products with free GPUs.*|no GPU node with 1-16 free GPUs.*|did not take \d+ low-priority.*|"
         r"is allocated to other claims|taken away while \S+ filled).*")


def either(*patterns: str) -> str:
    return "|".join(f"(?:{p})" for p in patterns)


DRA_SKIPPING = ("dra-deviceclass", "dra-unique", "dra-claim-allocated", "dra-cel", "dra-shared-claim",
                "dra-match-attribute", "dra-mig-placement", "dra-exhaust")

# every check that judges something on the mixed fleet
_MIXED_PASS = """
    gpu-nodes-present pool-found
    node-ready node-schedulable node-no-pressure node-taints-expected
    gfd-fresh
    memory-plausible family-plausible compute-plausible product-known product-fits-instance count-fits-instance
    mig-count-plausible mig-memory-plausible mig-slices-plausible
    capacity-matches-count allocatable-matches-count no-whole-gpus-under-mixed-mig mig-resources-present
    mig-profile-valid no-shared-resource shared-resource-name
    gfd-labels-on-gpu-node label-well-formed driver-version-consistent shared-suffix mig-single-valid pool-uniform
    inventory
    gpu-node-tainted untolerating-pod-kept-off tolerating-gpu-pod-lands
    node-selector-product required-affinity-product preferred-while-room preferred-falls-back memory-gt memory-gt-none
    preemptor-lands just-enough-victims never-policy-waits never-policy-no-victims foreign-pods-untouched
    quota-admits-within quota-refuses-over limitrange-admits-max limitrange-refuses-over
    shared-allocatable shared-product-suffix co-running-peak one-more-waits shared-request-gt1-refused
    mig-capacity-matches-count mig-allocatable-matches-count mig-profile-known mig-single-count mig-single-product
    mig-placement mig-absent-profile-waits
"""
# checks built on free capacity: under churn they may skip, saying whose pods took it
PLACEMENT = frozenset("""
    untolerating-pod-kept-off tolerating-gpu-pod-lands node-selector-product required-affinity-product
    preferred-while-room preferred-falls-back memory-gt memory-gt-none preemptor-lands just-enough-victims
    never-policy-waits never-policy-no-victims foreign-pods-untouched co-running-peak one-more-waits
    shared-request-gt1-refused mig-placement mig-absent-profile-waits
""".split())

MIXED = Healthy(frozenset(_MIXED_PASS.split()), {
    "device-plugin-ready": KWOK_PLUGIN, "suites/test_advertisement.py": KWOK_PLUGIN,
    **{check: NO_DRA for check in DRA_SKIPPING}, "suites/test_dra.py": either(NO_DRA, REAL_GPUS, NO_KIND),
    "suites/test_health.py": REAL_GPUS, "suites/test_mig.py": REAL_GPUS, "suites/test_timeslicing.py": REAL_GPUS,
    "suites/test_topology.py": REAL_GPUS, "suites/test_stack.py": NO_KIND, "suites/test_plausibility.py": NO_KIND,
    "suites/test_census.py": REAL_GPUS, "suites/test_monitoring.py": either(REAL_GPUS, NO_EXPORTER),
    "suites/test_driver.py": REAL_GPUS, "suites/test_access.py": REAL_GPUS, **GANG_SKIPS, **OPERATOR_SKIPS})

# other people's pods on the GPU nodes (tests/test_concurrency.py): capacity checks may skip, saying why
MIXED_UNDER_CHURN = Healthy(MIXED.must_pass - PLACEMENT, {
    **MIXED.may_skip,
    **{check: TAKEN for check in ("preferred-affinity", "co-running", "shared-request-gt1", "preemption",
                                  "tolerating-gpu-pod-lands", "node-selector-product", "required-affinity-product",
                                  "mig-placement")},
    **{f"suites/test_{suite}.py": either(MIXED.may_skip.get(f"suites/test_{suite}.py", "$^"), TAKEN)
       for suite in ("affinity", "timeslicing", "preemption", "taints", "mig")}}, churn_skips=4)

# GKE, EKS (plain and Karpenter), AKS and OpenShift node shapes
MANAGED = Healthy(frozenset("""
    gpu-nodes-present pool-found node-ready node-schedulable node-no-pressure node-taints-expected
    gfd-fresh driver-upgrade-state mig-config-matches mig-config-state operator-component-state operator-pod-ready
    memory-plausible family-plausible compute-plausible product-known product-fits-instance count-fits-instance
    capacity-matches-count allocatable-matches-count no-shared-resource shared-resource-name
    gfd-labels-on-gpu-node label-well-formed driver-version-consistent shared-suffix mig-single-valid pool-uniform
    inventory gpu-node-tainted untolerating-pod-kept-off tolerating-gpu-pod-lands
    node-selector-product required-affinity-product preferred-while-room preferred-falls-back memory-gt memory-gt-none
    preemptor-lands just-enough-victims never-policy-waits never-policy-no-victims foreign-pods-untouched
    quota-admits-within quota-refuses-over limitrange-admits-max limitrange-refuses-over
    shared-allocatable co-running-peak one-more-waits shared-request-gt1-refused mig-single-count mig-single-product
""".split()), {
    "device-plugin-ready": KWOK_PLUGIN, "suites/test_advertisement.py": either(KWOK_PLUGIN, NO_KIND),
    **{check: NO_DRA for check in DRA_SKIPPING}, "suites/test_dra.py": either(NO_DRA, REAL_GPUS, NO_KIND),
    "label-present": NOT_GFD, "shared-suffix": NOT_GFD, "gfd-labels-on-gpu-node": NO_GFD_PEERS,
    "suites/test_labels.py": either(NOT_GFD, NO_GFD_PEERS),
    "mig-placement": NO_MIXED_MIG, "suites/test_mig.py": either(NO_KIND, NO_MIXED_MIG, REAL_GPUS),
    "suites/test_health.py": REAL_GPUS, "suites/test_plausibility.py": NO_KIND, "suites/test_timeslicing.py": REAL_GPUS,
    "suites/test_topology.py": either(REAL_GPUS, NO_KIND), "suites/test_census.py": REAL_GPUS,
    "suites/test_monitoring.py": either(REAL_GPUS, NO_EXPORTER), "suites/test_driver.py": either(REAL_GPUS, NO_KIND),
    "suites/test_access.py": either(REAL_GPUS, NO_KIND), **GANG_SKIPS, **OPERATOR_SKIPS})

DRA_CHECKS = frozenset("""
    dra-deviceclass dra-deviceclass-selector dra-device-count dra-attributes dra-unique dra-claim-allocated
    dra-unsatisfiable-waits dra-cel-product dra-cel-memory dra-cel-compute dra-shared-claim dra-template-distinct
    dra-match-attribute dra-mig-placement dra-mig-absent-waits dra-exhaust dra-freed-claim-reused
""".split())
# the DRA suite alone on the dra fleet (a run of suites/test_dra.py)
DRA_SUITE = Healthy(DRA_CHECKS, {"suites/test_dra.py": REAL_GPUS})


def skipped(res) -> list[tuple[str, str]]:
    """(check or suite file, reason) of every skip: the run's skip records and pytest's SKIPPED lines (-ra)."""
    out = [(c["check"], c["message"]) for c in res.checks if c["verdict"] == "skip"]
    for line in res.output.splitlines():
        m = re.match(r"^SKIPPED \[\d+\] (?:\S*/)?(suites/test_\w+\.py)(?::\d+)?: (.*)$", line)
        if m:           # the suite file, however the run named it (gpuproof run: gpuproof/suites/...)
            out.append((m.group(1), m.group(2)))
    return out


def assert_healthy(res, spec: Healthy) -> None:
    assert res.code == 0, res
    assert [c for c in res.checks if c["verdict"] == "fail"] == [], res
    passed = {c["check"] for c in res.checks if c["verdict"] == "pass"}
    assert sorted(spec.must_pass - passed) == [], f"checks that did not pass: {sorted(spec.must_pass - passed)}"
    churn = [c for c in res.checks if c["verdict"] == "skip" and CHURN in (c["message"] or "")]
    assert len(churn) <= spec.churn_skips, f"{len(churn)} skipped for churn, at most {spec.churn_skips}: {churn}"
    unexpected = [(what, why) for what, why in skipped(res) if not (
        (spec.churn_skips and CHURN in why) or re.fullmatch(spec.may_skip.get(what, "$^"), why))]
    assert unexpected == [], f"skips a healthy run may not have: {unexpected}"

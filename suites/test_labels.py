"""Labels: GPU Feature Discovery labels are present, well formed, and uniform within a pool.

What GPU Feature Discovery writes on every GPU node (product, count, family, compute capability, driver and CUDA
versions; the older ``cuda.driver.*`` and ``cuda.runtime.*`` names are read too) must be there and well formed;
the labels GFD writes only in some set-ups (``gpu.memory``, ``gpu.replicas``, ``gpu.sharing-strategy``,
``mig.strategy``) are checked where present. Nodes another scheme labels (GKE, EKS, Karpenter, AKS) skip, with the
reason. The labels of every GPU node are recorded in the run's ``inventory.json``.
"""

import re

from gpuproof.plugin.checks import for_nodes
from gpuproof.vocab import NFD_PCI_LABEL

FEATURE = "labels"

INT = re.compile(r"^\d+$")
VERSION = re.compile(r"^\d+(\.\d+){1,2}$")
PRODUCT = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")

# What every GPU Feature Discovery release writes on a GPU node, each with the label names it has had
# (newest first: releases before v0.8 write only cuda.driver.* and cuda.runtime.*, later ones add
# *-version.*). requirement -> (label names, pattern or allowed values, description)
REQUIRED = {
    "product": (["nvidia.com/gpu.product"], PRODUCT, "a product name"),
    "count": (["nvidia.com/gpu.count"], INT, "a whole number"),
    "family": (["nvidia.com/gpu.family"], re.compile(r"^[a-z][-a-z]*$"), "an architecture family"),
    "compute major": (["nvidia.com/gpu.compute.major"], INT, "a whole number"),
    "compute minor": (["nvidia.com/gpu.compute.minor"], INT, "a whole number"),
    "driver major": (["nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver.major"], INT, "a whole number"),
    "driver minor": (["nvidia.com/cuda.driver-version.minor", "nvidia.com/cuda.driver.minor"], INT, "a whole number"),
    "CUDA major": (["nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime.major"], INT, "a whole number"),
}
# Labels GFD writes only in some set-ups or releases: checked where present. (gpu.memory is absent when
# NVML cannot read it, and GFD v0.6 wrote it in bytes; replicas came with time-slicing in v0.6,
# sharing-strategy with MPS later still; mig.strategy is not written for "none"; gpu.present comes from
# the GPU operator or NFD rules, not from GFD; cuda.driver.rev is empty for drivers without a revision.)
OPTIONAL = {
    "nvidia.com/gpu.memory": (INT, "MiB (or, from GFD v0.6, bytes) as a whole number"),
    "nvidia.com/gpu.replicas": (INT, "a whole number"),
    "nvidia.com/cuda.driver.rev": (re.compile(r"^\d*$"), "a whole number or empty"),
    "nvidia.com/cuda.runtime.minor": (INT, "a whole number"),
    "nvidia.com/gpu.present": ({"true"}, "true"),
    "nvidia.com/gpu.sharing-strategy": ({"none", "time-slicing", "mps"}, "none, time-slicing or mps"),
    "nvidia.com/mig.strategy": ({"none", "single", "mixed"}, "none, single or mixed"),
    "nvidia.com/cuda.driver-version.full": (VERSION, "a driver version such as 550.54.15"),
    "nvidia.com/cuda.runtime-version.full": (VERSION, "a CUDA version such as 12.4"),
}

# what must be the same on every node of a pool: fact -> (how it is read, whichever GFD release wrote it)
UNIFORM = {
    "nvidia.com/gpu.product": lambda n: n.label("nvidia.com/gpu.product"),
    "nvidia.com/gpu.count": lambda n: n.label("nvidia.com/gpu.count"),
    "nvidia.com/gpu.memory (MiB)": lambda n: n.memory_mib,
    "driver version (nvidia.com/cuda.driver-version.* or cuda.driver.*)": lambda n: n.driver_version or None,
    "CUDA version (nvidia.com/cuda.runtime-version.* or cuda.runtime.*)": lambda n: n.cuda_version or None,
    "nvidia.com/gpu.replicas": lambda n: n.replicas if n.gfd else None,
    "sharing (nvidia.com/gpu.sharing-strategy, or replicas)": lambda n: n.sharing_strategy if n.gfd else None,
    "nvidia.com/mig.strategy": lambda n: n.label("nvidia.com/mig.strategy"),
}


def _ok(value, rule) -> bool:
    return value in rule if isinstance(rule, set) else bool(rule.match(value))


def _gfd_only(node, check, name):
    if not node.gfd:
        check.skip(name, f"labelled by {node.scheme}, not GPU Feature Discovery: GFD's labels are not expected "
                         f"(product from {node.sources['product']}, count from {node.sources['count']})")




def test_gfd_labelled_where_it_runs(gpu_node, discovery, check):
    """A node that advertises GPUs where GFD labels its peers has GFD's labels too.

    GFD writes no labels at all when it cannot start on a node (for instance when NVML reports a GPU
    lost), while the device plugin keeps advertising. The node's peers are the other nodes of its
    pool; with none labelled, NFD's NVIDIA PCI label on a cluster where GFD labels other nodes marks
    a node GFD's DaemonSet was meant for.
    """
    n = gpu_node
    if n.gfd:
        check.record("gfd-labels-on-gpu-node", "pass", "GPU Feature Discovery's labels", n.product)
        return
    labelled = [m.name for m in discovery.gpu_nodes if m.gfd]
    peers = [m for m in discovery.gpu_nodes if m.pool == n.pool and m.gfd]
    nfd = n.label(NFD_PCI_LABEL) == "true" and labelled
    if not peers and not nfd:
        check.skip("gfd-labels-on-gpu-node", f"labelled by {n.scheme}: no node of pool {n.pool} carries GPU Feature "
                                             "Discovery's labels, so none are expected")
    advertised = {k: v for k, v in n.capacity.items() if k.startswith("nvidia.com/")}
    why = (f"{len(peers)} other node(s) of pool {n.pool} have them" if peers
           else f"NFD marks an NVIDIA PCI device ({NFD_PCI_LABEL}=true) and GFD labels {len(labelled)} other node(s)")
    check.true("gfd-labels-on-gpu-node", False,
               expected=f"GPU Feature Discovery's labels (nvidia.com/gpu.product, gpu.count, ...): {why}",
               actual=f"no GPU labels, while it advertises {advertised or 'no GPU resources'}",
               what="GPU labels missing")


def test_gfd_labels_present_and_well_formed(gpu_node, check):
    _gfd_only(gpu_node, check, "label-present")
    for what, (names, rule, desc) in REQUIRED.items():
        label = next((name for name in names if gpu_node.label(name) is not None), None)
        if label is None:
            check.true("label-present", False, expected=f"{' or '.join(names)} ({desc})", actual=None,
                       what=f"GPU {what} label")
        else:
            check.true("label-well-formed", _ok(gpu_node.label(label), rule), expected=desc,
                       actual=gpu_node.label(label), what=f"label {label}")
    for label, (rule, desc) in OPTIONAL.items():
        value = gpu_node.label(label)
        if value is not None:
            check.true("label-well-formed", _ok(value, rule), expected=desc, actual=value, what=f"label {label}")


def test_driver_version_parts_agree(gpu_node, check):
    """GFD's driver-version.full and its major/minor parts agree (releases before v0.8 write neither)."""
    full = gpu_node.label("nvidia.com/cuda.driver-version.full")
    parts = [gpu_node.label(f"nvidia.com/cuda.driver-version.{p}") for p in ("major", "minor")]
    if full and all(parts):
        check.equal("driver-version-consistent", ".".join(full.split(".")[:2]), ".".join(parts),
                    what="driver-version.major.minor vs driver-version.full")


def test_product_suffix_fits_sharing(gpu_node, check):
    n = gpu_node
    _gfd_only(n, check, "shared-suffix")
    product = n.product
    if not product:
        return  # reported by the presence check
    shared_suffix = n.time_sliced and not n.shared_renamed
    check.true("shared-suffix", product.endswith("-SHARED") == shared_suffix,
               expected=("a product ending in -SHARED (time-sliced, not renamed)" if shared_suffix
                         else "a product without the -SHARED suffix"),
               actual=product, what="nvidia.com/gpu.product")
    if n.label("nvidia.com/mig.strategy") == "single":
        # GFD names the product <model>-MIG-INVALID when the single strategy meets GPUs whose MIG devices
        # differ or are missing (internal/lm/mig-strategy.go); with MIG off it writes the plain product
        check.true("mig-single-valid", not product.endswith("-MIG-INVALID"),
                   expected="one MIG profile on every MIG-enabled GPU, or MIG off (a plain product)",
                   actual=product, what="nvidia.com/gpu.product under MIG single strategy")


def test_pool_is_uniform(gpu_pool, check):
    """Every node of a pool has the same GPUs, driver, CUDA and sharing set-up."""
    for label, read in UNIFORM.items():
        values = {}
        for n in gpu_pool.nodes:
            values.setdefault(read(n), []).append(n.name)
        if len(values) <= 1:
            check.record("pool-uniform", "pass", expected=next(iter(values), None), actual=next(iter(values), None),
                         target=f"pool/{gpu_pool.name}")
            continue
        majority = max(values, key=lambda v: (len(values[v]), v is not None))
        for value, nodes in sorted(values.items(), key=lambda kv: str(kv[0])):
            if value == majority:
                continue
            for node in nodes:
                check.equal("pool-uniform", majority, value, target=node,
                            what=f"{label} differs within pool {gpu_pool.name} "
                                 f"({len(values[majority])} of {len(gpu_pool.nodes)} nodes have {majority!r})")


@for_nodes(lambda n: True)
def test_inventory_entry(gpu_node, check):
    """Record the node's GPU inventory (product, count, memory, versions, strategies)."""
    n = gpu_node
    check.record("inventory", "pass", actual={
        "scheme": n.scheme, "sources": n.sources, "product": n.product, "count": n.count_label,
        "memory_mib": n.memory_mib, "driver": n.driver_version,
        "cuda": n.cuda_version, "sharing": n.sharing_strategy, "replicas": n.replicas, "mig": n.mig_strategy})

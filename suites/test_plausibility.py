"""Plausibility: a node's GPU labels can be true for the product they name.

Memory, family and compute capability are compared with the product catalog
(``gpuproof/catalog.yaml``), MIG slices with the product's MIG table, and the GPU count and
product with what the node's instance type has. On nodes whose GPUs only NVIDIA's DRA driver
describes (no GPU Feature Discovery labels), the devices it publishes are held to the same
rules: their product and number of GPUs against the instance type, their memory against the
product. A product the catalog does not know is a warning (extend the catalog), never a failure.
Names are read however drivers spell them (``gpuproof.catalog.resolve``): an NVIDIA vGPU profile
(``GRID-A100-40C``) is judged as its physical product with the profile's framebuffer as memory.
"""

from gpuproof import catalog
from gpuproof.plugin.checks import for_nodes

FEATURE = "plausibility"


def test_product_in_catalog(gpu_node, check):
    if gpu_node.catalog_product is None:
        check.warn("product-known", f"product {gpu_node.product or '(none)'!r} is not in gpuproof's catalog, so "
                   f"its labels cannot be checked (add it to gpuproof/catalog.yaml)",
                   expected="a catalog product", actual=gpu_node.product or None)
    else:
        check.record("product-known", "pass", expected="a catalog product", actual=gpu_node.catalog_product.label)


@for_nodes(lambda n: (n.gfd or n.dra) and n.catalog_product is not None)
def test_gpus_fit_product(gpu_node, check):
    """nodes of catalog products that GFD labels or NVIDIA's DRA driver describes"""
    n, p = gpu_node, gpu_node.catalog_product
    if not n.gfd:
        _dra_devices_fit_product(n, check)
        return
    memory = n.memory_mib
    if memory is not None:
        profile = p.mig_profile(n.single_mig_profile) if n.single_mig_profile else None
        if n.single_mig_profile and profile is not None:
            check.true("memory-plausible", profile.memory_plausible(memory),
                       expected=f"about {profile.memory_gb} GB ({n.single_mig_profile} of a {p.label})",
                       actual=f"{memory} MiB", what="nvidia.com/gpu.memory")
        elif not n.single_mig_profile:
            named = n.catalog_name or catalog.Named(p.label, p)
            check.true("memory-plausible", named.memory_plausible(memory),
                       expected=f"{named.memory_mib} MiB +-{catalog.MEMORY_TOLERANCE:.0%} ({named.what})",
                       actual=f"{memory} MiB", what="nvidia.com/gpu.memory")
    family = n.label("nvidia.com/gpu.family")
    if family is not None:
        check.equal("family-plausible", p.family, family, what=f"nvidia.com/gpu.family of a {p.label}")
    major, minor = n.label("nvidia.com/gpu.compute.major"), n.label("nvidia.com/gpu.compute.minor")
    if major is not None and minor is not None:
        check.equal("compute-plausible", f"{p.compute[0]}.{p.compute[1]}", f"{major}.{minor}",
                    what=f"nvidia.com/gpu.compute.major.minor of a {p.label}")


@for_nodes(lambda n: n.instance is not None)
def test_gpus_fit_instance_type(gpu_node, check):
    """nodes whose instance type is in the catalog"""
    n, it = gpu_node, gpu_node.instance
    if n.catalog_product is not None or n.scheme == "dra":
        for product in sorted(_products(n)):
            check.equal("product-fits-instance", it.product, product,
                        what=f"GPU product ({n.sources['product']}) of instance type {it.name}")
    if n.mig_strategy == "single" and n.gfd:
        return   # GFD's count is MIG devices there; the advertisement and MIG suites check those
    physical = n.count_label if n.gfd else n.physical_count
    if physical is not None:
        check.equal("count-fits-instance", it.count, physical,
                    what=f"GPUs ({n.count_source}) of instance type {it.name}: a GPU missing from the node?")


@for_nodes(lambda n: n.mig_strategy == "mixed" and n.catalog_product is not None)
def test_mig_labels_fit_product(gpu_node, check):
    """mixed-MIG nodes of catalog products"""
    n, p = gpu_node, gpu_node.catalog_product
    if not p.mig_known:
        check.skip("mig-plausible", f"gpuproof has no MIG table for {p.label}")
    gpus = n.count_label or 0
    slices = 0
    for profile, count in sorted(n.mig_resources.items()):
        prof = p.mig_profile(profile)
        if prof is None:
            continue                       # an unknown profile fails the MIG suite's mig-profile-known
        slices += prof.slices * count
        check.true("mig-count-plausible", count <= prof.max_per_gpu * gpus,
                   expected=f"at most {prof.max_per_gpu} per GPU x {gpus} GPUs", actual=count,
                   what=f"nvidia.com/mig-{profile} on a {p.label}")
        mem = n.label(f"nvidia.com/mig-{profile}.memory")
        if mem is not None and mem.isdigit():
            check.true("mig-memory-plausible", prof.memory_plausible(int(mem)),
                       expected=f"about {prof.memory_gb} GB", actual=f"{mem} MiB",
                       what=f"nvidia.com/mig-{profile}.memory")
    check.true("mig-slices-plausible", slices <= 7 * gpus, expected=f"at most 7 compute slices x {gpus} GPUs",
               actual=slices, what="compute slices of the advertised MIG devices")


def _products(n) -> set[str]:
    """The node's product(s) in the catalog's spelling; a DRA node: every product its devices name."""
    if n.scheme != "dra":
        return {n.catalog_product.label}
    named = {d.product: catalog.resolve(d.product) for d in n.dra_devices}
    return {(named[d.product].product.label if named[d.product] else d.product) or "(none)" for d in n.dra_devices}


def _dra_devices_fit_product(n, check) -> None:
    """The memory of each whole GPU NVIDIA's DRA driver publishes, against its product (MIG devices:
    dra-attributes holds them to the product's MIG table)."""
    whole: dict[tuple[str, int | None], int] = {}
    for d in n.dra_devices:
        if d.type == "gpu":
            whole[(d.product, d.memory_mib)] = whole.get((d.product, d.memory_mib), 0) + 1
    for (product, memory), count in sorted(whole.items(), key=str):
        p = catalog.resolve(product)   # a vGPU profile: its physical product, with the profile's memory
        if p is None:
            continue                   # product-known warns: the catalog cannot judge it
        check.true("memory-plausible", memory is not None and p.memory_plausible(memory),
                   expected=f"{p.memory_mib} MiB +-{catalog.MEMORY_TOLERANCE:.0%} ({p.what})",
                   actual=f"{memory} MiB", what=f"memory of {count} {product} device(s) NVIDIA's DRA driver publishes")

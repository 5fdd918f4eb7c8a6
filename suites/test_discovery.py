"""Discovery: the cluster has GPU nodes, found from labels and capacity (never from node names)."""

FEATURE = "discovery"


def test_cluster_has_gpu_nodes(target, discovery, check):
    check.true("gpu-nodes-present", bool(discovery.gpu_nodes), expected="at least 1 GPU node",
               actual=f"{len(discovery.gpu_nodes)} GPU nodes among "
                      f"{len(discovery.gpu_nodes) + len(discovery.other_nodes)}",
               what=f"cluster {target.cluster.name} has no node with nvidia.com/gpu.present=true or an NVIDIA GPU "
                    "resource (is the NVIDIA device plugin / GPU operator installed?)",
               target="cluster")


def test_pools_and_products_inventory(discovery, run_dir, check):
    """Record which pools and products were found (the inventory of the run)."""
    for pool, nodes in sorted(discovery.pools.items()):
        products = sorted({n.product for n in nodes})
        check.record("pool-found", "pass", expected="", actual={"nodes": len(nodes), "products": products},
                     target=f"pool/{pool}")

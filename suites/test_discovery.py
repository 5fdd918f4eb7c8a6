"""Discovery: the cluster has GPU nodes, found from labels and capacity (never from node names).

Every other suite works on what discovery finds, so this is where a cluster's GPU nodes and pools are decided
(``gpuproof/discovery/nodes.py``):

- **GPU Feature Discovery's labels** (``nvidia.com/gpu.product``, ``gpu.count``, ``gpu.memory``, ...), or a managed
  offering's own: GKE's ``cloud.google.com/gke-accelerator``, ``gke-gpu-partition-size`` and
  ``gke-max-shared-clients-per-gpu``, Karpenter's ``karpenter.k8s.aws/instance-gpu-*``, and AKS and EKS instance types
  read through the product catalog (``gpuproof/catalog.yaml``);
- **NVIDIA's DRA driver's ResourceSlices**, for nodes whose GPUs only Dynamic Resource Allocation offers;
- **capacity**: a node advertising ``nvidia.com/gpu`` (or MIG or shared resources) is a GPU node whatever its labels
  say; a resource left at 0 (the kubelet keeps old extended resources at 0 after a MIG or sharing change) is not
  advertised, and MIG devices a node advertises make it a MIG node.

Older GFD releases' labels are read too (``cuda.driver.*``, no ``gpu.replicas`` or ``gpu.sharing-strategy``,
``gpu.memory`` in bytes). Each node records where its product, count, sharing and partitioning came from (a label
scheme, the catalog, the capacity, a ResourceSlice), and whether it is real or a simulated kwok node; the run's
``inventory.json`` keeps it all. Pools are the nodes of one pool label (``--pool-label``, default the first common
cloud pool label found) or, without one, of one instance type and product.
"""

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

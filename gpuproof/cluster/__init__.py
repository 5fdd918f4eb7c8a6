"""API access to a Kubernetes cluster, real or embedded: the client (``api``), the run's namespace and labels,
the run lease, the churn of other people's pods, and the RBAC rules a run needs (``rbac.yaml``).

Layer 1: may import only the base modules (``gpuproof``, ``vocab``, ``errors``, ``results``, ``catalog``, ``images``).
"""

"""The reader of clusters: what a cluster says about its GPUs. Nodes and their label schemes (``nodes``: GPU
Feature Discovery, GKE, EKS, Karpenter, AKS, OpenShift), ResourceSlices and claims (``dra``), the inventory a run
records, NVLink topology read in a pod, and numbers from label values and quantities.

Layer 2: may import ``cluster`` and the base modules; never the simulator (``sim``): words both need live in
``gpuproof.vocab``.
"""

"""The embedded cluster: a real control plane (``controlplane``, ``binaries``, ``pki``) with kwok nodes
(``stages``) or kubelet nodes (``kubelet*``, ``clusternet``), a fleet file's model and parser (``fleet``,
``fleet_file``; shapes in ``fleets/``), NVIDIA's node software over its mock NVML (``nvidia``, ``gpunodes``,
``dradriver``, ``operator``), and the rendering of everything it publishes (nodes, ResourceSlices: ``slices``).

Layer 3, beside ``bench`` and ``report``: may import ``cluster`` and the base modules. It never imports the reader
of clusters (``discovery``) nor ``bench``: the words both sides use are :mod:`gpuproof.vocab`'s, the images
:mod:`gpuproof.images`'.
"""

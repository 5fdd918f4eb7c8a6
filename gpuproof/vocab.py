"""Words the embedded cluster writes and the reader of clusters reads: the only module both import."""

# Which software wrote a simulated node's GPU labels and resources (e.g. "gpu-feature-discovery v0.19.3",
# "k8s-device-plugin v0.19.3", or "gpuproof model (...)" where NVIDIA's software cannot show it here).
LABELS_BY = "gpuproof.dev/labels-by"
RESOURCES_BY = "gpuproof.dev/resources-by"

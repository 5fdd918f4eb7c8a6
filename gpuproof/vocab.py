"""Words the embedded cluster writes and the reader of clusters reads: the only module both import."""

GPU = "nvidia.com/gpu"                       # the device plugin's whole-GPU resource
GPU_SHARED = "nvidia.com/gpu.shared"         # ... renamed when shared (renameByDefault)

# Which software wrote a simulated node's GPU labels and resources (e.g. "gpu-feature-discovery v0.19.3",
# "k8s-device-plugin v0.19.3", or "gpuproof model (...)" where NVIDIA's software cannot show it here).
LABELS_BY = "gpuproof.dev/labels-by"
RESOURCES_BY = "gpuproof.dev/resources-by"
SLICES_BY = "gpuproof.dev/slices-by"          # which software published the node's ResourceSlices

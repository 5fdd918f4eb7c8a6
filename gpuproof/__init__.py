"""gpuproof: acceptance and benchmark suite for GPU Kubernetes clusters."""

__version__ = "0.1.0"

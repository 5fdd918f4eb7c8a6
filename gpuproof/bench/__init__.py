"""Benchmarks: a registry of benchmark classes (see :mod:`gpuproof.bench.base`).

``gpuproof bench --local <name>`` runs one on this host; the suites in ``suites/``
run them once per GPU product of a cluster (or locally on the CPU on the embedded one).
"""

from .base import REGISTRY, Benchmark, get, names, register  # noqa: F401
from . import benchmarks  # noqa: F401  (registers probe, matmul, allreduce, inference)
from .benchmarks import run_and_record  # noqa: F401

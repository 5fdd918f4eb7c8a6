"""Benchmarks: a registry of benchmark classes (see :mod:`gpuproof.bench.base`).

``gpuproof bench --local <name>`` runs one on this host; the suites in ``suites/``
run them once per GPU product of a real cluster (and skip on the embedded one). One module per benchmark
(``probe``, ``matmul``, ``allreduce``, ``inference``, ``health``, ``hbm``, ``census``), imported in order by
``benchmarks``. Beside the registry: the workloads' pod specs (``workloads``), the load generator's pods
(``loadpods``) and the sampler's records (``metrics``).

Layer 3, beside ``sim`` and ``report``: may import ``discovery``, ``cluster`` and the base modules, never
``sim``; the pytest glue of the benchmark suites is :mod:`gpuproof.plugin.bench_checks`.
"""

__all__ = ["REGISTRY", "Benchmark", "get", "names", "register", "run_and_record"]

from .base import REGISTRY, Benchmark, get, names, register  # noqa: F401
from .benchmarks import run_and_record  # noqa: F401  (importing it registers every benchmark, in order)

"""The registered benchmarks, one module each, in the order gpuproof lists and runs them ('all'), and
:func:`run_and_record`, which runs any of them on this host.

Importing a benchmark's module registers its class (:func:`gpuproof.bench.base.register`); a new benchmark is a
module beside these and a line below.
"""

from __future__ import annotations

import time

from ..results import MetricRecord
from . import metrics
from .base import get
from .probe import Probe
from .matmul import Matmul
from .allreduce import AllReduce
from .inference import Inference
from .health import Health
from .hbm import Hbm
from .census import Census

__all__ = ["AllReduce", "Census", "Hbm", "Health", "Inference", "Matmul", "Probe", "run_and_record"]


def run_and_record(name: str, run_dir, params: dict, *, node: str = "local", product: str = "",
                   echo: bool = False) -> tuple[dict, list[MetricRecord]]:
    """Run one benchmark locally and add its records and samples to ``run_dir``."""
    bench = get(name)
    t0 = time.time()
    result = bench.run_local(params, echo=echo)
    samples = result.pop("samples", [])
    result["wall_s"] = time.time() - t0
    records = bench.to_records(result, node=node, product=product)
    for r in records:
        r.parameters.setdefault("run_mode", "local")
    run_dir.add_metrics(records)
    if samples:
        run_dir.add_samples(metrics.sample_rows(samples, benchmark=name, node=node,
                                                product=bench.product_of(result, product)))
    return result, records

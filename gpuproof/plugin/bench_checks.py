"""What the bench suites (suites/test_bench_*.py) share.

A benchmark runs once per GPU product of a real cluster, on the first node of that product,
in a pod of the stock PyTorch image; records carry that node and product. On the embedded
cluster the benchmarks run on its kubelet nodes (``backend: kubelet``), in the image those nodes
lend (the host's Python over NVIDIA's mock NVML, computing on the CPU), and skip its kwok nodes
(pods never execute there), saying so; ``gpuproof bench --local`` runs them on this host.
"""

from __future__ import annotations

import os
from typing import Any

from ..errors import GpuproofError
from ..bench import get

IMAGE_ENV = "GPUPROOF_IMAGE"                 # override the workload image


def image(run=None):
    """The workload pods' image: the one the cluster lends (the embedded cluster's kubelet nodes: the host's
    Python and venv over NVIDIA's mock NVML), else ``$GPUPROOF_IMAGE``, else the stock PyTorch image."""
    from ..images import DEFAULT_IMAGE

    return getattr(run, "workload_image", None) or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE


def device(run=None) -> str:
    """What the workloads compute on: CUDA, or the CPU where the cluster's image says its GPUs are NVIDIA's mock
    (the embedded cluster's kubelet nodes: every NVML reading is real mock data, the arithmetic runs on the CPU)."""
    return getattr(getattr(run, "workload_image", None), "device", "cuda")


def bench_params(bench, run=None, overrides: dict | None = None) -> dict:
    """A benchmark's parameters for this run: its defaults (smaller ones on the CPU), its smallest sizes
    (``ci_params``) under --quick-bench, then the caller's overrides."""
    dev = device(run)
    quick = dict(bench.ci_params) if getattr(run, "quick_bench", False) else {}
    if dev != "cpu":              # the CPU path's thread and process counts; a GPU node uses its GPUs
        quick = {k: v for k, v in quick.items() if k not in ("threads", "nproc")}
    return bench.params({**quick, **(overrides or {})}, device=dev)


def mark(records: list, run=None) -> list:
    """Records of a benchmark run in the cluster: ``run_mode`` cluster, and ``sizes`` quick under --quick-bench
    (so a report never compares them with a full run's as if alike)."""
    for r in records:
        r.parameters.setdefault("run_mode", "cluster")
        if getattr(run, "quick_bench", False):
            r.parameters.setdefault("sizes", "quick")
    return records


def is_simulated(target, discovery=None) -> bool:
    if getattr(target, "is_embedded", False):
        return True
    return bool(discovery is not None and getattr(discovery, "simulated", False))


def require_real_gpus(target, discovery, gpu_products: dict) -> None:
    """Skip a benchmark where no node of the cluster runs GPU code (``gpu_products`` holds only nodes that do:
    on the embedded cluster its kubelet nodes, never its kwok nodes), saying why."""
    import pytest

    from .target import REAL_GPU_REASON

    if gpu_products:
        return
    if is_simulated(target, discovery) and all(n.simulated for n in getattr(discovery, "gpu_nodes", [])):
        pytest.skip(f"{REAL_GPU_REASON}; `gpuproof bench --local` runs the benchmarks on this host")
    pytest.skip("no GPU products found in the cluster")


def node_gpus(discovery, node_name: str, all_gpus: bool = False) -> tuple[str, int]:
    """(resource, count) a benchmark pod asks for on a node.

    Whole GPUs: ``nvidia.com/gpu`` x 1, or every allocatable one with ``all_gpus``.
    Time-sliced or renamed shared GPUs: one replica (more may be refused at admission).
    MIG mixed strategy: one instance of the largest profile the node advertises.
    """
    from ..bench.workloads import GPU_RESOURCE

    try:
        node = discovery.node(node_name)
    except Exception:
        return GPU_RESOURCE, 1
    res = node.gpu_resource
    count = node.allocatable_of(res) or 0
    if count == 0 and node.mig_resources:
        profile = max(node.mig_resources, key=lambda p: (int(p.split("g.")[0]), p))
        return f"nvidia.com/mig-{profile}", 1
    if not all_gpus or res != GPU_RESOURCE or node.time_sliced:
        return res, 1
    return res, max(1, count)


def node_tolerations(discovery, *node_names: str) -> list[dict] | None:
    """Tolerations of exactly these nodes' own taints (gpuproof.cluster.placement), or None where discovery does not
    know them (a GPU pod then tolerates ``nvidia.com/gpu`` only)."""
    from ..cluster.placement import tolerate

    try:
        nodes = [discovery.node(n) for n in node_names]
    except Exception:
        return None
    return tolerate(t for n in nodes for t in n.taints)


def run_per_product(name: str, run, run_dir, gpu_products: dict[str, list[str]], discovery=None,
                    params: dict | None = None, all_gpus: bool = False,
                    timeout: float | None = None) -> dict[str, Any]:
    """Run benchmark ``name`` once per GPU product; returns product -> result or error text."""
    bench = get(name)
    out: dict[str, Any] = {}
    for product, nodes in sorted(gpu_products.items()):
        if not nodes:
            continue
        node = sorted(nodes)[0]
        resource, gpus = node_gpus(discovery, node, all_gpus)
        p = bench_params(bench, run, params)
        # what else a benchmark needs in the cluster (a load generator's image, say) it takes from the run itself
        try:
            result = bench.run_in_cluster(run, p, product=product, node=node, gpus=gpus, resource=resource,
                                          image=image(run), timeout=timeout,
                                          tolerations=node_tolerations(discovery, node))
        except GpuproofError as exc:
            out[product] = f"{node}: {exc}"
            continue
        result.pop("samples", None)
        run_dir.add_metrics(mark(bench.to_records(result, node=node, product=product), run))
        out[product] = result
    return out


RESULT_OK = "the benchmark ran and its result is ok"


def outcomes(results: dict[str, Any], gpu_products: dict[str, list[str]]):
    """(product, the node it ran on, ok, what it gave) of each product's run, for the suite's ``check.true``:
    a run that raised (its error text), or a result that says not ok (its error, problems or verdict), is not ok."""
    for product, r in sorted(results.items()):
        node = sorted(gpu_products.get(product) or [product])[0]
        if isinstance(r, str):
            yield product, node, False, r
        elif not r.get("ok", False):
            yield product, node, False, f"result not ok: {r.get('error') or r.get('problems') or r.get('verdict')}"
        else:
            yield product, node, True, "ok"

"""Benchmark ``allreduce``: an all-reduce size sweep with torch.distributed (NCCL on GPUs, gloo on the CPU).

Runs ``workloads/allreduce.py``: per message size nccl-tests' columns (time, algbw, busbw, #wrong) and the average
bus bandwidth; with one rank, no bandwidth and why. In a cluster one pod starts the ranks with torchrun; across
nodes the fabric suite runs it (gpuproof.bench.fabric: pairs of nodes and a ring over all).
"""

from __future__ import annotations

from ..results import MetricRecord
from . import workloads as wl
from .base import CPU_PEER_PCT, Benchmark, present, register


@register
class AllReduce(Benchmark):
    name = "allreduce"
    script = "allreduce"
    description = ("all-reduce size sweep: algbw, busbw (nccl-tests definitions), #wrong, average busbw; "
                   "per-node figures and stragglers across nodes; no bandwidth with one rank")
    defaults = {"min_bytes": "8", "max_bytes": "1G", "sizes": None, "dtype": "float32", "iters": 20, "warmup": 5,
                "nproc": 1, "sample_hz": 10.0, "threads": None, "straggler_pct": None, "node_bytes": None,
                "ranks_per_node": None, "collectives": None, "report_size": None}
    # stragglers judged at base.CPU_PEER_PCT on the CPU (80% named a healthy kubelet node in the CI's lab run: 0.172
    # against a median of 0.224 GB/s over 2 nodes, measured beside the other tests' load)
    cpu_defaults = {"max_bytes": "64M", "straggler_pct": CPU_PEER_PCT}
    # node_bytes: the per-node figures that judge stragglers at the CPU run's own size (at 4K, all latency, and at 4M
    # on a busy machine, they named healthy nodes)
    ci_params = {"sizes": "8,1K,4K", "iters": 5, "warmup": 1, "nproc": 2, "threads": 1, "node_bytes": "64M"}
    flags = {"device": "--device", "min_bytes": "--min-bytes", "max_bytes": "--max-bytes", "sizes": "--sizes",
             "dtype": "--dtype", "iters": "--iters", "warmup": "--warmup", "nproc": "--nproc",
             "sample_hz": "--sample-hz", "threads": "--threads", "straggler_pct": "--straggler-pct",
             "node_bytes": "--node-bytes", "ranks_per_node": "--ranks-per-node", "collectives": "--collectives",
             "report_size": "--report-size"}
    timeout_s = 3600

    shared_options = ("sizes",)             # message sizes (matmul's are matrices)

    def cli_params(self, args, device: str = "auto") -> dict:
        """As given; on CUDA without --nproc, one local rank per GPU torch sees."""
        nproc = args.nproc
        if nproc is None and device == "cuda":
            import torch

            nproc = max(1, torch.cuda.device_count())
        return {"sample_hz": args.sample_hz, "threads": args.threads, "sizes": args.allreduce_sizes or args.sizes,
                "min_bytes": args.min_bytes, "max_bytes": args.max_bytes, "iters": args.iters, "nproc": nproc}

    def headline(self, result: dict) -> str:
        if result.get("no_bandwidth_reason"):
            return f"world size {result.get('world_size')}: no bandwidth ({result['no_bandwidth_reason']})"
        return (f"world size {result.get('world_size')}, avg busbw {result.get('avg_busbw_gbps') or 0:.3g} GB/s, "
                f"#wrong {result.get('wrong_total')}")

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        base = {"device": result.get("device"), "backend": result.get("backend"),
                "world_size": result.get("world_size"), "nnodes": result.get("nnodes")}
        extra = self._node_records(result, base, node, product)
        recs = []
        for r in result.get("results") or []:
            p = {**base, "size_bytes": r["size_bytes"], "dtype": r["type"], "redop": r["redop"]}
            recs += [
                self.record("busbw_gbps", r["busbw_gbps"], "GB/s", p, node, product),
                self.record("algbw_gbps", r["algbw_gbps"], "GB/s", p, node, product),
                self.record("time_us", r["time_us"], "us", p, node, product),
                self.record("wrong", r.get("wrong"), "count", p, node, product),
            ]
        recs += [
            self.record("avg_busbw_gbps", result.get("avg_busbw_gbps"), "GB/s", base, node, product),
            self.record("max_busbw_gbps", result.get("max_busbw_gbps"), "GB/s", base, node, product),
            self.record("wrong_total", result.get("wrong_total"), "count", base, node, product),
        ]
        recs += self._other_collectives(result, base, node, product)
        return present(recs) + extra + self.utilization_records(result, node, product)

    def _other_collectives(self, result: dict, base: dict, node: str, product: str) -> list[MetricRecord]:
        """all_gather, reduce_scatter, alltoall, sendrecv: the same columns, each under its ``collective`` (all_reduce's
        records keep their parameters as before, so a report still joins them with earlier runs')."""
        recs = []
        for r in result.get("results_all") or []:
            if r.get("collective", "all_reduce") == "all_reduce":
                continue
            p = {**base, "collective": r["collective"], "size_bytes": r["size_bytes"], "dtype": r["type"]}
            recs += [self.record("busbw_gbps", r.get("busbw_gbps"), "GB/s", p, node, product),
                     self.record("algbw_gbps", r.get("algbw_gbps"), "GB/s", p, node, product),
                     self.record("time_us", r.get("time_us"), "us", p, node, product),
                     self.record("wrong", r.get("wrong"), "count", p, node, product)]
        for name, summary in (result.get("collectives") or {}).items():
            if name == "all_reduce" or not summary.get("measured"):
                continue
            p = {**base, "collective": name}
            recs += [self.record("avg_busbw_gbps", summary.get("avg_busbw_gbps"), "GB/s", p, node, product),
                     self.record("wrong_total", summary.get("wrong_total"), "count", p, node, product)]
        return recs

    def _node_records(self, result: dict, base: dict, node: str, product: str) -> list[MetricRecord]:
        """No-bandwidth note (one rank), per-node bus bandwidth and stragglers (records carry the node)."""
        recs = []
        if result.get("no_bandwidth_reason"):
            recs.append(self.record("no_bandwidth", True, "bool", {**base, "reason": result["no_bandwidth_reason"]},
                                    node, product))
        rows = result.get("nodes") or []
        if rows:
            p = {**base, "size_bytes": result.get("per_node_size_bytes"),
                 "straggler_pct": result.get("straggler_pct")}
            for r in rows:
                where = r.get("node") or node
                recs += [
                    self.record("node_intra_busbw_gbps", r.get("intra_busbw_gbps"), "GB/s", p, where, product),
                    self.record("node_inter_busbw_gbps", r.get("inter_busbw_gbps"), "GB/s", p, where, product),
                    self.record("straggler", bool(r.get("straggler")), "bool",
                                {**p, "reason": r.get("straggler_reason") or ""}, where, product),
                ]
            recs.append(self.record("stragglers", len(result.get("stragglers") or []), "count",
                                    {**p, "names": ",".join(result.get("stragglers") or [])}, node, product))
        return present(recs)

    def manifests(self, params: dict, *, labels: dict, namespace: str, name: str, product: str | None = None,
                  node: str | None = None, image: str = wl.DEFAULT_IMAGE, gpus: int = 1,
                  resource: str = wl.GPU_RESOURCE, tolerations: list[dict] | None = None) -> list[dict]:
        args = self.workload_args({**params, "nproc": None, "ranks_per_node": None})  # torchrun starts the ranks
        return [wl.workload_pod(name, self.script, args, labels=labels, namespace=namespace, image=image,
                                gpus=gpus, resource=resource, product=product, node=node, torchrun=True,
                                tolerations=tolerations)]

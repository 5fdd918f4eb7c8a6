"""The ``census`` benchmark and its judge: every GPU of a node measured for seconds, judged among its peers.

``workloads/census.py`` runs in one pod per node (``pod_key`` is the node, as for health) and reports per GPU
NVML lists (index, UUID) a short matmul (``matmul_tflops``, bf16 from compute capability 8.0) and a
device-to-device copy (``d2d_copy_gbps``), with the product's datasheet figures where known; on nodes with 2 or
more GPUs an intra-node all-reduce (``allreduce.busbw_gbps``). On the CPU path (the embedded cluster's kubelet
nodes over NVIDIA's mock NVML) the same code runs on the CPU once per NVML GPU.

A figure alone says little; :func:`judge` compares it with its peers. Each GPU's figure against

- the median of its **pool**'s GPUs (same product and node shape, i.e. GPU count; the caller names the pool):
  below ``pool_pct`` percent of that median fails. Default **85 %**: GPUs of one SKU in one node shape run
  within a few percent of each other (power and clock spread), and a 15 % shortfall is no such spread;
  the GPU the issue hunts at 60-70 % of its peers is far below it. A pool of one GPU has no peers: skipped,
  saying so, never failed;
- the product's **datasheet** (dense peak of the dtype it ran, HBM bandwidth): below ``matmul_pct``
  (default **50 %**) or ``copy_pct`` (default **50 %**) fails. The pool test cannot see a whole pool gone
  slow (power-capped, wrong clocks); half the datasheet is far below what a healthy GPU reaches in this
  census' sizes (an H200 did 672 of 989 bf16 TFLOPS = 68 % at 8192^3, a 1 GiB copy 89 % of its 4.8 TB/s:
  benchmarks/RESULTS.md). Skipped where there is no datasheet figure: on the CPU, or an unknown product.

The node's all-reduce busbw is judged against the median of its pool's nodes, with ``pool_pct``.

Floors come from ``GPUPROOF_CENSUS_FLOORS`` (or any string), e.g. ``pool=85,matmul=50,copy=50``, in percent;
:func:`parse_floors` says in one line what is wrong with a bad one.

Records (``to_records``): per GPU ``matmul_tflops`` and ``d2d_copy_gbps``, per node ``allreduce_busbw_gbps``,
with the node, GPU index and UUID in the parameters, so ``gpuproof report compare`` follows one node and one
GPU across runs.
"""

from __future__ import annotations

import dataclasses
import os
import re
import statistics

from ..errors import GpuproofError
from ..results import MetricRecord
from .base import CPU_PEER_PCT, NodeBenchmark, register

FLOORS_ENV = "GPUPROOF_CENSUS_FLOORS"
FLOOR_KEYS = {"pool": "pool_pct", "matmul": "matmul_pct", "copy": "copy_pct"}
# per-GPU metric -> (short name of its check, unit, datasheet field of the GPU entry, Floors field, datasheet words)
GPU_METRICS = {
    "matmul_tflops": ("matmul", "TFLOPS", "peak_tflops", "matmul_pct", "dense peak"),
    "d2d_copy_gbps": ("copy", "GB/s", "peak_hbm_gbps", "copy_pct", "HBM bandwidth"),
}
ALLREDUCE = "allreduce_busbw_gbps"
CHECKS = ("census-result", "census-matmul-pool", "census-matmul-datasheet", "census-copy-pool",
          "census-copy-datasheet", "census-allreduce-pool")


@register
class Census(NodeBenchmark):
    name = "census"
    script = "census"
    description = ("per-GPU census: a short bf16 matmul and a device-to-device copy on every GPU NVML lists, and an "
                   "intra-node all-reduce; each GPU judged against its pool's median and its datasheet")
    defaults = {"matmul_size": 8192, "copy_mib": 256, "allreduce_mib": 256, "iters": 20, "warmup": 5,
                "product": None, "threads": None}
    # on the CPU one thread: torch's threads fight for the cores of a shared machine (one run 300x slower)
    cpu_defaults = {"matmul_size": 256, "copy_mib": 16, "allreduce_mib": 4, "threads": 1}
    # about 0.3 s of measuring per node of 8 mock GPUs on one core (plus torch's import)
    ci_params = {"matmul_size": 256, "copy_mib": 8, "allreduce_mib": 1, "iters": 20, "warmup": 2, "threads": 1}
    flags = {"device": "--device", "matmul_size": "--matmul-size", "copy_mib": "--copy-mib",
             "allreduce_mib": "--allreduce-mib", "iters": "--iters", "warmup": "--warmup", "product": "--product",
             "threads": "--threads"}
    timeout_s = 900

    def headline(self, result: dict) -> str:
        return headline(result)

    def to_records(self, result: dict, node: str = "local", product: str = "") -> list[MetricRecord]:
        product = self.product_of(result, product)
        recs = []
        for g in result.get("gpus") or []:
            p = {"node": node, "gpu": g.get("index"), "uuid": g.get("uuid"), "device": g.get("device")}
            recs.append(self.record("matmul_tflops", g.get("matmul_tflops"), "TFLOPS",
                                    {**p, "dtype": g.get("dtype"), "size": g.get("matmul_size"),
                                     "iters": (result.get("params") or {}).get("iters")}, node, product))
            recs.append(self.record("d2d_copy_gbps", g.get("d2d_copy_gbps"), "GB/s",
                                    {**p, "bytes": g.get("copy_bytes"),
                                     "iters": (result.get("params") or {}).get("iters")}, node, product))
        ar = result.get("allreduce") or {}
        recs.append(self.record(ALLREDUCE, ar.get("busbw_gbps"), "GB/s",
                                {"node": node, "gpus": ar.get("gpus"), "device": ar.get("device"),
                                 "bytes": ar.get("bytes"), "iters": ar.get("iters")}, node, product))
        return [r for r in recs if r is not None]

    @staticmethod
    def product_of(result: dict, product: str) -> str:
        gpus = result.get("gpus") or []
        return product or result.get("product") or (gpus[0].get("name") if gpus else "") or ""


# ------------------------------------------------------------------ floors


@dataclasses.dataclass(frozen=True)
class Floors:
    """Percentages under which a figure fails (see the module's doc for why these defaults)."""

    pool_pct: float = 85.0      # of the pool's median (GPUs for matmul and copy, nodes for the all-reduce)
    matmul_pct: float = 50.0    # of the datasheet dense peak of the dtype the matmul ran
    copy_pct: float = 50.0      # of the datasheet HBM bandwidth

    def describe(self) -> str:
        return ",".join(f"{key}={getattr(self, field):g}" for key, field in FLOOR_KEYS.items())


def parse_floors(text: str, source: str = FLOORS_ENV) -> Floors:
    """'pool=85,matmul=50,copy=50' (any subset, percent, '%' allowed) -> Floors; GpuproofError in one line."""
    hint = f"write e.g. {Floors().describe()} (percent of the pool's median, of the datasheet's matmul and copy)"
    values: dict[str, float] = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        key, sep, value = (s.strip() for s in part.partition("="))
        problem = (f"{part!r} is not key=percent" if not sep else
                   f"unknown floor {key!r} (known: {', '.join(FLOOR_KEYS)})" if key not in FLOOR_KEYS else
                   f"{key} given twice" if FLOOR_KEYS[key] in values else None)
        if problem is None:
            try:
                pct = float(value.removesuffix("%"))
            except ValueError:
                pct = None
            if pct is None or not 0 <= pct <= 100:
                problem = f"{key}={value!r} is not a percentage from 0 to 100"
            else:
                values[FLOOR_KEYS[key]] = pct
        if problem:
            raise GpuproofError(f"{source}={text!r}: {problem}; {hint}")
    return Floors(**values)


CPU_POOL_PCT = CPU_PEER_PCT       # the pool floor where the figures are the CPU's (base.CPU_PEER_PCT says why)


def floors_from_env(environ=None, device: str = "cuda") -> Floors:
    """The floors of ``GPUPROOF_CENSUS_FLOORS``, or the defaults when it is unset or empty (on the CPU path the pool
    floor is :data:`CPU_POOL_PCT`)."""
    text = (os.environ if environ is None else environ).get(FLOORS_ENV, "")
    if text.strip():
        return parse_floors(text)
    return Floors(pool_pct=CPU_POOL_PCT) if device == "cpu" else Floors()


# ------------------------------------------------------------------ judging


def pool_key(product: str, gpus: int) -> str:
    """A pool: one product in one node shape, e.g. 'NVIDIA-A100-SXM4-80GB x8'."""
    return f"{product} x{gpus}"


def pool_key_of(result: dict) -> str:
    """The pool of a node the caller did not name: its GPUs' NVML name and how many NVML lists."""
    gpus = [g for g in result.get("gpus") or [] if g.get("index") is not None]
    return pool_key(gpus[0].get("name") or "unknown", len(gpus)) if gpus else "host CPU (no NVML GPU)"


@dataclasses.dataclass(frozen=True)
class Verdict:
    node: str
    gpu: int | None          # NVML index; None for the node's all-reduce and a host without NVML
    uuid: str | None
    metric: str              # matmul_tflops | d2d_copy_gbps | allreduce_busbw_gbps | result
    basis: str               # pool | datasheet | result
    value: float | None
    unit: str
    pool: str
    pool_median: float | None
    pool_size: int           # GPUs (nodes, for the all-reduce) of the pool with a figure
    reference: float | None  # what the floor is a share of: the pool's median, or the datasheet figure
    floor_pct: float | None
    verdict: str             # pass | fail | skip
    detail: str              # the message without the node's name

    @property
    def message(self) -> str:
        return f"{self.node} {self.detail}"

    @property
    def check(self) -> str:
        if self.basis == "result":
            return "census-result"
        short = GPU_METRICS[self.metric][0] if self.metric in GPU_METRICS else "allreduce"
        return f"census-{short}-{self.basis}"

    @property
    def ratio(self) -> float | None:
        return self.value / self.reference if self.value is not None and self.reference else None

    @property
    def expected(self) -> str:
        if self.floor_pct is None or self.reference is None:
            return ""
        what = "the pool median" if self.basis == "pool" else "the datasheet"
        return f">= {self.floor_pct:g}% of {what} {fmt(self.reference)} {self.unit}"

    @property
    def actual(self) -> str:
        if self.value is None:
            return "no figure"
        return f"{fmt(self.value)} {self.unit}" + (f" ({self.ratio:.0%})" if self.ratio is not None else "")

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "message": self.message, "check": self.check, "ratio": self.ratio}


def fmt(x: float) -> str:
    """312.0, 45.67, 0.123: enough digits to tell GPUs apart at any scale (TFLOPS on a GPU or on a CPU)."""
    return f"{x:.1f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) >= 1 else f"{x:.3g}"


def gpu_label(g: dict) -> str:
    """'GPU 3 (GPU-8a1c...)', or 'host CPU' for the entry of a host without NVML."""
    if g.get("index") is None:
        return "host CPU"
    return f"GPU {g['index']}" + (f" ({g['uuid']})" if g.get("uuid") else "")


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _what(metric: str, g: dict) -> str:
    if metric == "matmul_tflops":
        return f"{g.get('dtype') or ''} matmul".strip()
    return "device-to-device copy"


def judge(results: dict[str, dict], pool_of: dict[str, str], floors: Floors | None = None) -> list[Verdict]:
    """Every GPU's matmul and copy against its pool's median and its datasheet, every node's all-reduce against its
    pool's nodes. ``results``: node -> census result; ``pool_of``: node -> pool key (:func:`pool_key`; a node
    missing there gets :func:`pool_key_of` its result). Verdicts by node, then GPU, matmul before copy."""
    floors = floors or Floors()
    pools: dict[str, list[str]] = {}
    for node in sorted(results):
        pools.setdefault(pool_of.get(node) or pool_key_of(results[node]), []).append(node)
    pool_name = {n: p for p, nodes in pools.items() for n in nodes}
    medians: dict[tuple[str, str], tuple[float | None, int]] = {}
    for pool, nodes in pools.items():
        for metric in GPU_METRICS:
            vals = [g[metric] for n in nodes for g in results[n].get("gpus") or [] if _number(g.get(metric))]
            medians[pool, metric] = (statistics.median(vals) if vals else None, len(vals))
        vals = [v for n in nodes if _number(v := (results[n].get("allreduce") or {}).get("busbw_gbps"))]
        medians[pool, ALLREDUCE] = (statistics.median(vals) if vals else None, len(vals))

    out: list[Verdict] = []
    for node in sorted(results):
        r, pool = results[node], pool_name[node]
        if not r.get("gpus"):
            why = r.get("error") or r.get("pod_error") or "a result without GPUs"
            out.append(Verdict(node, None, None, "result", "result", None, "", pool, None, 0, None, None, "fail",
                               f"census gave no GPU figures: {why}"))
            continue
        for g in r["gpus"]:
            for metric in GPU_METRICS:
                out += _judge_gpu(node, g, metric, pool, *medians[pool, metric], floors)
        ar = r.get("allreduce") or {}
        if ar:
            out.append(_judge_allreduce(node, ar, pool, *medians[pool, ALLREDUCE], floors))
    return out


def _judge_gpu(node: str, g: dict, metric: str, pool: str, median: float | None, size: int,
               floors: Floors) -> list[Verdict]:
    short, unit, peak_field, floor_field, peak_words = GPU_METRICS[metric]
    label, what, value = gpu_label(g), _what(metric, g), g.get(metric)
    base = dict(node=node, gpu=g.get("index"), uuid=g.get("uuid"), metric=metric, value=value, unit=unit,
                pool=pool, pool_median=median, pool_size=size)
    if not _number(value):
        if g.get("error"):
            return [Verdict(**base, basis="pool", reference=median, floor_pct=floors.pool_pct, verdict="fail",
                            detail=f"{label}: {what} could not be measured: {g['error']}")]
        why = g.get("reason") or "not measured"
        return [Verdict(**base, basis=basis, reference=None, floor_pct=None, verdict="skip",
                        detail=f"{label}: {what}: no figure ({why})") for basis in ("pool", "datasheet")]
    head = f"{label}: {what} {fmt(value)} {unit}"
    if size < 2:
        pool_v = Verdict(**base, basis="pool", reference=median, floor_pct=floors.pool_pct, verdict="skip",
                         detail=f"{head}: no peers to compare with (pool {pool} has no other GPU with a figure)")
    else:
        ratio = value / median
        pool_v = Verdict(**base, basis="pool", reference=median, floor_pct=floors.pool_pct,
                         verdict="pass" if ratio * 100 >= floors.pool_pct else "fail",
                         detail=f"{head} is {ratio:.0%} of its pool's median {fmt(median)} (pool {pool}, {size} "
                                f"GPUs; floor {floors.pool_pct:g}%)")
    peak, floor = g.get(peak_field), getattr(floors, floor_field)
    if not _number(peak):
        why = ("measured on the CPU" if g.get("device") == "cpu" and not g.get("product") else
               f"none known for {g.get('product') or g.get('name')!r}")
        sheet_v = Verdict(**base, basis="datasheet", reference=None, floor_pct=floor, verdict="skip",
                          detail=f"{head}: no datasheet figure ({why})")
    else:
        ratio = value / peak
        key = g.get("peak_key" if metric == "matmul_tflops" else "hbm_key") or g.get("product")
        of = f"{key} {peak_words}" + (f" {g.get('dtype')}" if metric == "matmul_tflops" else "")
        sheet_v = Verdict(**base, basis="datasheet", reference=peak, floor_pct=floor,
                          verdict="pass" if ratio * 100 >= floor else "fail",
                          detail=f"{head} is {ratio:.0%} of the datasheet's {fmt(peak)} ({of}; floor {floor:g}%)")
    return [pool_v, sheet_v]


def _judge_allreduce(node: str, ar: dict, pool: str, median: float | None, size: int, floors: Floors) -> Verdict:
    value, n = ar.get("busbw_gbps"), ar.get("gpus")
    on = " on the CPU" if ar.get("device") == "cpu" else ""
    base = dict(node=node, gpu=None, uuid=None, metric=ALLREDUCE, basis="pool", value=value, unit="GB/s", pool=pool,
                pool_median=median, pool_size=size, reference=median, floor_pct=floors.pool_pct)
    if not _number(value):
        if ar.get("error") or ar.get("check_ok") is False:
            return Verdict(**base, verdict="fail", detail=f"all-reduce over {n} GPUs{on} failed: "
                                                          f"{ar.get('error') or 'a tensor does not hold the sum'}")
        return Verdict(**base, verdict="skip", detail=f"all-reduce: {ar.get('reason') or 'no figure'}")
    head = f"all-reduce busbw {fmt(value)} GB/s over {n} GPUs{on}"
    if size < 2:
        return Verdict(**base, verdict="skip",
                       detail=f"{head}: no peers to compare with (pool {pool} has no other node with a figure)")
    ratio = value / median
    return Verdict(**base, verdict="pass" if ratio * 100 >= floors.pool_pct else "fail",
                   detail=f"{head} is {ratio:.0%} of its pool's median {fmt(median)} (pool {pool}, {size} nodes; "
                          f"floor {floors.pool_pct:g}%)")


def headline(result: dict) -> str:
    """One line: the GPUs measured, the spread of their figures, the all-reduce."""
    gpus = result.get("gpus") or []
    parts = [f"{len(gpus)} GPU(s) on {result.get('device')}"]
    for metric, (short, unit, *_rest) in GPU_METRICS.items():
        vals = [(g[metric], gpu_label(g)) for g in gpus if _number(g.get(metric))]
        if vals:
            lo = min(vals)
            parts.append(f"{short} median {fmt(statistics.median(v for v, _ in vals))} {unit}" +
                         (f" (lowest {fmt(lo[0])}, {re.sub(r' [(].*', '', lo[1])})" if len(vals) > 1 else ""))
    ar = result.get("allreduce") or {}
    parts.append(f"all-reduce busbw {fmt(ar['busbw_gbps'])} GB/s" if _number(ar.get("busbw_gbps")) else
                 f"all-reduce: {ar.get('reason') or ar.get('error')}")
    return "; ".join(parts)

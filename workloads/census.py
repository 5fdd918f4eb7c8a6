"""Per-GPU performance census: seconds per GPU, on every GPU NVML lists.

For each GPU (NVML index, UUID, name), on the torch device matched to it by UUID:

- ``matmul_tflops``: a short square matmul, TFLOPS = 2 N^3 / t with t the mean over one timed loop of
  ``--iters`` back-to-back iterations after ``--warmup``; bf16 on compute capability >= 8.0, fp16 >= 7.0,
  else fp32 (``dtype`` says which);
- ``d2d_copy_gbps``: ``dst.copy_(src)`` on the device, GB/s = 2 x buffer / t (read + written), the same way.

Sustained, not median: a census looks for the GPU that stays slow (power-capped, throttling, a node whose CPU
is held back), and a median of single iterations keeps the fast ones and drops the slow (a CFS-throttled
process runs most iterations at full speed and stalls in a few; its median hid a node held to 10% of a core).

On nodes with 2 or more GPUs, ``allreduce``: one all-reduce over one tensor per GPU in this one
process (``torch.cuda.nccl.all_reduce``; what NCCL used within the node, read from its own log, in
``allreduce.transport``), busbw = algbw x 2(n-1)/n (nccl-tests' definition,
allreduce.py). Per GPU the datasheet figures of its product (``peak_tflops``: dense peak of the
dtype it ran; ``peak_hbm_gbps``: its memory bandwidth; gpuproof's product catalog, datasheet.py) when known.

On the CPU (``--device cpu``, or no CUDA: kubelet nodes run NVIDIA's mock NVML with CPU only) the
same code runs on the CPU in float32 with small sizes, once per NVML GPU, so every GPU still gets
figures of its own, measured, labelled with its index and UUID (``device: cpu``); with 2 or more
NVML GPUs the all-reduce is a sum over one host tensor per GPU, marked ``device: cpu``. Datasheet
figures are null on the CPU unless ``--product`` names one. Without NVML: one entry for the host's
CPU (index null) with the reason.

Judging against the GPU's pool (same product, same node shape) is gpuproof's (bench/census.py):
a figure means something only beside its peers'. Exit 0 when every GPU that could be measured was
and the checks (copy equal, all-reduce sum) held; 1 when one failed (a CUDA error is a failure).
"""

from __future__ import annotations

import os
import sys
import time

import allreduce
import health
import matmul
import nccl_capture
import workload_common as common

DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
GPU_DEFAULTS = {"matmul_size": 8192, "copy_mib": 256, "allreduce_mib": 256}
CPU_DEFAULTS = {"matmul_size": 256, "copy_mib": 16, "allreduce_mib": 4}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else repr(exc)


def _device_ctx(torch, device: str):
    return torch.cuda.device(device) if device.startswith("cuda") else health._nullcontext()


def sustained(op, iters: int, device: str, min_s: float) -> tuple[float, int]:
    """(seconds per iteration, iterations) over back-to-back loops of ``iters`` calls, until ``min_s`` seconds have
    passed: longer than a CFS period (100 ms) and a GPU's boost, so a held-back GPU or CPU shows its held rate."""
    total, count = 0.0, 0
    while True:
        total += common.time_total(op, iters, device)
        count += iters
        if total >= min_s:
            return total / count, count


def measure_matmul(device: str, size: int, iters: int, warmup: int, min_s: float = 0.0) -> dict:
    import torch

    dt = health.pick_dtype(torch, device)
    with _device_ctx(torch, device):
        a = torch.randn(size, size, device=device, dtype=torch.float32).to(dt)
        b = torch.randn(size, size, device=device, dtype=torch.float32).to(dt)
        c = torch.empty(size, size, device=device, dtype=dt)

        def op(_i):
            torch.matmul(a, b, out=c)

        common.time_total(op, warmup, device)
        t, n = sustained(op, iters, device, min_s)           # sustained: see the module's doc
    return {"dtype": DTYPE_NAMES.get(str(dt).removeprefix("torch."), str(dt)), "matmul_size": size,
            "matmul_iters": n, "matmul_mean_ms": t * 1e3, "matmul_tflops": matmul.tflops(size, size, size, t)}


def measure_copy(device: str, nbytes: int, iters: int, warmup: int, min_s: float = 0.0) -> dict:
    import torch

    count = max(1, nbytes // 4)
    with _device_ctx(torch, device):
        src = torch.randn(count, device=device, dtype=torch.float32)
        dst = torch.empty_like(src)

        def op(_i):
            dst.copy_(src)

        common.time_total(op, warmup, device)
        t, n = sustained(op, iters, device, min_s)
        ok = bool(torch.equal(dst, src))
    return {"copy_bytes": count * 4, "copy_iters": n, "copy_mean_ms": t * 1e3, "d2d_copy_gbps": 2 * count * 4 / t / 1e9,
            "copy_check_ok": ok}


def measure_allreduce(devices: list[str], nbytes: int, iters: int, warmup: int, min_s: float = 0.0) -> dict:
    """One all-reduce over one float32 tensor per device: NCCL across GPUs, a sum into each on the CPU."""
    import torch

    n, count = len(devices), max(1, nbytes // 4)
    cuda = devices[0].startswith("cuda")
    tensors = [torch.zeros(count, device=d, dtype=torch.float32) for d in devices]   # zeros: sums stay finite
    if cuda:
        if not torch.cuda.nccl.is_available(tensors):
            return {"reason": "torch.cuda.nccl cannot all-reduce these tensors (NCCL not built into torch?)"}

        def op(_i):
            torch.cuda.nccl.all_reduce(tensors)
    else:
        acc = torch.empty(count, dtype=torch.float32)

        def op(_i):
            acc.copy_(tensors[0])
            for t in tensors[1:]:
                acc.add_(t)
            for t in tensors:
                t.copy_(acc)

    def sync():                       # every device: torch.cuda.synchronize() alone waits for the current one
        if cuda:
            for d in devices:
                torch.cuda.synchronize(d)

    for i in range(warmup):
        op(i)
    sync()
    total, runs = 0.0, 0
    while runs == 0 or total < min_s:     # host clock around each loop, every device synchronized at its end
        t0 = time.perf_counter()
        for i in range(iters):
            op(i)
        sync()
        total += time.perf_counter() - t0
        runs += iters
    t = total / runs
    for k, x in enumerate(tensors):   # the check: tensor k holds k + 1, every tensor must end with the sum
        x.fill_(k + 1)
    op(0)
    sync()
    want = n * (n + 1) / 2
    ok = all(bool(torch.all(x == want)) for x in tensors)
    return {"bytes": count * 4, "iters": runs, "mean_ms": t * 1e3, "algbw_gbps": allreduce.algbw_gbps(count * 4, t),
            "busbw_gbps": allreduce.busbw_gbps(count * 4, t, n), "check_ok": ok}


def list_gpus(device: str, torch) -> tuple[list[dict], str | None]:
    """Every GPU NVML lists (index, UUID, name, PCI bus) with the torch device it is measured on; (entries,
    why NVML is not there)."""
    reader, why = health.open_nvml()
    cuda_devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if device == "cuda" else []
    if reader is None:
        if cuda_devices:       # CUDA without NVML: torch's own view, by ordinal
            return [{"index": i, "uuid": f"GPU-{torch.cuda.get_device_properties(d).uuid}",
                     "name": torch.cuda.get_device_name(d), "pci_bus_id": None, "device": d}
                    for i, d in enumerate(cuda_devices)], why
        return [{"index": None, "uuid": None, "name": common.device_name("cpu"), "pci_bus_id": None,
                 "device": "cpu", "reason": f"no NVML GPU ({why}): the host's CPU, measured once"}], why
    by_uuid = {str(getattr(torch.cuda.get_device_properties(d), "uuid", "")).lower(): d for d in cuda_devices}
    gpus = []
    for r in reader.readings:
        g = {k: r.get(k) for k in ("index", "uuid", "name", "pci_bus_id")}
        if device == "cpu":
            g["device"] = "cpu"
        else:
            d = by_uuid.get(str(r.get("uuid") or "").lower().removeprefix("gpu-"))
            if d is None and len(reader.readings) == 1 and len(cuda_devices) == 1:
                d = cuda_devices[0]   # a MIG slice: torch sees the MIG device, NVML its parent GPU
            g["device"] = d
            if d is None:
                g["reason"] = "torch has no CUDA device with this GPU's UUID: not measured"
        if r.get("reason"):
            g["device"], g["reason"] = None, r["reason"]
        gpus.append(g)
    return gpus, None


def datasheet(g: dict, product: str | None) -> None:
    """The GPU's datasheet figures (null when the product is unknown or it was measured on the CPU)."""
    g["product"] = product
    g["peak_key"] = matmul.peak_key(product) if product else None
    g["peak_tflops"] = matmul.peak_tflops(product, g["dtype"]) if product and g.get("dtype") else None
    g["hbm_key"] = matmul.hbm_key(product) if product else None
    hbm = matmul.peak_hbm_tbps(product) if product else None
    g["peak_hbm_gbps"] = hbm * 1e3 if hbm else None
    for key, peak, ratio in (("matmul_tflops", "peak_tflops", "matmul_ratio_to_peak"),
                             ("d2d_copy_gbps", "peak_hbm_gbps", "copy_ratio_to_peak")):
        g[ratio] = g[key] / g[peak] if g.get(key) and g.get(peak) else None


def label(g: dict) -> str:
    if g.get("index") is None:
        return "host CPU"
    return f"GPU {g['index']}" + (f" ({g['uuid']})" if g.get("uuid") else "")


def build_parser():
    p = common.parser(
        "census.py",
        "Per-GPU census: a short matmul (TFLOPS) and a device-to-device copy (GB/s) on every GPU NVML lists, "
        "and an intra-node all-reduce (busbw) across the GPUs when there are 2 or more; seconds per GPU.",
        epilog="examples:\n"
               "  python census.py                                    # every GPU: bf16 8192^3, 256 MiB copy\n"
               "  python census.py --matmul-size 4096 --iters 10       # shorter\n"
               "  python census.py --device cpu                       # the CPU, once per NVML GPU (mock NVML)\n"
               "  python census.py --device cpu --matmul-size 64 --copy-mib 1 --iters 3 --threads 1\n"
               "  python census.py --device cpu --product 'NVIDIA H100 80GB HBM3'   # datasheet figures on the CPU\n",
    )
    common.add_device_arg(p)
    p.add_argument("--matmul-size", type=int, default=None, help="N of the N x N x N matmul (default 8192; CPU 256)")
    p.add_argument("--copy-mib", type=int, default=None, help="MiB per copy buffer (default 256; CPU 16)")
    p.add_argument("--allreduce-mib", type=int, default=None,
                   help="MiB per GPU of the all-reduce (default 256; CPU 4)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per measurement (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("--min-s", type=float, default=None,
                   help="each measurement repeats its --iters loop until this many seconds have passed "
                        "(default 1 on a GPU, 0.3 on the CPU): longer than a CFS period and a GPU's boost")
    p.add_argument("--product", default=None,
                   help="product to take datasheet figures from (default: each GPU's NVML name on a GPU; none on "
                        "the CPU)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("matmul_size", "copy_mib", "allreduce_mib"):
        if getattr(args, flag) is not None and getattr(args, flag) < 1:
            return common.fail_usage(f"--{flag.replace('_', '-')} must be >= 1 (got {getattr(args, flag)})")
    if args.iters < 1 or args.warmup < 0:
        return common.fail_usage(f"--iters must be >= 1 and --warmup >= 0 (got {args.iters}, {args.warmup})")
    if args.min_s is not None and not 0 <= args.min_s <= 600:
        return common.fail_usage(f"--min-s must be 0 to 600 seconds (got {args.min_s:g})")
    import torch  # after the argument checks

    t_start = time.monotonic()
    device = common.setup_device(args)
    sizes = {k: getattr(args, k) or (GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS)[k] for k in GPU_DEFAULTS}
    min_s = args.min_s if args.min_s is not None else 1.0 if device == "cuda" else 0.3
    result = common.base_result("census")
    result.update(device=device, torch=torch.__version__, product=args.product,
                  params={"matmul_size": sizes["matmul_size"], "copy_bytes": sizes["copy_mib"] * 2**20,
                          "allreduce_bytes": sizes["allreduce_mib"] * 2**20, "iters": args.iters,
                          "warmup": args.warmup, "min_s": min_s, "threads": torch.get_num_threads()})
    gpus, nvml_reason = list_gpus(device, torch)
    failed: list[str] = []
    for g in gpus:
        d = g.get("device")
        g.update(dtype=None, matmul_tflops=None, d2d_copy_gbps=None, error=None)
        if d is not None:
            try:
                g.update(measure_matmul(d, sizes["matmul_size"], args.iters, args.warmup, min_s))
                g.update(measure_copy(d, sizes["copy_mib"] * 2**20, args.iters, args.warmup, min_s))
            except (RuntimeError, MemoryError) as exc:       # a sick GPU: a failed GPU, not a crash
                g["error"] = _first_line(exc)
            if g["error"] or g.get("copy_check_ok") is False:
                failed.append(f"{label(g)}: " + (g["error"] or "the copy differs from its source"))
        datasheet(g, args.product or (g.get("name") if device == "cuda" else None))
        common.log(f"{label(g)} on {d}: " + (
            f"{g['dtype']} matmul {g['matmul_tflops']:.4g} TFLOPS, copy {g['d2d_copy_gbps']:.4g} GB/s"
            if g.get("d2d_copy_gbps") else g.get("error") or g.get("reason") or "not measured"))

    devices = [g["device"] for g in gpus if g.get("device") and g.get("index") is not None and not g["error"]]
    ar = {"device": "cuda" if device == "cuda" else "cpu", "gpus": len(devices), "busbw_gbps": None,
          "iters": args.iters, "error": None, "reason": None}
    if len(devices) < 2:
        ar["reason"] = (f"{len(devices)} GPU measured: no intra-node all-reduce" if gpus[0].get("index") is not None
                        else f"no NVML GPU ({nvml_reason}): no intra-node all-reduce")
    else:
        nccl_file = None
        if device == "cuda":            # what NCCL used within the node: its own lines, read back (nccl_capture.py)
            os.environ.setdefault("NCCL_DEBUG", "INFO")
            os.environ.setdefault("NCCL_DEBUG_SUBSYS", "INIT,P2P,SHM,NVLS")
            nccl_file = nccl_capture.prepare(0, device)
        try:
            ar.update(measure_allreduce(devices, sizes["allreduce_mib"] * 2**20, args.iters, args.warmup, min_s))
            if device == "cuda":
                ar["nccl"] = nccl_capture.local(nccl_file, device, 0)
                ar["transport"] = ",".join(ar["nccl"].get("intra") or []) or None
        except (RuntimeError, MemoryError) as exc:
            ar["error"] = _first_line(exc)
        if ar["error"] or ar.get("check_ok") is False:
            failed.append("all-reduce: " + (ar["error"] or "a tensor does not hold the sum"))
        if ar.get("busbw_gbps"):
            common.log(f"all-reduce over {len(devices)} ({ar['device']}): busbw {ar['busbw_gbps']:.4g} GB/s")
    result["gpus"] = gpus
    result["allreduce"] = ar
    result["nvml"] = {"available": nvml_reason is None, "reason": nvml_reason,
                      "gpus": sum(g.get("index") is not None for g in gpus)}
    result["utilization"] = {"available": False, "phases": {},
                             "reason": "the census does not sample NVML (seconds per GPU)"}
    result["failed"] = failed
    result["ok"] = not failed
    result["elapsed_s"] = round(time.monotonic() - t_start, 3)
    for f in failed:
        common.log(f"FAIL {f}")
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

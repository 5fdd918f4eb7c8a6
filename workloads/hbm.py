"""Memory bandwidth: HBM on a GPU, host memory on the CPU.

Two kernels over large buffers, each timed per iteration after a warm-up, median reported:

- ``copy``: ``dst.copy_(src)``, device to device; bytes = read S + written S = 2 S;
- ``read``: ``src.sum()``, a read-only reduction; bytes = read S + written one element.

GB/s = bytes / t_median / 1e9. Buffers should be much larger than the last-level cache
(H100: 50 MB of L2; default 1 GiB per buffer on a GPU, 256 MiB on the CPU). On a GPU the
figure is compared with the datasheet bandwidth of the product (gpuproof's product catalog,
``peaks.hbmTBps``: datasheet.py, by the name torch/NVML reports; ``--product`` overrides the name), and
the SM clock and clock-event reasons NVML saw during each kernel are reported as for
matmul. On the CPU the figure is the host's memory bandwidth (one process, ``--threads``
threads) and there is no datasheet ratio unless ``--product`` names one.

Prints one JSON object on stdout. Exit 0 when the copy check passed.
"""

from __future__ import annotations

import sys

import matmul
import nvml_sampler
import workload_common as common

KERNELS = ("copy", "read")
ELEM = 4  # float32


def bytes_moved(kernel: str, nbytes: int, elem: int = ELEM) -> int:
    """Bytes one call of ``kernel`` reads plus writes for a buffer of ``nbytes``."""
    if kernel == "copy":
        return 2 * nbytes            # read src, write dst
    if kernel == "read":
        return nbytes + elem         # read src, write the one-element sum
    raise ValueError(f"unknown kernel {kernel!r} (choose from {', '.join(KERNELS)})")


def gbps(nbytes: float, seconds: float) -> float:
    """Bytes per second in GB/s (1e9)."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    return nbytes / seconds / 1e9


def ratio_to_peak(gbps_value: float | None, product: str | None) -> tuple[float | None, float | None]:
    """(datasheet GB/s, measured / datasheet) for ``product``; (None, None) when unknown."""
    peak = matmul.peak_hbm_tbps(product) if product else None
    if not peak or gbps_value is None:
        return (peak * 1e3 if peak else None), None
    return peak * 1e3, gbps_value / (peak * 1e3)


def phase_name(kernel: str, nbytes: int) -> str:
    return f"hbm:{kernel}:{nbytes}"


def bench_kernel(kernel: str, nbytes: int, device: str, args, sampler) -> dict:
    import torch

    count = nbytes // ELEM
    nbytes = count * ELEM
    src = torch.randn(count, device=device, dtype=torch.float32)
    if kernel == "copy":
        dst = torch.empty_like(src)

        def op(_i):
            dst.copy_(src)
    else:
        out = torch.empty((), device=device, dtype=torch.float32)

        def op(_i):
            torch.sum(src, dim=0, out=out)

    with sampler.phase(phase_name(kernel, nbytes)):
        common.time_total(op, args.warmup, device)
        times = common.time_iterations(op, args.iters, device)
    moved = bytes_moved(kernel, nbytes)
    t_med = common.median(times)
    row = {
        "kernel": kernel, "size_bytes": nbytes, "bytes_moved": moved, "iters": args.iters,
        "median_ms": t_med * 1e3, "min_ms": min(times) * 1e3, "p90_ms": common.percentile(times, 90) * 1e3,
        "gbps": gbps(moved, t_med), "gbps_best": gbps(moved, min(times)),
    }
    if kernel == "copy":
        row["check_ok"] = bool(torch.equal(dst, src))
    else:
        ref = float(src.double().sum())
        row["check_ok"] = abs(float(out) - ref) <= 1e-3 * max(1.0, float(src.double().abs().sum()))
    return row


def build_parser():
    p = common.parser(
        "hbm.py",
        "Memory bandwidth (GB/s) of a device-to-device copy and a read-only reduction, with the "
        "ratio to the product's datasheet HBM bandwidth.",
        epilog="examples:\n"
               "  python hbm.py                                   # GPU: 1 GiB buffers, copy and read\n"
               "  python hbm.py --device cpu --size 64M --iters 5  # host memory bandwidth\n"
               "  python hbm.py --device cpu --product 'NVIDIA H100 80GB HBM3'   # ratio against a named product\n",
    )
    common.add_device_arg(p)
    p.add_argument("--size", default=None, help="bytes per buffer (default 1G on a GPU, 256M on the CPU)")
    p.add_argument("--kernels", default="copy,read", help="comma list of copy,read (default both)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per kernel (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="warm-up iterations (default 3)")
    p.add_argument("--product", default=None,
                   help="product name to look the datasheet bandwidth up by (default: the device's name "
                        "on a GPU; none on the CPU)")
    nvml_sampler.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kernels = [k for k in args.kernels.replace(" ", "").split(",") if k]
    bad = [k for k in kernels if k not in KERNELS]
    if bad or not kernels:
        return common.fail_usage(f"unknown kernel(s) {bad}; choose from {', '.join(KERNELS)}")
    if args.iters < 1 or args.warmup < 0:
        return common.fail_usage("--iters must be >= 1, --warmup >= 0")
    try:
        size = common.parse_bytes(args.size) if args.size else None
    except ValueError as exc:
        return common.fail_usage(str(exc))
    if size is not None and size < ELEM:
        return common.fail_usage(f"--size must be at least {ELEM} bytes")
    import torch  # after the argument checks

    device = common.setup_device(args)
    size = size or common.parse_bytes("1G" if device == "cuda" else "256M")
    name = common.device_name(device)
    product = args.product or (name if device == "cuda" else None)
    result = common.base_result("hbm")
    result.update(device=device, device_name=name, torch=torch.__version__, cuda=torch.version.cuda,
                  memory="hbm" if device == "cuda" else "host", product=product,
                  peak_key=matmul.hbm_key(product) if product else None, results=[])
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        if 2 * size > 0.9 * free:
            return common.fail_usage(f"--size {common.human_bytes(size)} x 2 buffers does not fit in "
                                     f"{free / 2**30:.1f} GiB of free GPU memory")
    sampler = nvml_sampler.make_sampler(args.sample_hz, torch_device=device).start()
    try:
        for kernel in kernels:
            row = bench_kernel(kernel, size, device, args, sampler)
            row["peak_gbps"], row["ratio_to_peak"] = ratio_to_peak(row["gbps"], product)
            result["results"].append(row)
            ratio = f", {row['ratio_to_peak']:.0%} of {result['peak_key']}" if row["ratio_to_peak"] else ""
            common.log(f"{kernel} {common.human_bytes(row['size_bytes'])}: {row['gbps']:.1f} GB/s "
                       f"(median {row['median_ms']:.3f} ms{ratio})")
    finally:
        summary = nvml_sampler.finish(sampler, args)
    matmul.attach_clocks(result["results"], summary, lambda r: phase_name(r["kernel"], r["size_bytes"]))
    if not product:
        result["ratio_note"] = "no datasheet bandwidth for the host's memory: pass --product to compare with one"
    elif result["peak_key"] is None:
        result["ratio_note"] = f"no datasheet bandwidth known for {product!r}"
    if not summary.get("available"):
        result["clocks_note"] = f"no SM clocks or clock-event reasons: {summary.get('reason')}"
    result["utilization"] = summary
    result["ok"] = bool(result["results"]) and all(r["check_ok"] for r in result["results"])
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

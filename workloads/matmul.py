"""Dense matmul throughput (TFLOPS) per dtype and size, on a GPU or on the CPU.

For each dtype (fp32, tf32, bf16, fp16; fp8 on compute capability >= 8.9) and size:

1. allocate a few rotating buffer sets of normal random inputs (never zeros: zero
   operands run faster than real data), so consecutive iterations do not reuse the
   same operands from cache;
2. warm up (a number of iterations and, on a GPU, at least ``--warmup-s`` seconds so
   clocks settle);
3. time ``--iters`` iterations one by one (CUDA events on a GPU, perf_counter on the
   CPU) and report the median: TFLOPS = 2*M*N*K / t_median / 1e12;
4. check correctness once per dtype at ``--check-size`` against a float64 reference
   computed on the CPU from the same (already rounded) inputs;
5. on a GPU, compare with the datasheet dense peak of the product (gpuproof's product
   catalog, ``peaks``: datasheet.py) and
   report the SM clock and clock-event (throttle) reasons NVML saw during the run;
6. with NVML clocks, also the efficiency at the clock it ran (``ratio_to_peak_at_clock``):
   TFLOPS / (peak x mean SM clock / max SM clock). A GPU at its power cap shows a low
   ratio to peak but a high ratio at its clock; a slow kernel shows both low. Absent on
   the CPU and without NVML (``ratio_to_peak_at_clock_note`` says why).

Prints one JSON object on stdout. Exit 0 when every correctness check passed.

Long: the timed loop, the correctness check per dtype (fp8 included), the datasheet peaks and the clock-aware
efficiency are one measurement; apart they would only import each other.
"""

from __future__ import annotations

import sys

import datasheet
import nvml_sampler
import workload_common as common

DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

# Relative Frobenius-norm error allowed against the float64 reference at --check-size.
# Inputs are rounded to the dtype first, so this measures the product, not the inputs.
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3, "bf16": 1.5e-2, "fp16": 5e-3, "fp8": 2e-2}


def peak_key(name: str) -> str | None:
    """The name of a product's datasheet dense peak TFLOPS ('NVIDIA H100 80GB HBM3', 'NVIDIA-H100-80GB-HBM3' ->
    'H100 SXM'), from gpuproof's product catalog (datasheet.py); None for a product it has no figures for."""
    return datasheet.tflops_key(name)


def hbm_key(name: str) -> str | None:
    """The name of a product's datasheet memory bandwidth (catalog ``peaks.hbmTBps``), or None."""
    return datasheet.hbm_key(name)


def peak_hbm_tbps(name: str) -> float | None:
    """A product's datasheet memory bandwidth in TB/s (1e12 bytes/s), or None. Used by hbm.py and census.py."""
    return datasheet.peak_hbm_tbps(name)


def efficiency_at_clock(tflops_value: float | None, peak: float | None, sm_clock_mean: float | None,
                        sm_clock_max: float | None) -> float | None:
    """TFLOPS against the peak scaled to the clock the GPU ran at.

    efficiency = tflops / (peak * mean SM clock / max SM clock). None when any input is
    unknown (on the CPU, or without NVML clocks). A GPU held at its power cap at 1500 of
    1980 MHz that reaches 680 of 989 TFLOPS is at 0.69 of peak but 0.91 of its clock's peak.
    """
    if not tflops_value or not peak or not sm_clock_mean or not sm_clock_max:
        return None
    return tflops_value / (peak * sm_clock_mean / sm_clock_max)


def peak_tflops(name: str, dtype: str) -> float | None:
    """A product's datasheet dense peak TFLOPS (no sparsity) for a dtype; None: unknown, or no such mode."""
    return datasheet.peak_tflops(name, dtype)


def tflops(m: int, n: int, k: int, seconds: float) -> float:
    """Dense matmul rate: 2*M*N*K floating-point operations in ``seconds``, in TFLOPS."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    return 2.0 * m * n * k / seconds / 1e12


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'4096,8192x8192x1024' -> [(4096,4096,4096), (8192,8192,1024)] as (M, N, K)."""
    shapes = []
    for item in str(text).replace(" ", "").split(","):
        if not item:
            continue
        parts = [int(p) for p in item.lower().split("x")]
        if len(parts) == 1:
            parts *= 3
        if len(parts) != 3 or min(parts) <= 0:
            raise ValueError(f"bad size {item!r}: use N or MxNxK with positive integers")
        shapes.append(tuple(parts))
    if not shapes:
        raise ValueError("no sizes given")
    return shapes


# --------------------------------------------------------------------------- torch side


def dtype_support(dtype: str, device: str) -> str | None:
    """None when ``dtype`` can run on ``device``, else the reason it cannot."""
    import torch

    if dtype not in DTYPES:
        return f"unknown dtype {dtype!r} (choose from {', '.join(DTYPES)})"
    if device == "cpu":
        if dtype == "tf32":
            return "TF32 is a CUDA tensor-core mode; on the CPU it would be plain fp32"
        if dtype == "fp8":
            return "fp8 matmul (torch._scaled_mm) needs a GPU with compute capability >= 8.9"
        return None
    cc = torch.cuda.get_device_capability()
    if dtype in ("tf32", "bf16") and cc < (8, 0):
        return f"{dtype} needs compute capability >= 8.0 (this GPU: {cc[0]}.{cc[1]})"
    if dtype == "fp8":
        if cc < (8, 9):
            return f"fp8 needs compute capability >= 8.9 (this GPU: {cc[0]}.{cc[1]})"
        if not (hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn")):
            return f"torch {torch.__version__} has no torch._scaled_mm / float8_e4m3fn"
    return None


class _Operands:
    """Rotating sets of (A, B, C) for one dtype and shape; ``run(i)`` computes set i."""

    def __init__(self, dtype: str, m: int, n: int, k: int, device: str, nbuf: int, seed: int):
        import torch

        self.torch = torch
        self.dtype = dtype
        g = torch.Generator(device=device).manual_seed(seed)
        tdt = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
               "fp16": torch.float16, "fp8": torch.bfloat16}[dtype]
        self.sets = []
        for _ in range(nbuf):
            a = torch.randn(m, k, device=device, generator=g, dtype=torch.float32)
            b = torch.randn(k, n, device=device, generator=g, dtype=torch.float32)
            if dtype == "fp8":
                # _scaled_mm wants A row-major and B column-major, both float8_e4m3fn.
                a = a.to(torch.float8_e4m3fn)
                b = b.t().contiguous().to(torch.float8_e4m3fn).t()
            else:
                a, b = a.to(tdt), b.to(tdt)
            c = torch.empty(m, n, device=device, dtype=tdt)
            self.sets.append((a, b, c))
        if dtype == "fp8":
            self.scale = torch.ones((), device=device, dtype=torch.float32)

    def run(self, i: int):
        a, b, c = self.sets[i % len(self.sets)]
        if self.dtype == "fp8":
            out = self.torch._scaled_mm(a, b, scale_a=self.scale, scale_b=self.scale,
                                        out_dtype=self.torch.bfloat16)
            return out[0] if isinstance(out, tuple) else out  # torch < 2.5 returned (out, amax)
        return self.torch.matmul(a, b, out=c)

    def reference(self):
        """float64 product of set 0's inputs as the kernel saw them, on the CPU."""
        a, b, _ = self.sets[0]
        return a.cpu().double() @ b.cpu().double()


class tf32_mode:
    """Context manager: TF32 tensor-core matmuls on (tf32) or off (everything else)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        import torch

        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.enabled
        return self

    def __exit__(self, *exc):
        import torch

        torch.backends.cuda.matmul.allow_tf32 = self.saved


def buffer_sets(m: int, n: int, k: int, dtype: str, device: str, wanted: int) -> int:
    """How many rotating buffer sets fit a memory budget (at least 1)."""
    import torch

    elem = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[dtype]
    per_set = (m * k + k * n) * elem + m * n * (2 if dtype == "fp8" else elem)
    if device == "cuda":
        free, _total = torch.cuda.mem_get_info()
        budget = min(4 * 2**30, int(0.4 * free))
    else:
        budget = 512 * 2**20
    return max(1, min(wanted, budget // max(per_set, 1)))


def check_correctness(dtype: str, size: int, device: str, seed: int) -> dict:
    import torch

    if dtype == "fp8":
        size = max(16, (size + 15) // 16 * 16)  # _scaled_mm needs multiples of 16
    ops = _Operands(dtype, size, size, size, device, nbuf=1, seed=seed + 1)
    with tf32_mode(dtype == "tf32"):
        out = ops.run(0)
    common.sync(device)
    ref = ops.reference()
    rel = float(torch.linalg.norm(out.cpu().double() - ref) / torch.linalg.norm(ref))
    tol = TOLERANCE[dtype]
    return {"dtype": dtype, "size": size, "rel_err": rel, "tolerance": tol, "ok": rel <= tol}


def bench_one(dtype: str, m: int, n: int, k: int, device: str, args, sampler) -> dict:
    import time

    nbuf = buffer_sets(m, n, k, dtype, device, args.buffers)
    ops = _Operands(dtype, m, n, k, device, nbuf=nbuf, seed=args.seed)
    phase = f"matmul:{dtype}:{m}x{n}x{k}"
    with tf32_mode(dtype == "tf32"), sampler.phase(phase):
        common.time_total(ops.run, args.warmup, device)
        if device == "cuda" and args.warmup_s > 0:
            deadline = time.monotonic() + args.warmup_s
            while time.monotonic() < deadline:  # bounded by time; each batch is synchronized
                common.time_total(ops.run, max(1, args.warmup), device)
        times = common.time_iterations(ops.run, args.iters, device)
    t_med = common.median(times)
    row = {
        "dtype": dtype, "m": m, "n": n, "k": k,
        "iters": args.iters, "buffers": nbuf,
        "median_ms": t_med * 1e3,
        "mean_ms": common.mean(times) * 1e3,
        "min_ms": min(times) * 1e3,
        "p90_ms": common.percentile(times, 90) * 1e3,
        "tflops": tflops(m, n, k, t_med),
        "tflops_best": tflops(m, n, k, min(times)),
    }
    peak = peak_tflops(common.device_name(device), dtype) if device == "cuda" else None
    row["peak_tflops"] = peak
    row["ratio_to_peak"] = row["tflops"] / peak if peak else None
    return row


def max_sm_clock(summary: dict) -> float | None:
    """The first sampled GPU's maximum SM clock (MHz) from a sampler summary, if known."""
    for d in summary.get("devices") or []:
        if d.get("max_sm_clock_mhz"):
            return float(d["max_sm_clock_mhz"])
    return None


def attach_clocks(rows: list[dict], summary: dict, phase_of) -> None:
    """Copy SM clock, clock-event reasons and power seen in each row's phase onto the row.

    ``phase_of(row)`` names the sampler phase of a row. Used by matmul and hbm.
    """
    phases = summary.get("phases", {})
    max_clock = max_sm_clock(summary)
    for row in rows:
        gpus = phases.get(phase_of(row), {}).get("gpus", {})
        stats = next(iter(gpus.values()), None)
        clock = (stats or {}).get("sm_clock_mhz") or {}
        row["sm_clock_mhz_mean"] = clock.get("mean")
        row["sm_clock_mhz_max"] = max_clock
        row["clock_event_reasons"] = (stats or {}).get("clock_event_reasons")
        row["throttled_fraction"] = (stats or {}).get("throttled_fraction")
        power = (stats or {}).get("power_w") or {}
        row["power_w_mean"] = power.get("mean")


def _attach_clocks(rows: list[dict], summary: dict) -> None:
    attach_clocks(rows, summary, lambda r: f"matmul:{r['dtype']}:{r['m']}x{r['n']}x{r['k']}")
    for row in rows:
        row["ratio_to_peak_at_clock"] = efficiency_at_clock(row["tflops"], row.get("peak_tflops"),
                                                         row.get("sm_clock_mhz_mean"), row.get("sm_clock_mhz_max"))
        if row["ratio_to_peak_at_clock"] is None:
            row["ratio_to_peak_at_clock_note"] = (
                "no datasheet peak for this device" if not row.get("peak_tflops") else
                "SM clocks unknown: " + (summary.get("reason") or "the sampler saw no clock in this phase"))


def build_parser():
    p = common.parser(
        "matmul.py",
        "Dense matmul TFLOPS per dtype and size with correctness check and datasheet ratio.",
        epilog="examples:\n"
               "  python matmul.py                         # all dtypes this device supports, default size\n"
               "  python matmul.py --dtypes bf16,fp8 --sizes 4096,8192\n"
               "  python matmul.py --device cpu --sizes 256 --iters 10\n",
    )
    common.add_device_arg(p)
    p.add_argument("--dtypes", default="auto",
                   help="comma list of fp32,tf32,bf16,fp16,fp8 (default auto: all the device "
                        "supports; on the CPU fp32,bf16)")
    p.add_argument("--sizes", default=None,
                   help="comma list of N (square) or MxNxK (default 8192 on a GPU, 512 on the CPU)")
    p.add_argument("--iters", type=int, default=50, help="timed iterations per size (default 50)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up iterations (default 5)")
    p.add_argument("--warmup-s", type=float, default=1.0,
                   help="on a GPU, keep warming up at least this many seconds (default 1)")
    p.add_argument("--buffers", type=int, default=4,
                   help="rotating input buffer sets, fewer if memory is short (default 4)")
    p.add_argument("--check-size", type=int, default=256,
                   help="size of the float64 correctness check (default 256; 0 skips it)")
    p.add_argument("--seed", type=int, default=1234)
    nvml_sampler.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.buffers < 1:
        return common.fail_usage("--iters and --buffers must be >= 1, --warmup >= 0")
    wanted = None if args.dtypes == "auto" else [d for d in args.dtypes.replace(" ", "").split(",") if d]
    bad = [d for d in wanted or [] if d not in DTYPES]
    if bad:
        return common.fail_usage(f"unknown dtype(s) {bad}; choose from {', '.join(DTYPES)}")
    try:
        shapes = parse_shapes(args.sizes) if args.sizes else None
    except ValueError as exc:
        return common.fail_usage(str(exc))
    import torch  # after the argument checks: importing torch takes seconds

    device = common.setup_device(args)
    shapes = shapes or parse_shapes("8192" if device == "cuda" else "512")
    if wanted is None:
        wanted = ["fp32", "bf16"] if device == "cpu" else [d for d in DTYPES if dtype_support(d, device) is None]

    result = common.base_result("matmul")
    name = common.device_name(device)
    result.update(device=device, device_name=name, torch=torch.__version__, cuda=torch.version.cuda,
                  peak_key=peak_key(name) if device == "cuda" else None,
                  results=[], checks=[], skipped=[])
    if device == "cuda":
        result["compute_capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    sampler = nvml_sampler.make_sampler(args.sample_hz, torch_device=device).start()
    try:
        for dtype in wanted:
            reason = dtype_support(dtype, device)
            if reason:
                common.log(f"skip {dtype}: {reason}")
                result["skipped"].append({"dtype": dtype, "reason": reason})
                continue
            if args.check_size > 0:
                chk = check_correctness(dtype, args.check_size, device, args.seed)
                result["checks"].append(chk)
                common.log(f"check {dtype} @ {args.check_size}: rel_err={chk['rel_err']:.2e} "
                           f"(tol {chk['tolerance']:.0e}) {'ok' if chk['ok'] else 'FAILED'}")
            for m, n, k in shapes:
                if dtype == "fp8" and (m % 16 or n % 16 or k % 16):
                    result["skipped"].append({"dtype": dtype, "size": f"{m}x{n}x{k}",
                                              "reason": "fp8 needs M, N, K multiples of 16"})
                    continue
                row = bench_one(dtype, m, n, k, device, args, sampler)
                result["results"].append(row)
                ratio = f", {row['ratio_to_peak']:.0%} of peak" if row["ratio_to_peak"] else ""
                common.log(f"{dtype} {m}x{n}x{k}: {row['tflops']:.2f} TFLOPS "
                           f"(median {row['median_ms']:.3f} ms{ratio})")
    finally:
        summary = nvml_sampler.finish(sampler, args)
    _attach_clocks(result["results"], summary)
    for row in result["results"]:
        if row["ratio_to_peak_at_clock"] is not None:
            common.log(f"{row['dtype']} {row['m']}x{row['n']}x{row['k']}: {row['ratio_to_peak_at_clock']:.0%} of peak "
                       f"at its mean SM clock {row['sm_clock_mhz_mean']:.0f} of {row['sm_clock_mhz_max']:.0f} MHz")
    result["utilization"] = summary
    result["ok"] = all(c["ok"] for c in result["checks"]) and bool(result["results"])
    common.emit(result)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

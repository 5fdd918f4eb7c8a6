"""Figure: gpuproof's matmul TFLOPS against a bare torch.matmul loop, same device, size, dtype.

For each (dtype, size) it alternates, ``--trials`` times, between

- ours: ``workloads/matmul.py``'s own measurement (``bench_one``: rotating buffers,
  warm-up, per-iteration CUDA-event / perf_counter timing, median), and
- bare: ``c = a @ b`` in a plain loop over one pair of operands, the whole loop timed
  once (CUDA events around it on a GPU, perf_counter on the CPU), mean per iteration,

and reports the median over trials of each and their ratio (target >= 0.97). Both use
the same iteration count. Prints a Markdown table and writes JSON with ``--json``.

    python benchmarks/matmul_vs_torch.py --device cuda --dtypes bf16,fp16,tf32,fp32 --sizes 4096,8192
    python benchmarks/matmul_vs_torch.py --device cpu --dtypes fp32 --sizes 256,512,1024 --threads 1
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "workloads"))

import matmul  # noqa: E402  (workloads/matmul.py)
import workload_common as common  # noqa: E402
from nvml_sampler import NullSampler  # noqa: E402


def bare_tflops(dtype: str, n: int, device: str, iters: int, warmup: int) -> float:
    import torch

    ops = matmul._Operands(dtype, n, n, n, device, nbuf=1, seed=7)
    a, b, _ = ops.sets[0]
    if dtype == "fp8":
        def step(_i):
            return ops.run(0)
    else:
        def step(_i):
            return a @ b  # the plain loop a user would write
    with matmul.tf32_mode(dtype == "tf32"), torch.inference_mode():
        common.time_total(step, warmup, device)
        seconds = common.time_total(step, iters, device)
    return matmul.tflops(n, n, n, seconds / iters)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtypes", default="fp32")
    p.add_argument("--sizes", default="256,512,1024")
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--trials", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = p.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    wargs = argparse.Namespace(iters=args.iters, warmup=args.warmup, warmup_s=0.5 if args.device == "cuda" else 0,
                               buffers=4, seed=1234)
    rows = []
    for dtype in args.dtypes.split(","):
        why = matmul.dtype_support(dtype, args.device)
        if why:
            print(f"skip {dtype}: {why}", file=sys.stderr)
            continue
        for n in matmul.parse_shapes(args.sizes):
            n = n[0]
            ours, ours_mean, bare = [], [], []
            for _ in range(args.trials):  # alternate so drift (clocks, other load) hits both alike
                row = matmul.bench_one(dtype, n, n, n, args.device, wargs, NullSampler())
                ours.append(row["tflops"])
                ours_mean.append(matmul.tflops(n, n, n, row["mean_ms"] / 1e3))
                bare.append(bare_tflops(dtype, n, args.device, args.iters, args.warmup))
            o, om, b = statistics.median(ours), statistics.median(ours_mean), statistics.median(bare)
            rows.append({"dtype": dtype, "n": n, "ours_tflops": o, "ours_mean_tflops": om, "bare_tflops": b,
                         "ratio": o / b, "ratio_mean": om / b, "ours_trials": ours, "bare_trials": bare})
            print(f"{dtype} {n}: ours {o:.4g} (mean-based {om:.4g}) bare {b:.4g} ratio {o / b:.3f}",
                  file=sys.stderr)
    dev = common.device_name(args.device)
    print(f"\ndevice: {args.device} ({dev}), torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"{platform.platform()}\n")
    print("| dtype | N | gpuproof TFLOPS (median iter) | gpuproof TFLOPS (mean iter) | bare loop TFLOPS | "
          "ratio (median) | ratio (mean) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['dtype']} | {r['n']} | {r['ours_tflops']:.4g} | {r['ours_mean_tflops']:.4g} | "
              f"{r['bare_tflops']:.4g} | {r['ratio']:.3f} | {r['ratio_mean']:.3f} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": args.device, "device_name": dev, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

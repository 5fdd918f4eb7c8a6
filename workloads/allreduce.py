"""All-reduce bandwidth sweep with torch.distributed (NCCL on GPUs, gloo on the CPU).

Reports, per message size, the columns nccl-tests prints for all_reduce (in-place):
size, count, type, redop, time (us), algbw and busbw (GB/s) and #wrong, plus the
"Avg bus bandwidth" (arithmetic mean of busbw over all sizes).

- algbw = S / t, with S one rank's buffer in bytes and t the mean time of one
  all-reduce (averaged over the ranks, like nccl-tests), in GB/s (1e9 bytes);
- busbw = algbw * 2(n-1)/n for all-reduce (0 for a single rank: nothing crosses a bus);
- #wrong: after the timed loop each rank fills its buffer with (i + rank) mod 3, runs one
  more all-reduce and counts elements that differ from the known sum.

How it is launched (the same file in every case):

- ``python allreduce.py``                        one process, world size 1;
- ``python allreduce.py --nproc 2``              N local processes (file store, loopback);
- ``torchrun --nproc-per-node 8 allreduce.py``   one pod with several GPUs;
- ``torchrun --nnodes N --node-rank $I --master-addr <job>-0.<svc> ... allreduce.py``
  several nodes (an indexed Job with a headless Service, see gpuproof/workloads.py).

Only global rank 0 prints the JSON result.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time

import nvml_sampler
import workload_common as common

DEFAULT_MIN = "8"
DEFAULT_MAX = "1G"

# nccl-tests bus bandwidth factors (src/*.cu, "getBw"): busbw = algbw * factor(n)
BUSBW_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
}

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def algbw_gbps(size_bytes: float, seconds: float) -> float:
    """nccl-tests algorithm bandwidth: bytes / seconds, in GB/s (1e9)."""
    if seconds <= 0:
        raise ValueError("seconds must be > 0")
    return size_bytes / seconds / 1e9


def busbw_gbps(size_bytes: float, seconds: float, nranks: int, collective: str = "all_reduce") -> float:
    """nccl-tests bus bandwidth: algbw times the collective's factor for ``nranks``."""
    if nranks < 1:
        raise ValueError("nranks must be >= 1")
    return algbw_gbps(size_bytes, seconds) * BUSBW_FACTORS[collective](nranks)


def expected_sum_table(nranks: int) -> list[int]:
    """sum over ranks r < n of (b + r) mod 3, for b = 0, 1, 2 (the #wrong check's pattern)."""
    return [sum((b + r) % 3 for r in range(nranks)) for b in range(3)]


def _sizes(args) -> list[int]:
    if args.sizes:
        return [common.parse_bytes(s) for s in args.sizes.split(",") if s.strip()]
    return common.geometric_sizes(common.parse_bytes(args.min_bytes), common.parse_bytes(args.max_bytes),
                                  args.step_factor)


# --------------------------------------------------------------------------- worker


def _init(device: str):
    """Join the process group; returns (rank, world, local_rank)."""
    import torch
    import torch.distributed as dist

    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    backend = "nccl" if device == "cuda" else "gloo"
    kwargs = {}
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        kwargs["device_id"] = torch.device("cuda", local_rank)
    timeout = datetime.timedelta(seconds=float(env.get("GPUPROOF_PG_TIMEOUT", "600")))
    store_file = env.get("GPUPROOF_STORE_FILE")
    if "MASTER_ADDR" in env and not store_file:  # torchrun / a Job: env:// rendezvous
        init = {"init_method": "env://"}
    else:  # local: a file store, no listening socket for rendezvous
        if not store_file:
            store_file = os.path.join(tempfile.mkdtemp(prefix="gpuproof-ar-"), "store")
        # gloo / NCCL bootstrap sockets on loopback only, unless the user said otherwise
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        init = {"store": dist.FileStore(store_file, world)}
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **init, **kwargs)
    except TypeError:  # torch without device_id
        kwargs.pop("device_id", None)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **init)
    return rank, world, local_rank


def _one_size(size: int, args, device: str, world: int, rank: int) -> dict | None:
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, args.dtype)
    elem = DTYPES[args.dtype]
    count = size // elem
    if count == 0:
        return None
    nbytes = count * elem
    buf = torch.randn(count, device=device, dtype=torch.float32).to(dtype)

    def op(_i):
        dist.all_reduce(buf)

    common.time_total(op, args.warmup, device)
    dist.barrier()
    seconds = common.time_total(op, args.iters, device) / args.iters
    # nccl-tests averages the time over ranks
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    seconds = float(t.item()) / world
    row = {
        "size_bytes": nbytes, "count": count, "type": args.dtype, "redop": "sum",
        "time_us": seconds * 1e6,
        "algbw_gbps": algbw_gbps(nbytes, seconds),
        "busbw_gbps": busbw_gbps(nbytes, seconds, world),
        "wrong": None,
    }
    if args.check:
        row["wrong"] = _count_wrong(buf, count, rank, world, args.dtype, device)
    return row


CHECK_CHUNK = 1 << 24  # elements per step of the #wrong check: bounded extra memory for 1 GiB buffers


def _count_wrong(buf, count: int, rank: int, world: int, dtype: str, device: str) -> int:
    """Fill with (i + rank) mod 3, all-reduce once, count elements off the known sum (all ranks)."""
    import torch
    import torch.distributed as dist

    for lo in range(0, count, CHECK_CHUNK):
        hi = min(count, lo + CHECK_CHUNK)
        buf[lo:hi].copy_((torch.arange(lo, hi, device=device, dtype=torch.int64) + rank) % 3)
    dist.all_reduce(buf)
    table = torch.tensor(expected_sum_table(world), device=device, dtype=torch.float64)
    tol = {"float16": 2.0**-10, "bfloat16": 2.0**-7}.get(dtype, 0.0)
    wrong = 0
    for lo in range(0, count, CHECK_CHUNK):
        hi = min(count, lo + CHECK_CHUNK)
        want = table[torch.arange(lo, hi, device=device, dtype=torch.int64) % 3]
        diff = (buf[lo:hi].double() - want).abs()
        wrong += int((diff > tol * want.abs().clamp(min=1.0)).sum())
    t = torch.tensor([wrong], dtype=torch.int64, device=device)
    dist.all_reduce(t)
    return int(t.item())


def _nccl_version() -> str | None:
    import torch

    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older torch: e.g. 2708 / 21903
        major, rest = divmod(v, 10000) if v >= 10000 else divmod(v, 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    return ".".join(map(str, v))


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    device = common.setup_device(args)
    sizes = _sizes(args)
    rank, world, local_rank = _init(device)

    sampler = (nvml_sampler.make_sampler(args.sample_hz) if local_rank == 0
               else nvml_sampler.NullSampler("sampled by local rank 0")).start()
    rows = []
    try:
        for size in sizes:
            with sampler.phase(f"allreduce:{size}"):
                row = _one_size(size, args, device, world, rank)
            if row is None:
                continue
            rows.append(row)
            if rank == 0:
                common.log(f"{common.human_bytes(row['size_bytes']):>8} {row['time_us']:10.1f} us "
                           f"algbw {row['algbw_gbps']:8.3f} busbw {row['busbw_gbps']:8.3f} GB/s "
                           f"#wrong {row['wrong']}")
    finally:
        summary = nvml_sampler.finish(sampler, args)
        dist.destroy_process_group()
    if rank != 0:
        return 0
    result = common.base_result("allreduce")
    result.update(
        device=device,
        device_name=common.device_name(device),
        backend="nccl" if device == "cuda" else "gloo",
        torch=torch.__version__,
        nccl=_nccl_version() if device == "cuda" else None,
        world_size=world,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        nnodes=max(1, world // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))),
        iters=args.iters, warmup=args.warmup,
        results=rows,
        avg_busbw_gbps=common.mean(r["busbw_gbps"] for r in rows),
        max_busbw_gbps=max((r["busbw_gbps"] for r in rows), default=None),
        wrong_total=sum(r["wrong"] or 0 for r in rows) if args.check else None,
        utilization=summary,
    )
    if world == 1:
        result["note"] = "world size 1: busbw is 0 by definition (2(n-1)/n), algbw is a local copy rate"
    result["ok"] = bool(rows) and (not args.check or result["wrong_total"] == 0)
    common.log(f"# Avg bus bandwidth: {result['avg_busbw_gbps']}")
    common.emit(result)
    return 0 if result["ok"] else 1


# --------------------------------------------------------------------------- launcher


def launch_local(args, argv: list[str]) -> int:
    """Start ``--nproc`` copies of this script as ranks of one job on this host."""
    n = args.nproc
    tmp = tempfile.mkdtemp(prefix="gpuproof-ar-")
    env_base = dict(os.environ)
    env_base.update(WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(n),
                    GPUPROOF_STORE_FILE=os.path.join(tmp, "store"))
    env_base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env_base.setdefault("NCCL_SOCKET_IFNAME", "lo")
    out_path = os.path.join(tmp, "rank0.out")
    procs = []
    with open(out_path, "wb") as out0:
        for r in range(n):
            env = dict(env_base, RANK=str(r), LOCAL_RANK=str(r))
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env,
                                          stdout=out0 if r == 0 else subprocess.DEVNULL))
        deadline = time.monotonic() + args.timeout
        failed = None
        while True:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0, 1)), None)
            if failed is not None or all(c is not None for c in codes):
                break
            if time.monotonic() > deadline:
                failed = "timeout"
                break
            time.sleep(0.05)  # polling child processes, bounded by the deadline above
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if failed is not None:
        why = (f"ranks did not finish within --timeout {args.timeout:.0f}s" if failed == "timeout"
               else f"rank {failed} exited with status {procs[failed].returncode}")
        common.log(f"error: {why}")
        common.emit({"workload": "allreduce", "ok": False, "error": why, "world_size": n})
        return 1
    with open(out_path, encoding="utf-8") as fh:
        lines = [line for line in fh.read().splitlines() if line.strip()]
    if not lines:
        common.emit({"workload": "allreduce", "ok": False, "error": "rank 0 printed no result", "world_size": n})
        return 1
    print(lines[-1], flush=True)
    return procs[0].returncode


def build_parser():
    p = common.parser(
        "allreduce.py",
        "All-reduce size sweep with nccl-tests' algbw, busbw and #wrong (NCCL on GPUs, gloo on the CPU).",
        epilog="examples:\n"
               "  python allreduce.py --device cpu --max-bytes 64K\n"
               "  python allreduce.py --nproc 2 --device cpu --sizes 8,1K,4K\n"
               "  torchrun --nproc-per-node 8 allreduce.py --min-bytes 8 --max-bytes 1G\n",
    )
    common.add_device_arg(p)
    p.add_argument("--min-bytes", "-b", default=DEFAULT_MIN, help="smallest message (default 8)")
    p.add_argument("--max-bytes", "-e", default=DEFAULT_MAX, help="largest message (default 1G = 1 GiB)")
    p.add_argument("--step-factor", "-f", type=int, default=2, help="size multiplier (default 2)")
    p.add_argument("--sizes", default=None, help="explicit comma list of sizes instead, e.g. 8,1K,1M")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="element type (default float32)")
    p.add_argument("--iters", "-n", type=int, default=20, help="timed all-reduces per size (default 20)")
    p.add_argument("--warmup", "-w", type=int, default=5, help="warm-up all-reduces per size (default 5)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the #wrong check")
    p.add_argument("--nproc", type=int, default=1,
                   help="start this many local ranks (default 1; ignored under torchrun)")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="with --nproc: seconds before the ranks are stopped (default 1800)")
    nvml_sampler.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.nproc < 1:
        return common.fail_usage("--iters and --nproc must be >= 1, --warmup >= 0")
    try:
        _sizes(args)
    except ValueError as exc:
        return common.fail_usage(str(exc))
    if "RANK" not in os.environ and args.nproc > 1:
        return launch_local(args, argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())

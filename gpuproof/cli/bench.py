"""``gpuproof bench --local <benchmark>``: run benchmarks on this host and write a run folder."""

from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import GpuproofError

def _choices() -> tuple[str, ...]:
    """Every registered benchmark, and 'all' (the registry is the one list of them)."""
    from ..bench import names

    return (*names(), "all")


def _benchmarks(text: str) -> list[str]:
    """The benchmarks a comma list names, in its order ('all': every one), or argparse's one-line error."""
    from ..bench import names

    wanted = [w.strip() for w in text.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in _choices()]
    if unknown or not wanted:
        raise argparse.ArgumentTypeError(f"no benchmark {', '.join(map(repr, unknown)) or repr(text)}; "
                                         f"choose from {', '.join(_choices())}, or a comma list of them")
    if "all" in wanted:
        return list(names())
    return list(dict.fromkeys(wanted))

DESCRIPTION = """\
Run gpuproof's benchmarks on this host, on its GPU (default when torch sees one) or on
the CPU, and write reports/<run-id>/ with long-format records (metrics.jsonl +
metrics.parquet), utilization samples (samples.jsonl, when a GPU is sampled) and each
benchmark's raw JSON result (bench-<name>.json).

The benchmarks run the same scripts that run in cluster pods (workloads/*.py), as
subprocesses. To benchmark a cluster's GPUs, run the bench suites against it:
gpuproof run --kubeconfig ... --only-bench.
"""

def _listing() -> str:
    """The registry's benchmarks with their descriptions, wrapped under one another (the help's first part)."""
    import textwrap

    from ..bench import get, names

    lines = ["benchmarks:"]
    for name in names():
        lines += textwrap.wrap(get(name).description, 108, initial_indent=f"  {name:<11} ",
                               subsequent_indent=" " * 14)
    lines += ["  all         every one of them, in this order",
              "  a,b,...     those, one after another, into one run folder (what a baseline and `report check`",
              "              compare)"]
    return "\n".join(lines) + "\n\n"


EPILOG = """\
examples:
  gpuproof bench --local matmul
  gpuproof bench --local matmul --dtypes bf16,fp8 --sizes 4096,8192
  gpuproof bench --local allreduce --nproc 8 --max-bytes 1G
  gpuproof bench --local inference --slo-ttft-ms 500 --slo-tpot-ms 50
  gpuproof bench --local inference --url http://127.0.0.1:8000 --model my-model   # your own endpoint
  gpuproof bench --local all --device cpu
  gpuproof bench --local matmul,hbm,inference --run-id nightly-1   # one run folder for report check
"""


def register(sub) -> None:
    p = sub.add_parser("bench", help="run benchmarks on this host (GPU or CPU) and write a run folder",
                       description=DESCRIPTION, epilog=_listing() + EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    choices = _choices()
    p.add_argument("benchmark", type=_benchmarks, metavar="{" + ",".join(choices) + "}",
                   help="what to run: one, a comma list (matmul,hbm,inference: one run folder), or all")
    p.add_argument("--local", action="store_true",
                   help="run on this host (required: cluster benchmarks run through `gpuproof run --only-bench`)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="cuda when torch sees a GPU (auto, default), or force cpu / cuda")
    p.add_argument("--sizes", default=None,
                   help="matmul: N or MxNxK list (e.g. 4096,8192); allreduce: byte sizes (e.g. 8,1K,1M). "
                        "With 'all' use --matmul-sizes / --allreduce-sizes")
    p.add_argument("--matmul-sizes", default=None, help="matmul sizes when running 'all'")
    p.add_argument("--allreduce-sizes", default=None, help="all-reduce sizes when running 'all'")
    p.add_argument("--hbm-size", default=None,
                   help="hbm: bytes each buffer holds (default 1G on a GPU, 256M on the CPU; e.g. 64M)")
    p.add_argument("--dtypes", default=None, help="matmul dtypes: fp32,tf32,bf16,fp16,fp8 (default: all supported)")
    p.add_argument("--iters", type=int, default=None, help="timed iterations (matmul, allreduce, hbm)")
    p.add_argument("--min-bytes", default=None, help="allreduce: smallest message (default 8)")
    p.add_argument("--max-bytes", default=None, help="allreduce: largest message (default 1G; 64M on the CPU)")
    p.add_argument("--nproc", type=int, default=None, help="allreduce: local ranks (default 1; GPUs: one per GPU)")
    p.add_argument("--rates", default=None,
                   help="inference: LO:HI searches for the capacity (default 1:1024; CPU 1:256), a,b,c runs those. "
                        "On a GPU the search starts inside LO:HI at an eighth of batch slots / one request's time "
                        "(loadgen --search-start auto)")
    p.add_argument("--step-s", type=float, default=None, help="inference: seconds of sending per load step")
    p.add_argument("--url", default=None,
                   help="inference: drive this OpenAI-compatible endpoint (vLLM, TGI, SGLang, NIM, ...) instead of "
                        "the built-in server")
    p.add_argument("--model", default=None, help="inference: model name to send (default: the first of /v1/models)")
    p.add_argument("--input-tokens", type=int, default=None, help="inference: prompt length (default 512; CPU 64)")
    p.add_argument("--output-tokens", type=int, default=None, help="inference: max_tokens (default 128; CPU 32)")
    p.add_argument("--slo-ttft-ms", type=float, default=None, help="inference: time-to-first-token SLO in ms")
    p.add_argument("--slo-tpot-ms", type=float, default=None, help="inference: time-per-output-token SLO in ms")
    p.add_argument("--users", type=int, default=None, help="inference: locust users (default 512; CPU 64)")
    p.add_argument("--sample-hz", type=float, default=None, help="NVML sampling rate (default 10; 0 = off)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads torch may use in the workloads")
    p.add_argument("--prometheus", default=None,
                   help="also read DCGM exporter series from this Prometheus URL for each benchmark's time window")
    p.add_argument("--prometheus-selector", default="",
                   help='label selector for the DCGM series, e.g. hostname="node-a" (the exporter\'s host label: '
                        '"hostname" since 4.6.0-4.8.3, "Hostname" before)')
    p.add_argument("--out", default="reports", help="parent folder of run folders (default: reports)")
    p.add_argument("--run-id", default=None, help="run id (default: time-stamp + random suffix)")
    p.add_argument("--quiet", action="store_true", help="do not echo the workloads' progress")
    p.set_defaults(func=_bench)


def _device(choice: str) -> str:
    if choice != "auto":
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _dcgm(args, run_dir, name: str, start: float, end: float, exporters: dict) -> None:
    """The DCGM exporter's series of this benchmark's window from Prometheus, as records; what they say of the
    exporter (its name set, host label, the releases those fit) goes into ``exporters[name]``, for run.json."""
    from ..bench import metrics

    try:
        dcgm = metrics.dcgm_phase_summary(args.prometheus, [{"name": name, "start": start, "end": end}],
                                          selector=args.prometheus_selector)
    except Exception as exc:  # an extra source: report, do not fail the benchmark
        print(f"  {name}: could not read DCGM series from {args.prometheus}: {exc}", file=sys.stderr)
        return
    records = metrics.dcgm_to_records(dcgm, benchmark=name, node="local")
    run_dir.add_metrics(records)
    if records:
        exporters[name] = metrics.dcgm_exporter(dcgm)
    print(f"  {name}: {len(records)} DCGM records from {args.prometheus}"
          + (f" (exporter {exporters[name]['releases']})" if records else ""), file=sys.stderr)


def _refuse_ambiguous(args, todo: list[str]) -> None:
    """An option two of the benchmarks read in senses of their own (--sizes: matmul's matrices, all-reduce's
    messages) is refused when both run; each has its own (--matmul-sizes, --allreduce-sizes)."""
    from ..bench import get, names

    readers: dict[str, list[str]] = {}
    for name in names():            # the registry's order, whatever the command line's
        if name in todo:
            for option in get(name).shared_options:
                readers.setdefault(option, []).append(name)
    for option, both in readers.items():
        if len(both) > 1 and getattr(args, option):
            raise GpuproofError(f"--{option} is ambiguous with both {' and '.join(both)} (their {option} differ); "
                                f"use {' and '.join(f'--{n}-{option}' for n in both)}")


def _bench(args) -> int:
    if not args.local:
        raise GpuproofError("gpuproof bench runs on this host only: add --local. To benchmark a cluster's GPUs "
                            "run the bench suites: gpuproof run --kubeconfig <file> --only-bench")
    todo = args.benchmark
    from ..bench import get

    _refuse_ambiguous(args, todo)
    from .extras import require

    # the workloads run here, as subprocesses: what each benchmark needs (torch; locust for a load generator)
    require("bench", list(dict.fromkeys(m for name in todo for m in get(name).local_modules)),
            "gpuproof bench --local")
    from ..results import _SAFE, RunDir

    if args.run_id and not _SAFE.match(args.run_id):
        raise GpuproofError(f"--run-id {args.run_id!r} is not a safe folder name (letters, digits, '.', '_', '-')")
    from ..bench import run_and_record
    from ..bench.metrics import unavailable_reason

    device = _device(args.device)
    run_dir = RunDir.create(args.out, args.run_id, target="local", cluster="local", argv=sys.argv[1:])
    print(f"gpuproof bench: run {run_dir.run_id} on {device} -> {run_dir.path}/", file=sys.stderr)
    failed: list[str] = []
    notes: dict[str, str] = {}
    exporters: dict[str, dict] = {}     # benchmark -> what its DCGM series say of the exporter (--prometheus)
    for name in todo:
        print(f"gpuproof bench: {name} ...", file=sys.stderr, flush=True)
        t0 = time.time()
        params = get(name).params(get(name).cli_params(args, device), device=device)
        try:
            result, records = run_and_record(name, run_dir, params, echo=not args.quiet)
        except GpuproofError as exc:
            print(f"gpuproof bench: {name} failed: {exc}", file=sys.stderr)
            failed.append(name)
            continue
        if args.prometheus:
            _dcgm(args, run_dir, name, t0, time.time(), exporters)
        (run_dir.path / f"bench-{name}.json").write_text(json.dumps(result, indent=2, sort_keys=True, default=str))
        why = unavailable_reason(result.get("utilization")) if get(name).samples_utilization else None
        if why:
            notes[name] = why
        ok = result.get("ok", True)
        if not ok:
            failed.append(name)
        print(f"  {name}: {'ok' if ok else 'FAILED'} in {time.time() - t0:.1f}s, {len(records)} records. "
              f"{get(name).headline(result)}", flush=True)
    if notes:
        print(f"  utilization not sampled: {next(iter(notes.values()))}", flush=True)
    run_dir.meta.extra = {"device": device, "benchmarks": todo, "failed": failed, "utilization_notes": notes,
                          **({"dcgm_exporter": exporters} if exporters else {})}
    run_dir.finalize("failed" if failed else "passed")
    print(f"gpuproof bench: {run_dir.path}/ ({'failed: ' + ', '.join(failed) if failed else 'all ok'})")
    return 1 if failed else 0

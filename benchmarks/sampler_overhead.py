"""Figure: CPU overhead of the NVML sampler (workloads/nvml_sampler.py) at 10 Hz.

Three measurements, all of the real sampler code (no stand-in NVML):

1. ``as used``: ``Sampler(hz).start()``, idle for ``--seconds``, ``stop()``; process CPU
   time minus the same idle wait without a sampler, as % of one core. On a host without
   a GPU this is the no-GPU path (no thread is started, nothing is recorded).
2. ``loop at hz``: the sampler's own loop (``Sampler._loop``: fixed-rate schedule, tick,
   phase bookkeeping, appends) run in its thread at ``hz`` over the devices NVML reports
   (none without a GPU), CPU time of that thread (``time.thread_time``) per wall second.
3. ``loop flat out``: the same loop with no wait between ticks for ``--seconds`` / 5
   (every read kept on the tick: no budget applies), giving the CPU cost of one tick; on a GPU host, also the cost
   of one device read
   (every NVML call the sampler makes for one GPU).

On a GPU host, (1) and (2) include the NVML calls for every GPU; without one they
measure the scaffolding around them only, and the per-device NVML cost must be taken on
a GPU host with this same script. Every line gives CPU per tick and % of one core per
GPU (the budget is 1% per GPU at 10 Hz, i.e. 1 ms of CPU per GPU per tick); on a GPU host
it also lists the CPU time of each read and the reads the sampler moved to the phase
boundaries to stay within that budget.

The last row is what the sampler says it cost in its own records (``sampler_cost`` of the
summary a workload writes: CPU of its thread per tick and per GPU, each read's CPU time).

``--mock PROFILE`` runs the same over NVIDIA's mock NVML with one of its GPU profiles (``h100``:
8 GPUs), built by ``gpuproof.sim.nvidia``: the NVML calls are the mock's, not a driver's, so the
figures are the sampler's own cost around NVML plus the mock's, a stand-in for a real driver's.

    python benchmarks/sampler_overhead.py --seconds 20 --hz 10
    python benchmarks/sampler_overhead.py --seconds 20 --hz 10 --mock h100
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import sys
import threading
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1] / "workloads"))

import nvml_sampler  # noqa: E402


def idle_cpu(seconds: float) -> float:
    c0 = time.process_time()
    threading.Event().wait(seconds)  # the measurement window itself, not a wait for something
    return time.process_time() - c0


def as_used(hz: float, seconds: float) -> dict:
    base = idle_cpu(seconds)
    c0 = time.process_time()
    s = nvml_sampler.Sampler(hz=hz)  # one-off: import pynvml, nvmlInit, device handles
    c1 = time.process_time()
    s.start()
    with s.phase("window"):
        threading.Event().wait(seconds)
    s.stop()
    used = time.process_time() - c1
    ndev = max(1, len(s.devices))
    return {"available": s.available, "reason": s.reason, "devices": len(s.devices), "samples": len(s.samples),
            "thread_started": s.ticks > 0, "setup_cpu_s": c1 - c0, "cpu_s": used, "idle_baseline_cpu_s": base,
            "overhead_pct_of_core": max(0.0, used - base) / seconds * 100,
            "overhead_pct_of_core_per_gpu": max(0.0, used - base) / seconds * 100 / ndev,
            "cpu_us_per_tick": max(0.0, used - base) / s.ticks * 1e6 if s.ticks else None,
            "sampler_cost": s.summary()["sampler_cost"], "summary_devices": s.summary()["devices"]}


def run_loop(hz: float, seconds: float, budget_pct: float = nvml_sampler.DEFAULT_BUDGET_PCT) -> dict:
    s = nvml_sampler.Sampler(hz=hz, budget_pct=budget_pct)
    t = threading.Thread(target=s._loop, daemon=True)  # the real loop, whatever devices NVML reports
    t0 = time.perf_counter()
    t.start()
    threading.Event().wait(seconds)
    s._stop.set()
    t.join()
    wall = time.perf_counter() - t0
    cost = s.cost()
    return {"hz": hz, "devices": len(s.devices), "ticks": s.ticks, "missed_ticks": s.missed_ticks,
            "wall_s": wall, "thread_cpu_s": s.cpu_seconds, "pct_of_core": s.cpu_seconds / wall * 100,
            "pct_of_core_per_gpu": s.cpu_seconds / wall * 100 / len(s.devices) if s.devices else None,
            "cpu_us_per_tick": s.cpu_seconds / max(1, s.ticks) * 1e6,
            "read_cpu_us": cost["read_cpu_us"], "moved_to_boundaries": cost["moved_to_boundaries"]}


def device_read_cost(n: int = 2000) -> dict | None:
    s = nvml_sampler.Sampler(hz=10)
    if not s.devices:
        return None
    dev = s.devices[0]
    c0 = time.thread_time()
    for _ in range(n):
        dev.read()
    c1 = time.thread_time()
    for _ in range(max(1, n // 10)):
        dev.read_boundary()
    c2 = time.thread_time()
    return {"cpu_us_per_device_read": (c1 - c0) / n * 1e6, "device": dev.name,
            "cpu_us_per_boundary_read": (c2 - c1) / max(1, n // 10) * 1e6,
            "read_cpu_us": dev.read_cost_us()}


def rerun_over_mock(args) -> int:
    """This script again, in a process of its own with NVIDIA's mock NVML first on LD_LIBRARY_PATH."""
    import subprocess

    from gpuproof.sim.nvidia import locate

    sw = locate()
    with tempfile.TemporaryDirectory(prefix="gpuproof-sampler-mock-") as tmp:
        config = Path(tmp) / "config.yaml"
        shutil.copy(sw.profiles / f"mock-nvml-config-{args.mock}.yaml", config)
        env = {**os.environ, "LD_LIBRARY_PATH": f"{sw.lib}:{os.environ.get('LD_LIBRARY_PATH', '')}",
               "MOCK_NVML_CONFIG": str(config)}
        argv = ["--seconds", str(args.seconds), "--hz", str(args.hz)] + (["--json", args.json] if args.json else [])
        return subprocess.run([sys.executable, __file__, *argv], env=env).returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--json", default=None)
    p.add_argument("--mock", default=None, metavar="PROFILE",
                   help="run over NVIDIA's mock NVML with this GPU profile (h100, a100, t4, gb200, ...)")
    args = p.parse_args()
    if args.mock:
        return rerun_over_mock(args)
    out = {
        "host": platform.platform(),
        "as_used": as_used(args.hz, args.seconds),
        "loop_at_hz": run_loop(args.hz, args.seconds),
        # flat out, no read fits any budget: keep every read on the tick, for the cost of a whole tick
        "loop_flat_out": run_loop(1e6, max(1.0, args.seconds / 5), budget_pct=float("inf")),
        "device_read": device_read_cost(),
    }
    a, loop, f = out["as_used"], out["loop_at_hz"], out["loop_flat_out"]
    print(f"\n{out['host']}; NVML: {'%d device(s)' % a['devices'] if a['available'] else a['reason']}\n")
    def pct(x):
        return "n/a (no GPU)" if x is None else f"{x:.4f} %"

    print("| measurement | CPU per tick | % of one core | % of one core per GPU | notes |")
    print("|---|---|---|---|---|")
    tick = f"{a['cpu_us_per_tick']:.1f} us" if a["cpu_us_per_tick"] is not None else "no ticks"
    print(f"| as used, {args.hz:g} Hz, {args.seconds:g} s | {tick} | {a['overhead_pct_of_core']:.4f} % | "
          f"{pct(a['overhead_pct_of_core_per_gpu'] if a['available'] else None)} | thread started: "
          f"{a['thread_started']}, samples: {a['samples']}; {a['setup_cpu_s'] * 1e3:.1f} ms CPU once to set up |")
    for label, r in ((f"sampler loop at {args.hz:g} Hz", loop), ("sampler loop flat out", f)):
        print(f"| {label} over {r['devices']} device(s) | {r['cpu_us_per_tick']:.1f} us | {r['pct_of_core']:.4f} % | "
              f"{pct(r['pct_of_core_per_gpu'])} | {r['ticks']} ticks in {r['wall_s']:.1f} s, "
              f"{r['missed_ticks']} missed |")
    if out["device_read"]:
        d = out["device_read"]
        reads = ", ".join(f"{k} {v:.1f} us" for k, v in d["read_cpu_us"].items())
        print(f"| one tick's reads of one GPU ({d['device']}) | {d['cpu_us_per_device_read']:.1f} us | | "
              f"{d['cpu_us_per_device_read'] / (1e6 / args.hz) * 100:.4f} % at {args.hz:g} Hz | per read: {reads}; "
              f"one phase-boundary read {d['cpu_us_per_boundary_read']:.1f} us |")
        if loop["moved_to_boundaries"]:
            print(f"| reads moved to phase boundaries (over budget) | | | | {loop['moved_to_boundaries']} |")
    else:
        print("| one tick's reads of one GPU (NVML calls) | not measurable here: no GPU | | | |")
    c = a["sampler_cost"]
    if a["available"]:
        reads = ", ".join(f"{k} {v:.1f} us" for k, v in c["read_cpu_us"].items())
        print(f"| the sampler's own records (`sampler_cost`, as used) | {c['cpu_us_per_tick']:.1f} us | "
              f"{c['pct_of_core']:.4f} % | {c['pct_of_core_per_gpu']:.4f} % | {c['ticks']} ticks over "
              f"{a['devices']} GPU(s); per read and GPU: {reads}; moved to phase boundaries: "
              f"{c['moved_to_boundaries'] or 'none'}; utilization from "
              f"{sorted({d['util_source'] for d in a['summary_devices']})} |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

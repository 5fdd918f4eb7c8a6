"""Figure: CPU overhead of the NVML sampler (workloads/nvml_sampler.py) at 10 Hz.

Three measurements, all of the real sampler code (no stand-in NVML):

1. ``as used``: ``Sampler(hz).start()``, idle for ``--seconds``, ``stop()``; process CPU
   time minus the same idle wait without a sampler, as % of one core. On a host without
   a GPU this is the no-GPU path (no thread is started, nothing is recorded).
2. ``loop at hz``: the sampler's own loop (``Sampler._loop``: fixed-rate schedule, tick,
   phase bookkeeping, appends) run in its thread at ``hz`` over the devices NVML reports
   (none without a GPU), CPU time of that thread (``time.thread_time``) per wall second.
3. ``loop flat out``: the same loop with no wait between ticks for ``--seconds`` / 5,
   giving the CPU cost of one tick; on a GPU host, also the cost of one device read
   (every NVML call the sampler makes for one GPU).

On a GPU host, (1) and (2) include the NVML calls for every GPU; without one they
measure the scaffolding around them only, and the per-device NVML cost must be taken on
a GPU host with this same script.

    python benchmarks/sampler_overhead.py --seconds 20 --hz 10
"""

from __future__ import annotations

import argparse
import json
import platform
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
    return {"available": s.available, "reason": s.reason, "devices": len(s.devices), "samples": len(s.samples),
            "thread_started": s.ticks > 0, "setup_cpu_s": c1 - c0, "cpu_s": used, "idle_baseline_cpu_s": base,
            "overhead_pct_of_core": max(0.0, used - base) / seconds * 100}


def run_loop(hz: float, seconds: float) -> dict:
    s = nvml_sampler.Sampler(hz=hz)
    t = threading.Thread(target=s._loop, daemon=True)  # the real loop, whatever devices NVML reports
    t0 = time.perf_counter()
    t.start()
    threading.Event().wait(seconds)
    s._stop.set()
    t.join()
    wall = time.perf_counter() - t0
    return {"hz": hz, "devices": len(s.devices), "ticks": s.ticks, "missed_ticks": s.missed_ticks,
            "wall_s": wall, "thread_cpu_s": s.cpu_seconds, "pct_of_core": s.cpu_seconds / wall * 100,
            "cpu_us_per_tick": s.cpu_seconds / max(1, s.ticks) * 1e6}


def device_read_cost(n: int = 2000) -> dict | None:
    s = nvml_sampler.Sampler(hz=10)
    if not s.devices:
        return None
    dev = s.devices[0]
    c0 = time.thread_time()
    for _ in range(n):
        dev.read()
    return {"cpu_us_per_device_read": (time.thread_time() - c0) / n * 1e6, "device": dev.name}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    out = {
        "host": platform.platform(),
        "as_used": as_used(args.hz, args.seconds),
        "loop_at_hz": run_loop(args.hz, args.seconds),
        "loop_flat_out": run_loop(1e6, max(1.0, args.seconds / 5)),
        "device_read": device_read_cost(),
    }
    a, l, f = out["as_used"], out["loop_at_hz"], out["loop_flat_out"]
    print(f"\n{out['host']}; NVML: {'%d device(s)' % a['devices'] if a['available'] else a['reason']}\n")
    print("| measurement | result |")
    print("|---|---|")
    print(f"| as used, {args.hz:g} Hz, {args.seconds:g} s | {a['overhead_pct_of_core']:.3f} % of one core "
          f"while running (thread started: {a['thread_started']}, samples: {a['samples']}); "
          f"{a['setup_cpu_s'] * 1e3:.1f} ms CPU once to set up |")
    print(f"| sampler loop at {args.hz:g} Hz over {l['devices']} device(s) | {l['pct_of_core']:.4f} % of one core, "
          f"{l['cpu_us_per_tick']:.1f} us CPU per tick, {l['ticks']} ticks, {l['missed_ticks']} missed |")
    print(f"| sampler loop flat out over {f['devices']} device(s) | {f['cpu_us_per_tick']:.2f} us CPU per tick "
          f"({f['ticks']} ticks in {f['wall_s']:.1f} s) |")
    if out["device_read"]:
        d = out["device_read"]
        print(f"| one device read (all NVML calls, {d['device']}) | {d['cpu_us_per_device_read']:.1f} us CPU |")
    else:
        print("| one device read (all NVML calls) | not measurable here: no GPU |")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

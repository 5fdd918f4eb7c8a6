"""GPU utilization sampler on NVML (nvidia-ml-py), in a background thread.

Used three ways, one code path:

- inside a workload (matmul, allreduce, inference server): ``--sample-hz`` starts a
  :class:`Sampler`; each benchmark phase is wrapped in ``sampler.phase(name)`` and the
  result JSON carries ``sampler.summary()`` (mean and p95 per phase and GPU);
- from gpuproof (``gpuproof.metrics`` re-exports this module);
- standalone: ``python nvml_sampler.py --hz 10 --duration 5`` prints one JSON summary.

With no GPU, no NVML library or no ``pynvml`` module the sampler records nothing, does
not start a thread, and says why in ``summary()["reason"]``; it never raises for that.

Per tick and GPU one sample row: GPU and memory utilization (%), memory used (MiB),
power (W), energy since the sampler started (J), temperature (C), SM clock (MHz),
clock-event (throttle) reason bitmask, and corrected/uncorrected ECC error counts since
the sampler started. Fields a GPU does not support are None (and not asked again).

Optional: :func:`read_prometheus_range` / :func:`dcgm_phase_summary` read DCGM exporter
series from a Prometheus URL for the same phases (e.g. ``DCGM_FI_PROF_GR_ENGINE_ACTIVE``,
which NVML cannot give per MIG instance).
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.parse
import urllib.request
from typing import Any, Iterable

import workload_common as common

DEFAULT_HZ = 10.0

# Clock-event ("throttle") reason bits, as in nvml.h (nvmlClocksEventReason*).
CLOCK_EVENT_REASONS = {
    0x001: "gpu_idle",
    0x002: "applications_clocks_setting",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal_slowdown",
    0x040: "hw_thermal_slowdown",
    0x080: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that do not mean the GPU was slowed down by power, heat or hardware.
BENIGN_REASONS = 0x001 | 0x002 | 0x010 | 0x100

NUMERIC_FIELDS = (
    "gpu_util_pct", "mem_util_pct", "mem_used_mib", "power_w", "temp_c", "sm_clock_mhz",
)


def decode_reasons(mask: int | None) -> list[str]:
    if not mask:
        return []
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"other_0x{unknown:x}")
    return names


def _load_nvml():
    """(module, None) when NVML initialises, else (None, reason)."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None, "pynvml (nvidia-ml-py) is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"NVML unavailable: {exc}"
    return pynvml, None


class _Device:
    """One GPU's NVML handle plus the fields it turned out not to support."""

    def __init__(self, nvml, index: int):
        self.nvml = nvml
        self.index = index
        self.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        self.unsupported: set[str] = set()
        self.uuid = self._call("uuid", nvml.nvmlDeviceGetUUID)
        self.name = self._call("name", nvml.nvmlDeviceGetName)
        for attr in ("uuid", "name"):
            if isinstance(getattr(self, attr), bytes):
                setattr(self, attr, getattr(self, attr).decode())
        self.energy0 = self._call("energy_j", nvml.nvmlDeviceGetTotalEnergyConsumption)
        self.ecc0 = self._ecc()

    def _call(self, field: str, fn, *args):
        if field in self.unsupported:
            return None
        try:
            return fn(self.handle, *args)
        except Exception:  # NVMLError_NotSupported / NoPermission / GpuIsLost ...
            self.unsupported.add(field)
            return None

    def _ecc(self) -> tuple[int | None, int | None]:
        n = self.nvml
        return (
            self._call("ecc_corrected", n.nvmlDeviceGetTotalEccErrors,
                       n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC),
            self._call("ecc_uncorrected", n.nvmlDeviceGetTotalEccErrors,
                       n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC),
        )

    def read(self) -> dict:
        n = self.nvml
        util = self._call("util", n.nvmlDeviceGetUtilizationRates)
        mem = self._call("mem", n.nvmlDeviceGetMemoryInfo)
        power = self._call("power_w", n.nvmlDeviceGetPowerUsage)
        energy = self._call("energy_j", n.nvmlDeviceGetTotalEnergyConsumption)
        reasons_fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            n.nvmlDeviceGetCurrentClocksThrottleReasons  # older nvidia-ml-py
        ecc = self._ecc()
        return {
            "gpu": self.index,
            "uuid": self.uuid,
            "gpu_util_pct": util.gpu if util is not None else None,
            "mem_util_pct": util.memory if util is not None else None,
            "mem_used_mib": mem.used / 2**20 if mem is not None else None,
            "mem_total_mib": mem.total / 2**20 if mem is not None else None,
            "power_w": power / 1e3 if power is not None else None,
            "energy_j": (energy - self.energy0) / 1e3 if energy is not None and self.energy0 is not None else None,
            "temp_c": self._call("temp_c", n.nvmlDeviceGetTemperature, n.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": self._call("sm_clock_mhz", n.nvmlDeviceGetClockInfo, n.NVML_CLOCK_SM),
            "clock_event_reasons": self._call("clock_event_reasons", reasons_fn),
            "ecc_corrected_delta": _delta(ecc[0], self.ecc0[0]),
            "ecc_uncorrected_delta": _delta(ecc[1], self.ecc0[1]),
        }


def _delta(now, start):
    return now - start if now is not None and start is not None else None


class Sampler:
    """Samples every visible GPU at ``hz`` in a daemon thread until :meth:`stop`.

    ``devices``: NVML indices to sample (default all). ``nvml``: an already initialised
    NVML module (default: import pynvml and initialise it).
    """

    def __init__(self, hz: float = DEFAULT_HZ, devices: Iterable[int] | None = None, nvml: Any = None):
        if hz <= 0:
            raise ValueError("hz must be > 0")
        self.hz = float(hz)
        self.interval = 1.0 / self.hz
        self.samples: list[dict] = []
        self.phases: list[dict] = []          # {"name", "start", "end"} (epoch seconds)
        self.cpu_seconds = 0.0                # CPU time the sampling thread used
        self.ticks = 0
        self.missed_ticks = 0
        self._phase = "unphased"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.devices: list[_Device] = []
        self.nvml, self.reason = (nvml, None) if nvml is not None else _load_nvml()
        if self.nvml is not None:
            try:
                count = self.nvml.nvmlDeviceGetCount()
                wanted = range(count) if devices is None else [i for i in devices if i < count]
                self.devices = [_Device(self.nvml, i) for i in wanted]
            except Exception as exc:
                self.reason = f"NVML could not list devices: {exc}"
                self.devices = []
            if not self.devices and self.reason is None:
                self.reason = "NVML sees no GPU"

    @property
    def available(self) -> bool:
        return bool(self.devices)

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "Sampler":
        if self.available and self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
            self._thread.start()
        elif not self.available:
            common.log(f"utilization sampling off: {self.reason}")
        return self

    def stop(self) -> "Sampler":
        self._end_phase(time.time())
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5 + 2 * self.interval)
            self._thread = None
        return self

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        next_tick = time.monotonic()
        try:
            while not self._stop.is_set():
                self.tick()
                next_tick += self.interval
                now = time.monotonic()
                if now > next_tick:  # fell behind: skip the ticks we missed, keep the grid
                    skipped = int((now - next_tick) / self.interval) + 1
                    self.missed_ticks += skipped
                    next_tick += skipped * self.interval
                self._stop.wait(next_tick - now)
        finally:
            self.cpu_seconds += time.thread_time() - cpu0

    def tick(self) -> None:
        """Take one sample of every device (the loop calls this at ``hz``)."""
        ts = time.time()
        rows = []
        for dev in self.devices:
            row = dev.read()
            row["ts"] = ts
            row["phase"] = self._phase
            rows.append(row)
        with self._lock:
            self.samples.extend(rows)
            self.ticks += 1

    # -- phases ----------------------------------------------------------------------
    def _end_phase(self, ts: float) -> None:
        if self.phases and self.phases[-1]["end"] is None:
            self.phases[-1]["end"] = ts

    def set_phase(self, name: str) -> None:
        ts = time.time()
        self._end_phase(ts)
        self._phase = name
        self.phases.append({"name": name, "start": ts, "end": None})

    @contextlib.contextmanager
    def phase(self, name: str):
        previous = self._phase
        self.set_phase(name)
        try:
            yield self
        finally:
            self._end_phase(time.time())
            self._phase = previous

    # -- results ---------------------------------------------------------------------
    def summary(self) -> dict:
        with self._lock:
            samples = list(self.samples)
        out = summarize(samples, self.phases)
        out.update(
            available=self.available,
            reason=self.reason,
            hz=self.hz,
            devices=[{"gpu": d.index, "uuid": d.uuid, "name": d.name} for d in self.devices],
            n_samples=len(samples),
            ticks=self.ticks,
            missed_ticks=self.missed_ticks,
            sampler_cpu_seconds=round(self.cpu_seconds, 6),
        )
        return out


class NullSampler:
    """Same interface as :class:`Sampler`, records nothing (sampling turned off)."""

    available = False
    samples: list = []

    def __init__(self, reason: str = "sampling turned off (--sample-hz 0)"):
        self.reason = reason
        self.phases: list[dict] = []

    def start(self) -> "NullSampler":
        return self

    def stop(self) -> "NullSampler":
        return self

    def set_phase(self, name: str) -> None:
        pass

    def phase(self, name: str):
        return contextlib.nullcontext(self)

    def summary(self) -> dict:
        return {"available": False, "reason": self.reason, "phases": {}, "n_samples": 0}


def _normal_uuid(u: Any) -> str:
    u = u.decode() if isinstance(u, bytes) else str(u or "")
    return u.lower().removeprefix("gpu-")


def make_sampler(hz: float, torch_device: str | None = None):
    """A started-able sampler for a workload: :class:`NullSampler` when ``hz`` <= 0.

    With ``torch_device='cuda'`` only the GPU torch is using is sampled (matched by
    UUID, so it works whatever CUDA_VISIBLE_DEVICES says); if it cannot be matched
    (e.g. a MIG instance, whose parent GPU NVML lists), every GPU is sampled.
    """
    if hz <= 0:
        return NullSampler()
    devices = None
    if torch_device == "cuda":
        try:
            import torch

            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            want = _normal_uuid(getattr(props, "uuid", ""))
            nvml, _ = _load_nvml()
            if nvml is not None and want:
                for i in range(nvml.nvmlDeviceGetCount()):
                    if _normal_uuid(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))) == want:
                        devices = [i]
                        break
        except Exception as exc:  # sampling is a side show: never fail the workload for it
            common.log(f"could not match the CUDA device to NVML ({exc}); sampling every GPU")
    return Sampler(hz=hz, devices=devices)


def add_args(parser) -> None:
    """The sampling options every GPU workload takes."""
    parser.add_argument("--sample-hz", type=float, default=DEFAULT_HZ,
                        help="NVML utilization sampling rate during the run (default 10; 0 = off)")
    parser.add_argument("--samples-out", default=None,
                        help="also write every utilization sample to this JSONL file")


def finish(sampler, args) -> dict:
    """Stop ``sampler``, write its samples to ``--samples-out`` if asked; return its summary."""
    sampler.stop()
    path = getattr(args, "samples_out", None)
    if path and not isinstance(sampler, NullSampler):  # other ranks must not overwrite rank 0's file
        with open(path, "w", encoding="utf-8") as fh:
            for row in sampler.samples:
                fh.write(json.dumps(row, sort_keys=True) + "\n")
    return sampler.summary()


def summarize(samples: list[dict], phases: list[dict] | None = None) -> dict:
    """Mean and p95 per phase and GPU of each numeric field (pure function of the rows).

    Also per phase and GPU: energy used (J, last minus first reading), ECC errors seen
    during the phase, the union of clock-event reasons and the share of samples with a
    non-benign reason (power, thermal or hardware slowdown).
    """
    by_phase: dict[str, dict[int, list[dict]]] = {}
    for row in samples:
        by_phase.setdefault(row.get("phase", "unphased"), {}).setdefault(row.get("gpu", 0), []).append(row)
    durations = {}
    for p in phases or []:
        if p.get("end") is not None:
            durations[p["name"]] = durations.get(p["name"], 0.0) + p["end"] - p["start"]
    result: dict[str, Any] = {"phases": {}}
    for name in sorted(set(by_phase) | set(durations)):
        gpus = {}
        for gpu, rows in sorted(by_phase.get(name, {}).items()):
            stats: dict[str, Any] = {"n": len(rows)}
            for field in NUMERIC_FIELDS:
                vals = [r[field] for r in rows if r.get(field) is not None]
                stats[field] = {"mean": common.mean(vals), "p95": common.percentile(vals, 95)} if vals else None
            for field in ("energy_j", "ecc_corrected_delta", "ecc_uncorrected_delta"):
                vals = [r[field] for r in rows if r.get(field) is not None]
                stats[field.replace("_delta", "")] = (max(vals) - min(vals)) if vals else None
            masks = [r["clock_event_reasons"] for r in rows if r.get("clock_event_reasons") is not None]
            union = 0
            for m in masks:
                union |= m
            stats["clock_event_reasons"] = decode_reasons(union)
            stats["throttled_fraction"] = (
                sum(1 for m in masks if m & ~BENIGN_REASONS) / len(masks) if masks else None
            )
            gpus[str(gpu)] = stats
        result["phases"][name] = {"duration_s": durations.get(name), "gpus": gpus}
    return result


# ------------------------------------------------------------------ DCGM via Prometheus

DCGM_SERIES = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
)


def read_prometheus_range(url: str, query: str, start: float, end: float, step: float = 1.0,
                          timeout: float = 10.0) -> list[dict]:
    """``/api/v1/query_range`` -> [{"metric": labels, "values": [(ts, float), ...]}]."""
    qs = urllib.parse.urlencode({"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"})
    with urllib.request.urlopen(url.rstrip("/") + "/api/v1/query_range?" + qs, timeout=timeout) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus query {query!r} failed: {body.get('error', body)}")
    return [
        {"metric": s.get("metric", {}), "values": [(float(t), float(v)) for t, v in s.get("values", [])]}
        for s in body.get("data", {}).get("result", [])
    ]


def dcgm_phase_summary(url: str, phases: list[dict], series: Iterable[str] = DCGM_SERIES,
                       step: float = 1.0, selector: str = "") -> dict:
    """Mean and p95 per phase, DCGM field and GPU (labels gpu / UUID / Hostname).

    ``selector`` is added inside the braces, e.g. ``Hostname="node-a"``. A series the
    exporter does not publish is left out; an unreachable Prometheus raises.
    """
    out: dict[str, Any] = {}
    for p in phases:
        if p.get("end") is None:
            continue
        per_field: dict[str, Any] = {}
        for field in series:
            query = f"{field}{{{selector}}}" if selector else field
            for s in read_prometheus_range(url, query, p["start"], p["end"], step):
                labels = s["metric"]
                key = labels.get("UUID") or labels.get("gpu") or "?"
                vals = [v for _, v in s["values"]]
                per_field.setdefault(field, {})[key] = {
                    "mean": common.mean(vals), "p95": common.percentile(vals, 95), "n": len(vals),
                    "node": labels.get("Hostname", ""),
                }
        out[p["name"]] = per_field
    return out


# ------------------------------------------------------------------ command line


def main(argv: list[str] | None = None) -> int:
    p = common.parser(
        "nvml_sampler.py",
        "Sample GPU utilization with NVML for a while and print one JSON summary "
        "(mean and p95 per GPU). With no GPU it prints available=false and the reason.",
    )
    p.add_argument("--hz", type=float, default=DEFAULT_HZ, help="samples per second (default 10)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds to sample (default 5)")
    p.add_argument("--samples", action="store_true", help="include every sample row in the result")
    args = p.parse_args(argv)
    if args.hz <= 0 or args.duration < 0:
        return common.fail_usage("--hz must be > 0 and --duration >= 0")
    result = common.base_result("nvml_sampler")
    sampler = Sampler(hz=args.hz).start()
    with sampler.phase("sample"):
        sampler._stop.wait(args.duration) if sampler.available else None
    sampler.stop()
    result["utilization"] = sampler.summary()
    if args.samples:
        result["samples"] = sampler.samples
    result["ok"] = True
    common.emit(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

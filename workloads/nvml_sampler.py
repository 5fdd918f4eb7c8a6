"""GPU utilization sampler on NVML (nvidia-ml-py), in a background thread.

Used three ways, one code path:

- inside a workload (matmul, allreduce, inference server): ``--sample-hz`` starts a
  :class:`Sampler`; each benchmark phase is wrapped in ``sampler.phase(name)`` and the
  result JSON carries ``sampler.summary()`` (mean and p95 per phase and GPU);
- from gpuproof (``gpuproof.metrics`` re-exports this module);
- standalone: ``python nvml_sampler.py --hz 10 --duration 5`` prints one JSON summary.

With no GPU, no NVML library or no ``pynvml`` module the sampler records nothing, does
not start a thread, and says why in ``summary()["reason"]``; it never raises for that.

NVML is read whatever torch sees: every GPU NVML lists is sampled (a GPU NVML cannot open is
left out and named in ``skipped_devices``). Per tick and GPU one sample row: GPU and memory
utilization (%), memory used (MiB), power (W, in one batched ``nvmlDeviceGetFieldValues``
call), temperature (C), SM clock (MHz) and the clock-event (throttle) reason bitmask.
Utilization is the mean of the driver's own samples since the last tick
(``nvmlDeviceGetSamples``); where NVML does not support those (NVIDIA's mock NVML, some
virtual GPUs) it falls back to ``nvmlDeviceGetUtilizationRates``. Each row's
``util_source`` (``samples`` or ``utilization_rates``) and each device's ``util_fallback``
in the summary say which was used and why. Slow counters (energy, volatile ECC
totals: one batched field call) are read only at phase boundaries (start, each phase's
start and end, stop), which gives energy and ECC errors per phase. Fields a GPU does not
support are None (and not asked again).

What the sampler costs is measured and reported in every summary (``sampler_cost``):
CPU time of the sampling thread in total and per tick, % of one core per GPU, the CPU
time of each read, and the phase-boundary reads. Reads that would take a tick over the
budget (default 1% of one core per GPU at the sampling rate) are moved to the phase
boundaries after the first ticks, and the summary names them.

Optional: :func:`read_prometheus_range` / :func:`dcgm_phase_summary` read DCGM exporter
series from a Prometheus URL for the same phases (e.g. the graphics engine's activity,
which NVML cannot give per MIG instance), by the names and units of every exporter release
(``dcgm_series.py``).

Long: every NVML reading the benchmarks record (utilization, memory, power, clocks, clock-event reasons) with
its cost budget per tick, and the DCGM-exporter queries that stand in for it through Prometheus.
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

import dcgm_series
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


# Per-tick values in one nvmlDeviceGetFieldValues call (sample field -> NVML field id name).
TICK_FIELDS = {"power_w": "NVML_FI_DEV_POWER_INSTANT"}
# Slow counters, read only at phase boundaries (start, phase starts and ends, stop), in one
# nvmlDeviceGetFieldValues call: energy since the driver loaded (mJ), volatile ECC totals.
BOUNDARY_FIELDS = {
    "energy_mj": "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "ecc_corrected": "NVML_FI_DEV_ECC_SBE_VOL_TOTAL",
    "ecc_uncorrected": "NVML_FI_DEV_ECC_DBE_VOL_TOTAL",
}
# Where utilization comes from: the driver's own samples since the last tick (nvmlDeviceGetSamples), or,
# where NVML does not support those, the utilization over its last sample period (nvmlDeviceGetUtilizationRates).
UTIL_SAMPLES, UTIL_RATES = "samples", "utilization_rates"
DEFAULT_BUDGET_PCT = 1.0   # % of one core per GPU the per-tick reads may cost at the sampling rate
CALIBRATION_TICKS = 3      # ticks whose read costs decide which reads move to phase boundaries

class _Device:
    """One GPU's NVML handle, its per-tick readers and the fields it turned out not to support.

    A *reader* is one NVML call (or one batched ``nvmlDeviceGetFieldValues`` call) giving
    one or more sample fields. Per-tick readers run every tick; the CPU time of each is
    measured (``time.thread_time``), and after the calibration ticks the costliest are
    moved to the phase-boundary reads until a tick fits the budget.
    """

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
        max_clock = getattr(nvml, "nvmlDeviceGetMaxClockInfo", None)
        self.max_sm_clock_mhz = self._call("max_sm_clock_mhz", max_clock, nvml.NVML_CLOCK_SM) if max_clock else None
        self._last_sample: dict[int, tuple[int, float | None]] = {}    # sampling type -> (timestamp, mean)
        self.util_source, self.util_fallback = UTIL_SAMPLES, None
        try:
            self._sampled_util()
        except Exception as exc:   # Not Supported (NVIDIA's mock, some vGPUs), or an nvidia-ml-py without it
            self.util_source, self.util_fallback = UTIL_RATES, f"nvmlDeviceGetSamples: {exc}"
        self.tick_readers: dict[str, Any] = {
            "fields": self._read_tick_fields,
            "util": self._read_util,
            "mem": self._read_mem,
            "temp": self._read_temp,
            "sm_clock": self._read_clock,
            "clock_event_reasons": self._read_reasons,
        }
        self.boundary_readers: dict[str, Any] = {"counters": self._read_counters}
        self.demoted: dict[str, float] = {}          # reader -> mean CPU us when it was moved off the tick
        self.read_cpu_s: dict[str, float] = {}       # reader -> CPU seconds spent in it
        self.read_calls: dict[str, int] = {}
        self.counters0 = self._read_counters()       # baseline for the deltas
        self.last_boundary: dict = dict(self.counters0)

    def _call(self, field: str, fn, *args):
        if field in self.unsupported or fn is None:
            return None
        try:
            return fn(self.handle, *args)
        except Exception:  # NVMLError_NotSupported / NoPermission / GpuIsLost ...
            self.unsupported.add(field)
            return None

    # -- readers: each returns a dict of sample fields
    def _fields(self, key: str, wanted: dict[str, str]) -> dict:
        """One nvmlDeviceGetFieldValues call for ``wanted`` (sample field -> NVML id name)."""
        n = self.nvml
        names = [f for f, ident in wanted.items() if hasattr(n, ident)]
        values = self._call(key, getattr(n, "nvmlDeviceGetFieldValues", None),
                            [getattr(n, wanted[f]) for f in names]) if names else None
        if values is None:
            return {f: None for f in wanted}
        out = {f: None for f in wanted}
        for f, fv in zip(names, values):
            out[f] = common.nvml_field(fv)
        return out

    def _read_tick_fields(self) -> dict:
        got = self._fields("tick_fields", TICK_FIELDS)
        power = got.get("power_w")
        if power is None and "tick_fields" in self.unsupported:  # no field API: the plain call
            power = self._call("power_w", self.nvml.nvmlDeviceGetPowerUsage)
        return {"power_w": power / 1e3 if power is not None else None}  # mW -> W

    def _sampled_util(self) -> tuple[float | None, float | None]:
        """GPU and memory utilization (%) as the driver sampled them since the last call: the mean of
        ``nvmlDeviceGetSamples`` (the last mean again when the driver took no new sample)."""
        n = self.nvml
        get = getattr(n, "nvmlDeviceGetSamples", None)
        if get is None:
            raise AttributeError("this nvidia-ml-py has no nvmlDeviceGetSamples")
        out = []
        for kind in (n.NVML_GPU_UTILIZATION_SAMPLES, n.NVML_MEMORY_UTILIZATION_SAMPLES):
            since, last = self._last_sample.get(kind, (0, None))
            try:
                value_type, samples = get(self.handle, kind, since)
            except Exception as exc:
                if getattr(exc, "value", None) != getattr(n, "NVML_ERROR_NOT_FOUND", 6):   # 6: no new sample
                    raise
                samples = []
            if samples:
                values = [common.nvml_value(x.sampleValue, value_type) for x in samples]
                last = sum(values) / len(values)
                since = max(x.timeStamp for x in samples)
            self._last_sample[kind] = (since, last)
            out.append(last)
        return out[0], out[1]

    def _read_util(self) -> dict:
        if self.util_source == UTIL_SAMPLES:
            try:
                gpu, mem = self._sampled_util()
                return {"gpu_util_pct": gpu, "mem_util_pct": mem, "util_source": UTIL_SAMPLES}
            except Exception as exc:
                self.util_source, self.util_fallback = UTIL_RATES, f"nvmlDeviceGetSamples: {exc}"
        util = self._call("util", self.nvml.nvmlDeviceGetUtilizationRates)
        return {"gpu_util_pct": util.gpu if util is not None else None,
                "mem_util_pct": util.memory if util is not None else None, "util_source": UTIL_RATES}

    def _read_mem(self) -> dict:
        mem = self._call("mem", self.nvml.nvmlDeviceGetMemoryInfo)
        return {"mem_used_mib": mem.used / 2**20 if mem is not None else None,
                "mem_total_mib": mem.total / 2**20 if mem is not None else None}

    def _read_temp(self) -> dict:
        return {"temp_c": self._call("temp_c", self.nvml.nvmlDeviceGetTemperature, self.nvml.NVML_TEMPERATURE_GPU)}

    def _read_clock(self) -> dict:
        return {"sm_clock_mhz": self._call("sm_clock_mhz", self.nvml.nvmlDeviceGetClockInfo, self.nvml.NVML_CLOCK_SM)}

    def _read_reasons(self) -> dict:
        n = self.nvml
        fn = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(n, "nvmlDeviceGetCurrentClocksThrottleReasons", None)  # older nvidia-ml-py
        return {"clock_event_reasons": self._call("clock_event_reasons", fn)}

    def _read_counters(self) -> dict:
        """Energy (mJ) and volatile ECC totals in one field call; per-call fallbacks without it."""
        got = self._fields("boundary_fields", BOUNDARY_FIELDS)
        if "boundary_fields" in self.unsupported:
            n = self.nvml
            got["energy_mj"] = self._call("energy_mj", n.nvmlDeviceGetTotalEnergyConsumption)
            for field, kind in (("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                                ("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
                got[field] = self._call(field, n.nvmlDeviceGetTotalEccErrors, getattr(n, kind, 0),
                                        getattr(n, "NVML_VOLATILE_ECC", 0))
        return got

    # -- reading
    def _timed(self, key: str, fn) -> dict:
        c0 = time.thread_time()
        out = fn()
        self.read_cpu_s[key] = self.read_cpu_s.get(key, 0.0) + time.thread_time() - c0
        self.read_calls[key] = self.read_calls.get(key, 0) + 1
        return out

    def read(self) -> dict:
        """One tick's sample row (the per-tick readers only)."""
        row: dict[str, Any] = {"gpu": self.index, "uuid": self.uuid}
        for key, fn in list(self.tick_readers.items()):
            row.update(self._timed(key, fn))
        return row

    def read_boundary(self) -> dict:
        """The slow counters (as deltas since the sampler started) and any demoted readers' fields."""
        raw: dict[str, Any] = {}
        for key, fn in list(self.boundary_readers.items()):
            raw.update(self._timed(key, fn))
        out = {k: v for k, v in raw.items() if k not in BOUNDARY_FIELDS}
        energy = raw.get("energy_mj")
        e0 = self.counters0.get("energy_mj")
        out["energy_j"] = (energy - e0) / 1e3 if energy is not None and e0 is not None else None
        out["ecc_corrected_delta"] = _delta(raw.get("ecc_corrected"), self.counters0.get("ecc_corrected"))
        out["ecc_uncorrected_delta"] = _delta(raw.get("ecc_uncorrected"), self.counters0.get("ecc_uncorrected"))
        self.last_boundary = out
        return out

    def read_cost_us(self) -> dict[str, float]:
        return {k: self.read_cpu_s[k] / self.read_calls[k] * 1e6 for k in self.read_cpu_s if self.read_calls.get(k)}

    def fit_budget(self, budget_s: float) -> dict[str, float]:
        """Move the costliest per-tick readers to the phase boundaries until a tick fits ``budget_s``."""
        cost = {k: v for k, v in self.read_cost_us().items() if k in self.tick_readers}
        total = sum(cost.values())
        for key in sorted(cost, key=cost.get, reverse=True):
            if total <= budget_s * 1e6:
                break
            self.boundary_readers[key] = self.tick_readers.pop(key)
            self.demoted[key] = cost[key]
            total -= cost[key]
        return dict(self.demoted)


def _delta(now, start):
    return now - start if now is not None and start is not None else None


def _cost_summary(*, available: bool, reason: str | None, hz: float, ndev: int, thread_cpu_s: float,
                  ticks: int, tick_cpu_s: float, wall_s: float, boundary_reads: int, boundary_cpu_s: float,
                  budget_pct: float, read_cpu_us: dict | None = None, demoted: dict | None = None) -> dict:
    """What the sampler itself cost (CPU), per tick, per GPU and in total; pure function."""
    pct = thread_cpu_s / wall_s * 100 if wall_s > 0 else None
    per_gpu = pct / ndev if pct is not None and ndev else None
    out = {
        "thread_cpu_s": round(thread_cpu_s, 6),
        "ticks": ticks,
        "cpu_us_per_tick": thread_cpu_s / ticks * 1e6 if ticks else None,
        "read_cpu_us_per_tick": tick_cpu_s / ticks * 1e6 if ticks else None,
        "wall_s": round(wall_s, 6),
        "pct_of_core": pct,
        "pct_of_core_per_gpu": per_gpu,
        "boundary_reads": boundary_reads,
        "boundary_cpu_s": round(boundary_cpu_s, 6),
        "total_cpu_s": round(thread_cpu_s + boundary_cpu_s, 6),
        "budget_pct_of_core_per_gpu": budget_pct,
        "within_budget": (per_gpu <= budget_pct) if per_gpu is not None else None,
        "read_cpu_us": read_cpu_us or {},
        "moved_to_boundaries": demoted or {},
    }
    if not available:
        out["note"] = f"no sampling, no CPU spent on it: {reason}"
    return out


class Sampler:
    """Samples every visible GPU at ``hz`` in a daemon thread until :meth:`stop`.

    ``devices``: NVML indices to sample (default all). ``nvml``: an already initialised
    NVML module (default: import pynvml and initialise it). ``budget_pct``: % of one core
    per GPU the per-tick reads may cost (default 1); reads found costlier during the first
    ticks are moved to the phase boundaries (and the summary says which).

    Per tick: utilization, memory, power (batched field call), temperature, SM clock,
    clock-event reasons. At phase boundaries only (start, each phase's start and end,
    stop): energy and ECC counters, in one batched field call.
    """

    def __init__(self, hz: float = DEFAULT_HZ, devices: Iterable[int] | None = None, nvml: Any = None,
                 budget_pct: float = DEFAULT_BUDGET_PCT, calibration_ticks: int = CALIBRATION_TICKS):
        if hz <= 0:
            raise ValueError("hz must be > 0")
        self.hz = float(hz)
        self.interval = 1.0 / self.hz
        self.budget_pct = float(budget_pct)
        self.calibration_ticks = int(calibration_ticks)
        self.samples: list[dict] = []
        self.phases: list[dict] = []          # {"name", "start", "end", "counters_start", "counters_end"}
        self.cpu_seconds = 0.0                # CPU time the sampling thread used (whole loop)
        self.tick_cpu_seconds = 0.0           # CPU time inside tick() (the reads and bookkeeping)
        self.boundary_cpu_seconds = 0.0       # CPU time of the phase-boundary reads (caller's thread)
        self.boundary_reads = 0
        self.wall_seconds = 0.0
        self.ticks = 0
        self.missed_ticks = 0
        self._phase = "unphased"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.devices: list[_Device] = []
        self.skipped: dict[int, str] = {}     # NVML index -> why it is not sampled (e.g. GPU is lost)
        self.nvml, self.reason = (nvml, None) if nvml is not None else common.load_nvml()
        if self.nvml is not None:
            try:
                count = self.nvml.nvmlDeviceGetCount()
            except Exception as exc:
                self.reason, count = f"NVML could not list devices: {exc}", 0
            for i in range(count) if devices is None else [i for i in devices if i < count]:
                try:
                    self.devices.append(_Device(self.nvml, i))
                except Exception as exc:     # one GPU NVML cannot open does not stop the others' sampling
                    self.skipped[i] = f"NVML: {exc}"
                    common.log(f"sampler: GPU {i} not sampled: NVML: {exc}")
            if not self.devices and self.reason is None:
                self.reason = "NVML sees no GPU" + (f" it can open ({self.skipped})" if self.skipped else "")

    @property
    def available(self) -> bool:
        return bool(self.devices)

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "Sampler":
        if self.available and self._thread is None:
            self._stop.clear()
            self.boundary()
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
            self.boundary()
        return self

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _loop(self) -> None:
        cpu0 = time.thread_time()
        wall0 = time.monotonic()
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
            self.wall_seconds += time.monotonic() - wall0

    def tick(self) -> None:
        """Take one sample of every device (the loop calls this at ``hz``)."""
        c0 = time.thread_time()
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
        if self.ticks == self.calibration_ticks:
            budget_s = self.budget_pct / 100.0 * self.interval
            for dev in self.devices:
                moved = dev.fit_budget(budget_s)
                if moved:
                    common.log(f"sampler: GPU {dev.index}: reads over the {self.budget_pct:g}% budget at "
                               f"{self.hz:g} Hz moved to phase boundaries: "
                               + ", ".join(f"{k} ({v:.0f} us)" for k, v in moved.items()))
        self.tick_cpu_seconds += time.thread_time() - c0

    def boundary(self) -> dict:
        """Read the slow counters of every device now (phase boundaries); returns gpu -> values."""
        if not self.devices:
            return {}
        c0 = time.thread_time()
        out = {str(dev.index): dev.read_boundary() for dev in self.devices}
        self.boundary_cpu_seconds += time.thread_time() - c0
        self.boundary_reads += 1
        return out

    # -- phases ----------------------------------------------------------------------
    def _end_phase(self, ts: float) -> None:
        if self.phases and self.phases[-1]["end"] is None:
            self.phases[-1]["end"] = ts
            self.phases[-1]["counters_end"] = self.boundary()

    def set_phase(self, name: str) -> None:
        ts = time.time()
        self._end_phase(ts)
        self._phase = name
        self.phases.append({"name": name, "start": ts, "end": None, "counters_start": self.boundary()})

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
    def cost(self) -> dict:
        read_us: dict[str, float] = {}
        demoted: dict[str, float] = {}
        for dev in self.devices:
            for k, v in dev.read_cost_us().items():
                read_us[k] = max(read_us.get(k, 0.0), v)
            demoted.update(dev.demoted)
        return _cost_summary(available=self.available, reason=self.reason, hz=self.hz, ndev=len(self.devices),
                             thread_cpu_s=self.cpu_seconds, ticks=self.ticks, tick_cpu_s=self.tick_cpu_seconds,
                             wall_s=self.wall_seconds, boundary_reads=self.boundary_reads,
                             boundary_cpu_s=self.boundary_cpu_seconds, budget_pct=self.budget_pct,
                             read_cpu_us=read_us, demoted=demoted)

    def summary(self) -> dict:
        with self._lock:
            samples = list(self.samples)
        out = summarize(samples, self.phases)
        out.update(
            available=self.available,
            reason=self.reason,
            hz=self.hz,
            devices=[{"gpu": d.index, "uuid": d.uuid, "name": d.name, "max_sm_clock_mhz": d.max_sm_clock_mhz,
                      "util_source": d.util_source, "util_fallback": d.util_fallback} for d in self.devices],
            skipped_devices=self.skipped,
            n_samples=len(samples),
            ticks=self.ticks,
            missed_ticks=self.missed_ticks,
            sampler_cpu_seconds=round(self.cpu_seconds, 6),
            sampler_cost=self.cost(),
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
        cost = _cost_summary(available=False, reason=self.reason, hz=0.0, ndev=0, thread_cpu_s=0.0, ticks=0,
                             tick_cpu_s=0.0, wall_s=0.0, boundary_reads=0, boundary_cpu_s=0.0,
                             budget_pct=DEFAULT_BUDGET_PCT)
        return {"available": False, "reason": self.reason, "phases": {}, "n_samples": 0,
                "sampler_cpu_seconds": 0.0, "sampler_cost": cost}


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
            nvml, _ = common.load_nvml()
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


_COUNTERS = ("energy_j", "ecc_corrected_delta", "ecc_uncorrected_delta")


def summarize(samples: list[dict], phases: list[dict] | None = None) -> dict:
    """Mean and p95 per phase and GPU of each numeric field (pure function of the rows).

    Also per phase and GPU: energy used (J) and ECC errors seen during the phase, from
    the counters read at the phase's start and end (``counters_start`` /
    ``counters_end`` of the phase, summed over phases of the same name; rows carrying
    ``energy_j`` etc. are the fallback: last minus first reading), the union of
    clock-event reasons and the share of samples with a non-benign reason (power,
    thermal or hardware slowdown). A numeric field no row has (its read was moved to
    the phase boundaries) is taken from the boundary reads.
    """
    by_phase: dict[str, dict[int, list[dict]]] = {}
    for row in samples:
        by_phase.setdefault(row.get("phase", "unphased"), {}).setdefault(row.get("gpu", 0), []).append(row)
    durations: dict[str, float] = {}
    counters: dict[str, dict[str, dict[str, float]]] = {}   # phase -> gpu -> counter -> delta
    edges: dict[str, dict[str, list[dict]]] = {}             # phase -> gpu -> boundary reads
    for p in phases or []:
        if p.get("end") is not None:
            durations[p["name"]] = durations.get(p["name"], 0.0) + p["end"] - p["start"]
        start, end = p.get("counters_start") or {}, p.get("counters_end") or {}
        for gpu in set(start) | set(end):
            edges.setdefault(p["name"], {}).setdefault(str(gpu), []).extend(
                x for x in (start.get(gpu), end.get(gpu)) if x)
            if gpu not in start or gpu not in end:
                continue
            for field in _COUNTERS:
                d = _delta(end[gpu].get(field), start[gpu].get(field))
                if d is not None:
                    acc = counters.setdefault(p["name"], {}).setdefault(str(gpu), {})
                    acc[field] = acc.get(field, 0) + d
    result: dict[str, Any] = {"phases": {}}
    for name in sorted(set(by_phase) | set(durations)):
        gpus = {}
        rows_by_gpu = {str(g): rows for g, rows in by_phase.get(name, {}).items()}
        for gpu in sorted(set(rows_by_gpu) | set(counters.get(name, {})), key=lambda g: (len(g), g)):
            rows = rows_by_gpu.get(gpu, [])
            stats: dict[str, Any] = {"n": len(rows)}
            for field in NUMERIC_FIELDS:
                vals = [r[field] for r in rows if r.get(field) is not None]
                if not vals:
                    vals = [e[field] for e in edges.get(name, {}).get(gpu, []) if e.get(field) is not None]
                stats[field] = {"mean": common.mean(vals), "p95": common.percentile(vals, 95)} if vals else None
            measured = counters.get(name, {}).get(gpu, {})
            for field in _COUNTERS:
                if field in measured:
                    value = measured[field]
                else:
                    vals = [r[field] for r in rows if r.get(field) is not None]
                    value = (max(vals) - min(vals)) if vals else None
                stats[field.replace("_delta", "")] = value
            masks = [r["clock_event_reasons"] for r in rows if r.get("clock_event_reasons") is not None]
            union = 0
            for m in masks:
                union |= m
            stats["clock_event_reasons"] = decode_reasons(union)
            stats["throttled_fraction"] = (
                sum(1 for m in masks if m & ~BENIGN_REASONS) / len(masks) if masks else None
            )
            gpus[gpu] = stats
        result["phases"][name] = {"duration_s": durations.get(name), "gpus": gpus}
    return result


# ------------------------------------------------------------------ DCGM via Prometheus

# quantities (dcgm_series.FIELDS) read from the exporter, each by its classic and its DCGM 4.7 name
DCGM_SERIES = ("gpu_util_pct", "gr_engine_active", "sm_active", "power_w", "sm_clock_mhz")


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


def dcgm_query(quantity: str, selector: str = "") -> str:
    """A PromQL selector for both names of a quantity (an exporter writes one set): ``{__name__=~"A|B",...}``."""
    names = "|".join(name for name, _ in dcgm_series.FIELDS[quantity])
    return "{" + f'__name__=~"{names}"' + (f",{selector}" if selector else "") + "}"


def dcgm_phase_summary(url: str, phases: list[dict], series: Iterable[str] = DCGM_SERIES,
                       step: float = 1.0, selector: str = "") -> dict:
    """Mean and p95 per phase, quantity and GPU (key: UUID, else gpu index), in gpuproof's units.

    Each quantity is asked for by its classic and its DCGM 4.7 name (dcgm-exporter 4.9 renamed them and changed
    their units: utilization 0-1, memory in bytes, clocks in Hz); values are brought to gpuproof's unit
    (``dcgm_series.FIELDS``), and each GPU keeps the name the exporter wrote and its node from either spelling of
    the host label (``Hostname`` up to 4.5.3-4.8.2, ``hostname`` since). ``selector`` is added inside the braces,
    e.g. ``hostname="node-a"``. A quantity the exporter does not publish is left out; an unreachable Prometheus
    raises.
    """
    out: dict[str, Any] = {}
    for p in phases:
        if p.get("end") is None:
            continue
        per_field: dict[str, Any] = {}
        for quantity in series:
            for s in read_prometheus_range(url, dcgm_query(quantity, selector), p["start"], p["end"], step):
                labels = s["metric"]
                name = labels.get("__name__", "")
                factor = dcgm_series.BY_NAME[name][1] if name in dcgm_series.BY_NAME else 1.0
                vals = [v * factor for _, v in s["values"] if not dcgm_series.blank(v)]
                if not vals:
                    continue
                key = dcgm_series.label(labels, "uuid") or labels.get("gpu") or "?"
                per_field.setdefault(quantity, {})[key] = {
                    "mean": common.mean(vals), "p95": common.percentile(vals, 95), "n": len(vals),
                    "node": dcgm_series.label(labels, "host") or "", "name": name,
                    "host_label": next((k for k in dcgm_series.LABELS["host"] if k in labels), ""),
                }
        out[p["name"]] = per_field
    return out


def dcgm_exporter(summary: dict) -> dict:
    """What the series of :func:`dcgm_phase_summary` say of the exporter that wrote them (its name set, its host
    label's spelling, the releases those fit: ``dcgm_series.flavour``), to keep beside the records."""
    stats = [s for fields in (summary or {}).values() for per_gpu in fields.values() for s in per_gpu.values()]
    return dcgm_series.flavour_of({s.get("name", "") for s in stats}, {s["host_label"] for s in stats
                                                                         if s.get("host_label")})


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

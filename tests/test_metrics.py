"""The NVML sampler (gpuproof.bench.metrics = workloads/nvml_sampler.py): no-GPU path, the read
path against an in-memory NVML double, phase statistics and records (DCGM via Prometheus:
tests/test_dcgm_series.py)."""

import threading
import time
from types import SimpleNamespace

import pytest

from gpuproof.bench import metrics
from gpuproof.results import RunDir


def wait_for(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class FakeNVML:
    """Just the NVML calls the sampler makes, with values that change per call.

    A test-only stand-in for the pynvml module, injected with ``Sampler(nvml=...)``.
    ``burn_us``: CPU microseconds a call of that name burns (to test the cost accounting).
    """

    NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_FI_DEV_ECC_SBE_VOL_TOTAL = 3
    NVML_FI_DEV_ECC_DBE_VOL_TOTAL = 4
    NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION = 83
    NVML_FI_DEV_POWER_INSTANT = 186

    class NotSupported(Exception):
        pass

    def __init__(self, n=2, unsupported=(), burn_us=None):
        self.n = n
        self.unsupported = set(unsupported)
        self.burn_us = dict(burn_us or {})
        self.calls = {}
        self.lock = threading.Lock()

    def _count(self, name, handle):
        if name in self.unsupported:
            raise self.NotSupported(name)
        if name in self.burn_us:
            c0 = time.thread_time()
            while time.thread_time() - c0 < self.burn_us[name] / 1e6:
                pass
        with self.lock:
            k = (name, handle)
            self.calls[k] = self.calls.get(k, 0) + 1
            return self.calls[k]

    def total(self, name):
        return sum(v for (n, _), v in self.calls.items() if n == name)

    def nvmlDeviceGetFieldValues(self, h, ids):
        self._count("fields", h)
        out = []
        for i in ids:
            if i == self.NVML_FI_DEV_POWER_INSTANT:
                v = self.nvmlDeviceGetPowerUsage(h)
            elif i == self.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION:
                v = self.nvmlDeviceGetTotalEnergyConsumption(h)
            else:
                v = self.nvmlDeviceGetTotalEccErrors(h, 0 if i == self.NVML_FI_DEV_ECC_SBE_VOL_TOTAL else 1, 0)
            out.append(SimpleNamespace(fieldId=i, nvmlReturn=0, valueType=3, value=SimpleNamespace(ullVal=v)))
        return out

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetCount(self):
        return self.n

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-{h:08d}"

    def nvmlDeviceGetName(self, h):
        return b"Fake GPU"

    def nvmlDeviceGetUtilizationRates(self, h):
        self._count("util", h)
        return SimpleNamespace(gpu=90 + h, memory=40)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=2 * 2**30, total=80 * 2**30, free=78 * 2**30)

    def nvmlDeviceGetPowerUsage(self, h):
        self._count("power", h)
        return 300_000  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, h):
        return 1_000_000 + 500 * self._count("energy", h)  # mJ, +0.5 J per reading

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 60

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x004 if h == 1 else 0x001  # gpu 1 power capped, gpu 0 idle

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return self._count(f"ecc{kind}", h) - 1 if kind == 0 else 0


def test_no_gpu_records_nothing_and_says_so():
    s = metrics.Sampler(hz=10)
    if s.available:
        pytest.skip("this host has a GPU that NVML sees")
    s.start()
    with s.phase("work"):
        pass
    s.stop()
    summary = s.summary()
    assert summary["available"] is False
    assert summary["reason"]  # e.g. "NVML unavailable: NVML Shared Library Not Found"
    assert summary["n_samples"] == 0 and s.samples == [] and s.ticks == 0
    assert s._thread is None  # no thread was started
    cost = summary["sampler_cost"]  # the cost field is there, and says nothing was spent and why
    assert cost["thread_cpu_s"] == 0.0 and cost["ticks"] == 0 and summary["reason"] in cost["note"]
    assert metrics.to_records(summary, benchmark="matmul") == []
    assert metrics.unavailable_reason(summary) == summary["reason"]


def test_null_sampler_when_turned_off():
    s = metrics.make_sampler(0)
    with s.start().phase("x"):
        pass
    assert s.stop().summary()["available"] is False
    assert "turned off" in s.summary()["reason"]
    assert s.summary()["sampler_cost"]["thread_cpu_s"] == 0.0


def test_sampler_reads_every_field_per_phase():
    fake = FakeNVML(n=2)
    s = metrics.Sampler(hz=100, nvml=fake)
    assert s.available and [d.uuid for d in s.devices] == ["GPU-00000000", "GPU-00000001"]
    s.start()
    with s.phase("a"):
        wait_for(lambda: len([r for r in s.samples if r["phase"] == "a"]) >= 6, what="6 samples in phase a")
    with s.phase("b"):
        wait_for(lambda: len([r for r in s.samples if r["phase"] == "b"]) >= 6, what="6 samples in phase b")
    s.stop()
    row = s.samples[-1]
    for field in ("gpu_util_pct", "mem_util_pct", "mem_used_mib", "power_w", "temp_c",
                  "sm_clock_mhz", "clock_event_reasons", "ts", "phase", "gpu", "uuid"):
        assert field in row
    for slow in ("energy_j", "ecc_corrected_delta", "ecc_uncorrected_delta"):
        assert slow not in row  # slow counters: phase boundaries only
    assert row["power_w"] == 300.0 and row["mem_used_mib"] == 2048.0 and row["sm_clock_mhz"] == 1980
    summary = s.summary()
    assert summary["available"] and summary["n_samples"] == len(s.samples) and summary["ticks"] >= 6
    assert summary["sampler_cpu_seconds"] == round(s.cpu_seconds, 6) and s.cpu_seconds > 0
    assert summary["devices"][0]["max_sm_clock_mhz"] == 1980
    assert summary["sampler_cost"]["ticks"] == summary["ticks"] and summary["sampler_cost"]["thread_cpu_s"] > 0
    a = summary["phases"]["a"]
    assert a["duration_s"] > 0
    g1 = a["gpus"]["1"]
    assert g1["gpu_util_pct"]["mean"] == 91 and g1["gpu_util_pct"]["p95"] == 91
    assert g1["clock_event_reasons"] == ["sw_power_cap"] and g1["throttled_fraction"] == 1.0
    g0 = a["gpus"]["0"]
    assert g0["clock_event_reasons"] == ["gpu_idle"] and g0["throttled_fraction"] == 0.0
    assert g0["energy_j"] > 0  # energy grows 0.5 J per reading
    assert g0["ecc_corrected"] >= 1 and g0["ecc_uncorrected"] == 0

    records = metrics.to_records(summary, benchmark="matmul", node="n1", product="P")
    names = {r.metric for r in records}
    assert {"gpu_util_pct_mean", "gpu_util_pct_p95", "power_w_mean", "sm_clock_mhz_p95", "energy_j",
            "ecc_corrected", "throttled_fraction"} <= names
    assert all(r.benchmark == "utilization" and r.parameters["of"] == "matmul" for r in records)
    assert {"a", "b"} <= {r.parameters["phase"] for r in records if "phase" in r.parameters}
    cost = {r.metric: r for r in records if r.metric.startswith("sampler_")}
    assert set(cost) == {"sampler_cpu_us_per_tick", "sampler_pct_of_core_per_gpu", "sampler_cpu_s"}
    assert cost["sampler_pct_of_core_per_gpu"].parameters["gpus"] == 2


def test_slow_counters_only_at_phase_boundaries():
    """Energy and ECC are read at start, at each phase's start and end, and at stop: never per tick."""
    fake = FakeNVML(n=1)
    s = metrics.Sampler(hz=100, nvml=fake)
    base = (fake.total("energy"), fake.total("ecc0"))  # the baseline read when the device is opened
    assert base == (1, 1)
    for _ in range(5):
        s.tick()
    assert (fake.total("energy"), fake.total("ecc0")) == base and fake.total("util") == 5
    with s.phase("p"):       # boundary read at the phase start ...
        for _ in range(7):
            s.tick()
    assert fake.total("energy") == 3 and fake.total("ecc0") == 3  # ... and at its end
    assert fake.total("util") == 12 and fake.total("power") == 12  # power: in the per-tick field batch
    summary = s.summary()
    g = summary["phases"]["p"]["gpus"]["0"]
    assert g["n"] == 7
    assert g["energy_j"] == pytest.approx(0.5)   # one reading apart: +500 mJ
    assert g["ecc_corrected"] == 1 and g["ecc_uncorrected"] == 0
    assert summary["sampler_cost"]["boundary_reads"] == 2


def test_boundary_fields_fall_back_to_single_calls():
    fake = FakeNVML(n=1, unsupported={"fields"})
    s = metrics.Sampler(hz=100, nvml=fake)
    s.tick()
    assert s.samples[0]["power_w"] == 300.0  # nvmlDeviceGetPowerUsage instead of the field batch
    with s.phase("p"):
        s.tick()
    assert s.summary()["phases"]["p"]["gpus"]["0"]["energy_j"] == pytest.approx(0.5)


def test_tick_logic_fixed_rate_and_cost_accounting():
    """The real loop at 50 Hz over a stand-in NVML whose utilization call burns 300 us of CPU."""
    fake = FakeNVML(n=2, burn_us={"util": 300})
    s = metrics.Sampler(hz=50, nvml=fake, budget_pct=100.0)  # budget big enough: nothing moved
    s.start()
    with s.phase("w"):
        wait_for(lambda: s.ticks >= 10, what="10 ticks")
    s.stop()
    cost = s.summary()["sampler_cost"]
    assert cost["ticks"] == s.ticks >= 10 and cost["moved_to_boundaries"] == {}
    assert cost["cpu_us_per_tick"] == pytest.approx(cost["thread_cpu_s"] / cost["ticks"] * 1e6, rel=1e-3)
    assert cost["read_cpu_us_per_tick"] >= 2 * 300 * 0.9  # two GPUs, one burning read each
    assert cost["read_cpu_us"]["util"] >= 300 * 0.9
    assert cost["pct_of_core_per_gpu"] == pytest.approx(cost["pct_of_core"] / 2)
    assert cost["pct_of_core"] == pytest.approx(cost["thread_cpu_s"] / cost["wall_s"] * 100, rel=1e-3)
    assert cost["boundary_reads"] == 4 and cost["total_cpu_s"] >= cost["thread_cpu_s"]
    # fixed grid: about 50 ticks per second of wall time, never more
    assert s.ticks <= cost["wall_s"] * 50 + 2


def test_reads_over_budget_move_to_phase_boundaries():
    """1% of a core at 10 Hz is 1 ms per tick per GPU: a 3 ms read is moved off the tick."""
    fake = FakeNVML(n=1, burn_us={"util": 3000})
    s = metrics.Sampler(hz=10, nvml=fake, calibration_ticks=2)
    s.tick()
    s.tick()
    dev = s.devices[0]
    assert set(dev.demoted) == {"util"} and dev.demoted["util"] >= 3000 * 0.9
    assert "util" not in dev.tick_readers and "util" in dev.boundary_readers
    with s.phase("p"):
        s.tick()
    assert "gpu_util_pct" not in s.samples[-1] and s.samples[-1]["power_w"] == 300.0
    summary = s.summary()
    assert summary["phases"]["p"]["gpus"]["0"]["gpu_util_pct"]["mean"] == 90  # from the boundary reads
    assert set(summary["sampler_cost"]["moved_to_boundaries"]) == {"util"}


def test_cost_summary_by_hand():
    from gpuproof.bench.workloads import import_workload

    cost = import_workload("nvml_sampler")._cost_summary(
        available=True, reason=None, hz=10.0, ndev=2, thread_cpu_s=0.05, ticks=100, tick_cpu_s=0.03,
        wall_s=10.0, boundary_reads=4, boundary_cpu_s=0.002, budget_pct=1.0)
    # 0.05 s / 100 ticks = 500 us per tick; 0.05 s / 10 s = 0.5 % of a core, 0.25 % per GPU
    assert cost["cpu_us_per_tick"] == pytest.approx(500.0)
    assert cost["read_cpu_us_per_tick"] == pytest.approx(300.0)
    assert cost["pct_of_core"] == pytest.approx(0.5) and cost["pct_of_core_per_gpu"] == pytest.approx(0.25)
    assert cost["within_budget"] is True and cost["total_cpu_s"] == pytest.approx(0.052)


def test_unsupported_fields_are_none_and_not_asked_again():
    fake = FakeNVML(n=1, unsupported={"util"})
    s = metrics.Sampler(hz=100, nvml=fake)
    s.tick()
    s.tick()
    assert s.samples[0]["gpu_util_pct"] is None and s.samples[0]["power_w"] == 300.0
    assert "util" in s.devices[0].unsupported


def test_summarize_by_hand():
    rows = [{"phase": "p", "gpu": 0, "gpu_util_pct": v, "power_w": 100.0 + v, "energy_j": e,
             "clock_event_reasons": r, "ecc_corrected_delta": 0, "ecc_uncorrected_delta": 0}
            for v, e, r in [(10, 0.0, 0), (20, 1.0, 0x040), (30, 2.5, 0), (40, 4.0, 0x001)]]
    out = metrics.summarize(rows, [{"name": "p", "start": 0.0, "end": 2.0}])
    g = out["phases"]["p"]["gpus"]["0"]
    assert out["phases"]["p"]["duration_s"] == 2.0
    assert g["gpu_util_pct"]["mean"] == 25.0
    assert g["gpu_util_pct"]["p95"] == pytest.approx(38.5)  # 30 + 0.85 * (40 - 30)
    assert g["energy_j"] == 4.0
    assert g["clock_event_reasons"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert g["throttled_fraction"] == 0.25
    assert g["temp_c"] is None
    assert metrics.decode_reasons(0x1004) == ["sw_power_cap", "other_0x1000"]


def test_samples_go_to_the_run_dir(tmp_path):
    fake = FakeNVML(n=1)
    s = metrics.Sampler(hz=100, nvml=fake)
    s.tick()
    rd = RunDir.create(tmp_path, "r1")
    rd.add_samples(metrics.sample_rows(s.samples, benchmark="matmul", node="n", product="P"))
    rows = rd.samples()
    assert rows[0]["benchmark"] == "matmul" and rows[0]["run_id"] == "r1" and rows[0]["gpu_util_pct"] == 90

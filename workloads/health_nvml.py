"""health.py's NVML side: every health reading of every GPU NVML lists (:class:`NvmlReader`), the load
watcher that reads clocks and PCIe under the burst, and the XID event watcher."""

from __future__ import annotations

import ctypes
import threading
import time

import workload_common as common
from health_host import normalize_bus_id, parse_xid_lines
from health_rules import NVLINK_ERROR_COUNTERS, _missing

# --------------------------------------------------------------------------- NVML readings


def _handle_address(handle) -> int | None:
    """The C pointer behind an NVML device handle: the same for a GPU's handle however it was obtained."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


class NvmlReader:
    """Reads the health fields of every GPU NVML lists (MIG parents included) into plain dicts.

    A GPU whose handle NVML refuses is kept, with the reason; a call answering "GPU is lost" (or
    "reset required") marks the reading ``gone``. Each GPU's identity (UUID, name, PCI bus) is
    read first: NVML still answers it for a GPU that is about to be found lost.
    """

    def __init__(self, nvml):
        self.nvml = nvml
        self.readings: list[dict] = []
        self.handles: list = []
        for i in range(nvml.nvmlDeviceGetCount()):
            r = {"index": i, "unavailable": {}}
            h = self._get(r, "handle", lambda i=i: nvml.nvmlDeviceGetHandleByIndex(i))
            if h is None:
                r["reason"] = f"no NVML handle for GPU {i}: {r['unavailable']['handle']}"
            else:
                r["uuid"] = self._get(r, "uuid", lambda h=h: common.nvml_str(nvml.nvmlDeviceGetUUID(h)))
                r["name"] = self._get(r, "name", lambda h=h: common.nvml_str(nvml.nvmlDeviceGetName(h)))
                bus = self._get(r, "pci_bus_id", lambda h=h: common.nvml_str(nvml.nvmlDeviceGetPciInfo(h).busId))
                r["pci_bus_id"] = normalize_bus_id(bus) if bus else None
            self.readings.append(r)
            self.handles.append(h)
        self._reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)

    def live(self):
        """(reading, handle) of every GPU NVML gave a handle for."""
        return [(r, h) for r, h in zip(self.readings, self.handles) if h is not None]

    def index_of(self, handle) -> int | None:
        addr = _handle_address(handle)
        return next((r["index"] for r, h in self.live() if addr is not None and _handle_address(h) == addr), None)

    @staticmethod
    def _get(reading: dict, field: str, fn):
        try:
            return fn()
        except Exception as exc:   # NotSupported, NoPermission, GpuIsLost, a symbol this nvidia-ml-py lacks ...
            reading["unavailable"][field] = str(exc) if isinstance(exc, AttributeError) else f"NVML: {exc}"
            gone = common.nvml_gone(exc)
            if gone and not reading.get("gone"):
                reading["gone"] = f"{gone} (reading {field})"
            return None

    def _fn(self, name: str):
        """An nvidia-ml-py function or struct, or AttributeError naming what this version lacks."""
        found = getattr(self.nvml, name, None)
        if found is None:
            raise AttributeError(f"this nvidia-ml-py ({getattr(self.nvml, '__version__', 'unknown version')}) "
                                 f"has no {name}")
        return found

    def read_static(self) -> None:
        n = self.nvml
        for r, h in self.live():
            g = lambda field, fn: r.__setitem__(field, self._get(r, field, fn))  # noqa: E731
            g("ecc_mode", lambda: bool(n.nvmlDeviceGetEccMode(h)[0]))
            for kind, et in (("corrected", n.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                             ("uncorrected", n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                for counter, ct in (("volatile", n.NVML_VOLATILE_ECC), ("aggregate", n.NVML_AGGREGATE_ECC)):
                    g(f"ecc_{counter}_{kind}", lambda et=et, ct=ct: int(n.nvmlDeviceGetTotalEccErrors(h, et, ct)))
            g("sram_ecc", lambda: self.sram_ecc(h))
            g("retired_pages_sbe", lambda: len(n.nvmlDeviceGetRetiredPages(
                h, n.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)))
            g("retired_pages_dbe", lambda: len(n.nvmlDeviceGetRetiredPages(
                h, n.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)))
            g("retired_pages_pending", lambda: bool(n.nvmlDeviceGetRetiredPagesPendingStatus(h)))
            rows = self._get(r, "remapped_rows", lambda: n.nvmlDeviceGetRemappedRows(h))
            for i, key in enumerate(("remapped_rows_corrected", "remapped_rows_uncorrected",
                                     "remapped_rows_pending", "remapped_rows_failure")):
                r[key] = None if rows is None else (bool(rows[i]) if i >= 2 else int(rows[i]))
                if rows is None:
                    r["unavailable"][key] = r["unavailable"]["remapped_rows"]
            g("pcie_max_gen", lambda: int(n.nvmlDeviceGetMaxPcieLinkGeneration(h)))
            g("pcie_max_width", lambda: int(n.nvmlDeviceGetMaxPcieLinkWidth(h)))
            g("pcie_gpu_max_gen", lambda: int(n.nvmlDeviceGetGpuMaxPcieLinkGeneration(h)))
            g("pcie_gen_idle", lambda: int(n.nvmlDeviceGetCurrPcieLinkGeneration(h)))
            g("pcie_width_idle", lambda: int(n.nvmlDeviceGetCurrPcieLinkWidth(h)))
            g("persistence_mode", lambda: n.nvmlDeviceGetPersistenceMode(h) == n.NVML_FEATURE_ENABLED)
            g("power_limit_w", lambda: n.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3)
            g("power_default_w", lambda: n.nvmlDeviceGetPowerManagementDefaultLimit(h) / 1e3)
            r["nvlink"] = self._nvlink(r, h)
            g("fabric", lambda: self.fabric(h))
        self.read_nvlink_errors("nvlink_errors_start")

    def sram_ecc(self, h) -> dict:
        """SRAM ECC counters and NVML's threshold flag (nvmlDeviceGetSramEccErrorStatus)."""
        s = self._fn("c_nvmlEccSramErrorStatus_v1_t")()
        self._fn("nvmlDeviceGetSramEccErrorStatus")(h, ctypes.byref(s))
        return {"volatile_uncorrected_parity": int(s.volatileUncParity),
                "volatile_uncorrected_secded": int(s.volatileUncSecDed), "volatile_corrected": int(s.volatileCor),
                "aggregate_uncorrected": int(s.aggregateUncParity + s.aggregateUncSecDed),
                "aggregate_corrected": int(s.aggregateCor), "threshold_exceeded": bool(s.bThresholdExceeded)}

    def fabric(self, h) -> dict:
        """NVLink fabric registration and health (nvmlDeviceGetGpuFabricInfoV; v3, else v2 without a summary)."""
        get = self._fn("nvmlDeviceGetGpuFabricInfoV")
        info = self._fn("c_nvmlGpuFabricInfo_v3_t")()
        try:
            get(h, ctypes.byref(info))
        except Exception as exc:
            if getattr(exc, "value", None) != getattr(self.nvml, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", 25):
                raise
            info = self._fn("c_nvmlGpuFabricInfo_v2_t")()     # an older driver
            get(h, ctypes.byref(info))
        return {"state": int(info.state), "status": int(info.status), "health_mask": int(info.healthMask),
                "health_summary": int(getattr(info, "healthSummary", 0)) or None}

    def _nvlink(self, reading: dict, h) -> list[dict] | None:
        """State of each NVLink link the GPU has: NVML's link count (NVML_FI_DEV_NVLINK_LINK_COUNT) when it
        gives one (a T4 has none, an A100 12), else every link index NVML answers for."""
        n = self.nvml
        links, first_error = [], None
        count = self._get(reading, "nvlink_link_count", lambda: common.nvml_field(
            n.nvmlDeviceGetFieldValues(h, [self._fn("NVML_FI_DEV_NVLINK_LINK_COUNT")])[0]))
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18) if count is None else count):
            try:
                state = n.nvmlDeviceGetNvLinkState(h, link)
            except Exception as exc:   # NotSupported / InvalidArgument: no such link
                first_error = first_error or exc
                continue
            links.append({"link": link, "active": bool(state == n.NVML_FEATURE_ENABLED)})
        if not links and first_error is not None and not isinstance(
                first_error, getattr(n, "NVMLError_NotSupported", ())) and \
                not isinstance(first_error, getattr(n, "NVMLError_InvalidArgument", ())):
            reading["unavailable"]["nvlink"] = f"NVML: {first_error}"
            return None
        return links

    def read_nvlink_errors(self, field: str) -> None:
        """NVLink data-link error counters of every active link into ``field`` (link -> counter -> count)."""
        def counts(h, active):
            get = self._fn("nvmlDeviceGetNvLinkErrorCounter")
            return {str(link): {c: int(get(h, link, i)) for i, c in enumerate(NVLINK_ERROR_COUNTERS)}
                    for link in active}

        for r, h in self.live():
            active = [link["link"] for link in r.get("nvlink") or [] if link["active"]]
            if active:
                r[field] = self._get(r, field, lambda: counts(h, active))
            else:
                r[field] = None
                r["unavailable"][field] = _missing(r, "nvlink") or "this GPU reports no active NVLink link"

    def sample_load(self) -> list[dict]:
        """One reading of clock-event reasons, PCIe generation and width (under load)."""
        n = self.nvml
        rows = []
        for h in self.handles:
            row = {}
            for key, fn in (("reasons", self._reasons_fn), ("gen", n.nvmlDeviceGetCurrPcieLinkGeneration),
                            ("width", n.nvmlDeviceGetCurrPcieLinkWidth)):
                try:
                    row[key] = int(fn(h)) if fn and h is not None else None
                except Exception as exc:
                    row[key], row[f"{key}_error"] = None, f"NVML: {exc}"
            rows.append(row)
        return rows


class LoadWatcher:
    """Samples :meth:`NvmlReader.sample_load` at ``hz`` in a thread; folds the samples into readings.

    ``on_gpu``: whether the GPUs are loaded meanwhile (False without CUDA: the readings are idle ones)."""

    def __init__(self, reader: NvmlReader, hz: float = 10.0, on_gpu: bool = True):
        self.reader, self.interval, self.on_gpu = reader, 1.0 / hz, on_gpu
        self.samples: list[list[dict]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="health-load-watch", daemon=True)

    def _loop(self) -> None:
        while True:
            self.samples.append(self.reader.sample_load())
            if self._stop.wait(self.interval):
                break

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        self.fold()

    def fold(self) -> None:
        for i, r in enumerate(self.reader.readings):
            rows = [s[i] for s in self.samples if i < len(s)]
            r["load_samples"] = len(rows)
            r["load_on_gpu"] = self.on_gpu
            for key, field, combine in (("reasons", "clock_event_reasons_load", None),
                                        ("gen", "pcie_gen_load", max), ("width", "pcie_width_load", max)):
                vals = [row[key] for row in rows if row.get(key) is not None]
                if not self.on_gpu and key != "reasons":
                    vals = []      # PCIe read at idle stays the idle reading (links downtrain at idle)
                if not vals:
                    r[field] = None
                    err = next((row.get(f"{key}_error") for row in rows if row.get(f"{key}_error")), None)
                    r["unavailable"][field] = err or ("no GPU load (no CUDA device)" if not self.on_gpu else
                                                      "no sample during the load")
                elif combine is None:
                    mask = 0
                    for v in vals:
                        mask |= v
                    r[field] = mask
                else:
                    r[field] = combine(vals)


class XidWatcher:
    """XID critical-error events from an NVML event set, polled in a thread while the workload runs.

    Each event is given to the GPU whose handle it carries (by the handle's address, then by UUID:
    a lost GPU no longer answers for its UUID). The thread waits at least once and drains what is
    pending when it is stopped, so an XID that was raised before the run is never missed."""

    def __init__(self, nvml, reader: NvmlReader, poll_ms: int = 200):
        self.nvml, self.reader, self.poll_ms = nvml, reader, poll_ms
        self.events: list[dict] = []
        self.registered: dict[int, str | None] = {}   # index -> None (ok) or why not
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = None
        self._set = None
        try:
            self._set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            self.error = f"NVML event set: {exc}"
            return
        for r, h in reader.live():
            try:
                nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, self._set)
                self.registered[r["index"]] = None
            except Exception as exc:
                self.registered[r["index"]] = f"NVML XID events: {exc}"

    def __enter__(self):
        if self._set is not None and any(v is None for v in self.registered.values()):
            self._thread = threading.Thread(target=self._loop, name="health-xid-watch", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        n = self.nvml
        timeout_code = getattr(n, "NVML_ERROR_TIMEOUT", 10)
        while True:
            stopping = self._stop.is_set()
            try:
                data = n.nvmlEventSetWait_v2(self._set, 0 if stopping else self.poll_ms)
            except Exception as exc:
                if getattr(exc, "value", None) != timeout_code:
                    self.error = f"NVML event wait: {exc}"
                    return
                if stopping:
                    return
                continue
            try:
                uuid = common.nvml_str(n.nvmlDeviceGetUUID(data.device))
            except Exception:    # a lost GPU: its handle still says which one it is
                uuid = None
            self.events.append({"xid": int(data.eventData), "gpu": self.reader.index_of(data.device), "uuid": uuid,
                                "time": time.time(), "gpu_instance": int(getattr(data, "gpuInstanceId", 0) or 0)})

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 + self.poll_ms / 1e3)
        if self._set is not None:
            try:
                self.nvml.nvmlEventSetFree(self._set)
            except Exception:
                pass
        self.fold()

    def fold(self) -> None:
        for r in self.reader.readings:
            why = self.error or self.registered.get(r["index"], "not registered")
            if why:
                r["xid_events"] = None
                r["unavailable"]["xid_events"] = why
            else:
                r["xid_events"] = [e for e in self.events if _event_is_for(e, r)]


def _event_is_for(event: dict, reading: dict) -> bool:
    if event.get("gpu") is not None:
        return event["gpu"] == reading["index"]
    return event.get("uuid") in (None, reading.get("uuid"))     # an event NVML names no GPU for: every GPU's


def fold_kernel_xids(readings: list[dict], text: str | None, why: str | None) -> None:
    """Attach kernel-log XIDs to the GPU with the same PCI bus id."""
    events = parse_xid_lines(text) if text is not None else None
    for r in readings:
        if events is None:
            r["xid_log"] = None
            r["unavailable"]["xid_log"] = why or "kernel log not read"
        else:
            r["xid_log"] = [e for e in events if e["pci"] == r.get("pci_bus_id")]

"""GPU health inside a pod (or on this host): NVML health readings, a short load, copy bandwidth, DCGM.

NVML is read whenever the library loads, whatever torch sees: the GPUs are enumerated through
NVML, so a GPU that CUDA cannot use (an image whose CUDA is newer than the driver, a GPU
fallen off the bus) is still checked. CUDA is needed only for the parts that compute (the load
under which throttling and PCIe are read, the copies); without it those items say so.

Per GPU NVML lists:

- ``gpu_reachable``: NVML answers for the GPU (a lost GPU, fallen off the bus or needing a
  reset, fails here; its other readings are then not trusted);
- XID critical errors seen during the run (an NVML event set, polled while the workload
  runs) and XIDs since boot from the kernel log when it is readable (``/dev/kmsg``, then
  ``dmesg``; usually not readable in a pod, then reported "unavailable");
- ECC mode and volatile / aggregate corrected and uncorrected ECC error counts; SRAM ECC
  (uncorrectable SRAM errors, NVML's SRAM error threshold);
- retired pages (count, pending) and remapped rows (pending, failure, uncorrectable);
- clock-event (throttle) reasons seen DURING a short matmul burst on every GPU (without CUDA
  the GPUs are idle, and the item says so);
- PCIe link generation and width read during that load, against the maximum this GPU
  and system support (links downtrain at idle, so an idle reading only warns);
- NVLink links up (state of every link NVML reports), NVLink data-link errors (replay,
  recovery, CRC) counted during the run, NVLink fabric health (NVSwitch / GB200 fabrics);
- persistence mode, the enforced power limit against the default;
- host-to-device and device-to-host copy bandwidth (pinned memory), and a GPU-to-GPU copy
  bandwidth matrix over all visible GPUs;
- ``dcgmi diag -r 1`` (``--dcgm-level 2`` for -r 2) when the image has DCGM;
- ``torch_errors``: a CUDA error raised by the load or a copy fails the run as an item
  (a sick GPU gives a verdict, not a traceback).

Every reading becomes an item ``{name, gpu, uuid, value, threshold, verdict, reason}`` with
verdict pass | warn | fail | unavailable. Where NVML answers Not Supported the item is
"unavailable" with that answer, never a pass. Thresholds are in :data:`THRESHOLDS` (each one
a command-line flag; the table is in workloads/README.md).

The evaluation is pure: :func:`evaluate_gpu` and friends take plain dicts of readings, so
faults can be fed as data. Only :class:`NvmlReader`, :class:`XidWatcher` and the torch
parts touch hardware. Without NVML every GPU item is "unavailable" with the reason, and the
copy-bandwidth code paths still run on CPU tensors.

Prints one JSON object on stdout; exit 0 when no item failed, 1 when one did.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time

import workload_common as common
from nvml_sampler import CLOCK_EVENT_REASONS, decode_reasons  # noqa: F401  (decode_reasons: used below)

# Clock-event ("throttle") reason bits and their decoding: the sampler's (one table for both).

# PCIe payload rate per lane in GB/s after line encoding, by generation.
PCIE_GBPS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

VERDICTS = ("pass", "warn", "fail", "unavailable")

# name -> (default, type, help). Each is a flag --<name with dashes>; README's table lists them.
THRESHOLDS: dict[str, tuple] = {
    "xid_fail": ("48,64,74,79,92,94,95,119,120", "ints",
                 "XIDs that fail (double-bit ECC, row-remap failure, NVLink, fallen off the bus, "
                 "ECC rate, contained/uncontained ECC, GSP); any other XID warns"),
    "ecc_volatile_uncorrected_max": (0, int, "volatile uncorrected ECC errors above this fail"),
    "ecc_volatile_corrected_max": (1000, int, "volatile corrected ECC errors above this warn"),
    "ecc_aggregate_uncorrected_max": (0, int, "aggregate (lifetime) uncorrected ECC errors above this warn"),
    "ecc_off": ("warn", "verdict", "verdict when ECC is switched off"),
    "retired_pages_max": (60, int, "retired pages above this fail (any retired page warns)"),
    "remapped_rows_uncorrected_max": (0, int, "rows remapped for uncorrectable errors above this warn"),
    "throttle_fail": ("hw_slowdown,sw_thermal_slowdown,hw_thermal_slowdown,hw_power_brake_slowdown", "names",
                      "clock-event reasons that fail when seen during the load (others, e.g. "
                      "sw_power_cap, are noted)"),
    "pcie_min_gen": (None, int, "PCIe generation expected under load (default: the maximum the GPU and "
                                "system support)"),
    "pcie_min_width": (None, int, "PCIe lanes expected under load (default: the maximum)"),
    "nvlink_down_max": (0, int, "NVLink links down above this fail"),
    "persistence_off": ("warn", "verdict", "verdict when persistence mode is off"),
    "power_limit_min_ratio": (0.95, float, "enforced power limit below this share of the default fails "
                                            "(--power-limit-low sets the verdict)"),
    "power_limit_low": ("fail", "verdict", "verdict when the enforced power limit is below --power-limit-min-ratio"),
    "nvlink_errors_max": (0, int, "NVLink data-link errors (replay, recovery, CRC) counted during the run "
                                  "above this fail"),
    "copy_min_gbps": (8.0, float, "host<->device copy bandwidth below this (GB/s) fails"),
    "copy_min_link_ratio": (0.5, float, "host<->device bandwidth below this share of the PCIe link's "
                                        "theoretical rate warns"),
    "p2p_min_gbps": (5.0, float, "GPU-to-GPU copy bandwidth below this (GB/s) fails"),
    "p2p_min_median_ratio": (0.5, float, "a GPU pair below this share of the node's median pair warns"),
}


def default_thresholds() -> dict:
    return {k: parse_threshold(k, v[0]) for k, v in THRESHOLDS.items()}


def resolve_thresholds(overrides: dict | None = None) -> dict:
    """The defaults with ``overrides`` (flag text or values) applied; ValueError for unknown names."""
    t = default_thresholds()
    for k, v in (overrides or {}).items():
        if k not in THRESHOLDS:
            raise ValueError(f"unknown threshold {k!r} (known: {', '.join(THRESHOLDS)})")
        t[k] = parse_threshold(k, v)
    return t


def parse_threshold(name: str, text):
    """A threshold from its flag text (or a value) to its value; ValueError when malformed."""
    kind = THRESHOLDS[name][1]
    if text is None:
        return None
    flag = f"--{name.replace('_', '-')}"
    if kind in ("ints", "names"):
        items = text if isinstance(text, (set, list, tuple)) else str(text).replace(" ", "").split(",")
        items = [str(x) for x in items if str(x)]
        if kind == "ints":
            try:
                return {int(x) for x in items}
            except ValueError:
                raise ValueError(f"{flag}: expected comma-separated integers, got {text!r}") from None
        unknown = set(items) - set(CLOCK_EVENT_REASONS.values())
        if unknown:
            raise ValueError(f"{flag}: unknown clock-event reasons {sorted(unknown)} "
                             f"(known: {', '.join(CLOCK_EVENT_REASONS.values())})")
        return set(items)
    if kind == "verdict":
        if text not in ("pass", "warn", "fail"):
            raise ValueError(f"{flag}: choose pass, warn or fail, not {text!r}")
        return text
    try:
        return kind(text)
    except (TypeError, ValueError):
        raise ValueError(f"{flag}: expected a number, got {text!r}") from None


# --------------------------------------------------------------------------- evaluation (pure)


def item(name: str, verdict: str, value=None, threshold=None, reason: str = "", gpu=None, uuid=None,
         unit: str = "", detail=None) -> dict:
    assert verdict in VERDICTS, verdict
    out = {"name": name, "gpu": gpu, "uuid": uuid, "value": value, "threshold": threshold, "verdict": verdict,
           "reason": reason, "unit": unit}
    if detail is not None:
        out["detail"] = detail
    return out


def _missing(reading: dict, *fields: str) -> str | None:
    """None when every field has a value, else why one is missing."""
    for f in fields:
        if reading.get(f) is None:
            why = (reading.get("unavailable") or {}).get(f) or reading.get("reason") or "not read"
            return f"{f}: {why}"
    return None


def _xid_items(name: str, events, reading: dict, field: str, t: dict, ctx: dict, source: str) -> dict:
    why = _missing(reading, field)
    if why:
        return item(name, "unavailable", reason=why, threshold="no XID", **ctx)
    xids = sorted({int(e["xid"]) for e in events})
    fatal = [x for x in xids if x in t["xid_fail"]]
    if fatal:
        return item(name, "fail", xids, f"none of {sorted(t['xid_fail'])}",
                    f"XID {', '.join(map(str, fatal))} {source} (fail list: {sorted(t['xid_fail'])})",
                    detail=events[:20], **ctx)
    if xids:
        return item(name, "warn", xids, f"none of {sorted(t['xid_fail'])}",
                    f"XID {', '.join(map(str, xids))} {source} (not in the fail list)", detail=events[:20], **ctx)
    return item(name, "pass", [], f"none of {sorted(t['xid_fail'])}", f"no XID {source}", **ctx)


def evaluate_gpu(reading: dict, thresholds: dict | None = None) -> list[dict]:
    """Items for one GPU from a plain dict of readings (see the keys below; None = not read).

    Keys: index, uuid, xid_events (list of {xid, ...} seen during the run), xid_log (list
    from the kernel log since boot), ecc_mode (bool), ecc_volatile_corrected,
    ecc_volatile_uncorrected, ecc_aggregate_corrected, ecc_aggregate_uncorrected,
    retired_pages_sbe, retired_pages_dbe, retired_pages_pending (bool),
    remapped_rows_corrected, remapped_rows_uncorrected, remapped_rows_pending,
    remapped_rows_failure (bools), clock_event_reasons_load (mask, union over the load),
    load_samples, pcie_gen_load, pcie_width_load, pcie_gen_idle, pcie_width_idle,
    pcie_max_gen, pcie_max_width, load_on_gpu (bool: the samples were taken under a GPU load),
    nvlink (list of {link, active}), nvlink_errors_start / nvlink_errors_end (link -> counter
    -> count, read before and after the run), fabric ({state, status, health_mask,
    health_summary}), sram_ecc (see :meth:`NvmlReader.sram_ecc`), persistence_mode (bool),
    power_limit_w, power_default_w, h2d_gbps, d2h_gbps, copy_device, gone (why NVML says the
    GPU is lost, when it does). ``unavailable`` maps a key to why it is missing; ``reason``
    applies to every key.
    """
    t = resolve_thresholds(thresholds)
    r = reading
    ctx = {"gpu": r.get("index"), "uuid": r.get("uuid")}
    out = [
        _reachable_item(r, ctx),
        _xid_items("xid_during_run", r.get("xid_events") or [], r, "xid_events", t, ctx,
                   "during the run (NVML events)"),
        _xid_items("xid_since_boot", r.get("xid_log") or [], r, "xid_log", t, ctx, "in the kernel log since boot"),
    ]
    # ECC
    why = _missing(r, "ecc_mode")
    if why:
        out.append(item("ecc_mode", "unavailable", reason=why, threshold="enabled", **ctx))
    elif r["ecc_mode"]:
        out.append(item("ecc_mode", "pass", True, "enabled", "ECC is on", **ctx))
    else:
        out.append(item("ecc_mode", t["ecc_off"], False, "enabled",
                        "ECC is off: memory errors are neither corrected nor counted", **ctx))
    for name, key, verdict_over in (
            ("ecc_volatile_uncorrected", "ecc_volatile_uncorrected_max", "fail"),
            ("ecc_volatile_corrected", "ecc_volatile_corrected_max", "warn"),
            ("ecc_aggregate_uncorrected", "ecc_aggregate_uncorrected_max", "warn")):
        limit = t[key]
        why = _missing(r, name)
        kind = name.replace("ecc_", "").replace("_", " ")
        if why:
            out.append(item(name, "unavailable", threshold=f"<= {limit}", reason=why, unit="errors", **ctx))
        elif r[name] > limit:
            out.append(item(name, verdict_over, r[name], f"<= {limit}",
                            f"{r[name]} {kind} ECC errors (more than {limit})", unit="errors", **ctx))
        else:
            out.append(item(name, "pass", r[name], f"<= {limit}", f"{r[name]} {kind} ECC errors",
                            unit="errors", **ctx))
    out.append(_sram_item(r, ctx))
    # retired pages (pre-Ampere) and remapped rows (Ampere and later)
    why = _missing(r, "retired_pages_pending")
    if why:
        out.append(item("retired_pages_pending", "unavailable", threshold=False, reason=why, **ctx))
    elif r["retired_pages_pending"]:
        out.append(item("retired_pages_pending", "fail", True, False,
                        "a page retirement is pending: the GPU needs a reset (or reboot) to retire it", **ctx))
    else:
        out.append(item("retired_pages_pending", "pass", False, False, "no page retirement pending", **ctx))
    why = _missing(r, "retired_pages_sbe", "retired_pages_dbe")
    limit = t["retired_pages_max"]
    if why:
        out.append(item("retired_pages", "unavailable", threshold=f"<= {limit}", reason=why, unit="pages", **ctx))
    else:
        n = r["retired_pages_sbe"] + r["retired_pages_dbe"]
        split = f"{r['retired_pages_sbe']} for multiple single-bit, {r['retired_pages_dbe']} for double-bit errors"
        verdict = "fail" if n > limit else "warn" if n > 0 else "pass"
        text = (f"{n} retired pages, more than {limit} ({split})" if verdict == "fail" else
                f"{n} retired pages ({split})" if n else "no retired pages")
        out.append(item("retired_pages", verdict, n, f"<= {limit}", text, unit="pages", **ctx))
    for name, text_bad, text_ok in (
            ("remapped_rows_pending", "a row remapping is pending: the GPU needs a reset to apply it",
             "no row remapping pending"),
            ("remapped_rows_failure", "row remapping failed: the GPU has run out of spare rows (RMA)",
             "no row-remapping failure")):
        why = _missing(r, name)
        if why:
            out.append(item(name, "unavailable", threshold=False, reason=why, **ctx))
        else:
            out.append(item(name, "fail" if r[name] else "pass", bool(r[name]), False,
                            text_bad if r[name] else text_ok, **ctx))
    why = _missing(r, "remapped_rows_uncorrected")
    limit = t["remapped_rows_uncorrected_max"]
    if why:
        out.append(item("remapped_rows_uncorrected", "unavailable", threshold=f"<= {limit}", reason=why,
                        unit="rows", **ctx))
    else:
        n = r["remapped_rows_uncorrected"]
        corr = r.get("remapped_rows_corrected")
        out.append(item("remapped_rows_uncorrected", "warn" if n > limit else "pass", n, f"<= {limit}",
                        f"{n} rows remapped for uncorrectable errors, {corr} for correctable ones", unit="rows",
                        **ctx))
    out.append(_throttle_item(r, t, ctx))
    out += _pcie_items(r, t, ctx)
    out += [_nvlink_item(r, t, ctx), _nvlink_errors_item(r, t, ctx), _fabric_item(r, ctx)]
    # persistence mode
    why = _missing(r, "persistence_mode")
    if why:
        out.append(item("persistence_mode", "unavailable", threshold="enabled", reason=why, **ctx))
    elif r["persistence_mode"]:
        out.append(item("persistence_mode", "pass", True, "enabled", "persistence mode is on", **ctx))
    else:
        out.append(item("persistence_mode", t["persistence_off"], False, "enabled",
                        "persistence mode is off: the driver unloads between jobs (slow starts, lost state)", **ctx))
    # power limit
    why = _missing(r, "power_limit_w", "power_default_w")
    ratio = t["power_limit_min_ratio"]
    if why:
        out.append(item("power_limit", "unavailable", threshold=f">= {ratio:.0%} of default", reason=why,
                        unit="W", **ctx))
    else:
        lim, dflt = r["power_limit_w"], r["power_default_w"]
        share = lim / dflt if dflt else None
        ok = share is None or share >= ratio
        out.append(item("power_limit", "pass" if ok else t["power_limit_low"], round(lim, 1),
                        f">= {ratio:.0%} of default",
                        f"enforced power limit {lim:.0f} W is {share:.0%} of the default {dflt:.0f} W"
                        if share is not None else f"enforced power limit {lim:.0f} W (no default known)",
                        unit="W", detail={"default_w": dflt}, **ctx))
    out += _copy_items(r, t, ctx)
    if r.get("gone"):   # a lost GPU's other answers (some NVML calls still answer from cache) are not trusted
        keep = ("gpu_reachable", "xid_during_run", "xid_since_boot")
        out = [i if i["name"] in keep else item(i["name"], "unavailable", threshold=i["threshold"], unit=i["unit"],
                                                 reason="the GPU is lost (see gpu_reachable): this reading is "
                                                        "not trusted", **ctx) for i in out]
    return out


def _reachable_item(r: dict, ctx: dict) -> dict:
    if r.get("gone"):
        return item("gpu_reachable", "fail", False, "NVML answers for the GPU",
                    f"{r['gone']}: the GPU fell off the bus or stopped answering; it needs a reset or a reboot",
                    **ctx)
    if r.get("index") is None:
        return item("gpu_reachable", "unavailable", threshold="NVML answers for the GPU",
                    reason=r.get("reason") or "not read", **ctx)
    if r["unavailable"].get("handle"):
        return item("gpu_reachable", "fail", False, "NVML answers for the GPU",
                    f"NVML counts this GPU but gives no handle for it ({r['unavailable']['handle']})", **ctx)
    return item("gpu_reachable", "pass", True, "NVML answers for the GPU", "NVML answers for this GPU", **ctx)


def _sram_item(r: dict, ctx: dict) -> dict:
    threshold = "NVML's SRAM error threshold not exceeded, no uncorrectable SRAM error"
    why = _missing(r, "sram_ecc")
    if why:
        return item("sram_ecc", "unavailable", threshold=threshold, reason=why, unit="errors", **ctx)
    s = r["sram_ecc"]
    parity, secded = s["volatile_uncorrected_parity"], s["volatile_uncorrected_secded"]
    unc = parity + secded
    counts = (f"{unc} uncorrectable ({parity} parity, {secded} SEC-DED), {s['volatile_corrected']} correctable "
              "since the driver loaded")
    if s["threshold_exceeded"]:
        return item("sram_ecc", "fail", unc, threshold,
                    f"SRAM ECC errors past NVML's threshold: {counts}; the GPU should be replaced", unit="errors",
                    detail=s, **ctx)
    if unc:
        return item("sram_ecc", "warn", unc, threshold, f"{counts} (below NVML's threshold)", unit="errors",
                    detail=s, **ctx)
    return item("sram_ecc", "pass", 0, threshold, f"no uncorrectable SRAM ECC error ({counts})", unit="errors",
                **ctx)


# NVML_NVLINK_ERROR_DL_* counters, in their NVML order
NVLINK_ERROR_COUNTERS = ("replay", "recovery", "crc_flit", "crc_data")


def _nvlink_errors_item(r: dict, t: dict, ctx: dict) -> dict:
    limit = t["nvlink_errors_max"]
    threshold = f"<= {limit} during the run"
    why = _missing(r, "nvlink_errors_start", "nvlink_errors_end")
    if why:
        return item("nvlink_errors", "unavailable", threshold=threshold, reason=why, unit="errors", **ctx)
    start, end = r["nvlink_errors_start"], r["nvlink_errors_end"]
    grew = {link: {c: end[link][c] - start[link][c] for c in counts if end[link][c] != start[link][c]}
            for link, counts in end.items() if link in start}
    grew = {link: d for link, d in grew.items() if d}
    during = sum(sum(d.values()) for d in grew.values())
    by_kind = {c: sum(d.get(c, 0) for d in grew.values()) for c in NVLINK_ERROR_COUNTERS}
    total = sum(sum(c.values()) for c in end.values())
    since = f"{total} since the counters were reset, over {len(end)} active links"
    if during > limit:
        kinds = ", ".join(f"{c} {n}" for c, n in by_kind.items() if n)
        return item("nvlink_errors", "fail", during, threshold,
                    f"{during} NVLink errors during the run ({kinds}) on links {sorted(grew, key=int)}, more than "
                    f"{limit}; {since}", unit="errors", detail={"during_run": grew}, **ctx)
    return item("nvlink_errors", "pass", during, threshold,
                f"{during} NVLink errors during the run ({since})", unit="errors", **ctx)


FABRIC_STATES = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
FABRIC_SUMMARIES = {1: "healthy", 2: "unhealthy", 3: "limited capacity"}
# nvmlGpuFabricInfo_v3_t.healthMask: 2-bit fields (1 = the condition holds), then a 4-bit
# incorrect-configuration code (1 = none); NVML_GPU_FABRIC_HEALTH_MASK_* in nvml.h
FABRIC_CONDITIONS = {"degraded_bandwidth": 0, "route_recovery": 2, "route_unhealthy": 4, "access_timeout_recovery": 6}
FABRIC_MISCONFIGURATIONS = {2: "incorrect_sysguid", 3: "incorrect_chassis_sn", 4: "no_partition",
                            5: "insufficient_nvlinks", 6: "incompatible_gpu_fw", 7: "invalid_location",
                            8: "gpu_state_invalid"}


def fabric_conditions(mask: int) -> list[str]:
    """The fabric health conditions a healthMask reports ('route_unhealthy', 'incorrect_configuration=...')."""
    out = [name for name, shift in FABRIC_CONDITIONS.items() if (mask >> shift) & 0x3 == 1]
    misconfig = (mask >> 8) & 0xF
    if misconfig > 1:
        out.append(f"incorrect_configuration={FABRIC_MISCONFIGURATIONS.get(misconfig, misconfig)}")
    return out


def _fabric_item(r: dict, ctx: dict) -> dict:
    threshold = "fabric registration completed, health summary healthy"
    why = _missing(r, "fabric")
    if why:
        return item("fabric_health", "unavailable", threshold=threshold, reason=why, **ctx)
    f = r["fabric"]
    state = FABRIC_STATES.get(f["state"], f"state {f['state']}")
    if f["state"] == 0:
        return item("fabric_health", "unavailable", threshold=threshold,
                    reason="NVML: this GPU is not part of an NVLink fabric (fabric state: not supported)", **ctx)
    if f["state"] != 3 or f["status"] != 0:
        problem = (f"fabric registration {state}" if f["state"] != 3 else
                   f"fabric registration completed with NVML error {f['status']}")
        return item("fabric_health", "fail", state, threshold,
                    f"{problem}: the GPU has not joined its NVLink fabric (fabric manager / NVLink switches)",
                    detail=f, **ctx)
    conditions = fabric_conditions(f["health_mask"])
    summary = f.get("health_summary")
    if not summary:   # v2 of the struct, or a driver that gives no summary: NVML's rule from the mask
        summary = 2 if set(conditions) - {"degraded_bandwidth"} else 3 if conditions else 1
    word = FABRIC_SUMMARIES.get(summary, f"summary {summary}")
    detail = {**f, "conditions": conditions}
    said = f"fabric health {word}" + (f": {', '.join(conditions)}" if conditions else "")
    if summary == 1:
        return item("fabric_health", "pass", word, threshold, f"{said} (registration completed)", **ctx)
    return item("fabric_health", "warn" if summary == 3 else "fail", word, threshold, said, detail=detail, **ctx)


def _throttle_item(r: dict, t: dict, ctx: dict) -> dict:
    bad_names = t["throttle_fail"]
    threshold = f"none of {sorted(bad_names)} during load"
    why = _missing(r, "clock_event_reasons_load")
    if why:
        return item("clock_events_during_load", "unavailable", threshold=threshold, reason=why, **ctx)
    seen = decode_reasons(r["clock_event_reasons_load"])
    bad = [n for n in seen if n in bad_names]
    noted = [n for n in seen if n not in bad_names and n != "gpu_idle"]
    n = r.get("load_samples")
    during = "during the load" if r.get("load_on_gpu", True) else \
        "while the GPUs were idle (no CUDA device: no load to read them under)"
    during += f" ({n} samples)" if n else ""
    if bad:
        return item("clock_events_during_load", "fail", seen, threshold,
                    f"{', '.join(bad)} {during}" + (f"; also {', '.join(noted)}" if noted else ""), **ctx)
    if noted:
        return item("clock_events_during_load", "pass", seen, threshold,
                    f"noted: {', '.join(noted)} {during} (not a fault: the GPU holds its power or clock limit)",
                    **ctx)
    return item("clock_events_during_load", "pass", seen, threshold, f"no slowdown reason {during}", **ctx)


def _pcie_items(r: dict, t: dict, ctx: dict) -> list[dict]:
    out = []
    for what, _unit_word, key_min in (("gen", "generation", "pcie_min_gen"), ("width", "lanes", "pcie_min_width")):
        name = f"pcie_link_{what}"
        want = t[key_min] if t[key_min] is not None else r.get(f"pcie_max_{what}")
        loaded, idle = r.get(f"pcie_{what}_load"), r.get(f"pcie_{what}_idle")
        if want is None or (loaded is None and idle is None):
            why = _missing(r, f"pcie_max_{what}" if want is None else f"pcie_{what}_load")
            out.append(item(name, "unavailable", threshold=None, reason=why, **ctx))
            continue
        label = "Gen" if what == "gen" else "x"
        shown = f"{label}{want}" + ("" if t[key_min] is not None else " (the maximum)")
        if loaded is not None:
            ok = loaded >= want
            out.append(item(name, "pass" if ok else "fail", loaded, f">= {shown}",
                            f"{label}{loaded} under load" + ("" if ok else f", below {shown}: a degraded link"),
                            detail={"idle": idle, "max": r.get(f"pcie_max_{what}")}, **ctx))
        else:  # only an idle reading: links drop to a lower generation when idle
            ok = idle >= want
            out.append(item(name, "pass" if ok else "warn", idle, f">= {shown}",
                            f"{label}{idle} read while idle (no load reading)"
                            + ("" if ok else "; idle links downtrain, so this only warns"),
                            detail={"idle": idle, "max": r.get(f"pcie_max_{what}")}, **ctx))
    return out


def _nvlink_item(r: dict, t: dict, ctx: dict) -> dict:
    limit = t["nvlink_down_max"]
    why = _missing(r, "nvlink")
    if why:
        return item("nvlink_links", "unavailable", threshold=f"<= {limit} down", reason=why, unit="links", **ctx)
    links = r["nvlink"]
    if not links:
        return item("nvlink_links", "unavailable", threshold=f"<= {limit} down",
                    reason="this GPU reports no NVLink links", unit="links", **ctx)
    down = [link["link"] for link in links if not link.get("active")]
    up = len(links) - len(down)
    if len(down) > limit:
        hint = ("; every link is down: no NVLink fabric (NVSwitch fabric manager not running, or one GPU passed "
                "through to a VM)" if not up else "")
        return item("nvlink_links", "fail", up, f"<= {limit} down",
                    f"{len(down)} of {len(links)} NVLink links down: {down}{hint}", unit="links up", detail=links,
                    **ctx)
    return item("nvlink_links", "pass", up, f"<= {limit} down", f"{up} of {len(links)} NVLink links up"
                + (f" ({len(down)} down: {down})" if down else ""), unit="links up", **ctx)


def pcie_theoretical_gbps(gen: int | None, width: int | None) -> float | None:
    if not gen or not width or gen not in PCIE_GBPS_PER_LANE:
        return None
    return PCIE_GBPS_PER_LANE[gen] * width


def _copy_items(r: dict, t: dict, ctx: dict) -> list[dict]:
    out = []
    floor = t["copy_min_gbps"]
    link = pcie_theoretical_gbps(r.get("pcie_gen_load") or r.get("pcie_max_gen"),
                                 r.get("pcie_width_load") or r.get("pcie_max_width"))
    threshold = f">= {floor} GB/s" + (f" and >= {t['copy_min_link_ratio']:.0%} of the link's {link:.1f} GB/s"
                                      if link else "")
    for name, key in (("h2d_bandwidth", "h2d_gbps"), ("d2h_bandwidth", "d2h_gbps")):
        value = r.get(key)
        if r.get("copy_device") == "cpu" and value is not None:
            out.append(item(name, "unavailable", round(value, 3), threshold,
                            f"{r.get('reason') or 'no GPU'}; measured a CPU-to-CPU copy (the code path "
                            "only), no threshold applies", unit="GB/s", **ctx))
            continue
        why = _missing(r, key)
        if why:
            out.append(item(name, "unavailable", threshold=threshold, reason=why, unit="GB/s", **ctx))
        elif value < floor:
            out.append(item(name, "fail", round(value, 3), threshold,
                            f"{value:.2f} GB/s, below {floor} GB/s", unit="GB/s", **ctx))
        elif link and value < t["copy_min_link_ratio"] * link:
            out.append(item(name, "warn", round(value, 3), threshold,
                            f"{value:.2f} GB/s is {value / link:.0%} of the link's theoretical {link:.1f} GB/s",
                            unit="GB/s", **ctx))
        else:
            out.append(item(name, "pass", round(value, 3), threshold, f"{value:.2f} GB/s"
                            + (f" ({value / link:.0%} of the link's {link:.1f} GB/s)" if link else ""),
                            unit="GB/s", **ctx))
    return out


def evaluate_errors(errors: list[dict], device: str, reason: str | None = None) -> dict:
    """The CUDA errors the load and copies raised (``[{what, error}]``): any one fails."""
    if errors:
        return item("torch_errors", "fail", len(errors), 0,
                    "; ".join(f"{e['what']}: {e['error']}" for e in errors[:5]), unit="errors", detail=errors)
    if device != "cuda":
        return item("torch_errors", "unavailable", 0, 0, f"{reason or 'no GPU'}; the load and copies ran on the CPU",
                    unit="errors")
    return item("torch_errors", "pass", 0, 0, "the load and copies ran without a CUDA error", unit="errors")


def evaluate_p2p(p2p: dict, thresholds: dict | None = None) -> list[dict]:
    """Items for the GPU-to-GPU copy matrix ``{"pairs": [{src, dst, gbps, peer_access}], "device", "reason"}``."""
    t = resolve_thresholds(thresholds)
    floor, rel = t["p2p_min_gbps"], t["p2p_min_median_ratio"]
    threshold = f">= {floor} GB/s and >= {rel:.0%} of the median pair"
    pairs = p2p.get("pairs") or []
    if p2p.get("device") == "cpu":
        return [item("p2p_bandwidth", "unavailable", [round(p["gbps"], 3) for p in pairs], threshold,
                     f"{p2p.get('reason') or 'no GPU'}; measured CPU-to-CPU copies (the code path only), "
                     "no threshold applies",
                     unit="GB/s")]
    if not pairs:
        return [item("p2p_bandwidth", "unavailable", threshold=threshold,
                     reason=p2p.get("reason") or "fewer than 2 GPUs visible", unit="GB/s")]
    med = common.median([p["gbps"] for p in pairs])
    out = []
    for p in pairs:
        v = p["gbps"]
        pair = f"{p['src']}->{p['dst']}"
        access = "peer access" if p.get("peer_access") else "no peer access (through the host)"
        if v < floor:
            verdict, why = "fail", f"GPU {pair}: {v:.1f} GB/s, below {floor} GB/s ({access})"
        elif med and v < rel * med:
            verdict, why = "warn", f"GPU {pair}: {v:.1f} GB/s is {v / med:.0%} of the node's median {med:.1f} GB/s"
        else:
            verdict, why = "pass", f"GPU {pair}: {v:.1f} GB/s ({access})"
        out.append(item("p2p_bandwidth", verdict, round(v, 3), threshold, why, gpu=pair, unit="GB/s"))
    return out


# --------------------------------------------------------------------------- XIDs from the kernel log

_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+)(?:\.\d+)?\): (\d+)(?:, ?(.*))?")


def normalize_bus_id(bus: str) -> str:
    """'00000000:3B:00.0' (NVML) and '0000:3b:00' (kernel log) -> '0000:3b:00'."""
    parts = str(bus).strip().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    dom, b, dev = parts[-3], parts[-2], parts[-1].split(".")[0]
    return f"{int(dom, 16):04x}:{int(b, 16):02x}:{int(dev, 16):02x}"


def parse_xid_lines(text: str) -> list[dict]:
    """XID events in kernel log text: ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.``"""
    out = []
    for line in text.splitlines():
        m = _XID_LINE.search(line)
        if m:
            out.append({"pci": normalize_bus_id(m.group(1)), "xid": int(m.group(2)),
                        "detail": (m.group(3) or "").strip()[:200]})
    return out


def read_kernel_log(timeout: float = 10.0) -> tuple[str | None, str | None]:
    """(text, None) from /dev/kmsg or dmesg when readable, else (None, why not)."""
    reasons = []
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        reasons.append(f"/dev/kmsg: {exc.strerror or exc}")
    else:
        chunks = []
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    rec = os.read(fd, 8192)
                except BlockingIOError:     # the end of the buffer
                    break
                except BrokenPipeError:     # a record was overwritten while reading: go on
                    continue
                if not rec:
                    break
                chunks.append(rec.decode("utf-8", "replace"))
        except OSError as exc:
            reasons.append(f"/dev/kmsg: {exc.strerror or exc}")
            chunks = None
        finally:
            os.close(fd)
        if chunks is not None:
            return "\n".join(chunks), None
    dmesg = shutil.which("dmesg")
    if not dmesg:
        reasons.append("dmesg: not in this image")
        return None, "; ".join(reasons)
    try:
        proc = subprocess.run([dmesg], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        reasons.append(f"dmesg: {exc}")
        return None, "; ".join(reasons)
    if proc.returncode != 0:
        reasons.append(f"dmesg: {(proc.stderr or proc.stdout).strip()[:200] or f'exit {proc.returncode}'}")
        return None, "; ".join(reasons)
    return proc.stdout, None


def driver_proc_info(root: str = "/proc/driver/nvidia") -> dict:
    """What /proc/driver/nvidia says (driver version line, GPUs listed), when readable."""
    try:
        with open(os.path.join(root, "version"), encoding="utf-8", errors="replace") as fh:
            version = fh.readline().strip()
    except OSError as exc:
        return {"available": False, "reason": f"{root}/version: {exc.strerror or exc}"}
    try:
        gpus = sorted(os.listdir(os.path.join(root, "gpus")))
    except OSError:
        gpus = []
    return {"available": True, "version": version, "gpus": gpus}


# --------------------------------------------------------------------------- DCGM


def parse_dcgm_json(text: str) -> list[dict]:
    """Tests from ``dcgmi diag -j`` (DCGM 3 and 4 layouts): [{test, category, status, gpus, info}]."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError("no JSON object in the dcgmi output")
    doc = json.loads(text[start:end + 1])
    root = next((v for v in doc.values() if isinstance(v, dict) and "test_categories" in v), doc)
    tests = []
    for cat in root.get("test_categories") or []:
        for test in cat.get("tests") or []:
            statuses, gpus, info = [], [], []
            for res in test.get("results") or []:
                st = str(res.get("status", "")).strip()
                statuses.append(st)
                gid = res.get("gpu_id", res.get("gpu_ids", res.get("entity_id")))
                if gid is not None and st.lower().startswith("fail"):
                    gpus.append(str(gid))
                for key in ("warnings", "warning", "info", "errors"):
                    val = res.get(key)
                    if val:
                        info += [v.get("warning", v) if isinstance(v, dict) else v
                                 for v in (val if isinstance(val, list) else [val])]
            summary = (test.get("test_summary") or {}).get("status")
            tests.append({"test": test.get("name"), "category": cat.get("category"),
                          "status": _dcgm_status(summary, statuses), "gpus": gpus,
                          "info": [str(i)[:300] for i in info][:5]})
    if not tests:
        raise ValueError("the dcgmi JSON has no test results")
    return tests


def _dcgm_status(summary: str | None, statuses: list[str]) -> str:
    words = [s.lower() for s in ([summary] if summary else statuses) if s]
    for w in ("fail", "warn", "pass"):
        if any(s.startswith(w) for s in words):
            return w
    return "skip"


_DCGM_ROW = re.compile(r"^\|\s*([^|]+?)\s*\|\s*(Pass|Fail|Warn|Skip)\w*\b(.*?)\|?\s*$", re.IGNORECASE)


def parse_dcgm_text(text: str) -> list[dict]:
    """Tests from dcgmi diag's table: ``| Memory | Fail - GPU: 0 |``."""
    tests = []
    category = None
    for line in text.splitlines():
        m = re.match(r"^[|+]-+\s+(\w[\w ]*?)\s+-+", line)
        if m:
            category = m.group(1)
            continue
        m = _DCGM_ROW.match(line.strip())
        if m:
            status = m.group(2).lower()
            gpus = re.findall(r"\d+", m.group(3)) if status == "fail" else []
            tests.append({"test": m.group(1), "category": category, "status": status, "gpus": gpus, "info": []})
    if not tests:
        raise ValueError("no test rows in the dcgmi output")
    return tests


def evaluate_dcgm(dcgm: dict) -> list[dict]:
    """Items from ``{"tests": [...]} `` or ``{"reason": why not run}``."""
    tests = dcgm.get("tests")
    if not tests:
        return [item("dcgm_diag", "unavailable", threshold="every test passes",
                     reason=dcgm.get("reason") or "dcgmi diag gave no results")]
    out = []
    for t in tests:
        st = t["status"]
        verdict = {"pass": "pass", "warn": "warn", "fail": "fail"}.get(st, "unavailable")
        on = f" on GPU {', '.join(t['gpus'])}" if t.get("gpus") else ""
        more = f": {'; '.join(t['info'])}" if t.get("info") and verdict != "pass" else ""
        out.append(item(f"dcgm_diag:{t['test']}", verdict, st, "pass",
                        f"dcgmi diag -r {dcgm.get('level')} {t['test']}: {st}{on}{more}",
                        gpu=",".join(t["gpus"]) or None))
    return out


def run_dcgm(level: int, timeout: float) -> dict:
    """``dcgmi diag -r LEVEL -j`` (JSON, else the table) parsed into tests; {"reason"} when not run."""
    if level <= 0:
        return {"level": level, "reason": "turned off (--dcgm-level 0)"}
    exe = shutil.which("dcgmi")
    if not exe:
        return {"level": level, "reason": "dcgmi is not in this image (DCGM not installed)"}
    cmd = [exe, "diag", "-r", str(level), "-j"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"level": level, "reason": f"{' '.join(cmd[1:])} did not finish within {timeout:.0f}s"}
    except OSError as exc:
        return {"level": level, "reason": f"could not run dcgmi: {exc}"}
    out = {"level": level, "exit_code": proc.returncode, "elapsed_s": round(time.monotonic() - t0, 1)}
    for parse in (parse_dcgm_json, parse_dcgm_text):
        try:
            out["tests"] = parse(proc.stdout)
            return out
        except (ValueError, AttributeError, TypeError):
            continue
    tail = (proc.stdout + proc.stderr).strip()[-300:]
    out["reason"] = f"dcgmi diag exit {proc.returncode} without results: {tail}"
    return out


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


# --------------------------------------------------------------------------- torch: load and copies


def pick_dtype(torch, device: str):
    if not device.startswith("cuda"):
        return torch.float32
    cc = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if cc >= (8, 0) else torch.float16 if cc >= (7, 0) else torch.float32


def matmul_burst(devices: list[str], seconds: float, size: int) -> dict:
    """Keep every device busy with matmuls for ``seconds`` (bounded by time, synchronized per round)."""
    import torch

    ops = []
    for d in devices:
        dt = pick_dtype(torch, d)
        a = torch.randn(size, size, device=d, dtype=torch.float32).to(dt)
        b = torch.randn(size, size, device=d, dtype=torch.float32).to(dt)
        ops.append((d, a, b, torch.empty(size, size, device=d, dtype=dt)))
    rounds, per_round = 0, 8 if devices and devices[0].startswith("cuda") else 1
    t0 = time.monotonic()
    deadline = t0 + seconds
    while True:
        for _dev, a, b, c in ops:
            for _ in range(per_round):
                torch.matmul(a, b, out=c)
        for d, *_ in ops:
            common.sync(d)
        rounds += 1
        if time.monotonic() >= deadline:
            break
    elapsed = time.monotonic() - t0
    return {"devices": devices, "size": size, "dtype": [str(o[1].dtype).removeprefix("torch.") for o in ops],
            "matmuls": rounds * per_round * len(ops), "seconds": round(elapsed, 3)}


def copy_bandwidth(device: str, nbytes: int, iters: int) -> dict:
    """Median host-to-device and device-to-host copy bandwidth (GB/s, 1e9 B/s), pinned host memory.

    On the CPU the same code copies between two host tensors (the code path, not a bus).
    """
    import torch

    cuda = device.startswith("cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    host.fill_(7)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    out = {"device": device, "bytes": nbytes, "iters": iters, "pinned": cuda}
    ctx = torch.cuda.device(device) if cuda else _nullcontext()
    with ctx:
        for name, fn in (("h2d_gbps", lambda i: dev.copy_(host, non_blocking=True)),
                         ("d2h_gbps", lambda i: host.copy_(dev, non_blocking=True))):
            common.time_total(fn, 2, device)                      # warm-up
            times = common.time_iterations(fn, iters, device)
            out[name] = nbytes / max(common.median(times), 1e-9) / 1e9
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _sync(*devices: str) -> None:
    import torch

    for d in devices:
        if d.startswith("cuda"):
            torch.cuda.synchronize(d)


def p2p_matrix(devices: list[str], nbytes: int, iters: int) -> dict:
    """Copy bandwidth for every ordered pair of devices (GB/s), timed around ``iters`` copies."""
    import torch

    pairs = []
    bufs = {}
    for i, d in enumerate(devices):
        bufs[i] = torch.empty(nbytes, dtype=torch.uint8, device=d).fill_(i + 1)
    for i, src in enumerate(devices):
        for j, dst in enumerate(devices):
            if i == j:
                continue
            target = torch.empty(nbytes, dtype=torch.uint8, device=dst)
            peer = bool(src.startswith("cuda") and torch.cuda.can_device_access_peer(
                torch.device(src).index, torch.device(dst).index))
            target.copy_(bufs[i])                                   # warm-up (and peer mapping)
            _sync(src, dst)
            t0 = time.perf_counter()
            for _ in range(iters):
                target.copy_(bufs[i], non_blocking=True)
            _sync(src, dst)
            dt = max(time.perf_counter() - t0, 1e-9)
            pairs.append({"src": i, "dst": j, "gbps": nbytes * iters / dt / 1e9, "peer_access": peer})
            del target
    return {"device": "cuda" if devices and devices[0].startswith("cuda") else "cpu", "bytes": nbytes,
            "iters": iters, "pairs": pairs}


# --------------------------------------------------------------------------- the workload


def build_parser():
    p = common.parser(
        "health.py",
        "GPU health: XIDs, ECC, retired pages / remapped rows, throttling under load, PCIe and NVLink links, "
        "persistence, power limit, copy bandwidth (host<->GPU, GPU<->GPU), dcgmi diag.",
        epilog="examples:\n  python health.py\n  python health.py --device cpu\n"
               "  python health.py --dcgm-level 2 --copy-min-gbps 20 --throttle-fail hw_slowdown\n",
    )
    common.add_device_arg(p)
    p.add_argument("--load-s", type=float, default=5.0,
                   help="seconds of matmul load on every GPU while throttling and PCIe are read (default 5)")
    p.add_argument("--load-size", type=int, default=None, help="matmul size N (default 8192 on GPUs, 256 on the CPU)")
    p.add_argument("--sample-hz", type=float, default=10.0, help="NVML readings per second during the load")
    p.add_argument("--copy-mib", type=int, default=256, help="bytes per copy in MiB (default 256)")
    p.add_argument("--copy-iters", type=int, default=10, help="timed copies per direction / pair (default 10)")
    p.add_argument("--dcgm-level", type=int, default=1, choices=(0, 1, 2, 3),
                   help="run `dcgmi diag -r LEVEL` when dcgmi is in the image (default 1; 0 = off)")
    p.add_argument("--dcgm-timeout-s", type=float, default=900.0, help="give dcgmi diag this long (default 900)")
    p.add_argument("--no-kernel-log", action="store_true", help="do not try to read XIDs from the kernel log")
    p.add_argument("--no-p2p", action="store_true", help="skip the GPU-to-GPU copy matrix")
    g = p.add_argument_group("thresholds (see workloads/README.md)")
    for name, (default, _kind, text) in THRESHOLDS.items():
        g.add_argument(f"--{name.replace('_', '-')}", dest=f"t_{name}", default=None, metavar="V",
                       help=f"{text} (default {default if default is not None else 'the maximum'})")
    return p


def thresholds_from_args(args) -> dict:
    return resolve_thresholds({name: getattr(args, f"t_{name}") for name in THRESHOLDS
                               if getattr(args, f"t_{name}") is not None})


def summarize(items: list[dict]) -> dict:
    counts = {v: 0 for v in VERDICTS}
    for it in items:
        counts[it["verdict"]] += 1
    return counts


def _jsonable_thresholds(t: dict) -> dict:
    return {k: sorted(v) if isinstance(v, set) else v for k, v in t.items()}


def open_nvml() -> tuple[NvmlReader | None, str | None]:
    """The NVML reader over every GPU NVML lists (identities read), or (None, why not)."""
    nvml, why = common.load_nvml()
    if nvml is None:
        return None, why
    try:
        reader = NvmlReader(nvml)
    except Exception as exc:
        return None, f"NVML could not list devices: {exc}"
    if not reader.readings:
        return None, "NVML sees no GPU"
    return reader, None


def attach_copies(readings: list[dict], copies: list[dict], cuda_devices: list[str], cuda_reason: str | None,
                  torch) -> None:
    """Give each NVML GPU the copy bandwidth torch measured on it (matched by UUID: torch lacks the GPU- prefix)."""
    by_uuid = {}
    for d in cuda_devices:
        u = getattr(torch.cuda.get_device_properties(d), "uuid", None)
        if u is not None:
            by_uuid[str(u).lower()] = d
    for r in readings:
        d = by_uuid.get(str(r.get("uuid") or "").lower().removeprefix("gpu-"))
        if d is None and len(readings) == 1 and len(cuda_devices) == 1:
            d = cuda_devices[0]     # a MIG slice: torch sees the MIG device, NVML its parent GPU
        c = next((c for c in copies if c["device"] == d), None)
        for key in ("h2d_gbps", "d2h_gbps"):
            r[key] = c[key] if c else None
            if not c:
                r["unavailable"][key] = (f"{cuda_reason}: host<->GPU copies need CUDA" if cuda_reason else
                                         "torch has no CUDA device with this GPU's UUID")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        thresholds = thresholds_from_args(args)
    except ValueError as exc:
        return common.fail_usage(str(exc))
    import torch

    t_start = time.monotonic()
    device = common.setup_device(args)
    result = common.base_result("health")
    result.update(device=device, torch=torch.__version__, thresholds=_jsonable_thresholds(thresholds))
    cuda_reason = None if device == "cuda" else "no CUDA device (--device cpu)" if args.device == "cpu" else \
        f"no CUDA device (torch {torch.__version__}, CUDA build {torch.version.cuda}, sees none)"
    reader, nvml_reason = open_nvml()           # whatever torch sees: NVML is NVIDIA's own view of the GPUs
    nvml = reader.nvml if reader else None
    readings = reader.readings if reader else []
    cuda_devices = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if device == "cuda" else []
    result["driver"] = driver_proc_info()

    size = args.load_size or (8192 if device == "cuda" else 256)
    errors: list[dict] = []

    def guarded(what: str, fn, *fn_args):
        """Run a torch step; a CUDA error (a sick GPU) becomes an error entry, not a crash."""
        try:
            return fn(*fn_args)
        except (RuntimeError, MemoryError) as exc:   # torch.cuda errors are RuntimeErrors
            errors.append({"what": what, "error": str(exc).strip().splitlines()[0][:300] if str(exc) else repr(exc)})
            common.log(f"error in {what}: {errors[-1]['error']}")
            return None

    xid = XidWatcher(nvml, reader) if reader else None
    with (xid or _nullcontext()):     # XIDs raised while the GPUs are read count too
        if reader:
            reader.read_static()
        common.log(f"load: {args.load_s:.1f}s of {size}x{size} matmuls on {cuda_devices or ['cpu']}")
        with (LoadWatcher(reader, args.sample_hz, on_gpu=bool(cuda_devices)) if reader else _nullcontext()):
            result["load"] = guarded("matmul load", matmul_burst, cuda_devices or ["cpu"], args.load_s, size)
        nbytes = args.copy_mib * 2**20
        copies = []
        for d in cuda_devices or ["cpu"]:
            c = guarded(f"copies on {d}", copy_bandwidth, d, nbytes, args.copy_iters)
            if c:
                copies.append(c)
                common.log(f"copy {d}: H2D {c['h2d_gbps']:.2f} GB/s, D2H {c['d2h_gbps']:.2f} GB/s")
        result["copies"] = copies
        if args.no_p2p:
            p2p = {"pairs": [], "reason": "turned off (--no-p2p)", "device": device}
        elif device == "cuda" and len(cuda_devices) < 2:
            p2p = {"pairs": [], "reason": f"{len(cuda_devices)} GPU visible: no pair to copy between",
                   "device": device}
        else:
            p2p = guarded("GPU-to-GPU copies", p2p_matrix, cuda_devices or ["cpu", "cpu"],
                          min(nbytes, 64 * 2**20) if device == "cpu" else nbytes, args.copy_iters) or \
                {"pairs": [], "reason": "the copies failed (see torch_errors)", "device": device}
            if device == "cpu":
                p2p["reason"] = cuda_reason
        result["p2p"] = p2p
        # inside the XID window: the diagnostic stresses the GPUs too (DCGM reads the GPUs without CUDA)
        result["dcgm"] = run_dcgm(args.dcgm_level, args.dcgm_timeout_s) if reader else \
            {"level": args.dcgm_level, "reason": nvml_reason}
    result["torch_errors"] = errors

    if reader:
        reader.read_nvlink_errors("nvlink_errors_end")
        fold_kernel_xids(readings, *((None, "turned off (--no-kernel-log)") if args.no_kernel_log
                                     else read_kernel_log()))
        attach_copies(readings, copies, cuda_devices, cuda_reason, torch)
    else:   # no NVML: one set of items, every one unavailable with the reason
        c = copies[0] if copies else {}
        readings = [{"index": None, "uuid": None, "reason": nvml_reason, "unavailable": {},
                     "copy_device": "cpu" if device == "cpu" else None,
                     "h2d_gbps": c.get("h2d_gbps") if device == "cpu" else None,
                     "d2h_gbps": c.get("d2h_gbps") if device == "cpu" else None}]
        if device == "cuda":
            readings[0]["unavailable"].update(h2d_gbps=nvml_reason, d2h_gbps=nvml_reason)

    items = []
    for r in readings:
        items += evaluate_gpu(r, thresholds)
    items += evaluate_p2p(p2p, thresholds)
    items.append(evaluate_errors(errors, device, cuda_reason))
    items += evaluate_dcgm(result["dcgm"])

    result["nvml"] = {"available": reader is not None, "reason": nvml_reason,
                      "driver_version": _driver_version(nvml)}
    result["cuda"] = {"available": not cuda_reason, "reason": cuda_reason, "devices": len(cuda_devices)}
    # what gpuproof bench reports about sampling: the load watcher above is this workload's sampler
    result["utilization"] = {"available": reader is not None, "reason": nvml_reason, "phases": {}}
    result["gpus"] = [{k: r.get(k) for k in ("index", "uuid", "name", "pci_bus_id")} for r in readings
                      if r.get("index") is not None]
    result["readings"] = readings
    result["items"] = items
    result["summary"] = summarize(items)
    result["failed"] = [f"{gpu_label(i)}{i['name']}: {i['reason']}" for i in items if i["verdict"] == "fail"]
    result["ok"] = not result["failed"]
    result["elapsed_s"] = round(time.monotonic() - t_start, 3)
    for f in result["failed"]:
        common.log(f"FAIL {f}")
    common.log(f"health: {headline(result)}")
    common.emit(result)
    return 0 if result["ok"] else 1


def gpu_label(it: dict) -> str:
    """'GPU 3 (GPU-0100...): ' for an item of one GPU, '' for a node-wide one."""
    if it.get("gpu") is None:
        return ""
    return f"GPU {it['gpu']}" + (f" ({it['uuid']})" if it.get("uuid") else "") + ": "


def headline(result: dict) -> str:
    """One line: the verdict counts and the GPUs NVML listed, by UUID (gpuproof bench prints it)."""
    s = result.get("summary") or {}
    gpus = result.get("gpus") or []
    counts = ", ".join(f"{s.get(v, 0)} {v}" for v in VERDICTS)
    seen = (f"{len(gpus)} GPU(s) through NVML: {', '.join(str(g.get('uuid') or g.get('index')) for g in gpus)}"
            if gpus else f"0 GPU(s): {(result.get('nvml') or {}).get('reason')}")
    cuda = (result.get("cuda") or {}).get("reason")
    return f"{counts} items on {seen}" + (f"; {cuda}" if cuda else "") + \
        (f" ({result['elapsed_s']:.1f}s)" if result.get("elapsed_s") is not None else "")


def _driver_version(nvml) -> str | None:
    try:
        return common.nvml_str(nvml.nvmlSystemGetDriverVersion()) if nvml else None
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())

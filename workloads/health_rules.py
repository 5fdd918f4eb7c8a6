"""health.py's rules: the thresholds, and every reading turned into an item with its verdict. Pure: plain
dicts of readings in, items out, so faults can be fed as data (tests/test_health.py).

Long: one function per reading NVML gives (ECC, retired pages, remapped rows, XIDs, clock events, PCIe, NVLink,
fabric, power, copies), each with its thresholds and the reason it gives; splitting them further would scatter
the one table of verdicts.
"""

from __future__ import annotations


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

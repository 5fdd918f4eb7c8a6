"""health.py's readings from the host, not NVML: XIDs in the kernel log, the driver's /proc files, and
DCGM's ``dcgmi diag`` (run, parsed, judged)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

from health_rules import item

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

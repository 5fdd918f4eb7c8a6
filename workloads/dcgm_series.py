"""The DCGM exporter's ``/metrics``, read the way every release writes it.

dcgm-exporter has changed what it writes twice in 2026 (facts and sources: the project's reference
``dcgm-exporter.md``, §2.1-2.2):

- 4.6.0-4.8.3 renamed the host label ``Hostname`` to ``hostname``;
- 4.9.0 renames the default fields to DCGM 4.7's names, and 11 of them change unit (utilization 0-1 instead of
  percent, memory in bytes instead of MiB, clocks in Hz instead of MHz, energy in J instead of mJ), and the driver
  label ``DCGM_FI_DRIVER_VERSION`` becomes ``DCGM_FI_SYSTEM_DRIVER_VERSION``.

So gpuproof never asks for one name: each quantity it reads (:data:`FIELDS`) has its names in both sets, each with
the factor that brings its value to gpuproof's unit, and every label is read in each spelling
(``--use-old-namespace``'s ``uuid``/``pod_name`` too). Values at DCGM's blank sentinels are no values (the exporter
skips blanks, but its own README prints one).

Where the DCGM 4.7 names come from: the pairs for temperature, power and clock events from go-dcgm's alias tests
(high confidence); the utilization, memory, clock and energy names from a third-party study dated 2026-09-19 (low to
medium: 4.9.0's ``default-counters.csv`` was not read). A name that turns out different is one line of
:data:`FIELDS`.

:func:`parse` reads the text format strictly (a malformed line, a duplicate label name: :class:`MetricsError` naming
the line). It runs in gpuproof's process and in pods (stdlib only).
"""

from __future__ import annotations

import dataclasses
import re

# quantity -> ((name, factor to gpuproof's unit), ...): the classic name first, then DCGM 4.7's (dcgm-exporter 4.9+)
FIELDS: dict[str, tuple[tuple[str, float], ...]] = {
    "gpu_util_pct": (("DCGM_FI_DEV_GPU_UTIL", 1.0), ("DCGM_FI_DEV_GPU_UTIL_RATIO", 100.0)),
    "mem_copy_util_pct": (("DCGM_FI_DEV_MEM_COPY_UTIL", 1.0), ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 100.0)),
    "fb_used_mib": (("DCGM_FI_DEV_FB_USED", 1.0), ("DCGM_FI_DEV_FB_USED_BYTES", 1.0 / 2**20)),
    "fb_free_mib": (("DCGM_FI_DEV_FB_FREE", 1.0), ("DCGM_FI_DEV_FB_FREE_BYTES", 1.0 / 2**20)),
    "fb_reserved_mib": (("DCGM_FI_DEV_FB_RESERVED", 1.0), ("DCGM_FI_DEV_FB_RESERVED_BYTES", 1.0 / 2**20)),
    "sm_clock_mhz": (("DCGM_FI_DEV_SM_CLOCK", 1.0), ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e-6)),
    "mem_clock_mhz": (("DCGM_FI_DEV_MEM_CLOCK", 1.0), ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1e-6)),
    "gpu_temp_c": (("DCGM_FI_DEV_GPU_TEMP", 1.0), ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 1.0)),
    "mem_temp_c": (("DCGM_FI_DEV_MEMORY_TEMP", 1.0), ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 1.0)),
    "power_w": (("DCGM_FI_DEV_POWER_USAGE", 1.0), ("DCGM_FI_DEV_BOARD_POWER_WATTS", 1.0)),
    "energy_j": (("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3), ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1.0)),
    "pcie_replays": (("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 1.0), ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 1.0)),
    "xid": (("DCGM_FI_DEV_XID_ERRORS", 1.0), ("DCGM_FI_DEV_XID_ERROR", 1.0)),
    # profiling (DCP) fields: ratios in both sets
    "gr_engine_active": (("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1.0), ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", 1.0)),
    "sm_active": (("DCGM_FI_PROF_SM_ACTIVE", 1.0), ("DCGM_FI_PROF_SM_UTIL_RATIO", 1.0)),
    "tensor_active": (("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1.0), ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1.0)),
    "dram_active": (("DCGM_FI_PROF_DRAM_ACTIVE", 1.0), ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1.0)),
}
CLASSIC, DCGM47 = "classic", "dcgm-4.7"
BY_NAME: dict[str, tuple[str, float, str]] = {
    name: (quantity, factor, (CLASSIC, DCGM47)[i])
    for quantity, names in FIELDS.items() for i, (name, factor) in enumerate(names)}

# labels: gpuproof's word -> the spellings releases write, newest first
LABELS: dict[str, tuple[str, ...]] = {
    "host": ("hostname", "Hostname"),
    "uuid": ("UUID", "uuid"),
    "driver": ("DCGM_FI_SYSTEM_DRIVER_VERSION", "DCGM_FI_DRIVER_VERSION"),
    "pod": ("pod", "pod_name"),
    "namespace": ("namespace", "pod_namespace"),
    "container": ("container", "container_name"),
}

# DCGM's blank values (dcgm_structs.h: DCGM_INT64_BLANK 0x7ffffffffffffff0 and the sentinels just above it;
# DCGM_FP64_BLANK 140737488355328.0 and above): "no value", never a reading
_INT64_BLANK = 2**63 - 20
_FP64_BLANK = 140737488355328.0


class MetricsError(ValueError):
    """A /metrics text that is not the Prometheus text format."""


@dataclasses.dataclass(frozen=True)
class Sample:
    name: str
    labels: dict
    value: float
    line: int


_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LINE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+(-?\d+))?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _labels(text: str, lineno: int) -> dict:
    out: dict = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if not m:
            raise MetricsError(f"line {lineno}: malformed labels at {text[pos:pos + 40]!r}")
        key, value = m.group(1), re.sub(r'\\[\\"n]', lambda e: _UNESCAPE[e.group(0)], m.group(2))
        if key in out:
            raise MetricsError(f"line {lineno}: label {key!r} twice")
        out[key] = value
        pos = m.end()
        if m.group(3) == "" and pos < len(text):
            raise MetricsError(f"line {lineno}: malformed labels at {text[pos:pos + 40]!r}")
    return out


def parse(text: str) -> list[Sample]:
    """Every sample of a text-format exposition, strictly: a line that is neither a comment nor a sample, a label
    written twice, or a value that is no number raises :class:`MetricsError` naming the line."""
    out = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            raise MetricsError(f"line {lineno}: not a sample: {line[:80]!r}")
        try:
            value = float(m.group(3))
        except ValueError:
            raise MetricsError(f"line {lineno}: value {m.group(3)!r} is not a number") from None
        out.append(Sample(m.group(1), _labels(m.group(2) or "", lineno), value, lineno))
    return out


def label(labels: dict, word: str) -> str | None:
    """The value of ``word`` (a key of :data:`LABELS`) in whichever spelling the labels carry; None when absent
    (an empty pod label, as older exporters wrote for an idle GPU, is absent too)."""
    for key in LABELS[word]:
        if labels.get(key):
            return labels[key]
    return None


def blank(value: float) -> bool:
    return value >= _INT64_BLANK or _FP64_BLANK <= value < _FP64_BLANK + 8


@dataclasses.dataclass(frozen=True)
class Reading:
    """One GPU's (or MIG instance's) value of one quantity, in gpuproof's unit."""
    quantity: str
    value: float
    name: str               # the series name the exporter wrote
    names: str              # CLASSIC or DCGM47
    gpu: str
    uuid: str | None
    host: str | None
    mig: tuple[str, str] | None      # (GPU_I_PROFILE, GPU_I_ID)
    pod: tuple[str, str, str] | None  # (namespace, pod, container) the exporter attributed the GPU to
    labels: dict


def readings(samples: list[Sample]) -> list[Reading]:
    """The samples gpuproof knows a quantity for, in its units; blanks and other series are left out."""
    out = []
    for s in samples:
        known = BY_NAME.get(s.name)
        if known is None or blank(s.value):
            continue
        quantity, factor, names = known
        lab = s.labels
        pod = label(lab, "pod")
        mig = (lab.get("GPU_I_PROFILE", ""), lab["GPU_I_ID"]) if lab.get("GPU_I_ID") else None
        out.append(Reading(quantity, s.value * factor, s.name, names, lab.get("gpu", ""), label(lab, "uuid"),
                           label(lab, "host"), mig,
                           (label(lab, "namespace") or "", pod, label(lab, "container") or "") if pod else None, lab))
    return out


def flavour(samples: list[Sample]) -> dict:
    """What the output says of the exporter that wrote it: its name set, its host label's spelling, and the releases
    those fit (the exporter's version is not in its series: the image tag says it where there is one)."""
    return flavour_of({s.name for s in samples}, {k for s in samples for k in LABELS["host"] if k in s.labels})


def flavour_of(names, host_labels) -> dict:
    """:func:`flavour` from the series names and the host label spellings an output (or a Prometheus) showed."""
    sets = sorted({BY_NAME[n][2] for n in names if n in BY_NAME})
    hosts = sorted(set(host_labels))
    releases = []
    if DCGM47 in sets:
        releases.append("4.9.0 or later (DCGM 4.7 names)")
    elif sets == [CLASSIC]:
        releases.append("before 4.9.0 (classic names)")
    if "hostname" in hosts:
        releases.append("4.6.0-4.8.3 or later (label hostname)")
    elif "Hostname" in hosts:
        releases.append("before 4.6.0-4.8.3 (label Hostname)")
    return {"names": "+".join(sets) or "none", "host_label": "+".join(hosts) or "none",
            "releases": "; ".join(releases) or "unknown"}

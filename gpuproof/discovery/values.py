"""Numbers from what a cluster says: label values and Kubernetes quantities."""

from __future__ import annotations

import re
from typing import Any

_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
_FACTORS = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
            "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18, "m": 0.001}


def quantity(text: Any) -> float | None:
    """A Kubernetes quantity as a number ('80Gi' -> 85899345920); None if it is not one."""
    m = _QUANTITY.match(str(text or "").strip())
    return float(m.group(1)) * _FACTORS[m.group(2)] if m else None


def mib(text: Any) -> int | None:
    q = quantity(text)
    return None if q is None else int(round(q / 2**20))


def version_key(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text or "")[:3])


def as_int(value) -> int | None:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return None

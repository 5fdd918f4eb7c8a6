"""Optional dependencies (pip extras): say which one is missing in one line, never a traceback.

The core install runs the suites and the reports. Running workloads on this host
(``gpuproof bench --local``) needs the ``bench`` extra. Checks use ``find_spec``: nothing
here imports torch or locust.
"""

from __future__ import annotations

import importlib.util

from ..errors import GpuproofError

# extra -> {import name: distribution}, what ``pip install 'gpuproof[<extra>]'`` adds
EXTRAS = {
    "bench": {"torch": "torch", "locust": "locust", "pynvml": "nvidia-ml-py"},
}


class MissingExtra(GpuproofError):
    """An optional dependency group is not installed."""


def missing(modules) -> list[str]:
    out = []
    for mod in modules:
        try:
            found = importlib.util.find_spec(mod) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            out.append(mod)
    return out


def require(extra: str, modules, what: str) -> None:
    """Raise MissingExtra (one line: what needs it, what is missing, the install command)."""
    lacking = missing(modules)
    if lacking:
        dists = ", ".join(EXTRAS[extra].get(m, m) for m in lacking)
        raise MissingExtra(f"{what} needs gpuproof's '{extra}' extra ({dists} not installed); "
                           f"install it with: pip install 'gpuproof[{extra}]'")

"""Datasheet figures of a GPU product, from gpuproof's product catalog (``gpuproof/catalog.yaml``, ``peaks``).

The workloads never import gpuproof, so the catalog reaches them as a file: in a pod, ``catalog.json`` beside them
(gpuproof renders the catalog to JSON into the workloads' ConfigMap: ``gpuproof/bench/workloads.py``
``workload_files()``; stock PyTorch images need not have PyYAML); on a host, ``$GPUPROOF_CATALOG`` (YAML or JSON)
when set, else ``catalog.json`` beside this file, else the ``catalog.yaml`` of the gpuproof checkout or package
around it (read with PyYAML; without it, no figures). Adding a product to the catalog adds its figures here.

A product is found by any name a driver gives it, as ``gpuproof.catalog.lookup`` finds it: GFD's label
(``NVIDIA-H100-80GB-HBM3``), NVML's or CUDA's name (``NVIDIA H100 80GB HBM3``, ``Tesla T4``, with or without the
``NVIDIA``/``Tesla`` prefix), GFD's ``-MIG-<profile>`` and ``-SHARED`` suffixes ignored. A name no product has, or a
product the catalog gives no figures, has none (never a guessed neighbour's).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

CATALOG_ENV = "GPUPROOF_CATALOG"
CATALOG_JSON = "catalog.json"
VENDOR_PREFIXES = ("NVIDIA-", "TESLA-")


def catalog_file() -> Path | None:
    """Where the catalog is (see the module's docstring), or None."""
    if os.environ.get(CATALOG_ENV):
        return Path(os.environ[CATALOG_ENV])
    here = Path(__file__).parent
    for path in (here / CATALOG_JSON, here.parent / "catalog.yaml", here.parent / "gpuproof" / "catalog.yaml",
                 here.resolve().parent / "gpuproof" / "catalog.yaml"):
        if path.is_file():
            return path
    return None


@functools.lru_cache(maxsize=None)
def load(path: str | None = None) -> dict:
    """The catalog as a mapping ({} where there is none, or it is YAML and PyYAML is missing)."""
    file = Path(path) if path else catalog_file()
    if file is None or not file.is_file():
        return {}
    text = file.read_text(encoding="utf-8")
    if file.suffix == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError:
        return {}
    return yaml.safe_load(text) or {}


def key(name: str) -> str:
    """A product name as the catalog's index has it: dashes for spaces, GFD's suffixes cut, upper case, without
    the vendor prefixes (``NVIDIA A100-SXM4-40GB MIG 1g.5gb`` -> ``A100-SXM4-40GB``)."""
    base = str(name or "").strip().replace(" ", "-").removesuffix("-SHARED").partition("-MIG-")[0].upper()
    for prefix in VENDOR_PREFIXES:
        base = base.removeprefix(prefix)
    return base


@functools.lru_cache(maxsize=None)
def _index(path: str | None = None) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for p in load(path).get("products") or []:
        for name in (p.get("label"), str(p.get("nvml") or "")):
            if name:
                out.setdefault(key(name), p)
    return out


def product(name: str | None) -> dict | None:
    """The catalog's entry for a product name, or None."""
    return _index(os.environ.get(CATALOG_ENV) or None).get(key(name)) if name else None


def peaks(name: str | None) -> tuple[str, dict] | None:
    """(the figures' name, the product's ``peaks``) for a product name, or None without figures."""
    p = product(name)
    if not p or not p.get("peaks"):
        return None
    return str(p["peaks"].get("name") or p["label"]), p["peaks"]


def tflops_key(name: str | None) -> str | None:
    """The name of the product's dense peak TFLOPS ('H100 SXM'), or None when the catalog has none for it."""
    found = peaks(name)
    return found[0] if found and found[1].get("tflops") else None


def peak_tflops(name: str | None, dtype: str) -> float | None:
    """The product's datasheet dense peak TFLOPS for a dtype (None: unknown, or no such mode)."""
    found = peaks(name)
    value = (found[1].get("tflops") or {}).get(dtype) if found else None
    return float(value) if value is not None else None


def hbm_key(name: str | None) -> str | None:
    """The name of the product's memory bandwidth figure, or None when the catalog has none for it."""
    found = peaks(name)
    return found[0] if found and found[1].get("hbmTBps") is not None else None


def peak_hbm_tbps(name: str | None) -> float | None:
    """The product's datasheet memory bandwidth in TB/s, or None."""
    found = peaks(name)
    value = found[1].get("hbmTBps") if found else None
    return float(value) if value is not None else None

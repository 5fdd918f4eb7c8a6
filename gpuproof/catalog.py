"""What gpuproof knows about GPU products: the data in ``catalog.yaml``, read once.

Used to fill in a fleet pool from its product name, to check that a node's labels can be
true for the product they name (memory, family, compute capability, MIG profiles), and to
read clusters that have no GPU Feature Discovery labels (product and GPU count from GKE's
accelerator label, Karpenter's instance-gpu labels, or the instance type).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

import yaml

CATALOG_FILE = Path(__file__).with_name("catalog.yaml")
MIG_NAME = re.compile(r"^(\d+)g\.(\d+)gb$")
MEMORY_TOLERANCE = 0.07          # NVML memory moves with ECC and driver; more than this is implausible
MIG_MEMORY_RANGE = (0.85, 1.05)  # a MIG slice's MiB against its nominal <mem>gb x 1024


@dataclasses.dataclass(frozen=True)
class MigProfile:
    name: str            # "1g.10gb"
    slices: int          # compute slices (the "1g")
    memory_gb: int       # the "10gb"
    max_per_gpu: int     # how many fit on one GPU

    @property
    def memory_mib(self) -> int:
        """About what GFD reports for the slice (e.g. 1g.5gb -> 4864 MiB)."""
        return int(self.memory_gb * 1024 * 0.95)

    def memory_plausible(self, mib: int) -> bool:
        low, high = MIG_MEMORY_RANGE
        return low * self.memory_gb * 1024 <= mib <= high * self.memory_gb * 1024


@dataclasses.dataclass(frozen=True)
class Product:
    label: str                 # nvidia.com/gpu.product value
    memory_mib: int            # nvidia.com/gpu.memory
    family: str                # nvidia.com/gpu.family
    compute: tuple[int, int]   # nvidia.com/gpu.compute.major / .minor
    sms: int                   # streaming multiprocessors of the full GPU
    mig: tuple[MigProfile, ...] = ()
    mig_known: bool = True     # False: MIG-capable, but gpuproof has no profile table for it
    aliases: tuple[tuple[str, str], ...] = ()   # (scheme, name)
    nvml: str = ""             # NVML's name where it is not the label's first '-' as a space

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig if p.name == name), None)

    def memory_plausible(self, mib: int) -> bool:
        return abs(mib - self.memory_mib) <= MEMORY_TOLERANCE * self.memory_mib


@dataclasses.dataclass(frozen=True)
class InstanceType:
    name: str
    product: str
    count: int


def _compute(text: str) -> tuple[int, int]:
    major, minor = str(text).split(".")
    return int(major), int(minor)


@functools.lru_cache(maxsize=None)
def _load(path: Path = CATALOG_FILE) -> tuple[dict[str, Product], dict[str, InstanceType]]:
    data = yaml.safe_load(path.read_text())
    tables = {}
    for table, profiles in data["migTables"].items():
        rows = []
        for name, per_gpu in profiles.items():
            g, mem = MIG_NAME.match(name).groups()  # type: ignore[union-attr]
            rows.append(MigProfile(name, int(g), int(mem), int(per_gpu)))
        tables[table] = tuple(rows)
    products = {}
    for p in data["products"]:
        mig = p.get("mig", "none")
        aliases = tuple((scheme, name) for scheme, names in (p.get("aliases") or {}).items() for name in names)
        products[p["label"]] = Product(p["label"], int(p["memoryMiB"]), p["family"], _compute(p["compute"]),
                                       int(p["sms"]), tables.get(mig, ()), mig != "unknown", aliases,
                                       p.get("nvml", ""))
    types = {name: InstanceType(name, t["product"], int(t["count"])) for name, t in data["instanceTypes"].items()}
    return products, types


PRODUCTS: dict[str, Product] = _load()[0]
INSTANCE_TYPES: dict[str, InstanceType] = _load()[1]


def lookup(product: str) -> Product | None:
    """The product a GFD product label names; ``-SHARED`` and ``-MIG-<profile>`` suffixes are ignored."""
    return PRODUCTS.get(base_product(product))


def base_product(label: str) -> str:
    """``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED`` -> ``NVIDIA-A100-SXM4-40GB``."""
    return label.removesuffix("-SHARED").partition("-MIG-")[0]


def instance_type(name: str | None) -> InstanceType | None:
    return INSTANCE_TYPES.get(name or "")


def by_alias(scheme: str, name: str, memory_mib: int | None = None) -> Product | None:
    """The product another label scheme names (``gke`` accelerator, ``karpenter`` gpu-name).

    An ambiguous name (Karpenter's ``a100``) is settled by the memory the scheme also labels.
    """
    found = [p for p in PRODUCTS.values() if (scheme, name.lower()) in p.aliases]
    if len(found) > 1 and memory_mib:
        found.sort(key=lambda p: abs(p.memory_mib - memory_mib))
        return found[0] if found[0].memory_plausible(memory_mib) else None
    return found[0] if len(found) == 1 else None


def family_for(compute: tuple[int, int]) -> str | None:
    """The family GFD names for a compute capability (from the catalog's own products)."""
    return next((p.family for p in PRODUCTS.values() if p.compute == compute), None)

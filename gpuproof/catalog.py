"""What gpuproof knows about GPU products: the data in ``catalog.yaml``, read once.

Used to fill in a fleet pool from its product name, to check that a node's labels can be
true for the product they name (memory, family, compute capability, MIG profiles), and to
read clusters that have no GPU Feature Discovery labels (product and GPU count from GKE's
accelerator label, Karpenter's instance-gpu labels, or the instance type).

A product name as drivers spell it (:func:`resolve`): GFD's label (``NVIDIA-A100-SXM4-80GB``), NVML's
name with or without the vendor or ``Tesla`` prefix (``NVIDIA A100-SXM4-80GB``, ``A100-SXM4-80GB``,
``Tesla T4``, ``NVIDIA Tesla T4``), or an NVIDIA vGPU profile (``GRID A100-40C``, ``NVIDIA A100-4C``,
``GRID A100-1-5C``): a profile of a physical product, judged as that product with the profile's
framebuffer as its memory.
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
# NVIDIA vGPU type names, as NVIDIA's vGPU device manager parses them (NVIDIA/vgpu-device-manager
# pkg/types/vgpu_type.go): time-sliced <board>-<GB><series>, MIG-backed <board>-<G>-<GB><series>[ME|NOME|MEALL|GFX];
# series A (virtual applications), B (virtual PC), C (compute), Q (virtual workstation); GB 0 is 512 MB. A guest's
# NVML name is the type behind 'GRID ' (older drivers) or 'NVIDIA ' (NVIDIA AI Enterprise, "Virtual GPU Types for
# Supported GPUs": docs.nvidia.com/ai-enterprise/release-6/latest/appendix/vgpu.html; real: tests/data/names).
VGPU_TIME_SLICED = re.compile(r"^(?P<board>[A-Z0-9]+(?:-[A-Za-z]+)*)-(?P<gb>0|[1-9][0-9]*)(?P<series>[ABCQ])$")
VGPU_MIG_BACKED = re.compile(r"^(?P<board>[A-Z0-9]+)-(?P<g>[1-9])-(?P<gb>0|[1-9][0-9]*)(?P<series>[ABCQ])"
                             r"(?:ME|NOME|MEALL|GFX)?$")
VGPU_BRANDS = ("GRID-", "NVIDIA-")
VENDOR_PREFIXES = ("NVIDIA-", "TESLA-")      # NVML names carry none, one or both (NVIDIA Tesla T4)


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


DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")     # the dtypes a product's peaks name (matmul's)


@dataclasses.dataclass(frozen=True)
class Peaks:
    """A product's datasheet figures, as the benchmarks' workloads read them (workloads/datasheet.py)."""

    name: str                                     # how results name them ('H100 SXM'); the label by default
    tflops: tuple[tuple[str, float | None], ...] = ()   # (dtype, dense peak TFLOPS; None: no such mode)
    hbm_tbps: float | None = None                 # memory bandwidth, TB/s

    def tflops_of(self, dtype: str) -> float | None:
        return dict(self.tflops).get(dtype)


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
    vgpu: tuple[str, ...] = ()  # the board's name in NVIDIA vGPU type names (A100X for A100 HGX 40GB)
    peaks: Peaks | None = None  # datasheet figures (None: gpuproof has none, no ratio to peak)
    mock_nvml: str = ""         # NVIDIA's mock NVML profile the embedded cluster starts from ("": by family)

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


def _peaks(label: str, data: dict | None) -> Peaks | None:
    if not data:
        return None
    tflops = data.get("tflops") or {}
    unknown = set(tflops) - set(DTYPES)
    if unknown:
        raise ValueError(f"catalog.yaml: {label}: peaks.tflops names no dtype gpuproof measures: "
                         f"{', '.join(sorted(unknown))} (one of {', '.join(DTYPES)})")
    return Peaks(str(data.get("name") or label),
                 tuple((d, None if tflops[d] is None else float(tflops[d])) for d in DTYPES if d in tflops),
                 None if data.get("hbmTBps") is None else float(data["hbmTBps"]))


@functools.lru_cache(maxsize=None)
def _load(path: Path = CATALOG_FILE) -> tuple[dict[str, Product], dict[str, InstanceType]]:
    """The products and instance types; top-level sections other than these (and migTables) are others' to read."""
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
                                       p.get("nvml", ""), tuple(str(v).upper() for v in p.get("vgpu") or ()),
                                       _peaks(p["label"], p.get("peaks")), str(p.get("mockNvml") or ""))
    types = {name: InstanceType(name, t["product"], int(t["count"])) for name, t in data["instanceTypes"].items()}
    return products, types


PRODUCTS: dict[str, Product] = _load()[0]
INSTANCE_TYPES: dict[str, InstanceType] = _load()[1]


def lookup(product: str) -> Product | None:
    """The product a GFD product label names; ``-SHARED`` and ``-MIG-<profile>`` suffixes are ignored.

    NVML's spellings name it too (spaces for '-', with or without ``NVIDIA``/``Tesla``); vGPU profiles do not
    (:func:`resolve` reads those, with the profile's memory)."""
    base = base_product(str(product or "").strip().replace(" ", "-"))
    return PRODUCTS.get(base) or _by_key().get(_key(base))


@dataclasses.dataclass(frozen=True)
class Named:
    """A product name as a driver spells it, read: the catalog product, and for an NVIDIA vGPU its profile."""

    name: str
    product: Product
    vgpu: str = ""             # the vGPU type ("A100-40C", "A100-1-5C") where the name is a vGPU profile
    vgpu_gb: int = 0           # the type's framebuffer in GB (0: 512 MB)

    @property
    def memory_mib(self) -> int:
        """What the device has: the product's memory, or the vGPU profile's framebuffer."""
        if not self.vgpu:
            return self.product.memory_mib
        return self.vgpu_gb * 1024 or 512

    def memory_plausible(self, mib: int) -> bool:
        if not self.vgpu:
            return self.product.memory_plausible(mib)
        return abs(mib - self.memory_mib) <= MEMORY_TOLERANCE * self.memory_mib

    @property
    def what(self) -> str:
        """'NVIDIA-A100-PCIE-40GB' or 'vGPU A100-40C of a NVIDIA-A100-PCIE-40GB'."""
        return f"vGPU {self.vgpu} of a {self.product.label}" if self.vgpu else self.product.label

    def same(self, other: Named | None) -> bool:
        return other is not None and (self.product.label, self.vgpu) == (other.product.label, other.vgpu)


def _key(name: str) -> str:
    key = name.upper()
    for prefix in VENDOR_PREFIXES:
        key = key.removeprefix(prefix)
    return key


@functools.lru_cache(maxsize=None)
def _by_key() -> dict[str, Product]:
    """Each product under its label and NVML name without vendor prefixes ('A100-SXM4-80GB', 'T4')."""
    out: dict[str, Product] = {}
    for p in PRODUCTS.values():
        for name in (p.label, p.nvml.replace(" ", "-")):
            if name:
                out.setdefault(_key(name), p)
    return out


def _vgpu(name: str) -> tuple[Product | None, str, int, str]:
    """(product, vGPU type, GB, why not) for a vGPU name ('GRID-A100-40C'); product None says why not."""
    rest = name
    for brand in VGPU_BRANDS:
        if rest.upper().startswith(brand):
            rest = rest[len(brand):]
            break
    m = VGPU_MIG_BACKED.match(rest) or VGPU_TIME_SLICED.match(rest)
    if not m:
        return None, "", 0, "neither a catalog product nor an NVIDIA vGPU type (<board>-<GB><series>)"
    board, gb, slices = m.group("board").upper(), int(m.group("gb")), int(m.groupdict().get("g") or 0)
    found = next((p for p in PRODUCTS.values() if board in p.vgpu), None)
    if found is None:
        return None, rest, gb, f"vGPU type {rest}: board {board} is no catalog product's"
    if slices:
        profile = f"{slices}g.{gb}gb"
        if found.mig_known and found.mig_profile(profile) is None:
            return None, rest, gb, f"vGPU type {rest}: {found.label} has no MIG profile {profile}"
    elif gb * 1024 > found.memory_mib * (1 + MEMORY_TOLERANCE):
        return None, rest, gb, f"vGPU type {rest}: {gb} GB does not fit a {found.label} ({found.memory_mib} MiB)"
    return found, rest, gb, ""


def resolve(name: str) -> Named | None:
    """The catalog product (and vGPU profile) a product name means, however a driver spells it; None where no
    catalog product or profile of one can be it (:func:`why_unknown` says why)."""
    base = base_product(str(name or "").strip().replace(" ", "-"))
    if not base:
        return None
    found = lookup(base)
    if found is not None:
        return Named(str(name), found)
    product, vgpu, gb, _ = _vgpu(base)
    return Named(str(name), product, vgpu, gb) if product is not None else None


def why_unknown(name: str) -> str:
    """Why :func:`resolve` finds nothing for a name ('' where it finds it)."""
    base = base_product(str(name or "").strip().replace(" ", "-"))
    if not base:
        return "no product name"
    return "" if resolve(name) is not None else _vgpu(base)[3]


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

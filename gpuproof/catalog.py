"""What GPU Feature Discovery reports for known GPU products.

Used to fill in a fleet pool from just its product name, and to know which MIG
profiles exist on which product. Values are what GFD labels carry on such hardware
(memory in MiB as NVML reports it, family names as GFD spells them).
"""

from __future__ import annotations

import dataclasses
import re


@dataclasses.dataclass(frozen=True)
class MigProfile:
    name: str            # "1g.10gb"
    slices: int          # compute slices (the "1g")
    memory_gb: int       # the "10gb"
    max_per_gpu: int     # how many fit on one GPU

    @property
    def memory_mib(self) -> int:
        # GFD reports slightly less than the nominal size (e.g. 1g.5gb -> 4864 MiB)
        return int(self.memory_gb * 1024 * 0.95)


@dataclasses.dataclass(frozen=True)
class Product:
    label: str                 # nvidia.com/gpu.product value
    memory_mib: int            # nvidia.com/gpu.memory
    family: str                # nvidia.com/gpu.family
    compute: tuple[int, int]   # nvidia.com/gpu.compute.major / .minor
    sms: int                   # streaming multiprocessors of the full GPU
    mig: tuple[MigProfile, ...] = ()

    def mig_profile(self, name: str) -> MigProfile | None:
        return next((p for p in self.mig if p.name == name), None)


def _profiles(*spec: tuple[str, int]) -> tuple[MigProfile, ...]:
    out = []
    for name, max_per_gpu in spec:
        g, mem = MIG_NAME.match(name).groups()  # type: ignore[union-attr]
        out.append(MigProfile(name, int(g), int(mem), max_per_gpu))
    return tuple(out)


MIG_NAME = re.compile(r"^(\d)g\.(\d+)gb$")

_A100_40 = _profiles(("1g.5gb", 7), ("2g.10gb", 3), ("3g.20gb", 2), ("4g.20gb", 1), ("7g.40gb", 1))
_80GB = _profiles(("1g.10gb", 7), ("1g.20gb", 4), ("2g.20gb", 3), ("3g.40gb", 2), ("4g.40gb", 1), ("7g.80gb", 1))
_H200 = _profiles(("1g.18gb", 7), ("1g.35gb", 4), ("2g.35gb", 3), ("3g.71gb", 2), ("4g.71gb", 1), ("7g.141gb", 1))

PRODUCTS: dict[str, Product] = {
    p.label: p
    for p in [
        Product("NVIDIA-H100-80GB-HBM3", 81559, "hopper", (9, 0), 132, _80GB),
        Product("NVIDIA-H100-PCIe", 81559, "hopper", (9, 0), 114, _80GB),
        Product("NVIDIA-H200", 143771, "hopper", (9, 0), 132, _H200),
        Product("NVIDIA-A100-SXM4-80GB", 81920, "ampere", (8, 0), 108, _80GB),
        Product("NVIDIA-A100-SXM4-40GB", 40960, "ampere", (8, 0), 108, _A100_40),
        Product("NVIDIA-A100-PCIE-40GB", 40960, "ampere", (8, 0), 108, _A100_40),
        Product("NVIDIA-L40S", 46068, "ada-lovelace", (8, 9), 142),
        Product("NVIDIA-L4", 23034, "ada-lovelace", (8, 9), 58),
        Product("NVIDIA-A10G", 23028, "ampere", (8, 6), 80),
        Product("Tesla-T4", 15360, "turing", (7, 5), 40),
        Product("Tesla-V100-SXM2-32GB", 32768, "volta", (7, 0), 80),
    ]
}


def lookup(product: str) -> Product | None:
    return PRODUCTS.get(product)

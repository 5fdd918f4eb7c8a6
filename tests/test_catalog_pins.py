"""The product catalog against datasheets, typed here by hand.

The fleet builds its nodes from ``gpuproof/catalog.yaml`` and the plausibility checks judge
nodes against the same file, so a wrong value there keeps every other test green. Each value
below was typed from the source named beside it, never read from the catalog; a product or
instance type added to the catalog without a row here fails ``test_every_*_is_pinned``.

Memory is pinned twice: the datasheet's GB, and, where a published ``nvidia-smi`` reading
exists, the MiB NVML reports (what GFD writes to ``nvidia.com/gpu.memory``). Without such a
reading the catalog's MiB must lie in the window NVML reports for that many GB: at most
GB x 1024, at least 93 % of it (ECC on GDDR cards keeps back 1/16).
"""

from __future__ import annotations

import dataclasses

import pytest

from gpuproof import catalog
from gpuproof.sim import slices

# ---------------------------------------------------------------------------- sources

T4_DS = "NVIDIA T4 datasheet (nvidia.com/en-us/data-center/tesla-t4): 16 GB GDDR6, Turing, 40 SMs"
V100_DS = "NVIDIA V100 datasheet (nvidia.com/en-us/data-center/v100): 16 or 32 GB HBM2, Volta"
A10G_DS = "AWS EC2 G5 page (aws.amazon.com/ec2/instance-types/g5): NVIDIA A10G, 24 GB, Ampere GA102"
L4_DS = "NVIDIA L4 datasheet (nvidia.com/en-us/data-center/l4): 24 GB GDDR6, Ada Lovelace"
L40S_DS = "NVIDIA L40S datasheet (nvidia.com/en-us/data-center/l40s): 48 GB GDDR6 with ECC, Ada Lovelace"
A100_DS = "NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): 40 or 80 GB HBM2/HBM2e, Ampere, MIG up to 7"
H100_DS = ("NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM 80 GB, PCIe 80 GB, NVL 94 GB; Hopper; "
           "MIG up to 7 instances")
H200_DS = "NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): 141 GB HBM3e, Hopper, MIG up to 7 @ 18 GB"
B200_DS = "NVIDIA DGX B200 datasheet: 8 B200, 1,440 GB GPU memory in all (180 GB each), Blackwell"
GB200_DS = "NVIDIA GB200 NVL72 spec (nvidia.com/en-us/data-center/gb200-nvl72): 13.4 TB HBM3e over 72 GPUs (186 GB)"
CC = "CUDA GPUs compute capability table (developer.nvidia.com/cuda-gpus)"
FAMILY = "GPU Feature Discovery's nvidia.com/gpu.family per compute capability (NVIDIA/k8s-device-plugin)"
MIG_GUIDE = "NVIDIA MIG user guide, 'Supported MIG Profiles' (docs.nvidia.com/datacenter/tesla/mig-user-guide)"
SMI = "nvidia-smi totals listed in modal-labs/modal-client PR #2797 (H100, A100 80/40, A10, L40S, L4, T4)"
GKE = "GKE accelerator names (cloud.google.com/kubernetes-engine/docs/how-to/gpus)"
KARPENTER = ("EC2 DescribeInstanceTypes GpuInfo names, lower-cased by Karpenter "
             "(karpenter.sh/docs/reference/instance-types)")

# ---------------------------------------------------------------------------- MIG profiles (profile -> per GPU)

MIG_A100_40 = {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
MIG_80GB = {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
MIG_H100_NVL = {"1g.12gb": 7, "1g.24gb": 4, "2g.24gb": 3, "3g.47gb": 2, "4g.47gb": 1, "7g.94gb": 1}
MIG_H200 = {"1g.18gb": 7, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1}
MIG_B200 = {"1g.23gb": 7, "1g.45gb": 4, "2g.45gb": 3, "3g.90gb": 2, "4g.90gb": 1, "7g.180gb": 1}
NO_MIG = {}
UNKNOWN = None          # MIG-capable, but the catalog has no table for it (its checks skip, saying so)


@dataclasses.dataclass(frozen=True)
class Pin:
    memory_gb: int             # datasheet
    nvml_mib: int | None       # what NVML reports, where a published reading exists
    family: str
    compute: tuple[int, int]
    mig: dict | None
    nvml_name: str             # the NVML device name (what NVIDIA's DRA driver publishes as productName)
    gke: tuple[str, ...]
    karpenter: tuple[str, ...]
    source: str


PRODUCTS = {
    "Tesla-T4": Pin(16, 15360, "turing", (7, 5), NO_MIG, "Tesla T4", ("nvidia-tesla-t4",), ("t4",),
                    f"{T4_DS}; {SMI}"),
    "Tesla-V100-SXM2-16GB": Pin(16, None, "volta", (7, 0), NO_MIG, "Tesla V100-SXM2-16GB", ("nvidia-tesla-v100",),
                                ("v100",), V100_DS),
    "Tesla-V100-SXM2-32GB": Pin(32, None, "volta", (7, 0), NO_MIG, "Tesla V100-SXM2-32GB", (), ("v100",), V100_DS),
    "Tesla-V100-PCIE-16GB": Pin(16, None, "volta", (7, 0), NO_MIG, "Tesla V100-PCIE-16GB", (), (), V100_DS),
    "NVIDIA-A10G": Pin(24, 23028, "ampere", (8, 6), NO_MIG, "NVIDIA A10G", (), ("a10g",),
                       f"{A10G_DS}; {SMI} (A10, the same GA102 memory)"),
    "NVIDIA-L4": Pin(24, 23034, "ada-lovelace", (8, 9), NO_MIG, "NVIDIA L4", ("nvidia-l4",), ("l4",),
                     f"{L4_DS}; {SMI}"),
    "NVIDIA-L40S": Pin(48, 46068, "ada-lovelace", (8, 9), NO_MIG, "NVIDIA L40S", (), ("l40s",), f"{L40S_DS}; {SMI}"),
    "NVIDIA-A100-SXM4-40GB": Pin(40, 40960, "ampere", (8, 0), MIG_A100_40, "NVIDIA A100-SXM4-40GB",
                                 ("nvidia-tesla-a100",), ("a100",), f"{A100_DS}; {SMI}; {MIG_GUIDE}"),
    "NVIDIA-A100-PCIE-40GB": Pin(40, None, "ampere", (8, 0), MIG_A100_40, "NVIDIA A100-PCIE-40GB", (), (),
                                 f"{A100_DS}; {MIG_GUIDE}"),
    "NVIDIA-A100-SXM4-80GB": Pin(80, 81920, "ampere", (8, 0), MIG_80GB, "NVIDIA A100-SXM4-80GB",
                                 ("nvidia-a100-80gb",), ("a100",), f"{A100_DS}; {SMI}; {MIG_GUIDE}"),
    "NVIDIA-A100-80GB-PCIe": Pin(80, None, "ampere", (8, 0), MIG_80GB, "NVIDIA A100 80GB PCIe", (), (),
                                 f"{A100_DS}; {MIG_GUIDE}"),
    "NVIDIA-H100-PCIe": Pin(80, None, "hopper", (9, 0), MIG_80GB, "NVIDIA H100 PCIe", (), (),
                            f"{H100_DS}; {MIG_GUIDE}"),
    "NVIDIA-H100-80GB-HBM3": Pin(80, 81559, "hopper", (9, 0), MIG_80GB, "NVIDIA H100 80GB HBM3",
                                 ("nvidia-h100-80gb", "nvidia-h100-mega-80gb"), ("h100",),
                                 f"{H100_DS}; {SMI}; {MIG_GUIDE}"),
    "NVIDIA-H100-NVL": Pin(94, None, "hopper", (9, 0), MIG_H100_NVL, "NVIDIA H100 NVL", (), (),
                           f"{H100_DS}; {MIG_GUIDE}"),
    "NVIDIA-H200": Pin(141, None, "hopper", (9, 0), MIG_H200, "NVIDIA H200", ("nvidia-h200-141gb",), ("h200",),
                       f"{H200_DS}; {MIG_GUIDE}"),
    "NVIDIA-B200": Pin(180, None, "blackwell", (10, 0), MIG_B200, "NVIDIA B200", ("nvidia-b200",), ("b200",),
                       f"{B200_DS}; {MIG_GUIDE}"),
    "NVIDIA-GB200": Pin(186, None, "blackwell", (10, 0), UNKNOWN, "NVIDIA GB200", ("nvidia-gb200",), (),
                        GB200_DS),
}

# ---------------------------------------------------------------------------- instance types

AWS_P3 = "aws.amazon.com/ec2/instance-types/p3"
AWS_G4 = "aws.amazon.com/ec2/instance-types/g4 (G4dn)"
AWS_G5 = "aws.amazon.com/ec2/instance-types/g5"
AWS_G6 = "aws.amazon.com/ec2/instance-types/g6"
AWS_G6E = "aws.amazon.com/ec2/instance-types/g6e"
AWS_P4 = "aws.amazon.com/ec2/instance-types/p4"
AWS_P5 = "aws.amazon.com/ec2/instance-types/p5"
AWS_P6 = "aws.amazon.com/ec2/instance-types/p6"
GCP_A2 = "cloud.google.com/compute/docs/gpus#a100-gpus (A2 Standard, A2 Ultra)"
GCP_A3 = "cloud.google.com/compute/docs/accelerator-optimized-machines#a3-vms (A3 High, Mega, Edge, Ultra)"
GCP_A4 = "cloud.google.com/compute/docs/accelerator-optimized-machines#a4-vms"
GCP_G2 = "cloud.google.com/compute/docs/accelerator-optimized-machines#g2-vms"
AZ_NCT4 = "learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/ncast4v3-series"
AZ_NCA100 = "learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/nca100v4-series"
AZ_NDA100 = "learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/nda100v4-series (and ndma100v4)"
AZ_NCH100 = "learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/ncadsh100v5-series"
AZ_NDH100 = "learn.microsoft.com/azure/virtual-machines/sizes/gpu-accelerated/ndh100v5-series (and ndh200v5)"

T4, V16, V32, A10G, L4, L40S = ("Tesla-T4", "Tesla-V100-SXM2-16GB", "Tesla-V100-SXM2-32GB", "NVIDIA-A10G",
                                "NVIDIA-L4", "NVIDIA-L40S")
A100_40, A100_80, A100_80_PCIE = "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-80GB-PCIe"
H100, H100_NVL, H200, B200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-NVL", "NVIDIA-H200", "NVIDIA-B200"


def _sizes(prefix: str, product: str, source: str, counts: dict[str, int]) -> dict[str, tuple[str, int, str]]:
    return {f"{prefix}{size}": (product, n, source) for size, n in counts.items()}


ONE = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1}

INSTANCE_TYPES: dict[str, tuple[str, int, str]] = {
    # AWS
    **_sizes("p3.", V16, AWS_P3, {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8}),
    "p3dn.24xlarge": (V32, 8, AWS_P3),
    **_sizes("g4dn.", T4, AWS_G4, {**ONE, "12xlarge": 4, "metal": 8}),
    **_sizes("g5.", A10G, AWS_G5, {**ONE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    **_sizes("g6.", L4, AWS_G6, {**ONE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    **_sizes("g6e.", L40S, AWS_G6E, {**ONE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    "p4d.24xlarge": (A100_40, 8, AWS_P4),
    "p4de.24xlarge": (A100_80, 8, AWS_P4),
    "p5.48xlarge": (H100, 8, AWS_P5),
    "p5e.48xlarge": (H200, 8, AWS_P5),
    "p5en.48xlarge": (H200, 8, AWS_P5),
    "p6-b200.48xlarge": (B200, 8, AWS_P6),
    # Google Cloud
    **_sizes("a2-highgpu-", A100_40, GCP_A2, {"1g": 1, "2g": 2, "4g": 4, "8g": 8}),
    "a2-megagpu-16g": (A100_40, 16, GCP_A2),
    **_sizes("a2-ultragpu-", A100_80, GCP_A2, {"1g": 1, "2g": 2, "4g": 4, "8g": 8}),
    **_sizes("a3-highgpu-", H100, GCP_A3, {"1g": 1, "2g": 2, "4g": 4, "8g": 8}),
    "a3-megagpu-8g": (H100, 8, GCP_A3),
    "a3-edgegpu-8g": (H100, 8, GCP_A3),
    "a3-ultragpu-8g": (H200, 8, GCP_A3),
    "a4-highgpu-8g": (B200, 8, GCP_A4),
    **_sizes("g2-standard-", L4, GCP_G2, {"4": 1, "8": 1, "12": 1, "16": 1, "32": 1, "24": 2, "48": 4, "96": 8}),
    # Azure
    **{f"Standard_NC{n}as_T4_v3": (T4, gpus, AZ_NCT4) for n, gpus in ((4, 1), (8, 1), (16, 1), (64, 4))},
    **{f"Standard_NC{n}ads_A100_v4": (A100_80_PCIE, gpus, AZ_NCA100) for n, gpus in ((24, 1), (48, 2), (96, 4))},
    "Standard_ND96asr_v4": (A100_40, 8, AZ_NDA100),
    "Standard_ND96amsr_A100_v4": (A100_80, 8, AZ_NDA100),
    "Standard_NC40ads_H100_v5": (H100_NVL, 1, AZ_NCH100),
    "Standard_NC80adis_H100_v5": (H100_NVL, 2, AZ_NCH100),
    "Standard_ND96isr_H100_v5": (H100, 8, AZ_NDH100),
    "Standard_ND96isr_H200_v5": (H200, 8, AZ_NDH100),
}


# ---------------------------------------------------------------------------- tests


def test_every_product_is_pinned():
    assert sorted(catalog.PRODUCTS) == sorted(PRODUCTS)


def test_every_instance_type_is_pinned():
    assert sorted(catalog.INSTANCE_TYPES) == sorted(INSTANCE_TYPES)


def test_the_pins_name_their_sources():
    assert all(p.source for p in PRODUCTS.values())
    assert all(source for _, _, source in INSTANCE_TYPES.values())


@pytest.mark.parametrize("label", sorted(PRODUCTS))
def test_product_memory(label):
    pin, product = PRODUCTS[label], catalog.PRODUCTS[label]
    if pin.nvml_mib is not None:
        assert product.memory_mib == pin.nvml_mib, pin.source
    low, high = int(0.93 * pin.memory_gb * 1024), pin.memory_gb * 1024
    assert low <= product.memory_mib <= high, f"{product.memory_mib} MiB for {pin.memory_gb} GB ({pin.source})"


@pytest.mark.parametrize("label", sorted(PRODUCTS))
def test_product_family_and_compute_capability(label):
    pin, product = PRODUCTS[label], catalog.PRODUCTS[label]
    assert (product.family, product.compute) == (pin.family, pin.compute), f"{CC}; {FAMILY}"


@pytest.mark.parametrize("label", sorted(PRODUCTS))
def test_product_mig_profiles(label):
    pin, product = PRODUCTS[label], catalog.PRODUCTS[label]
    if pin.mig is UNKNOWN:
        assert (product.mig_known, product.mig) == (False, ()), MIG_GUIDE
        return
    assert product.mig_known
    assert {p.name: p.max_per_gpu for p in product.mig} == pin.mig, MIG_GUIDE


@pytest.mark.parametrize("label", sorted(PRODUCTS))
def test_product_names_elsewhere(label):
    """NVML's name (DRA productName), GKE's accelerator and Karpenter's instance-gpu-name."""
    pin, product = PRODUCTS[label], catalog.PRODUCTS[label]
    assert slices.nvml_name(label) == pin.nvml_name
    aliases = {scheme: tuple(sorted(n for s, n in product.aliases if s == scheme)) for scheme in ("gke", "karpenter")}
    assert aliases == {"gke": tuple(sorted(pin.gke)), "karpenter": tuple(sorted(pin.karpenter))}, f"{GKE}; {KARPENTER}"
    assert {s for s, _ in product.aliases} <= {"gke", "karpenter"}


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_instance_type_gpus(name):
    product, count, source = INSTANCE_TYPES[name]
    it = catalog.INSTANCE_TYPES[name]
    assert (it.product, it.count) == (product, count), source


def test_mig_profile_memory_and_slices_follow_the_name():
    """'3g.40gb': 3 compute slices, 40 GB; what fits on one GPU fits its 7 compute slices."""
    for label in PRODUCTS:
        for profile in catalog.PRODUCTS[label].mig:
            g, gb = profile.name.split(".")
            assert (profile.slices, profile.memory_gb) == (int(g[:-1]), int(gb[:-2])), (label, profile)
            assert profile.slices * profile.max_per_gpu <= 7, (label, profile)

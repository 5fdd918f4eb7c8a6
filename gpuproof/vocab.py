"""Words the embedded cluster writes and the reader of clusters reads: resource names, label keys, annotations,
and the names of gpuproof's pods on a node (:func:`name_on`: the replay nodes serve their logs by those names).

A base module: it imports nothing, and the simulator (``sim/``) and the reader of clusters (``discovery/``) both
import it instead of each other.
"""

GPU = "nvidia.com/gpu"                       # the device plugin's whole-GPU resource
# on gpuproof's workload pods: the workload (script) the pod runs; replay nodes fail such a pod without a recording
COMPONENT_LABEL = "gpuproof.dev/component"
GPU_SHARED = "nvidia.com/gpu.shared"         # ... renamed when shared (renameByDefault)

# Which software wrote a simulated node's GPU labels and resources (e.g. "gpu-feature-discovery v0.19.3",
# "k8s-device-plugin v0.19.3", or "gpuproof model (...)" where NVIDIA's software cannot show it here).
LABELS_BY = "gpuproof.dev/labels-by"
RESOURCES_BY = "gpuproof.dev/resources-by"
SLICES_BY = "gpuproof.dev/slices-by"          # which software published the node's ResourceSlices

# NFD's label for a node with an NVIDIA PCI device (GFD's DaemonSet in NVIDIA's chart selects on it)
NFD_PCI_LABEL = "feature.node.kubernetes.io/pci-10de.present"

# simulated nodes: kwok's annotation, and its values ("unmanaged": kwok leaves the node alone, a dead kubelet)
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
SIMULATED = ("fake", "unmanaged")
INSTANCE_TYPE = "node.kubernetes.io/instance-type"

# managed offerings' own GPU labels
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
GKE_MAX_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
KARPENTER_GPU_MAKER = "karpenter.k8s.aws/instance-gpu-manufacturer"
AKS_ACCELERATOR = "kubernetes.azure.com/accelerator"

# GPU operator component (nvidia.com/gpu.deploy.<component>) -> the app label (and name prefix) of its pods
OPERATOR_COMPONENT_APPS = {
    "driver": "nvidia-driver-daemonset", "container-toolkit": "nvidia-container-toolkit-daemonset",
    "device-plugin": "nvidia-device-plugin-daemonset", "gpu-feature-discovery": "gpu-feature-discovery",
    "dcgm-exporter": "nvidia-dcgm-exporter", "dcgm": "nvidia-dcgm", "operator-validator": "nvidia-operator-validator",
    "node-status-exporter": "nvidia-node-status-exporter", "mig-manager": "nvidia-mig-manager",
    "sandbox-device-plugin": "nvidia-sandbox-device-plugin-daemonset", "vgpu-manager": "nvidia-vgpu-manager-daemonset",
}

# Dynamic Resource Allocation: the API group, NVIDIA's DRA driver and the DeviceClasses its chart installs
DRA_API = "resource.k8s.io/v1"
DRA_GROUP, DRA_VERSION = "resource.k8s.io", "v1"
DRA_DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
# DeviceClass name -> the device type its selector admits (NVIDIA's chart)
CLASS_TYPES = {GPU_CLASS: "gpu", MIG_CLASS: "mig"}
SIM_DRA_LABEL = "gpuproof.dev/sim-dra"           # on objects the embedded cluster publishes for its DRA pools

# nvidia.com/gpu.family (GFD) -> the architecture string go-nvlib gives NVIDIA's DRA driver
ARCHITECTURES = {"kepler": "Kepler", "maxwell": "Maxwell", "pascal": "Pascal", "volta": "Volta",
                 "turing": "Turing", "ampere": "Ampere", "ada-lovelace": "Ada Lovelace", "hopper": "Hopper",
                 "blackwell": "Blackwell"}


def name_on(node: str, prefix: str, index: int | None = None) -> str:
    """A pod name that names its node, ``<prefix>-<node>[-<index>]``: at most 63 characters (the node's part is cut,
    never the index), never ending in '-' or '.'. A test run once per node or pool gives each its own pod names: a
    name the previous node's test used and deleted may still be reached by work kwok queued for that pod, which
    kwok does by name (its pod controller's deletes and patches carry no UID): a CI run's ``share-two`` vanished so."""
    tail = f"-{index}" if index is not None else ""
    return f"{prefix}-{node}"[:63 - len(tail)].rstrip("-.") + tail


def fabric_job(nodes, again: bool = False) -> str:
    """The name of the fabric suite's job over ``nodes`` (its Service; its pods add ``-<i>``, i the node's place in
    ``nodes``): ``fab-<10 hex of the sorted node names>``, ``-again`` for a pair measured again with a known-good node
    and ``fab-ring-...`` for three nodes or more. Derived from the nodes alone, so replay nodes can serve a recording
    for the pod a pair will have (gpuproof.sim.replay)."""
    import hashlib

    digest = hashlib.sha1("|".join(sorted(nodes)).encode()).hexdigest()[:10]
    return ("fab-ring-" if len(nodes) > 2 else "fab-") + digest + ("-again" if again else "")


# ------------------------------------------------------------------ the fabric suite's pair schedule
# (gpuproof.bench.fabric_plan re-exports these; the replay nodes write the logs of the pairs it will measure)


def circle_rounds(nodes: list[str], limit: int | None = None) -> list[list[tuple[str, str]]]:
    """Every round of the circle method: n-1 rounds (n even; n rounds with a bye when odd), each pairing every node at
    most once, every pair exactly once over all rounds (each pair sorted). ``limit``: only the first rounds."""
    ring = list(nodes) + ([None] if len(nodes) % 2 else [])
    n = len(ring)
    out = []
    for _ in range(n - 1 if limit is None else min(n - 1, limit)):
        pairs = [(ring[i], ring[n - 1 - i]) for i in range(n // 2)]
        out.append([(min(p), max(p)) for p in pairs if None not in p])
        ring = [ring[0], ring[-1], *ring[1:-1]]          # node 0 stays, the others turn one place
    return [r for r in out if r]


def default_rounds(count: int) -> int:
    """Rounds that give every node two partners: 2 for an even count, 3 for an odd one (each node sits out once)."""
    return 2 if count % 2 == 0 else 3


def pair_rounds(nodes, every_pair: bool = False, rounds: int | None = None) -> list[list[tuple[str, str]]]:
    """Rounds of disjoint pairs over ``nodes`` (sorted first, so a run's schedule is the same every time): by default
    :func:`default_rounds`, ``rounds`` of them, or all (``every_pair``)."""
    nodes = sorted(set(nodes))
    if len(nodes) < 2:
        return []
    return circle_rounds(nodes, None if every_pair else max(1, rounds or default_rounds(len(nodes))))

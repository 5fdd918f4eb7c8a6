"""DRA figures for issue #10: a large DRA fleet's ResourceSlices, how long publishing and discovery take,
and the DRA suite's wall time on the shipped ``dra`` fleet.

    .venv/bin/python benchmarks/dra_scale.py [--nodes 200] [--repeat 5] [--out benchmarks/dra_scale.json]

The scale fleet: ``--nodes`` DRA nodes, 3/4 with eight whole H100s, 1/4 with two A100-80GB split into
MIG devices (1g.10gb x2, 2g.20gb, 3g.40gb per GPU), all offered only through DRA. Discovery is what a
run does before its first check: list Nodes, ResourceSlices and DeviceClasses, and build the inventory
of GPU nodes (median of ``--repeat``). Wall-clock seconds on whatever machine runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuproof.cluster.api import connect  # noqa: E402
from gpuproof.discovery.nodes import discover  # noqa: E402
from gpuproof.sim.fleet_file import load_fleet, parse_fleet  # noqa: E402
from gpuproof.sim.controlplane import SimCluster, find_free_base  # noqa: E402


def fleet_of(n: int):
    mig = n // 4
    taint = ["nvidia.com/gpu=present:NoSchedule"]
    return parse_fleet({"name": f"dra-scale-{n}", "pools": [
        {"name": "h100", "count": n - mig, "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}, "offer": "dra",
         "taints": taint},
        {"name": "a100-mig", "count": mig, "gpu": {"product": "NVIDIA-A100-SXM4-80GB", "count": 2}, "offer": "dra",
         "mig": {"strategy": "mixed", "profiles": {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}}, "taints": taint},
    ]})


def discovery_once(client):
    t0 = time.perf_counter()
    d = discover(client.node_dicts(), slices=client.dra_objects("resourceslices"),
                 device_classes=client.dra_objects("deviceclasses"))
    return time.perf_counter() - t0, d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="gpuproof-dra-scale-") as tmp:
        sim = SimCluster(Path(tmp) / "sim", base_port=find_free_base(), private=True)
        sim.up()
        try:
            fleet = fleet_of(args.nodes)
            t0 = time.perf_counter()
            sim.load_fleet(fleet, timeout=600)
            out["load_fleet_s"] = round(time.perf_counter() - t0, 2)
            client = connect(str(sim.kubeconfig))
            times, d = [], None
            for _ in range(args.repeat):
                t, d = discovery_once(client)
                times.append(t)
            slices = client.dra_objects("resourceslices")
            out.update({
                "nodes": args.nodes, "gpu_nodes_found": len(d.gpu_nodes), "resource_slices": len(slices),
                "devices": len(d.dra_devices), "slice_json_bytes": len(json.dumps(slices)),
                "discovery_s_median": round(statistics.median(times), 3),
                "discovery_s_all": [round(t, 3) for t in times],
            })
            sim.load_fleet(load_fleet("dra"), timeout=120)
            t0 = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "pytest", "suites/test_dra.py", "-q", "-p", "no:cacheprovider",
                                   f"--kubeconfig={sim.kubeconfig}", "--no-lease",
                                   f"--report-dir={Path(tmp) / 'reports'}"],
                                  cwd=REPO, capture_output=True, text=True)
            out["dra_suite_wall_s"] = round(time.perf_counter() - t0, 2)
            out["dra_suite_result"] = (proc.stdout.strip().splitlines()[-1] if proc.stdout.strip()
                                       else proc.stderr[-500:])
        finally:
            sim.down()
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Embedded-cluster figures: warm start, fleet creation and listing, and how the
advertisement + labels suites scale with the number of GPU nodes.

    .venv/bin/python benchmarks/sim_scale.py [--sizes 10 100 1000] [--out benchmarks/sim_scale.json]

Each size is a fleet of that many GPU nodes (half 8-GPU A100, 3/10 time-sliced L4,
1/5 H100 with mixed MIG) loaded into one private embedded cluster; the suites run as
a user runs them (a pytest subprocess against the kubeconfig). Wall-clock seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuproof.cluster.api import connect  # noqa: E402
from gpuproof.sim.fleet_file import load_fleet, parse_fleet  # noqa: E402
from gpuproof.sim.controlplane import SimCluster, find_free_base  # noqa: E402


def fleet_of(n: int):
    a100, l4 = n // 2, (n * 3) // 10
    h100 = n - a100 - l4
    taint = ["nvidia.com/gpu=present:NoSchedule"]
    return parse_fleet({"name": f"scale-{n}", "pools": [
        {"name": "a100", "count": a100, "gpu": {"product": "NVIDIA-A100-SXM4-80GB", "count": 8}, "taints": taint},
        {"name": "l4", "count": l4, "gpu": {"product": "NVIDIA-L4", "count": 1}, "timeSlicing": {"replicas": 4},
         "taints": taint},
        {"name": "h100", "count": h100, "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
         "mig": {"strategy": "mixed", "profiles": {"1g.10gb": 7}}, "taints": taint},
    ]})


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "sim_scale.json"))
    args = ap.parse_args()
    results: dict = {"sizes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimCluster(Path(tmp) / "sim", base_port=find_free_base(), private=True)
        results["sim_up_s"], kubeconfig = timed(lambda: sim.up(load_fleet("minimal")))
        print(f"warm sim up (minimal fleet): {results['sim_up_s']:.1f}s", flush=True)
        try:
            client = connect(str(kubeconfig))
            for n in args.sizes:
                fleet = fleet_of(n)
                load_s, _ = timed(lambda: sim.load_fleet(fleet, timeout=600,
                                                         progress=lambda m: print("   ", m, flush=True)))
                list_s, nodes = timed(client.node_dicts)
                cmd = [sys.executable, "-m", "pytest", "suites/test_advertisement.py", "suites/test_labels.py",
                       f"--kubeconfig={kubeconfig}", f"--report-dir={tmp}/reports", "-q", "-p", "no:cacheprovider"]
                suite_s, proc = timed(lambda: subprocess.run(cmd, cwd=REPO, capture_output=True, text=True))
                tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
                results["sizes"][n] = {"create_and_ready_s": round(load_s, 2), "list_s": round(list_s, 3),
                                       "nodes_listed": len(nodes), "suite_s": round(suite_s, 2),
                                       "suite_exit": proc.returncode, "suite_summary": tail}
                print(f"{n:>5} GPU nodes: create+Ready {load_s:6.1f}s  list {list_s:6.3f}s  "
                      f"advertisement+labels suites {suite_s:6.1f}s  ({tail})", flush=True)
        finally:
            sim.down()
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

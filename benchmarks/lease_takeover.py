"""How long the next run waits for the run lease of a killed one (issue #12's takeover).

    .venv/bin/python benchmarks/lease_takeover.py [--trials 5] [--duration 2]

A run lease with ``leaseDurationSeconds=--duration`` is taken and then abandoned without renewal or
release, as a SIGKILLed run leaves it; the next run's ``acquire`` is timed until it holds the lease.
The wait is about the lease duration plus the waiter's watch latency. One private embedded cluster
(minimal fleet) serves every trial. Wall-clock seconds; tests/test_concurrency.py checks only that the
takeover happens, never how fast.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuproof.cluster.api import connect  # noqa: E402
from gpuproof.sim.fleet_file import load_fleet  # noqa: E402
from gpuproof.cluster.lease import RunLease  # noqa: E402
from gpuproof.sim.controlplane import SimCluster, find_free_base  # noqa: E402


def takeover_s(client, duration_s: int, trial: int) -> float:
    dead = RunLease(client, f"killed-{trial}", duration_s=duration_s)
    dead.acquire(wait_s=30)
    dead._stop.set()                 # as if SIGKILLed: no renewal, no release
    dead.held = False
    t0 = time.perf_counter()
    heir = RunLease(client, f"next-{trial}")
    heir.acquire(wait_s=120)
    took = time.perf_counter() - t0
    heir.release()
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--duration", type=int, default=2, help="leaseDurationSeconds of the abandoned lease")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimCluster(Path(tmp) / "sim", base_port=find_free_base(), private=True)
        kubeconfig = sim.up(load_fleet("minimal"))
        try:
            client = connect(str(kubeconfig))
            times = [takeover_s(client, args.duration, i) for i in range(args.trials)]
        finally:
            sim.down()
    print(f"lease duration {args.duration} s, {args.trials} trials: takeover after "
          f"median {statistics.median(times):.2f} s, min {min(times):.2f} s, max {max(times):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Record the replay nodes' pod logs: gpuproof's own workloads run over NVIDIA's mock NVML on this machine.

    .venv/bin/python -m gpuproof.sim.replay_record [--out gpuproof/sim/recordings] [--slow-quota 70]

Each workload runs as its pod runs it on the embedded cluster's kubelet nodes: ``python workloads/<name>.py`` with
the arguments gpuproof gives that pod on the CPU path (health and census: the benchmark's CPU parameters; the
topology probe: none), ``MOCK_NVML_CONFIG`` a mock config of the recorded product (gpuproof.sim.gpunodes.mock_config,
seeded ``replay-recording/<file>``) and NVIDIA's mock first on ``LD_LIBRARY_PATH``. Its stdout and stderr are
written as the kubelet writes a container's log (CRI format: ``<RFC3339Nano time> <stream> F <line>``), each line
stamped when it was read. Every workload runs in a cgroup (v1 ``cpu``) with the most CPU shares, so other work on
this machine does not skew it, as a node's CPU is its own; the slow census runs the same command with the cgroup's
CFS quota holding it to ``--slow-quota`` percent of one core; the recording is kept only when its matmul median is
really at most 75% of the normal recordings' (30% slower or more) and every normal GPU's is within 10% of their
median.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PRODUCT, GPUS = "NVIDIA-H100-80GB-HBM3", 8
CGROUP = Path("/sys/fs/cgroup/cpu/gpuproof-replay-record")
SHARES = 262144      # cgroup v1's most: the recording wins the CPU from whatever else runs here (a node of its own)
HEALTH_ARGS = ["--device", "cpu", "--load-s", "1.0", "--copy-mib", "32", "--copy-iters", "5", "--dcgm-level", "1"]
CENSUS_ARGS = ["--device", "cpu", "--matmul-size", "256", "--copy-mib", "16", "--allreduce-mib", "4", "--iters", "20",
               "--warmup", "5", "--threads", "1"]


def _stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def run_recorded(argv: list[str], env: dict, log: Path, cgroup: Path | None = None) -> tuple[int, float, str]:
    """Run argv; write its stdout and stderr to ``log`` in CRI format. Returns exit code, wall seconds, stdout."""
    lines: list[tuple[float, int, str, str]] = []
    lock = threading.Lock()

    def enter_cgroup():
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=enter_cgroup, cwd=REPO)

    def pump(stream, name):
        for n, line in enumerate(stream):
            with lock:
                lines.append((time.monotonic(), n, name, f"{_stamp()} {name} F {line.rstrip(chr(10))}"))

    threads = [threading.Thread(target=pump, args=(proc.stdout, "stdout")),
               threading.Thread(target=pump, args=(proc.stderr, "stderr"))]
    for t in threads:
        t.start()
    code = proc.wait(timeout=600)
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    lines.sort(key=lambda x: (x[0], x[2], x[1]))
    log.write_text("".join(x[3] + "\n" for x in lines))
    stdout = "".join(x[3].split(" F ", 1)[1] + "\n" for x in lines if x[2] == "stdout")
    return code, wall, stdout


def _last_json(stdout: str) -> dict:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("the workload printed no JSON result")


def _matmul(result: dict) -> list[float]:
    return [g["matmul_tflops"] for g in result["gpus"]]


def main(argv: list[str] | None = None) -> int:
    from .fleet_file import parse_fleet
    from . import gpunodes, nvidia

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "recordings"))
    ap.add_argument("--normal", type=int, default=3, help="normal census recordings")
    ap.add_argument("--slow-quota", type=int, default=70, help="percent of one core for the slow census")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sw = nvidia.locate(build_missing=False)
    py = sys.executable
    plan = [("health-0.log", "health", "normal", GPUS, [py, "workloads/health.py", *HEALTH_ARGS], None),
            ("probe-0.log", "probe", "normal", 2, [py, "workloads/probe.py"], None)]
    plan += [(f"census-{k}.log", "census", "normal", GPUS, [py, "workloads/census.py", *CENSUS_ARGS], None)
             for k in range(args.normal)]
    plan.append(("census-slow.log", "census", "slow", GPUS, [py, "workloads/census.py", *CENSUS_ARGS],
                 args.slow_quota))
    index = {"product": PRODUCT, "gpus": GPUS, "recorded": _stamp(), "host_cpus": os.cpu_count(),
             "command": f"{Path(py).name} -m gpuproof.sim.replay_record " + " ".join(argv or sys.argv[1:]),
             "recordings": []}
    results: dict[str, dict] = {}
    for file, workload, kind, gpus, cmd, quota in plan:
        seed = f"replay-recording/{file.removesuffix('.log')}"
        fleet = parse_fleet({"name": "rec", "pools": [{"name": "rec", "count": 1,
                                                       "gpu": {"product": PRODUCT, "count": gpus}}]})
        cfg = out / ".mock-nvml.yaml"
        mock = gpunodes.mock_config(sw, fleet.pools[0].gpu, seed=seed)
        cfg.write_text(yaml.safe_dump(mock, sort_keys=False))
        env = {**sw.mock_env(cfg), "PYTHONUNBUFFERED": "1"}
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.shares").write_text(str(SHARES))
        (CGROUP / "cpu.cfs_period_us").write_text("100000")
        (CGROUP / "cpu.cfs_quota_us").write_text(str(quota * 1000) if quota is not None else "-1")
        code, wall, stdout = run_recorded(cmd, env, out / file, CGROUP)
        cfg.unlink()
        result = _last_json(stdout)
        results[file] = result
        print(f"{file}: exit {code}, {wall:.1f}s" + (f", CPU quota {quota}% of a core" if quota else ""), flush=True)
        if code != 0:
            raise SystemExit(f"{file}: the workload exited {code}")
        index["recordings"].append({
            "file": file, "workload": workload, "kind": kind, "uuids": [d["uuid"] for d in mock["devices"]],
            "host": result.get("host"), "mock_seed": seed, "gpus": gpus, "exit_code": code,
            "wall_s": round(wall, 2), "cpu_quota_pct": quota,
            "argv": ["python", *cmd[1:]], "env": {"MOCK_NVML_CONFIG": f"mock_config(seed={seed!r})",
                                                   "LD_LIBRARY_PATH": "NVIDIA's mock NVML (gpuproof sim build)"}})
    if CGROUP.exists():
        CGROUP.rmdir()
    normal = [v for f, r in results.items() if f.startswith("census-") and f != "census-slow.log" for v in _matmul(r)]
    med = statistics.median(normal)
    slow = statistics.median(_matmul(results["census-slow.log"]))
    index["census_matmul_tflops"] = {"normal_median": med, "normal_min": min(normal), "normal_max": max(normal),
                                     "slow_median": slow, "slow_share_of_normal": slow / med}
    print(f"census matmul: normal median {med:.4f} TFLOPS ({min(normal) / med:.0%}-{max(normal) / med:.0%}), "
          f"slow {slow:.4f} ({slow / med:.0%})", flush=True)
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    if slow / med > 0.75:
        print("the slow recording is not 30% slower than the normal ones: record again", file=sys.stderr)
        return 1
    if min(normal) / med < 0.9 or max(normal) / med > 1.1:
        print("the normal recordings spread more than 10% around their median (a busy machine?): record again",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The fabric suite's pair schedule and its judging at 1,000 GPU nodes, against replay nodes (issue #50 item 5).

    .venv/bin/python benchmarks/fabric_scale.py [--nodes 1000] [--slow-node 416] [--parallel N] [--out FILE]

One private embedded cluster with ``--nodes`` replay nodes of one pool (``backend: replay``, 8x H100 as the
replay recordings; gpuproof/sim/replay.py), one of whose links is slow: the fleet fault ``replaySlowLink`` on node
``--slow-node`` names its partner of the default schedule's first round, and that pair's pod returns the pair workload
recorded over a veth really shaped to 20 Mbit/s (gpuproof/sim/recordings/README.md); every other pair returns a
normal recording with its own two nodes' names. Then the whole fabric pair check, as a user runs it:
``gpuproof run --kubeconfig <its kubeconfig> --only-bench -k fabric_pairs`` (pods, Services, the pair rounds bounded by
``--parallel``, each result read from pod ``-0``'s log through the API server, the judgement, the retests, the
verdicts, the report), measuring:

- the run's wall time (the subprocess, start to exit), and the pairs phase's (the suite's ``pairs_wall_s`` record:
  the schedule, the judgement, the retests and the verdicts of the pool), with each round's time from the run's
  progress lines;
- rounds and pairs (``rounds`` record), pairs measured again;
- fabric pods in flight: a watch on the pods labelled ``gpuproof.dev/fabric=jobs`` counts those that exist, the most
  ever and a series once a second; never above ``--parallel``;
- API requests per second (the API server's ``apiserver_request_total`` before and after, over the run's wall time)
  and the CPU seconds of the control plane's processes (benchmarks/scale_kwok.py's measures);
- the verdicts: every failed check, which must be exactly ``fabric-link`` of the slow link, and no ``fabric-node``.

Writes the figures as JSON (``--out``) and prints them. Exit 0 only when the slow link and nothing else fails and the
pods in flight never exceeded the bound.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpuproof.plugin.fanout import DEFAULT_PARALLEL  # noqa: E402
from gpuproof.sim.controlplane import SimCluster, find_free_base  # noqa: E402
from gpuproof.sim.fleet_file import load_fleet  # noqa: E402
from gpuproof.vocab import pair_rounds  # noqa: E402
from scale_kwok import InFlight, cpu_seconds, request_total  # noqa: E402

FABRIC_PODS = "gpuproof.dev/fabric=jobs"         # gpuproof.bench.fabric: LABEL=tag of every fabric pod
ROUND = re.compile(r"fabric (?P<pool>.+?)(?P<again> \(again\))?: round (?P<i>\d+)/(?P<n>\d+): (?P<pairs>\d+) pair\(s\) "
                   r"side by side in (?P<s>\d+)s")


def slow_link(nodes: int, slow: int) -> tuple[int, int]:
    """(node, partner): ``slow`` and its partner in the default schedule's first round."""
    names = [f"h100-{i}" for i in range(nodes)]
    me = names[slow]
    a, b = next(p for p in pair_rounds(names)[0] if me in p)
    return slow, names.index(b if a == me else a)


def fleet_file(path: Path, nodes: int, link: tuple[int, int]) -> Path:
    path.write_text(yaml.safe_dump({
        "name": f"fabric-{nodes}",
        "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
        "pools": [{"name": "h100", "count": nodes, "backend": "replay", "instanceType": "p5.48xlarge",
                   "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
                   "faults": [{"node": link[0], "replaySlowLink": link[1]}]}]}, sort_keys=False))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--slow-node", type=int, default=None, help="one node of the slow link (default: nodes * 5 // 12;"
                                                                " the other is its partner in the first round)")
    ap.add_argument("--parallel", type=int, default=None,
                    help=f"gpuproof run --parallel (default: its own, {DEFAULT_PARALLEL})")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "fabric_scale.json"))
    ap.add_argument("--keep", help="keep the run's report folder here")
    ap.add_argument("--node-lease-s", type=int, default=40,
                    help="the Lease kwok's nodes hold, renewed every quarter of it (default 40, a kubelet's)")
    args = ap.parse_args()
    link = slow_link(args.nodes, args.nodes * 5 // 12 if args.slow_node is None else args.slow_node)
    a, b = sorted(f"h100-{i}" for i in link)
    link_name = f"{a}<->{b}"
    bound = args.parallel or DEFAULT_PARALLEL
    out: dict = {"nodes": args.nodes, "slow_link": link_name, "parallel": bound, "node_lease_s": args.node_lease_s}
    with tempfile.TemporaryDirectory(prefix="gpuproof-fabric-scale-") as tmp:
        tmp = Path(tmp)
        sim = SimCluster(tmp / "sim", base_port=find_free_base(), private=True, node_lease_s=args.node_lease_s)
        try:
            t0 = time.monotonic()
            kubeconfig = sim.up(load_fleet(fleet_file(tmp / "fleet.yaml", args.nodes, link)),
                                progress=lambda m: print("   ", m, flush=True), timeout=900)
            out["cluster_up_s"] = round(time.monotonic() - t0, 1)
            out["replayed_logs"] = sum(1 for p in (tmp / "sim" / "replay").iterdir() if p.name.startswith("fab-"))
            print(f"embedded cluster with {args.nodes} replay nodes up in {out['cluster_up_s']}s "
                  f"({out['replayed_logs']} fabric pod logs written)", flush=True)
            reports = Path(args.keep) if args.keep else tmp / "reports"
            cmd = [str(REPO / ".venv" / "bin" / "gpuproof"), "run", "--kubeconfig", str(kubeconfig),
                   "--report-dir", str(reports), "--run-id", "fabric-scale", "--only-bench", "-k", "fabric_pairs"]
            if args.parallel:
                cmd += ["--parallel", str(args.parallel)]
            out["command"] = " ".join(cmd[1:])
            before, by_before = request_total(sim)
            cpu0, kids0 = cpu_seconds(sim), resource.getrusage(resource.RUSAGE_CHILDREN)
            watch = InFlight(str(kubeconfig), selector=FABRIC_PODS).start()
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
            wall = time.monotonic() - t0
            watch.close()
            after, by_after = request_total(sim)
            cpu1, kids1 = cpu_seconds(sim), resource.getrusage(resource.RUSAGE_CHILDREN)
            out["cpu_s"] = {c: round(cpu1[c] - cpu0.get(c, 0.0), 1) for c in cpu1}
            out["cpu_s"]["gpuproof run"] = round(kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime, 1)
            with open("/proc/loadavg") as f:
                out["loadavg_after"] = f.read().split()[:3]
            if args.keep:
                (reports / "run.log").write_text(proc.stdout + proc.stderr)
            out.update(_figures(reports / "fabric-scale", proc, wall, watch, before, after, by_before, by_after))
        finally:
            sim.down()
    fails = out["failed_checks"]
    named = [f for f in fails if (f["check"], f["target"]) == ("fabric-link", link_name)]
    others = [f for f in fails if f not in named]
    out["slow_link_named"] = bool(named)
    out["other_failures"] = others
    ok = bool(named) and not others and out["pods_in_flight_max"] <= bound and out["exit_code"] == 1
    out["ok"] = ok
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\ngpuproof run --only-bench -k fabric_pairs: {out['wall_s']}s wall, exit {out['exit_code']}, "
          f"{out['summary']}")
    print(f"pairs phase (schedule, judgement, retests, verdicts): {out['pairs_wall_s']}s; {out['rounds']} rounds, "
          f"{out['pairs']} pairs, {out['retests']} measured again; rounds: "
          + ", ".join(f"{r['pairs']} in {r['s']}s" + (" (again)" if r["again"] else "") for r in out["round_times"]))
    print(f"fabric pods in flight (watch): at most {out['pods_in_flight_max']} (bound {bound}); "
          f"{out['pods_created']} pods created; left at the end: {out['pods_left_at_end'] or 'none'}; watch "
          f"restarts: {out['pod_watch_restarts'] or 'none'}")
    print(f"API requests: {out['api_requests']:.0f} in {out['wall_s']}s = {out['api_requests_per_s']:.1f}/s; most: "
          + ", ".join(f"{k} {v:.0f}" for k, v in list(out["api_requests_top"].items())[:6]))
    print("CPU seconds during the run: " + ", ".join(f"{k} {v}" for k, v in out["cpu_s"].items())
          + f" (load average after: {' '.join(out['loadavg_after'])})")
    print(f"verdicts: {out['verdicts']}; slow pairs {out['slow_pairs']}, bad links {out['bad_links']}, bad nodes "
          f"{out['bad_nodes'] or 'none'}")
    print(f"slow link {link_name} named: {bool(named)}" + (f" ({named[0]['actual'][:240]})" if named else ""))
    print(f"other failures: {len(others)}" + "".join(f"\n  {f['target']} {f['check']}: {str(f['actual'])[:160]}"
                                                     for f in others[:20]))
    return 0 if ok else 1


def _records(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _params(m: dict) -> dict:
    return json.loads(m["parameters"]) if isinstance(m.get("parameters"), str) else (m.get("parameters") or {})


def _figures(run_dir: Path, proc, wall: float, watch: InFlight, before, after, by_before, by_after) -> dict:
    checks = _records(run_dir / "checks.jsonl")
    fabric = {m["metric"]: m for m in _records(run_dir / "metrics.jsonl") if m.get("benchmark") == "fabric"
              and m["metric"] in ("pairs_wall_s", "rounds", "slow_pairs", "bad_links", "bad_nodes",
                                  "reference_busbw_gbps")}
    rounds = fabric.get("rounds")
    delta = by_after.copy()
    delta.subtract(by_before)
    top = {f"{verb} {res}": v for (verb, res), v in delta.most_common(10)}
    text = proc.stdout + proc.stderr
    tail = [x for x in proc.stdout.strip().splitlines() if " in " in x and ("passed" in x or "failed" in x)]
    seen = [m.groupdict() for m in ROUND.finditer(text)]
    return {"wall_s": round(wall, 1), "exit_code": proc.returncode, "summary": (tail or ["?"])[-1].strip("= "),
            "output_tail": text[-3000:] if proc.returncode not in (0, 1) else "",
            "pairs_wall_s": round(fabric["pairs_wall_s"]["value"], 1) if "pairs_wall_s" in fabric else None,
            "rounds": int(rounds["value"]) if rounds else None,
            "pairs": _params(rounds).get("pairs") if rounds else None,
            "retests": _params(rounds).get("retests") if rounds else None,
            "reference_busbw_gbps": fabric.get("reference_busbw_gbps", {}).get("value"),
            "round_times": [{"round": int(r["i"]), "of": int(r["n"]), "pairs": int(r["pairs"]), "s": int(r["s"]),
                             "again": bool(r["again"])} for r in seen],
            **{k: _params(fabric[k]).get("names", "") if k in fabric else None
               for k in ("slow_pairs", "bad_links", "bad_nodes")},
            "checks": len(checks), "verdicts": dict(collections.Counter(c["verdict"] for c in checks)),
            "failed_checks": [{k: c.get(k) for k in ("target", "check", "expected", "actual", "message")}
                              for c in checks if c["verdict"] == "fail"],
            "pods_in_flight_max": watch.most, "pods_created": watch.created, "pod_events": watch.events,
            "pod_watch_restarts": watch.restarts, "pods_left_at_end": sorted("/".join(k) for k in watch.live),
            "pods_in_flight_series": watch.series,
            "api_requests": after - before, "api_requests_per_s": round((after - before) / wall, 1),
            "api_requests_top": top}


if __name__ == "__main__":
    sys.exit(main())

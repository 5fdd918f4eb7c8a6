"""A whole fleet at once, at 1,000 GPU nodes: gpuproof's default run against replay nodes (issue #36).

    .venv/bin/python benchmarks/scale_kwok.py [--nodes 1000] [--slow 417] [--parallel N] [--out FILE]

One private embedded cluster with ``--nodes`` replay nodes (``backend: replay``, gpuproof/sim/replay.py: kwok nodes
whose workload pods return recordings of gpuproof's own health, census and topology probe as their logs, read by
gpuproof through the API server's ``pods/log``), 8 H100s each as NVIDIA's GFD and device plugin see them over the
mock NVML, one node (``--slow``) whose census recording was made under a CPU quota. Then the whole default
``gpuproof run --kubeconfig <its kubeconfig>`` (every check, the per-node pod checks included), measuring:

- the run's wall time (the subprocess, from start to exit), and each fanned-out check's (its ``fanout`` records);
- pods in flight: a watch on the pods carrying the fan-out's label counts those that exist (created, not yet gone),
  sampled on every event; the most ever, and a time series once a second; never above ``--parallel``;
- API requests per second: the API server's ``apiserver_request_total`` (summed over its labels) before and after,
  over the run's wall time, with the verbs and resources that made most of them;
- the verdicts: every failed check, which must all be census checks of the slow node, and it must be named.

Writes the figures as JSON (``--out``) and prints them. Exit 0 only when the slow node is named, nothing else fails
and the pods in flight never exceeded the bound.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import resource
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuproof.cluster.api import connect  # noqa: E402
from gpuproof.plugin.fanout import DEFAULT_PARALLEL, FANOUT_LABEL  # noqa: E402
from gpuproof.sim.controlplane import SimCluster, find_free_base  # noqa: E402
from gpuproof.sim.fleet_file import load_fleet  # noqa: E402


def fleet_file(path: Path, nodes: int, slow: int, start_s: float = 0.0, run_s: float = 0.0) -> Path:
    pool = {"name": "h100", "count": nodes, "backend": "replay", "instanceType": "p5.48xlarge",
            "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8},
            "faults": [{"node": slow, "replaySlow": True}]}
    if start_s or run_s:
        pool["replayLatency"] = {"startS": start_s, "runS": run_s}
    path.write_text(yaml.safe_dump({
        "name": f"replay-{nodes}",
        "defaults": {"taints": ["nvidia.com/gpu=present:NoSchedule"]},
        "pools": [pool]}, sort_keys=False))
    return path


class InFlight:
    """Pods with the fan-out's label (or ``selector``'s) that exist now, from one watch (events arrive in the API
    server's order)."""

    def __init__(self, kubeconfig: str, selector: str = FANOUT_LABEL):
        self.client = connect(kubeconfig=kubeconfig)
        self.selector = selector
        self.live: set[tuple[str, str]] = set()
        self.most = 0
        self.created = 0
        self.series: list[tuple[float, int]] = []
        self.events = 0
        self.restarts: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._watch, daemon=True),
                        threading.Thread(target=self._sample, daemon=True)]

    def start(self) -> "InFlight":
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()
        return self

    def _list(self) -> str:
        """List the pods (the truth after a lost watch); returns the resource version to watch from."""
        resp = self.client.core.list_pod_for_all_namespaces(label_selector=self.selector)
        with self.lock:
            self.live = {(p.metadata.namespace, p.metadata.name) for p in resp.items
                         }
            self.most = max(self.most, len(self.live))
        return resp.metadata.resource_version

    def _watch(self) -> None:
        from kubernetes import watch

        core = self.client.core
        rv = self._list()
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(core.list_pod_for_all_namespaces, label_selector=self.selector,
                                   resource_version=rv, timeout_seconds=30, allow_watch_bookmarks=True):
                    obj = ev["object"]
                    if ev["type"] == "BOOKMARK":
                        meta = obj.get("metadata") if isinstance(obj, dict) else None
                        rv = (meta or {}).get("resourceVersion", rv) if meta is not None else \
                            obj.metadata.resource_version
                        continue
                    if ev["type"] == "ERROR" or isinstance(obj, dict):
                        raise RuntimeError(f"watch event {ev['type']}: {str(obj)[:120]}")
                    rv = obj.metadata.resource_version
                    key = (obj.metadata.namespace, obj.metadata.name)
                    with self.lock:
                        if ev["type"] == "ADDED" and key not in self.live:
                            self.created += 1
                            self.live.add(key)
                        elif ev["type"] == "DELETED":
                            self.live.discard(key)
                        self.most = max(self.most, len(self.live))
                        self.events += 1
                    if self.stop.is_set():
                        break
            except Exception as exc:  # noqa: BLE001  (a gone resource version: list again)
                if self.stop.is_set():
                    return
                self.restarts.append(f"{time.monotonic() - self.t0:.1f}s: {str(exc).splitlines()[0][:160]}")
                try:
                    rv = self._list()
                except Exception:  # noqa: BLE001
                    if self.stop.wait(1.0):
                        return
            finally:
                w.stop()

    def _sample(self) -> None:
        while not self.stop.wait(1.0):
            with self.lock:
                self.series.append((round(time.monotonic() - self.t0, 1), len(self.live)))

    def close(self) -> None:
        self.stop.set()


def cpu_seconds(sim: SimCluster) -> dict[str, float]:
    """CPU seconds (user + system) each control-plane process has used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for comp, pid in sim.load_state().pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[comp] = (int(fields[11]) + int(fields[12])) / tick
    return out


def request_total(sim: SimCluster) -> tuple[float, collections.Counter]:
    """The API server's apiserver_request_total, summed, and by (verb, resource); its 429s under ("429", "")."""
    state = sim.load_state()
    pk = sim.dir / "pki"
    ctx = ssl.create_default_context(cafile=str(pk / "ca.crt"))
    ctx.load_cert_chain(str(pk / "admin.crt"), str(pk / "admin.key"))
    with urllib.request.urlopen(f"{state.api_url}/metrics", context=ctx, timeout=30) as r:
        text = r.read().decode()
    total, by = 0.0, collections.Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels, value = line.rsplit(" ", 1)
        fields = dict(kv.split("=", 1) for kv in labels[labels.index("{") + 1:-1].split(",") if "=" in kv)
        total += float(value)
        if fields.get("code", "").strip('"') == "429":
            by[("429", "")] += float(value)
        sub = fields.get("subresource", '""').strip('"')
        by[(fields.get("verb", "").strip('"'), fields.get("resource", "").strip('"') + (f"/{sub}" if sub else ""))] \
            += float(value)
    return total, by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--slow", type=int, default=None, help="the slow node's index (default: nodes * 5 // 12)")
    ap.add_argument("--parallel", type=int, default=None, help=f"gpuproof run --parallel (default: its own, "
                                                               f"{DEFAULT_PARALLEL})")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "scale_kwok.json"))
    ap.add_argument("--keep", help="keep the run's report folder here")
    ap.add_argument("--node-lease-s", type=int, default=40,
                    help="the Lease kwok's nodes hold, renewed every quarter of it (default 40, a kubelet's)")
    ap.add_argument("--pod-start-s", type=float, default=5.0,
                    help="seconds each pod takes to start on a replay node (image pull, container start; default 5)")
    ap.add_argument("--pod-run-s", type=float, default=15.0,
                    help="seconds each replayed workload runs (default 15: a pod takes 20 s in all)")
    ap.add_argument("--select", "-k", help="gpuproof run -k: only these checks (e.g. a comparison at --parallel 16)")
    args = ap.parse_args()
    slow = args.nodes * 5 // 12 if args.slow is None else args.slow
    slow_node = f"h100-{slow}"
    bound = args.parallel or DEFAULT_PARALLEL
    out: dict = {"nodes": args.nodes, "slow_node": slow_node, "parallel": bound, "node_lease_s": args.node_lease_s,
                 "pod_start_s": args.pod_start_s, "pod_run_s": args.pod_run_s, "select": args.select}
    with tempfile.TemporaryDirectory(prefix="gpuproof-scale-kwok-") as tmp:
        tmp = Path(tmp)
        sim = SimCluster(tmp / "sim", base_port=find_free_base(), private=True, node_lease_s=args.node_lease_s)
        try:
            t0 = time.monotonic()
            kubeconfig = sim.up(load_fleet(fleet_file(tmp / "fleet.yaml", args.nodes, slow, args.pod_start_s,
                                                      args.pod_run_s)),
                                progress=lambda m: print("   ", m, flush=True), timeout=900)
            out["cluster_up_s"] = round(time.monotonic() - t0, 1)
            print(f"embedded cluster with {args.nodes} replay nodes up in {out['cluster_up_s']}s", flush=True)
            reports = Path(args.keep) if args.keep else tmp / "reports"
            cmd = [str(REPO / ".venv" / "bin" / "gpuproof"), "run", "--kubeconfig", str(kubeconfig),
                   "--report-dir", str(reports), "--run-id", "scale-kwok"]
            if args.parallel:
                cmd += ["--parallel", str(args.parallel)]
            if args.select:
                cmd += ["-k", args.select]
            out["command"] = " ".join(cmd[1:])
            before, by_before = request_total(sim)
            cpu0, kids0 = cpu_seconds(sim), resource.getrusage(resource.RUSAGE_CHILDREN)
            watch = InFlight(str(kubeconfig)).start()
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
            (tmp / "run.log").write_text(proc.stdout + proc.stderr)
            if args.keep:
                (reports / "run.log").write_text(proc.stdout + proc.stderr)
            run_dir = reports / "scale-kwok"
            out.update(_figures(run_dir, proc, wall, watch, before, after, by_before, by_after))
        finally:
            sim.down()
    fails = out["failed_checks"]
    named = [f for f in fails if f["target"] == slow_node and f["check"].startswith("census-")]
    others = [f for f in fails if f not in named]
    out["slow_node_named"] = bool(named)
    out["other_failures"] = others
    census = not args.select or "census" in args.select
    ok = (bool(named) or not census) and not others and out["pods_in_flight_max"] <= bound
    out["ok"] = ok
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"\ngpuproof run: {out['wall_s']}s wall, exit {out['exit_code']}, {out['summary']}")
    for job in out["fanout"]:
        print(f"  {job['job']}: {job['nodes']} nodes in {job['wall_s']}s (nodes' sum {job['node_sum_s']}s), "
              f"at most {job['max_pods_in_flight']:.0f} pods in flight")
    print(f"pods in flight (watch): at most {out['pods_in_flight_max']} (bound {bound}); "
          f"{out['pods_created']} pods created; left at the end: {out['pods_left_at_end'] or 'none'}; watch "
          f"restarts: {out['pod_watch_restarts'] or 'none'}")
    print(f"API requests: {out['api_requests']:.0f} in {out['wall_s']}s = {out['api_requests_per_s']:.1f}/s, "
          f"429s {out['api_429s']:.0f}; most: "
          + ", ".join(f"{k} {v:.0f}" for k, v in list(out["api_requests_top"].items())[:6]))
    print("CPU seconds during the run: " + ", ".join(f"{k} {v}" for k, v in out["cpu_s"].items())
          + f" (load average after: {' '.join(out['loadavg_after'])})")
    print(f"slow node {slow_node} named: {bool(named)}" + (f" ({named[0]['message'][:200]})" if named else ""))
    print(f"other failures: {len(others)}" + "".join(f"\n  {f['target']} {f['check']}: {f['message'][:160]}"
                                                     for f in others[:20]))
    return 0 if ok else 1


def _figures(run_dir: Path, proc, wall: float, watch: InFlight, before, after, by_before, by_after) -> dict:
    checks = [json.loads(x) for x in (run_dir / "checks.jsonl").read_text().splitlines() if x.strip()] \
        if (run_dir / "checks.jsonl").exists() else []
    metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()] \
        if (run_dir / "metrics.jsonl").exists() else []
    jobs: dict[str, dict] = {}
    for m in metrics:
        if m.get("benchmark") == "fanout" and m.get("metric") in ("wall_s", "node_sum_s", "max_pods_in_flight"):
            p = json.loads(m["parameters"]) if isinstance(m["parameters"], str) else m["parameters"]
            job = jobs.setdefault(p["job"], {"job": p["job"], "nodes": p["nodes"]})
            job[m["metric"]] = round(m["value"], 1)
    delta = by_after.copy()
    delta.subtract(by_before)
    throttled = delta.pop(("429", ""), 0.0)
    top = {f"{verb} {res}": v for (verb, res), v in delta.most_common(10)}
    tail = [x for x in proc.stdout.strip().splitlines() if " in " in x and ("passed" in x or "failed" in x)]
    return {"wall_s": round(wall, 1), "exit_code": proc.returncode, "summary": (tail or ["?"])[-1].strip("= "),
            "checks": len(checks), "verdicts": dict(collections.Counter(c["verdict"] for c in checks)),
            "failed_checks": [{k: c.get(k) for k in ("target", "check", "expected", "actual", "message")}
                              for c in checks if c["verdict"] == "fail"],
            "fanout": list(jobs.values()),
            "pods_in_flight_max": watch.most, "pods_created": watch.created, "pod_events": watch.events,
            "pod_watch_restarts": watch.restarts, "pods_left_at_end": sorted("/".join(k) for k in watch.live),
            "pods_in_flight_series": watch.series,
            "api_requests": after - before, "api_requests_per_s": round((after - before) / wall, 1),
            "api_429s": throttled,
            "api_requests_top": top}


if __name__ == "__main__":
    sys.exit(main())

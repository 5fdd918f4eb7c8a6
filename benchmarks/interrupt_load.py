"""How fast a run obeys Ctrl-C (or SIGTERM), with one pod or hundreds of pods and watches in flight (issue #52 item 5).

    .venv/bin/python benchmarks/interrupt_load.py [--trials 5] [--nodes 40] [--pods-per-node 5] [--busy 4]
                                                  [--scenario one|fanout|both] [--signal INT|TERM] [--show]
                                                  [--checkout PATH --checkout PATH]

One private embedded cluster serves every trial: ``--nodes`` kwok GPU nodes (one pool, 8 GPUs each). Each trial
runs a suite as a user would (pytest with ``-p gpuproof.pytest_plugin`` against the cluster's kubeconfig, this
checkout's gpuproof) and interrupts it once its pods exist:

- ``one``: tests/test_cleanup.py's suite: one pod that never schedules, waited on for 600 s in the test's own thread;
- ``fanout``: one per-node check over every node through the fan-out (``--parallel`` as many pods as there are), each
  node's work holding ``--pods-per-node`` pods that never finish (pause pods, Running on kwok), each waited on through
  the check's shared pod watch, beside the progress plugin's watches: the signal comes once every pod exists.

``--busy`` busy loops (one Python process each) run beside every trial, started before it and killed after. A trial
is a pass when the run exits within ``--within`` seconds of the signal, leaves nothing labelled with its run in
the cluster, and wrote its report (``run.json`` with the outcome ``interrupted``). Printed per trial: seconds from
the signal to the exit, and at the end the pass count and the times' median and max; ``--show`` adds each trial's
output, every line with its time after the signal. ``--checkout`` twice (another checkout's root, e.g. a
``git archive`` of an earlier commit with its ``gpuproof``, ``controlplane`` and ``workloads``) compares two
gpuproofs trial by trial under the same load.

What a slow exit waited on: ``--dump-at S`` dumps the run's threads S seconds after the signal, and a run still alive
after ``--within`` seconds is dumped before it is killed: in C by gdb (where installed), in Python by faulthandler
(SIGUSR1, into a file: pytest captures the run's stderr). ``--pytest-args '-p plugin'`` adds a plugin of timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuproof.cluster.api import connect, watch_until  # noqa: E402
from gpuproof.sim.controlplane import SimCluster, find_free_base  # noqa: E402
from gpuproof.sim.fleet_file import parse_fleet  # noqa: E402

ONE = textwrap.dedent('''
    from gpuproof.plugin.checks import pod

    def test_hangs(run):
        run.apply(pod("stuck", {"nvidia.com/gpu": 999}))
        run.wait_running("stuck", timeout=600)      # never: interrupted
''')

FANOUT = textwrap.dedent('''
    import pytest

    from gpuproof.bench.base import applied
    from gpuproof.plugin.checks import pod, tolerations_for

    PER_NODE = int("{per_node}")


    def hang(run, node, lane):
        pods = [pod(f"hang-{{node.name}}-{{i}}", node=node.name, tolerations=tolerations_for(node),
                    labels={{**run.labels, **lane.labels}}) for i in range(PER_NODE)]
        with lane.pods(PER_NODE), applied(run, pods, lane=lane):
            for p in pods:                                  # pause pods: Running on kwok, never done
                lane.wait_done(p["metadata"]["name"], timeout=600)


    @pytest.mark.places_pods
    def test_fan_hangs(gpu_node, run, fanout, request):
        fanout.result(request.node, gpu_node, lambda n, lane: hang(run, n, lane), name="hang")
''')

# the run under a wrapper that dumps every thread's stack on SIGUSR1: what a run that does not exit waits on
WRAPPER = ("import faulthandler, os, signal, sys; "
           "faulthandler.register(signal.SIGUSR1, all_threads=True, file=open(os.environ['STACKS'], 'a')); "
           "import pytest; sys.exit(pytest.main(sys.argv[1:]))")


def fleet(nodes: int):
    return parse_fleet({"name": "interrupt", "pools": [{"name": "h100", "count": nodes,
                                                        "gpu": {"product": "NVIDIA-H100-80GB-HBM3", "count": 8}}]},
                       source="interrupt.yaml")


def dump(proc, work: Path, run_id: str) -> None:
    """Where each of the run's threads is, in C (a read, a lock: gdb, when installed) and in Python (SIGUSR1)."""
    if shutil.which("gdb"):
        gdb = subprocess.run(["gdb", "-p", str(proc.pid), "-batch", "-ex", "thread apply all bt 12"],
                             capture_output=True, text=True, timeout=120)
        with open(work / f"gdb-{run_id}.txt", "a") as f:
            f.write(gdb.stdout + gdb.stderr)
    proc.send_signal(signal.SIGUSR1)


def trial(client, kubeconfig: str, work: Path, scenario: str, i: int, args, checkout: Path = REPO) -> dict:
    run_id = f"intr-{scenario}-{i}-{checkout.name}-{os.getpid()}"[:52].rstrip("-")
    suite = work / f"test_{scenario}_{i}.py"
    pods = 1 if scenario == "one" else args.nodes * args.pods_per_node
    suite.write_text(ONE if scenario == "one" else FANOUT.format(per_node=args.pods_per_node))
    cmd = [sys.executable, "-c", WRAPPER, str(suite), "-p", "gpuproof.pytest_plugin", "-p", "no:cacheprovider",
           f"--rootdir={work}", f"--kubeconfig={kubeconfig}", f"--report-dir={work / 'reports'}",
           f"--run-id={run_id}", "-q", f"--parallel={max(1, args.nodes * args.pods_per_node)}",
           *args.pytest_args.split()]
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    out_lines: list[str] = []
    try:
        t_start = time.monotonic()
        stacks = work / f"stacks-{run_id}.txt"      # the wrapper's dump goes to a file: pytest captures fd 2
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work,
                                env={**os.environ, "STACKS": str(stacks),     # the checkout's gpuproof
                                     "PYTHONPATH": os.pathsep.join(filter(None, (str(checkout),
                                                                                 os.environ.get("PYTHONPATH"))))})
        reader = threading.Thread(target=lambda: out_lines.extend((time.monotonic(), line) for line in proc.stdout),
                                  daemon=True)
        reader.start()
        ns = f"gpuproof-{run_id}"
        try:
            watch_until(client.core.list_namespaced_pod,
                        lambda c: proc.poll() is not None or len(
                            [p for p in c.values() if p.metadata.deletion_timestamp is None]) >= pods,
                        args.start_timeout, f"the run's {pods} pods to exist", tick=1.0, namespace=ns)
            if proc.poll() is not None:
                raise RuntimeError(f"the run ended (exit {proc.returncode}) before its pods existed")
        except Exception as exc:                # noqa: BLE001  (reported as the trial's failure)
            proc.kill()
            proc.wait()
            return {"ok": False, "why": f"never started its pods: {exc}", "out": "".join(x for _, x in out_lines)}
        in_flight = time.monotonic() - t_start
        sig = getattr(signal, f"SIG{args.signal}")
        load = os.getloadavg()[0]
        t0 = time.monotonic()
        proc.send_signal(sig)
        if args.dump_at is not None:            # what it waits on that long after the signal
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=args.dump_at)
            if proc.poll() is None:
                dump(proc, work, run_id)
        try:
            proc.wait(timeout=max(0.0, args.within - (time.monotonic() - t0)))
            took = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            dump(proc, work, run_id)              # its stacks, then the end
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            took = None
        reader.join(10)
    finally:
        for b in busy:
            b.kill()
        for b in busy:
            b.wait()
    # each line with its time after the signal: where the time to exit went
    out = "".join(f"{t - t0:+7.2f}s {line}" for t, line in out_lines)
    if stacks.exists() and stacks.stat().st_size:
        out += f"--- its threads' stacks (SIGUSR1) ---\n{stacks.read_text()}"
    if (work / f"gdb-{run_id}.txt").exists():
        out += f"--- gdb ---\n{(work / f'gdb-{run_id}.txt').read_text()}"
    leftovers = client.leftover_runs().get(run_id, {})
    meta = work / "reports" / run_id / "run.json"
    outcome = json.loads(meta.read_text()).get("outcome", "") if meta.exists() else ""
    why = []
    if took is None:
        why.append(f"still running {args.within:.0f}s after the signal")
    if leftovers:
        why.append(f"left {leftovers}")
    if "interrupted" not in outcome:
        why.append(f"report outcome {outcome or '(no run.json)'}")
    if proc.returncode == 0:
        why.append("exit status 0")
    return {"ok": not why, "why": "; ".join(why), "took": took, "in_flight_after": in_flight, "load": load,
            "rc": proc.returncode, "out": out[-20000:] if why or args.show else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=40)
    ap.add_argument("--pods-per-node", type=int, default=5)
    ap.add_argument("--busy", type=int, default=4, help="busy loops beside each trial")
    ap.add_argument("--scenario", choices=("one", "fanout", "both"), default="both")
    ap.add_argument("--signal", choices=("INT", "TERM"), default="INT")
    ap.add_argument("--within", type=float, default=30.0, help="seconds the run has to exit after the signal")
    ap.add_argument("--start-timeout", type=float, default=300.0, help="seconds the run has to create its pods")
    ap.add_argument("--show", action="store_true", help="print every trial's output (each line's time after the "
                    "signal), not only a failed one's")
    ap.add_argument("--pytest-args", default="", help="more arguments for the interrupted run (a plugin of "
                    "timings: '-p name')")
    ap.add_argument("--dump-at", type=float, help="dump the run's stacks this many seconds after the signal")
    ap.add_argument("--checkout", action="append", type=Path, default=None,
                    help="the gpuproof the interrupted runs use (a checkout's root; default this one); given more "
                         "than once, each trial runs under each in turn, so they share the machine's load")
    args = ap.parse_args()
    scenarios = ("one", "fanout") if args.scenario == "both" else (args.scenario,)
    checkouts = [c.resolve() for c in args.checkout or [REPO]]
    keys = [(s, c) for s in scenarios for c in checkouts]
    results: dict[tuple, list[dict]] = {k: [] for k in keys}
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimCluster(Path(tmp) / "sim", base_port=find_free_base(), private=True)
        kubeconfig = str(sim.up(fleet(args.nodes)))
        try:
            client = connect(kubeconfig)
            work = Path(tmp) / "work"
            work.mkdir()
            for i in range(args.trials):
                for s, c in keys:
                    r = trial(client, kubeconfig, work, s, i, args, c)
                    results[(s, c)].append(r)
                    took = f"{r['took']:.2f} s" if r.get("took") is not None else "-"
                    name = s + (f" [{c}]" if len(checkouts) > 1 else "")
                    print(f"{name} trial {i + 1}: {'pass' if r['ok'] else 'FAIL'}; SIG{args.signal} to exit {took}; "
                          f"pods in flight after {r.get('in_flight_after', 0):.1f} s; load average "
                          f"{r.get('load', 0):.1f}" + ("" if r["ok"] else f"; {r['why']}"), flush=True)
                    if r["out"]:
                        print(textwrap.indent(r["out"], "    | "), flush=True)
        finally:
            sim.down()
    for (s, c), rs in results.items():
        times = [r["took"] for r in rs if r.get("took") is not None]
        passed = sum(r["ok"] for r in rs)
        span = (f"; SIG{args.signal} to exit median {statistics.median(times):.2f} s, max {max(times):.2f} s "
                f"({', '.join(f'{t:.2f}' for t in times)})") if times else ""
        pods = 1 if s == "one" else args.nodes * args.pods_per_node
        where = f" [{c}]" if len(checkouts) > 1 else ""
        print(f"{s}{where} ({pods} pod{'s' if pods > 1 else ''}, {args.busy} busy loops): {passed}/{len(rs)} "
              f"passed{span}")
    return 0 if all(r["ok"] for rs in results.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())

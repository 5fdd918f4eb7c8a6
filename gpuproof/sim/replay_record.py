"""Record the replay nodes' pod logs: gpuproof's own workloads run over NVIDIA's mock NVML on this machine.

Long: one recorder per kind of recording (node workloads, the fabric pair, the access suite's containers), each
setting up what its pods would have (a CPU quota, two network namespaces, a container's /dev) around run_recorded.

    .venv/bin/python -m gpuproof.sim.replay_record [--out gpuproof/sim/recordings] [--slow-quota 70]
    .venv/bin/python -m gpuproof.sim.replay_record --fabric [--slow-mbit 20]     # the fabric pairs' only
    .venv/bin/python -m gpuproof.sim.replay_record --access                      # the access suite's only

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

``--fabric`` records the fabric suite's pair (gpuproof.bench.fabric, and only it: the other recordings and their
entries stay): two network namespaces joined by a veth stand for the pair's two nodes, and in each ``torchrun`` runs
``workloads/allreduce.py`` as the suite's pod ``-0`` and ``-1`` run it on the CPU path (``--nnodes=2
--nproc-per-node=1 --node-rank=<i> --master-addr=<rank 0's address>``, the pair's arguments, gloo on ``eth0``, the
node's name in ``GPUPROOF_NODE_NAME``); rank 0's torchrun output is the recording. The slow pair is the same with
both ends of the veth shaped by the kernel (``tc``: an HTB class at ``--slow-mbit``, as the kubelet nodes'
``slowLinks``). Normal pairs are recorded one after another until ``--normal`` of them have all-reduce bus
bandwidths within 8% of their median (at most 30; a 1 MiB all-reduce on a shared machine's CPU varies more than that
from run to run), the others deleted, every figure kept in ``index.json``; the slow pair is kept when it is at most
half their median.

``--access`` records the access suite's containers (suites/test_access.py, and only them: the other recordings and
their entries stay): ``workloads/access.py --name <container>`` for each kind of container the suite's pods have
(``granted``, ``ungranted``, ``ungranted-env-all``), started as the container runtime starts it on a node with
NVIDIA's device plugin and container toolkit as NVIDIA recommends them (the kubelet nodes' ``containerToolkit: {}``,
gpuproof.sim.kubelet.toolkit): in a private mount namespace whose ``/dev`` is a tmpfs holding a container's default
devices and, for the granted container only, one GPU's ``nvidia0`` (``c 195:0``, the device spec the plugin passes)
with the driver's control nodes ``nvidiactl`` and ``nvidia-uvm``, and ``NVIDIA_VISIBLE_DEVICES`` that GPU's UUID (the
plugin's ``envvar`` strategy); the ungranted containers get no ``/dev/nvidia*``, the env-all one
``NVIDIA_VISIBLE_DEVICES=all`` and ``NVIDIA_DRIVER_CAPABILITIES=all`` in its env, which a runtime that does not
honour it from unprivileged pods leaves unused. NVIDIA's mock NVML (the same config and library as every workload
here) lists only the GPUs whose ``/dev/nvidia<N>`` the process has, its whole config when it has none. Each
recording is kept only when the container reached what it should (granted: ``/dev/nvidia0`` and that GPU's UUID
alone; the others: no GPU device file).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime as dt
import json
import os
import stat
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import yaml

REPO = Path(__file__).resolve().parents[2]
PRODUCT, GPUS = "NVIDIA-H100-80GB-HBM3", 8
CGROUP = Path("/sys/fs/cgroup/cpu/gpuproof-replay-record")
SHARES = 262144      # cgroup v1's most: the recording wins the CPU from whatever else runs here (a node of its own)
HEALTH_ARGS = ["--device", "cpu", "--load-s", "1.0", "--copy-mib", "32", "--copy-iters", "5", "--dcgm-level", "1"]
CENSUS_ARGS = ["--device", "cpu", "--matmul-size", "256", "--copy-mib", "16", "--allreduce-mib", "4", "--iters", "20",
               "--warmup", "5", "--threads", "1"]


# the fabric suite's pair on the CPU path: gpuproof.bench.fabric's params_for("cpu") pair through its FLAGS, and
# --no-per-node (tests/test_fabric_replay.py holds them equal: the simulator may not import gpuproof.bench)
FABRIC_ARGS = ["--device", "cpu", "--sizes", "1M", "--iters", "4", "--warmup", "1", "--threads", "1",
               "--sample-hz", "0", "--collectives", "all_reduce", "--report-size", "1M", "--no-per-node"]
FABRIC_NODES = ("replay-recording-0", "replay-recording-1")     # the two nodes' names (replay rewrites them per pair)
NETNS = ("gpuproof-rec-fab0", "gpuproof-rec-fab1")
ADDRS = ("10.231.7.1", "10.231.7.2")
PORT = 29500                     # gpuproof.bench.workloads.RDZV_PORT


def _stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


def run_recorded(argv: list[str], env: dict, log: Path, cgroup: Path | None = None,
                 setup: Callable[[], None] | None = None) -> tuple[int, float, str]:
    """Run argv; write its stdout and stderr to ``log`` in CRI format. Returns exit code, wall seconds, stdout.
    ``setup`` runs in the child before argv is executed (after it entered ``cgroup``)."""
    lines: list[tuple[float, int, str, str]] = []
    lock = threading.Lock()

    def enter_cgroup():
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(os.getpid()))
        if setup is not None:
            setup()

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


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@contextlib.contextmanager
def joined_namespaces(rate_mbit: int | None = None):
    """Two network namespaces joined by a veth (each end ``eth0``, ``ADDRS``); with ``rate_mbit`` both ends send at
    that rate (an HTB class, as gpuproof.sim.kubelet.faults shapes a slow link)."""
    for ns in NETNS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    try:
        for ns in NETNS:
            _ip("netns", "add", ns)
        _ip("link", "add", "gprec-fab0", "type", "veth", "peer", "name", "gprec-fab1")
        for k, (ns, addr) in enumerate(zip(NETNS, ADDRS)):
            _ip("link", "set", f"gprec-fab{k}", "netns", ns)
            _ip("-n", ns, "link", "set", f"gprec-fab{k}", "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            if rate_mbit:
                tc = ["ip", "netns", "exec", ns, "tc"]
                subprocess.run([*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "1"],
                               check=True)
                subprocess.run([*tc, "class", "add", "dev", "eth0", "parent", "1:", "classid", "1:1", "htb", "rate",
                                f"{rate_mbit}mbit"], check=True)
        yield
    finally:
        for ns in NETNS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def fabric_argv(rank: int) -> list[str]:
    """What pod ``-<rank>`` of a pair runs (gpuproof.bench.fabric.fabric_pods, the CPU path), rank 0 at ADDRS[0]."""
    return ["torchrun", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={rank}", f"--master-addr={ADDRS[0]}",
            f"--master-port={PORT}", "workloads/allreduce.py", *FABRIC_ARGS]


def record_pair(out: Path, file: str, sw, rate_mbit: int | None) -> tuple[dict, dict]:
    """One pair recorded: (its index entry, its result)."""
    from .fleet_file import parse_fleet
    from . import gpunodes

    seed = f"replay-recording/{file.removesuffix('.log')}"
    fleet = parse_fleet({"name": "rec", "pools": [{"name": "rec", "count": 1, "gpu": {"product": PRODUCT,
                                                                                      "count": GPUS}}]})
    cfg = out / ".mock-nvml.yaml"
    mock = gpunodes.mock_config(sw, fleet.pools[0].gpu, seed=seed)
    cfg.write_text(yaml.safe_dump(mock, sort_keys=False))
    torchrun = str(Path(sys.executable).parent / "torchrun")
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "cpu.shares").write_text(str(SHARES))
    (CGROUP / "cpu.cfs_quota_us").write_text("-1")

    def env(rank: int) -> dict:
        return {**sw.mock_env(cfg), "PYTHONUNBUFFERED": "1", "GLOO_SOCKET_IFNAME": "eth0",
                "GPUPROOF_NODE_NAME": FABRIC_NODES[rank]}

    def argv(rank: int) -> list[str]:
        return ["ip", "netns", "exec", NETNS[rank], torchrun, *fabric_argv(rank)[1:]]

    with joined_namespaces(rate_mbit):
        peer = subprocess.Popen(argv(1), env=env(1), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True, preexec_fn=lambda: (CGROUP / "cgroup.procs").write_text(str(os.getpid())))
        code, wall, stdout = run_recorded(argv(0), env(0), out / file, CGROUP)
        peer_err = peer.communicate(timeout=120)[1]
    cfg.unlink()
    if code != 0 or peer.returncode != 0:
        raise SystemExit(f"{file}: rank 0 exited {code}, rank 1 {peer.returncode}: {peer_err[-2000:]}")
    result = _last_json(stdout)
    entry = {"file": file, "workload": "fabric", "kind": "slow" if rate_mbit else "normal",
             "uuids": [d["uuid"] for d in mock["devices"]], "host": result.get("host"),
             "nodes": list(result.get("node_names") or []), "mock_seed": seed, "gpus": GPUS, "exit_code": code,
             "wall_s": round(wall, 2), "cpu_quota_pct": None, "link_mbit": rate_mbit,
             "argv": fabric_argv(0), "peer_argv": fabric_argv(1),
             "env": {"MOCK_NVML_CONFIG": f"mock_config(seed={seed!r})",
                     "LD_LIBRARY_PATH": "NVIDIA's mock NVML (gpuproof sim build)", "GLOO_SOCKET_IFNAME": "eth0",
                     "GPUPROOF_NODE_NAME": "the rank's node: " + ", ".join(FABRIC_NODES)},
             "network": (f"two network namespaces joined by a veth ({ADDRS[0]}, {ADDRS[1]}), "
                         + (f"both ends shaped by tc (htb rate {rate_mbit}mbit)" if rate_mbit else "unshaped"))}
    print(f"{file}: exit {code}, {wall:.1f}s, all_reduce busbw {_busbw(result):.4g} GB/s"
          + (f" over a {rate_mbit} Mbit/s link" if rate_mbit else ""), flush=True)
    return entry, result


def _busbw(result: dict) -> float:
    return result["at_size"]["all_reduce"]["busbw_gbps"]


BAND = 0.08         # the normal pairs kept lie within 8% of their median (the suite's pool limit is 80%)


def close_set(figures: dict[str, float], n: int) -> list[str] | None:
    """The ``n`` recordings whose figures lie closest together, all within :data:`BAND` of their median; None when
    no ``n`` do."""
    ordered = sorted(figures, key=figures.__getitem__)
    best: tuple[float, list[str]] | None = None
    for i in range(len(ordered) - n + 1):
        group = ordered[i:i + n]
        med = statistics.median(figures[g] for g in group)
        if figures[group[0]] >= (1 - BAND) * med and figures[group[-1]] <= (1 + BAND) * med:
            width = figures[group[-1]] / figures[group[0]]
            if best is None or width < best[0]:
                best = (width, group)
    return best[1] if best else None


def main_fabric(out: Path, normal: int, slow_mbit: int, most: int = 30) -> int:
    """Record the fabric pair's recordings (``--fabric``) and put them in ``index.json`` beside the others: normal
    pairs one after another until ``normal`` of them lie within :data:`BAND` of their median (at most ``most``; the
    others are deleted, their figures kept in the index), then the slow pair, kept when at most half their median."""
    from . import nvidia

    sw = nvidia.locate(build_missing=False)
    index = json.loads((out / "index.json").read_text())
    tries: dict[str, tuple[dict, dict]] = {}
    chosen = None
    for k in range(most):
        tries[f"fabric-try-{k}.log"] = record_pair(out, f"fabric-try-{k}.log", sw, None)
        chosen = close_set({f: _busbw(r) for f, (_, r) in tries.items()}, normal)
        if chosen:
            break
    figures = {f: _busbw(r) for f, (_, r) in tries.items()}
    if not chosen:
        for f in tries:
            (out / f).unlink()
        print(f"no {normal} of {most} normal pairs within {BAND:.0%} of their median (a busy machine?): "
              f"{', '.join(f'{v:.4g}' for v in figures.values())} GB/s", file=sys.stderr)
        return 1
    slow_entry, slow_result = record_pair(out, "fabric-slow.log", sw, slow_mbit)
    if CGROUP.exists():
        CGROUP.rmdir()
    kept = [figures[f] for f in chosen]
    med, slow = statistics.median(kept), _busbw(slow_result)
    print(f"fabric all_reduce busbw: {len(tries)} normal pairs recorded, kept {normal} "
          f"({min(kept) / med:.0%}-{max(kept) / med:.0%} of their median {med:.4g} GB/s), slow {slow:.4g} "
          f"({slow / med:.0%})", flush=True)
    entries = []
    for i, f in enumerate(chosen):
        entry = dict(tries[f][0], file=f"fabric-{i}.log")
        (out / f).rename(out / entry["file"])
        entries.append(entry)
    for f in set(tries) - set(chosen):
        (out / f).unlink()
    index["recordings"] = [r for r in index["recordings"] if r["workload"] != "fabric"] + entries + [slow_entry]
    index["fabric_recorded"] = _stamp()
    index["fabric_command"] = (f"{Path(sys.executable).name} -m gpuproof.sim.replay_record --fabric --slow-mbit "
                               f"{slow_mbit}")
    index["fabric_busbw_gbps"] = {
        "size_bytes": 1 << 20, "normal_median": med, "normal_min": min(kept), "normal_max": max(kept), "slow": slow,
        "slow_share_of_normal": slow / med,
        "normal_recorded": [{"mock_seed": tries[f][0]["mock_seed"], "busbw_gbps": v,
                             "kept_as": f"fabric-{chosen.index(f)}.log" if f in chosen else None}
                            for f, v in figures.items()]}
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    if slow / med > 0.5:
        print("the slow pair is not at most half the normal ones' median: record again", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------- the access suite's containers

# container (suites/test_access.py PODS: each pod's containers are of these kinds) -> (granted one GPU, its own env)
ACCESS_CONTAINERS = {
    "granted": (True, {}),
    "ungranted": (False, {}),
    "ungranted-env-all": (False, {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}),
}
NVIDIA_MAJOR = 195               # /dev/nvidia<N> and nvidiactl (minor 255): the driver's fixed major
UVM_MAJOR = 235                  # nvidia-uvm's major is the kernel's choice on each host (dynamic); one it gives
# what runc gives every container in /dev (the OCI runtime spec's default devices, its links, its shm)
DEFAULT_DEVICES = (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9),
                   ("tty", 5, 0))
DEFAULT_LINKS = (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                 ("stderr", "/proc/self/fd/2"), ("core", "/proc/kcore"))
# a container granted GPU 0: its device file (the device plugin's device spec) and the driver's control nodes, as
# NVIDIA's device plugin (PASS_DEVICE_SPECS) and container toolkit add them
GRANTED_DEVICES = (("nvidia0", NVIDIA_MAJOR, 0), ("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0))
CLONE_NEWNS, MS_NOSUID, MS_REC, MS_PRIVATE, MS_STRICTATIME = 0x20000, 0x2, 0x4000, 0x40000, 1 << 24


def container_dev(devices: tuple[tuple[str, int, int], ...]) -> Callable[[], None]:
    """What makes the calling process's ``/dev`` a container's: a private mount namespace (``unshare --mount
    --propagation private``), a tmpfs over ``/dev`` (mode 755, as runc mounts it) with :data:`DEFAULT_DEVICES`,
    :data:`DEFAULT_LINKS`, ``shm/`` and ``devices`` (name, major, minor: character devices, mode 666). Runs in the
    recorded process's child before it executes (``run_recorded``'s ``setup``); needs root."""
    def setup() -> None:
        libc = ctypes.CDLL(None, use_errno=True)

        def ok(rc: int, what: str) -> None:
            if rc != 0:
                raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

        ok(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
        ok(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        ok(libc.mount(b"tmpfs", b"/dev", b"tmpfs", MS_NOSUID | MS_STRICTATIME, b"mode=755,size=65536k"),
           "mount -t tmpfs tmpfs /dev")
        for name, major, minor in (*DEFAULT_DEVICES, *devices):
            os.mknod(f"/dev/{name}", 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            os.chmod(f"/dev/{name}", 0o666)
        for name, target in DEFAULT_LINKS:
            os.symlink(target, f"/dev/{name}")
        os.mkdir("/dev/shm", 0o1777)
    return setup


def access_argv(container: str) -> list[str]:
    """What each of the access suite's containers runs (suites/test_access.py ``manifest``: workload_pod's
    ``python <access.py> --name <container>``)."""
    return ["python", "workloads/access.py", "--name", container]


def access_check(container: str, result: dict, uuid: str) -> str:
    """Why ``result`` is not what the container reaches on a healthy node ('' when it is): granted, exactly
    ``/dev/nvidia0`` and NVML's one GPU ``uuid``; otherwise no ``/dev/nvidia<N>`` and no control node. (The suite's
    judgement, gpuproof.discovery.access, is a layer the simulator may not import: tests/test_scale_replay.py judges
    the recordings with it.)"""
    files = [f["path"] for f in result.get("device_files") or []]
    gpus = [g.get("uuid") for g in (result.get("nvml") or {}).get("gpus") or []]
    if ACCESS_CONTAINERS[container][0]:
        want = (["/dev/nvidia0"], [uuid], ["/dev/nvidia-uvm", "/dev/nvidiactl"])
        got = (files, gpus, result.get("control_files"))
        return "" if got == want else f"granted: reached {got}, not {want}"
    return "" if not files and not result.get("control_files") else \
        f"{container}: reached {files} {result.get('control_files')}, not none"


def main_access(out: Path) -> int:
    """Record the access suite's containers (``--access``) and put them in ``index.json`` beside the others."""
    from .fleet_file import parse_fleet
    from . import gpunodes, nvidia

    sw = nvidia.locate(build_missing=False)
    index = json.loads((out / "index.json").read_text())
    fleet = parse_fleet({"name": "rec", "pools": [{"name": "rec", "count": 1, "gpu": {"product": PRODUCT,
                                                                                      "count": GPUS}}]})
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "cpu.shares").write_text(str(SHARES))
    (CGROUP / "cpu.cfs_quota_us").write_text("-1")
    entries = []
    for container, (granted, own_env) in ACCESS_CONTAINERS.items():
        file = f"access-{container}.log"
        seed = f"replay-recording/{file.removesuffix('.log')}"
        cfg = out / ".mock-nvml.yaml"
        mock = gpunodes.mock_config(sw, fleet.pools[0].gpu, seed=seed)
        cfg.write_text(yaml.safe_dump(mock, sort_keys=False))
        uuids = [d["uuid"] for d in mock["devices"]]
        # the container's env: what its pod sets (the env-all one's), and the device plugin's NVIDIA_VISIBLE_DEVICES
        # for the GPU it allocated (strategy envvar, ids by UUID); nothing of this host's own NVIDIA_* or CUDA_*
        pod_env = {**own_env, **({"NVIDIA_VISIBLE_DEVICES": uuids[0]} if granted else {})}
        env = {k: v for k, v in sw.mock_env(cfg).items() if not k.startswith(("NVIDIA_", "CUDA_"))}
        env.update(pod_env, PYTHONUNBUFFERED="1")
        devices = GRANTED_DEVICES if granted else ()
        argv = access_argv(container)
        code, wall, stdout = run_recorded([sys.executable, *argv[1:]], env, out / file, CGROUP,
                                          setup=container_dev(devices))
        cfg.unlink()
        if code != 0:
            raise SystemExit(f"{file}: access.py exited {code}")
        result = _last_json(stdout)
        why = access_check(container, result, uuids[0])
        print(f"{file}: exit {code}, {wall:.1f}s, device files {[f['path'] for f in result['device_files']]}, "
              f"control {result['control_files']}, NVML {len(result['nvml']['gpus'])} GPU(s)", flush=True)
        if why:
            (out / file).unlink()
            raise SystemExit(f"{file}: not what a healthy node's container reaches: {why}")
        entries.append({
            "file": file, "workload": "access", "kind": container, "uuids": uuids, "host": result.get("host"),
            "mock_seed": seed, "gpus": GPUS, "exit_code": code, "wall_s": round(wall, 2), "cpu_quota_pct": None,
            "argv": argv, "allocated": [uuids[0]] if granted else [],
            "env": {"MOCK_NVML_CONFIG": f"mock_config(seed={seed!r})",
                    "LD_LIBRARY_PATH": "NVIDIA's mock NVML (gpuproof sim build)", **pod_env},
            "dev": ("a tmpfs in a private mount namespace: "
                    + ", ".join(f"{n} (c {a}:{b})" for n, a, b in (*DEFAULT_DEVICES, *devices))
                    + "; links " + ", ".join(n for n, _ in DEFAULT_LINKS) + "; shm/")})
    if CGROUP.exists():
        CGROUP.rmdir()
    index["recordings"] = [r for r in index["recordings"] if r["workload"] != "access"] + entries
    index["access_recorded"] = _stamp()
    index["access_command"] = f"{Path(sys.executable).name} -m gpuproof.sim.replay_record --access"
    (out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    from .fleet_file import parse_fleet
    from . import gpunodes, nvidia

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "recordings"))
    ap.add_argument("--normal", type=int, default=3, help="normal census recordings")
    ap.add_argument("--slow-quota", type=int, default=70, help="percent of one core for the slow census")
    ap.add_argument("--fabric", action="store_true", help="record the fabric suite's pair only (normal and slow)")
    ap.add_argument("--slow-mbit", type=int, default=20, help="the slow pair's link, Mbit/s each way")
    ap.add_argument("--access", action="store_true", help="record the access suite's containers only")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.fabric:
        return main_fabric(out, args.normal, args.slow_mbit)
    if args.access:
        return main_access(out)
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
    try:                # the fabric pair's recordings (--fabric) and the access suite's (--access) stay as they were
        before = json.loads((out / "index.json").read_text())
    except (OSError, ValueError):
        before = {}
    index["recordings"] += [r for r in before.get("recordings", []) if r["workload"] in ("fabric", "access")]
    index.update({k: v for k, v in before.items() if k.startswith(("fabric_", "access_"))})
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

"""Collective bandwidth sweep with torch.distributed (NCCL on GPUs, gloo on the CPU): all_reduce and beside it
all_gather, reduce_scatter, alltoall and sendrecv.

Long: one torch.distributed program, single node and multi-node (torchrun or an indexed Job), with its
sweep, the per-node figures and the straggler rule it reports on; what each collective is (nccl-tests'
sizes and factors, the torch calls, the #wrong patterns) lives in collectives.py.

Reports, per collective and message size, the columns nccl-tests prints: size, count, type, redop,
time (us), algbw and busbw (GB/s) and #wrong, plus the "Avg bus bandwidth" (arithmetic mean of busbw
over all sizes) of each collective.

- S: nccl-tests' size, one rank's buffer for all_reduce and sendrecv, the whole buffer (every rank's
  share x n) for all_gather, reduce_scatter and alltoall; t the mean time of one call (averaged over
  the ranks, like nccl-tests);
- algbw = S / t in GB/s (1e9 bytes); busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for
  all_gather, reduce_scatter and alltoall, x 1 for sendrecv (to rank+1, from rank-1); none at all
  for a single rank: nothing crosses a bus;
- #wrong: after the timed loop each rank fills its input with a known pattern, runs the collective
  once more and counts output elements that differ from the values every rank can compute (all_reduce:
  (i + rank) mod 3 and the known sum). all_reduce runs in place, the others out of place.

``--collectives`` (default ``auto``): all five with NCCL, as nccl-tests and NVIDIA's cluster checks run
them (a fabric fault can spare all-reduce's ring and show in alltoall's all-pairs traffic), at about five
times one all-reduce sweep; all_reduce alone with gloo, where the CPU runs stand in for the network path
in CI and must stay quick (``all`` asks for the five there too). A collective the backend lacks, or runs
as another one's traffic (gloo's reduce-scatter: missing in older torch, one all-reduce and a copy of the
share in torch 2.15), is not measured and says why (``collectives[c].why_not``): nothing stands in for it.

The JSON keeps all_reduce's keys as they were (``results``: all_reduce's rows, ``avg_busbw_gbps``,
``max_busbw_gbps``, ``wrong_total``, the per-node fields); every row carries ``collective``;
``results_all`` holds every collective's rows, ``collectives`` per collective its average and largest
busbw, #wrong, whether it was measured and why not, ``wrong_total_all`` the #wrong of all of them
(``ok`` is false when any is above 0), and ``at_size`` per collective the row of the largest size up to
``--report-size`` (the largest size without it): one figure per collective to judge.

How it is launched (the same file in every case):

- ``python allreduce.py``                        one process, world size 1;
- ``python allreduce.py --nproc 2``              N local processes (file store, loopback);
- ``torchrun --nproc-per-node 8 allreduce.py``   one pod with several GPUs;
- ``torchrun --nnodes N --node-rank $I --master-addr <job>-0.<svc> ... allreduce.py``
  several nodes (an indexed Job with a headless Service, see gpuproof/bench/workloads.py).

With one rank no data moves between devices: the sweep still times the call, but no
algbw / busbw is reported (``no_bandwidth_reason`` says why).

Per node (when the job spans two nodes or more): every rank times its own all-reduces,
and rank 0 gathers the figures of every node:

- intra-node: an all-reduce among each node's own ranks, all nodes at once (NVLink /
  PCIe of that node; needs two ranks per node or more);
- inter-node: an all-reduce over the ranks of two neighbouring nodes (i, i+1 mod N), one
  pair at a time; a node's figure is the best of its pairs, so one slow node drags its
  own figure down but not its neighbours' (needs three nodes or more to tell which of a
  pair is slow).

A node whose figure is below ``--straggler-pct`` (default 80) % of the median of the
nodes is named a straggler in the result (``stragglers``, ``nodes[].straggler``).
Test-only: ``GPUPROOF_TEST_SLOW_RANK=<rank>`` (and ``GPUPROOF_TEST_SLOW_MS``, default 50)
delays every timed call of that rank (every collective), to check the detection;
``GPUPROOF_TEST_CORRUPT_RANK=<rank>`` (and ``GPUPROOF_TEST_CORRUPT_COLLECTIVE``, default all) makes
that rank spoil one output element before the #wrong check, to see the check fail.

What carried the traffic: every rank reads its own NCCL log (``NCCL_DEBUG=INFO``: ``nccl_capture.py`` points it to a
file of the rank's own) and rank 0 puts the reads per node in ``fabric.by_node`` (transport between nodes, within a
node, the line that decided, fall-back warnings, HCAs the pod sees); on the CPU the ranks talk gloo over TCP.

Only global rank 0 prints the JSON result.
"""

from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import tempfile
import time

import collectives as coll
import nccl_capture
import nvml_sampler
import workload_common as common
from collectives import BUSBW_FACTORS, CHECK_CHUNK, algbw_gbps, busbw_gbps, expected_sum_table  # noqa: F401

DEFAULT_MIN = "8"
DEFAULT_MAX = "1G"

DTYPES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}

DEFAULT_STRAGGLER_PCT = 80.0
NODE_BYTES_CAP = 256 * 2**20   # per-node figures at min(largest sweep size, 256 MiB) unless --node-bytes
ONE_RANK_REASON = ("1 rank: no data moves between devices, so no bandwidth is reported "
                   "(the times are the cost of an all-reduce call with nothing to exchange)")
SLOW_RANK_ENV = "GPUPROOF_TEST_SLOW_RANK"   # test-only: delay this rank's timed calls
SLOW_MS_ENV = "GPUPROOF_TEST_SLOW_MS"
CORRUPT_RANK_ENV = coll.CORRUPT_RANK_ENV    # test-only: this rank spoils one output element before the check
GLOO_DEFAULT = ("all_reduce",)              # --collectives auto on the CPU (gloo): quick CI runs


def ring_pairs(nnodes: int) -> list[tuple[int, int]]:
    """Neighbouring node pairs (i, i+1 mod N), each once: 2 -> [(0, 1)], 3 -> [(0, 1), (1, 2), (0, 2)]."""
    pairs = []
    for i in range(nnodes):
        p = tuple(sorted((i, (i + 1) % nnodes)))
        if p[0] != p[1] and p not in pairs:
            pairs.append(p)
    return pairs


def find_stragglers(values: dict, pct: float = DEFAULT_STRAGGLER_PCT) -> dict:
    """Nodes whose bandwidth is below ``pct`` % of the median over nodes -> reason text.

    ``values``: node -> GB/s (None: not measured, left out). Fewer than two figures:
    nothing can be compared, no straggler.
    """
    known = {k: v for k, v in values.items() if v is not None}
    if len(known) < 2:
        return {}
    med = common.median(list(known.values()))
    limit = med * pct / 100.0
    return {k: f"{v:.3g} GB/s is below {pct:g}% of the median {med:.3g} GB/s over {len(known)} nodes"
            for k, v in known.items() if v < limit}


def _sizes(args) -> list[int]:
    if args.sizes:
        return [common.parse_bytes(s) for s in args.sizes.split(",") if s.strip()]
    return common.geometric_sizes(common.parse_bytes(args.min_bytes), common.parse_bytes(args.max_bytes),
                                  args.step_factor)


def parse_collectives(text: str, backend: str) -> list[str]:
    """``--collectives``: ``auto`` (all five with NCCL, all_reduce alone with gloo), ``all`` or a comma list
    (``-`` or ``_`` alike), in the order of :data:`collectives.COLLECTIVES`. ValueError for an unknown name."""
    words = [w.strip().lower().replace("-", "_") for w in str(text).split(",") if w.strip()]
    if not words:
        raise ValueError("--collectives: name one collective or more")
    if words == ["auto"]:
        return list(coll.COLLECTIVES) if backend == "nccl" else list(GLOO_DEFAULT)
    if words == ["all"]:
        return list(coll.COLLECTIVES)
    unknown = [w for w in words if w not in coll.COLLECTIVES]
    if unknown:
        raise ValueError(f"--collectives: unknown {', '.join(unknown)} (choose from auto, all, "
                         f"{', '.join(coll.COLLECTIVES)})")
    return [c for c in coll.COLLECTIVES if c in words]


def row_at_size(rows: list[dict], report_size: int | None) -> dict | None:
    """The row of the largest size up to ``report_size`` (the largest row when None); None when none is."""
    fit = [r for r in rows if report_size is None or r["size_bytes"] <= report_size]
    return max(fit, key=lambda r: r["size_bytes"], default=None)


# --------------------------------------------------------------------------- worker


def _init(device: str):
    """Join the process group; returns (rank, world, local_rank)."""
    import torch
    import torch.distributed as dist

    env = os.environ
    world = int(env.get("WORLD_SIZE", "1"))
    rank = int(env.get("RANK", "0"))
    local_rank = int(env.get("LOCAL_RANK", "0"))
    backend = "nccl" if device == "cuda" else "gloo"
    kwargs = {}
    if device == "cuda":
        index = int(env.get("GPUPROOF_DEVICE_INDEX", local_rank))  # simulated nodes on one host
        torch.cuda.set_device(index)
        kwargs["device_id"] = torch.device("cuda", index)
    timeout = datetime.timedelta(seconds=float(env.get("GPUPROOF_PG_TIMEOUT", "600")))
    store_file = env.get("GPUPROOF_STORE_FILE")
    if "MASTER_ADDR" in env and not store_file:  # torchrun / a Job: env:// rendezvous
        init = {"init_method": "env://"}
    else:  # local: a file store, no listening socket for rendezvous
        if not store_file:
            store_file = os.path.join(tempfile.mkdtemp(prefix="gpuproof-ar-"), "store")
        # gloo / NCCL bootstrap sockets on loopback only, unless the user said otherwise
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
        init = {"store": dist.FileStore(store_file, world)}
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **init, **kwargs)
    except TypeError:  # torch without device_id
        kwargs.pop("device_id", None)
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timeout, **init)
    return rank, world, local_rank


def _slow_op(rank: int):
    """Test-only delay before each timed call of rank $GPUPROOF_TEST_SLOW_RANK (None: no delay)."""
    slow = os.environ.get(SLOW_RANK_ENV)
    if slow is None or slow == "" or int(slow) != rank:
        return None
    delay = float(os.environ.get(SLOW_MS_ENV, "50")) / 1e3
    return lambda: time.sleep(delay)  # an injected delay, not a wait for something


def _timed(call, args, device: str, rank: int, group=None) -> float:
    """Mean seconds of one ``call()`` (a collective over ``group``), as this rank saw it."""
    import torch.distributed as dist

    delay = _slow_op(rank)

    def op(_i):
        if delay:
            delay()
        call()

    common.time_total(op, args.warmup, device)
    dist.barrier(group=group)
    return common.time_total(op, args.iters, device) / args.iters


def _timed_allreduce(buf, args, device: str, rank: int, group=None) -> float:
    """Mean seconds of one all-reduce of ``buf`` over ``group``, as this rank saw it."""
    import torch.distributed as dist

    return _timed(lambda: dist.all_reduce(buf, group=group), args, device, rank, group)


def _gather_floats(value: float, device: str, world: int) -> list[float]:
    """Every rank's ``value`` (all ranks call this)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(out, t)
    return [float(x.item()) for x in out]


def _one_size(collective: str, api: str, size: int, args, device: str, world: int, rank: int) -> dict | None:
    """One row of nccl-tests' table for ``collective`` at the swept ``size`` (None when nothing is left of it)."""
    count, nbytes = coll.coll_counts(collective, size, DTYPES[args.dtype], world)
    if count == 0:
        return None
    inp, out = coll.buffers(collective, count, world, args.dtype, device)
    mine = _timed(coll.make_call(collective, api, inp, out, rank, world), args, device, rank)
    per_rank = _gather_floats(mine, device, world)
    seconds = sum(per_rank) / world  # nccl-tests averages the time over ranks
    row = {
        "collective": collective,
        "size_bytes": nbytes, "count": count, "type": args.dtype, "redop": coll.REDOP.get(collective, "none"),
        "time_us": seconds * 1e6,
        "rank_time_us": [t * 1e6 for t in per_rank],
        "algbw_gbps": algbw_gbps(nbytes, seconds) if world > 1 else None,
        "busbw_gbps": busbw_gbps(nbytes, seconds, world, collective) if world > 1 else None,
        "wrong": None,
    }
    if args.check:
        row["wrong"] = coll.count_wrong(collective, api, inp, out, count, rank, world, args.dtype, device)
    return row


def _node_layout(rank: int, world: int, local_rank: int) -> tuple[list[dict], int]:
    """Every rank's node: ([{"index", "name", "ranks"}] by node index, this rank's node index)."""
    import torch.distributed as dist

    env = os.environ
    local_world = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    index = int(env["GROUP_RANK"]) if env.get("GROUP_RANK") else rank // local_world
    name = env.get("GPUPROOF_NODE_NAME") or env.get("NODE_NAME") or socket.gethostname()
    everyone: list = [None] * world
    dist.all_gather_object(everyone, (index, name))
    nodes: dict[int, dict] = {}
    for r, (i, n) in enumerate(everyone):
        nodes.setdefault(i, {"index": i, "name": n, "ranks": []})["ranks"].append(r)
    names = [nodes[i]["name"] for i in sorted(nodes)]
    for i in sorted(nodes):  # two indices, one name (e.g. the same host): tell them apart
        if names.count(nodes[i]["name"]) > 1:
            nodes[i]["name"] = f"{nodes[i]['name']}#{i}"
    return [nodes[i] for i in sorted(nodes)], index


def per_node(args, device: str, world: int, rank: int, nodes: list[dict], size: int) -> dict:
    """Intra-node and inter-node (neighbour pairs) bus bandwidth of every node; all ranks call this."""
    import torch
    import torch.distributed as dist

    dtype = getattr(torch, args.dtype)
    count = max(1, size // DTYPES[args.dtype])
    nbytes = count * DTYPES[args.dtype]
    buf = torch.randn(count, device=device, dtype=torch.float32).to(dtype)
    mine = {n["index"]: n for n in nodes}
    my_node = next(n["index"] for n in nodes if rank in n["ranks"])
    out = {n["name"]: {"node": n["name"], "index": n["index"], "ranks": n["ranks"], "intra_busbw_gbps": None,
                       "inter_busbw_gbps": None, "pairs": {}} for n in nodes}

    # intra-node: every node's own ranks at once (groups must be made by every rank, in one order)
    if any(len(n["ranks"]) > 1 for n in nodes):
        groups = {n["index"]: dist.new_group(n["ranks"]) for n in nodes}
        t = _timed_allreduce(buf, args, device, rank, group=groups[my_node]) if len(mine[my_node]["ranks"]) > 1 \
            else 0.0
        times = _gather_floats(t, device, world)
        for n in nodes:
            if len(n["ranks"]) > 1:
                sec = sum(times[r] for r in n["ranks"]) / len(n["ranks"])
                out[n["name"]]["intra_busbw_gbps"] = busbw_gbps(nbytes, sec, len(n["ranks"]))
    # inter-node: neighbouring pairs, one pair at a time
    for a, b in ring_pairs(len(nodes)):
        ranks = mine[a]["ranks"] + mine[b]["ranks"]
        group = dist.new_group(ranks)
        t = _timed_allreduce(buf, args, device, rank, group=group) if rank in ranks else 0.0
        times = _gather_floats(t, device, world)
        sec = sum(times[r] for r in ranks) / len(ranks)
        bw = busbw_gbps(nbytes, sec, len(ranks))
        for x, y in ((a, b), (b, a)):
            out[mine[x]["name"]]["pairs"][mine[y]["name"]] = bw
    for rec in out.values():
        if rec["pairs"]:
            rec["inter_busbw_gbps"] = max(rec["pairs"].values())
    return {"size_bytes": nbytes, "nodes": list(out.values())}


def mark_stragglers(node_rows: list[dict], pct: float) -> tuple[list[str], list[str]]:
    """Flag straggler nodes in ``node_rows`` in place; returns (straggler names, notes)."""
    notes = []
    found: dict[str, list[str]] = {}
    for key, label in (("intra_busbw_gbps", "intra-node"), ("inter_busbw_gbps", "inter-node")):
        values = {r["node"]: r.get(key) for r in node_rows}
        for node, why in find_stragglers(values, pct).items():
            found.setdefault(node, []).append(f"{label} busbw {why}")
    if len(node_rows) == 2:
        notes.append("2 nodes: one inter-node pair, so a slow node cannot be told from its peer by the "
                     "inter-node figure (3 nodes or more can); the intra-node figures still compare")
    for r in node_rows:
        r["straggler"] = r["node"] in found
        r["straggler_reason"] = "; ".join(found[r["node"]]) if r["straggler"] else None
    return sorted(found), notes


def _nccl_version() -> str | None:
    import torch

    v = torch.cuda.nccl.version()
    if isinstance(v, int):  # older torch: e.g. 2708 / 21903
        major, rest = divmod(v, 10000) if v >= 10000 else divmod(v, 1000)
        minor, patch = divmod(rest, 100)
        return f"{major}.{minor}.{patch}"
    return ".".join(map(str, v))


def _fmt(x: float | None) -> str:
    return "       n/a" if x is None else f"{x:10.3f}"


def _summary(name: str, rows: list[dict], api: str | None, why: str | None, args, world: int) -> dict:
    """One collective's figures over its rows (``collectives[name]`` in the result)."""
    bw = [r["busbw_gbps"] for r in rows if r["busbw_gbps"] is not None]
    return {"measured": api is not None, "why_not": why, "api": api, "sizes": len(rows),
            "avg_busbw_gbps": common.mean(bw) if bw and world > 1 else None,
            "max_busbw_gbps": max(bw) if bw and world > 1 else None,
            "wrong_total": sum(r["wrong"] or 0 for r in rows) if args.check and api is not None else None}


def _at_size(row: dict | None) -> dict | None:
    return None if row is None else {k: row[k] for k in ("size_bytes", "busbw_gbps", "algbw_gbps")}


def worker(args) -> int:
    import torch
    import torch.distributed as dist

    device = common.setup_device(args)
    sizes = _sizes(args)
    backend = "nccl" if device == "cuda" else "gloo"
    wanted = parse_collectives(args.collectives, backend)
    nccl_file = nccl_capture.prepare(int(os.environ.get("RANK", "0")), device)   # before NCCL starts
    rank, world, local_rank = _init(device)
    if rank != 0:
        args.samples_out = None  # ranks of simulated nodes share the host: only rank 0 writes samples

    sampler = (nvml_sampler.make_sampler(args.sample_hz) if local_rank == 0
               else nvml_sampler.NullSampler("sampled by local rank 0")).start()
    rows = []
    calls: dict[str, tuple[str | None, str | None]] = {}
    nodes_info = None
    try:
        nodes, _ = _node_layout(rank, world, local_rank)
        for name in wanted:
            api, why = calls[name] = coll.choose_call(name, world, rank, backend, device)
            if api is None:
                if rank == 0:
                    common.log(f"{name:>14}: not measured: {why}")
                continue
            for size in sizes:
                with sampler.phase(f"allreduce:{size}" if name == "all_reduce" else f"{name}:{size}"):
                    row = _one_size(name, api, size, args, device, world, rank)
                if row is None:
                    continue
                rows.append(row)
                if rank == 0:
                    common.log(f"{name:>14} {common.human_bytes(row['size_bytes']):>8} {row['time_us']:10.1f} us "
                               f"algbw {_fmt(row['algbw_gbps'])} busbw {_fmt(row['busbw_gbps'])} GB/s "
                               f"#wrong {row['wrong']}")
        if len(nodes) >= 2 and args.per_node:
            node_bytes = (common.parse_bytes(args.node_bytes) if args.node_bytes
                          else min(max(sizes), NODE_BYTES_CAP))
            with sampler.phase("allreduce:per-node"):
                nodes_info = per_node(args, device, world, rank, nodes, node_bytes)
        # what each rank's NCCL (or gloo) used, per node at rank 0 (workloads/nccl_capture.py)
        reads: list = [None] * world
        dist.all_gather_object(reads, nccl_capture.local(nccl_file, device, rank))
    finally:
        summary = nvml_sampler.finish(sampler, args)
        dist.destroy_process_group()
    if rank != 0:
        return 0
    ar_rows = [r for r in rows if r["collective"] == "all_reduce"]
    summaries = {name: _summary(name, [r for r in rows if r["collective"] == name], *calls[name], args, world)
                 for name in wanted}
    report_size = common.parse_bytes(args.report_size) if args.report_size else None
    result = common.base_result("allreduce")
    result.update(
        device=device,
        device_name=common.device_name(device),
        backend=backend,
        torch=torch.__version__,
        nccl=_nccl_version() if device == "cuda" else None,
        world_size=world,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        nnodes=len(nodes),
        node_names=[n["name"] for n in nodes],
        iters=args.iters, warmup=args.warmup,
        results=ar_rows,
        avg_busbw_gbps=summaries.get("all_reduce", {}).get("avg_busbw_gbps"),
        max_busbw_gbps=summaries.get("all_reduce", {}).get("max_busbw_gbps"),
        wrong_total=summaries.get("all_reduce", {}).get("wrong_total"),
        results_all=rows,
        collectives=summaries,
        wrong_total_all=sum(r["wrong"] or 0 for r in rows) if args.check else None,
        report_size_bytes=report_size,
        at_size={name: _at_size(row_at_size([r for r in rows if r["collective"] == name], report_size))
                 for name in wanted},
        utilization=summary,
        straggler_pct=args.straggler_pct,
        nodes=None, stragglers=[], straggler_notes=[],
        fabric={"backend": backend, "by_node": nccl_capture.by_node(
            reads, [next(n["name"] for n in nodes if r in n["ranks"]) for r in range(world)])},
    )
    if world == 1:
        result["no_bandwidth_reason"] = ONE_RANK_REASON
        common.log(f"no bandwidth: {ONE_RANK_REASON}")
    if nodes_info is not None:
        stragglers, notes = mark_stragglers(nodes_info["nodes"], args.straggler_pct)
        result.update(nodes=nodes_info["nodes"], per_node_size_bytes=nodes_info["size_bytes"],
                      stragglers=stragglers, straggler_notes=notes)
        for n in nodes_info["nodes"]:
            common.log(f"node {n['node']}: intra busbw {_fmt(n['intra_busbw_gbps'])} inter busbw "
                       f"{_fmt(n['inter_busbw_gbps'])} GB/s" + (f"  STRAGGLER: {n['straggler_reason']}"
                                                                if n["straggler"] else ""))
    elif len(nodes) >= 2:
        result["straggler_notes"] = ["per-node figures turned off (--no-per-node)"]
    result["ok"] = bool(rows) and (not args.check or result["wrong_total_all"] == 0)
    if world > 1:
        for name, rec in summaries.items():
            if rec["measured"]:
                common.log(f"# {name} Avg bus bandwidth: {rec['avg_busbw_gbps']}")
    common.emit(result)
    return 0 if result["ok"] else 1


# --------------------------------------------------------------------------- launcher


def launch_local(args, argv: list[str]) -> int:
    """Start ``--nproc`` copies of this script as ranks of one job on this host."""
    n = args.nproc
    per = args.ranks_per_node or n
    tmp = tempfile.mkdtemp(prefix="gpuproof-ar-")
    env_base = dict(os.environ)
    env_base.update(WORLD_SIZE=str(n), LOCAL_WORLD_SIZE=str(per),
                    GPUPROOF_STORE_FILE=os.path.join(tmp, "store"))
    env_base.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env_base.setdefault("NCCL_SOCKET_IFNAME", "lo")
    out_path = os.path.join(tmp, "rank0.out")
    procs = []
    with open(out_path, "wb") as out0:
        for r in range(n):
            env = dict(env_base, RANK=str(r), LOCAL_RANK=str(r % per), GROUP_RANK=str(r // per),
                       GPUPROOF_DEVICE_INDEX=str(r))
            if per < n:  # simulated nodes on this host
                env["GPUPROOF_NODE_NAME"] = f"{socket.gethostname()}-node{r // per}"
            procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env,
                                          stdout=out0 if r == 0 else subprocess.DEVNULL))
        deadline = time.monotonic() + args.timeout
        failed = None
        while True:
            codes = [p.poll() for p in procs]
            failed = next((r for r, c in enumerate(codes) if c not in (None, 0, 1)), None)
            if failed is not None or all(c is not None for c in codes):
                break
            if time.monotonic() > deadline:
                failed = "timeout"
                break
            time.sleep(0.05)  # polling child processes, bounded by the deadline above
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if failed is not None:
        why = (f"ranks did not finish within --timeout {args.timeout:.0f}s" if failed == "timeout"
               else f"rank {failed} exited with status {procs[failed].returncode}")
        common.log(f"error: {why}")
        common.emit({"workload": "allreduce", "ok": False, "error": why, "world_size": n})
        return 1
    with open(out_path, encoding="utf-8") as fh:
        lines = [line for line in fh.read().splitlines() if line.strip()]
    if not lines:
        common.emit({"workload": "allreduce", "ok": False, "error": "rank 0 printed no result", "world_size": n})
        return 1
    print(lines[-1], flush=True)
    return procs[0].returncode


def build_parser():
    p = common.parser(
        "allreduce.py",
        "Collective size sweep (all_reduce, all_gather, reduce_scatter, alltoall, sendrecv) with nccl-tests' "
        "algbw, busbw and #wrong (NCCL on GPUs, gloo on the CPU).",
        epilog="examples:\n"
               "  python allreduce.py --device cpu --max-bytes 64K\n"
               "  python allreduce.py --nproc 2 --device cpu --sizes 8,1K,4K\n"
               "  python allreduce.py --nproc 3 --device cpu --sizes 1K,64K --collectives all   # what gloo has\n"
               "  torchrun --nproc-per-node 8 allreduce.py --collectives all_reduce,all_gather,alltoall "
               "--report-size 1G\n"
               "  python allreduce.py --nproc 4 --ranks-per-node 1 --device cpu --sizes 64K   # 4 'nodes'\n"
               "  torchrun --nproc-per-node 8 allreduce.py --min-bytes 8 --max-bytes 1G\n",
    )
    common.add_device_arg(p)
    p.add_argument("--min-bytes", "-b", default=DEFAULT_MIN, help="smallest message (default 8)")
    p.add_argument("--max-bytes", "-e", default=DEFAULT_MAX, help="largest message (default 1G = 1 GiB)")
    p.add_argument("--step-factor", "-f", type=int, default=2, help="size multiplier (default 2)")
    p.add_argument("--sizes", default=None, help="explicit comma list of sizes instead, e.g. 8,1K,1M")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="element type (default float32)")
    p.add_argument("--collectives", default="auto",
                   help="comma list of " + ", ".join(coll.COLLECTIVES) + ", or all; default auto: all five with "
                        "NCCL, all_reduce alone with gloo (the CPU), whose runs must stay quick")
    p.add_argument("--report-size", default=None,
                   help="at_size in the result: each collective's row at the largest size up to this "
                        "(e.g. 1G; default: the largest size)")
    p.add_argument("--iters", "-n", type=int, default=20, help="timed calls per size (default 20)")
    p.add_argument("--warmup", "-w", type=int, default=5, help="warm-up calls per size (default 5)")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the #wrong check")
    p.add_argument("--nproc", type=int, default=1,
                   help="start this many local ranks (default 1; ignored under torchrun)")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="with --nproc: pretend the local ranks form nodes of this many ranks each "
                        "(default: one node), to try the per-node figures on one host")
    p.add_argument("--node-bytes", default=None,
                   help="message size of the per-node figures (default: the largest size, at most 256M)")
    p.add_argument("--straggler-pct", type=float, default=DEFAULT_STRAGGLER_PCT,
                   help="a node below this %% of the median node bandwidth is a straggler (default 80)")
    p.add_argument("--no-per-node", dest="per_node", action="store_false",
                   help="skip the per-node (intra-node, node-pair) figures of a multi-node job")
    p.add_argument("--timeout", type=float, default=1800.0,
                   help="with --nproc: seconds before the ranks are stopped (default 1800)")
    nvml_sampler.add_args(p)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.nproc < 1:
        return common.fail_usage("--iters and --nproc must be >= 1, --warmup >= 0")
    if args.ranks_per_node is not None and (args.ranks_per_node < 1 or args.nproc % args.ranks_per_node):
        return common.fail_usage("--ranks-per-node must be >= 1 and divide --nproc")
    if not 0 < args.straggler_pct <= 100:
        return common.fail_usage("--straggler-pct must be within (0, 100]")
    try:
        _sizes(args)
        parse_collectives(args.collectives, "nccl")
        if args.report_size:
            common.parse_bytes(args.report_size)
    except ValueError as exc:
        return common.fail_usage(str(exc))
    if "RANK" not in os.environ and args.nproc > 1:
        return launch_local(args, argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())

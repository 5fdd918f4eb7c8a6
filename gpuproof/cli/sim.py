"""``gpuproof sim``: build, start, inspect and stop the embedded cluster."""

from __future__ import annotations

import json
import sys
import time

from ..errors import GpuproofError


def progress(msg: str) -> None:
    print(f"[gpuproof] {msg}", file=sys.stderr, flush=True)


def register(sub) -> None:
    p = sub.add_parser("sim", help="the embedded cluster (real control plane, kwok GPU nodes)",
                       description="Build, start, inspect and stop the embedded cluster: etcd, kube-apiserver, "
                                   "kube-controller-manager, kube-scheduler and kwok on 127.0.0.1, with "
                                   "simulated nodes from a fleet file.")
    s = p.add_subparsers(dest="sim_command", metavar="<action>", required=True)

    def common(q):
        q.add_argument("--state-dir", default=None,
                       help="where the cluster keeps its state (default ~/.cache/gpuproof/sim/default)")

    up = s.add_parser("up", help="start (or keep) the cluster and load a fleet; prints the kubeconfig path",
                      description="Start the embedded cluster and load the fleet. Prints the kubeconfig path on "
                                  "stdout (progress goes to stderr), so: export KUBECONFIG=$(gpuproof sim up). "
                                  "Running it again while the cluster is up is harmless; with another --fleet it "
                                  "swaps the nodes.")
    common(up)
    up.add_argument("--fleet", default="mixed", help="fleet file or shipped fleet name (default: mixed)")
    up.add_argument("--port", default="16443",
                    help="base port; the cluster uses it and the next five (default 16443; 'auto' picks free ones)")
    up.add_argument("--timeout", type=float, default=300, help="seconds to wait for readiness (default 300)")
    up.set_defaults(func=_up)

    st = s.add_parser("status", help="is it running, on which ports, with which fleet")
    common(st)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=_status)

    dn = s.add_parser("down", help="stop the cluster and delete its state")
    common(dn)
    dn.set_defaults(func=_down)

    ld = s.add_parser("load", help="replace the running cluster's nodes with another fleet")
    common(ld)
    ld.add_argument("--fleet", required=True, help="fleet file or shipped fleet name")
    ld.set_defaults(func=_load)

    b = s.add_parser("build", help="build (or find) the control-plane binaries and list them",
                     description="Find the control-plane binaries ($GPUPROOF_<NAME>, $GPUPROOF_BIN_DIR, "
                                 "$KUBEBUILDER_ASSETS, the build cache, PATH) and build the missing ones with Go "
                                 "from the pinned modules gpuproof ships (controlplane/ in a checkout). The cache "
                                 "is keyed on those modules' content, so a checkout and an install of the same "
                                 "version share one build.")
    b.add_argument("--force", action="store_true", help="rebuild into the cache even if binaries exist")
    b.set_defaults(func=_build)

    bd = s.add_parser("bundle", help="write everything the embedded cluster needs but Python into one file",
                      description="Write one file with what the embedded cluster runs that is not Python: the control "
                                  "plane and kubelet nodes' Kubernetes programs (one multi-call executable), kwok, "
                                  "NFD, CoreDNS, containerd 1.7, NVIDIA's device plugin, GFD, DRA driver and mock "
                                  "NVML, the pause image. Built first where missing (that needs Go). Install it "
                                  "where there is no Go with `gpuproof sim install FILE` (or GPUPROOF_BUNDLE=FILE).")
    bd.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="the bundle to write (.tar.xz; .tar with --uncompressed)")
    bd.add_argument("--without-dra", action="store_true",
                    help="leave out NVIDIA's DRA driver, containerd 1.7 and nvidia-cdi-hook (only pools offered "
                         "through DRA use them; the gpu-host fleet does not)")
    packing = bd.add_mutually_exclusive_group()
    packing.add_argument("--fast", action="store_true",
                         help="compress with xz -1 instead of -9e: about twice the size in a small fraction of the "
                              "time (a bundle that needs not fit a size limit)")
    packing.add_argument("--uncompressed", action="store_true",
                         help="write a plain tar, in seconds (about 130 MiB: a bundle that stays on this machine or "
                              "a fast disk)")
    bd.set_defaults(func=_bundle)

    ins = s.add_parser("install", help="install a bundle into the build cache (no Go needed after)",
                       description="Unpack a bundle made by `gpuproof sim bundle` into gpuproof's build cache "
                                   "($GPUPROOF_CACHE, default ~/.cache/gpuproof), where `gpuproof sim up` and "
                                   "`gpuproof run` find every piece without Go or a network.")
    ins.add_argument("bundle", metavar="FILE", help="the bundle")
    ins.set_defaults(func=_install)

    f = s.add_parser("fleets", help="list the shipped fleets, or validate a fleet file",
                     description="Without --check, list shipped fleets. With --check FILE, validate it and "
                                 "print its pools.")
    f.add_argument("--check", metavar="FILE", help="validate this fleet file")
    f.set_defaults(func=_fleets)


def _cluster(args, port=None):
    from ..sim.controlplane import SimCluster, find_free_base

    base = None
    if port is not None:
        if port == "auto":
            base = find_free_base()
        else:
            try:
                base = int(port)
            except ValueError:
                raise GpuproofError(f"--port must be a number or 'auto', got {port!r}") from None
            if not 1024 <= base <= 65530:
                raise GpuproofError(f"--port must be between 1024 and 65530, got {base}")
    return SimCluster(args.state_dir, base_port=base)


def _up(args) -> int:
    from ..sim.fleet_file import load_fleet

    fleet = load_fleet(args.fleet)           # validate before anything starts
    t0 = time.monotonic()
    kubeconfig = _cluster(args, args.port).up(fleet, progress=progress, timeout=args.timeout)
    progress(f"embedded cluster up in {time.monotonic() - t0:.1f}s with fleet {fleet.name!r} "
             f"({fleet.node_count} nodes). Use: export KUBECONFIG={kubeconfig}")
    print(kubeconfig)
    return 0


def _status(args) -> int:
    st = _cluster(args).status()
    if args.json:
        print(json.dumps(st, indent=2))
    elif not st["components"]:
        print(f"embedded cluster: not running (state {st['state_dir']})")
    else:
        print(f"embedded cluster: {'running' if st['running'] else 'NOT healthy'} at {st.get('api')}")
        print(f"  kubeconfig: {st.get('kubeconfig')}\n  fleet:      {st.get('fleet')}\n"
              f"  kubernetes: {st.get('kubernetes_version')}\n  uptime:     {st.get('uptime_s')}s")
        for comp, state in st["components"].items():
            print(f"  {comp:<24} {state}")
    return 0 if st["running"] else 1


def _down(args) -> int:
    if _cluster(args).down(progress=progress):
        progress("embedded cluster stopped and its state removed")
    else:
        progress("no embedded cluster was running")
    return 0


def _load(args) -> int:
    from ..sim.fleet_file import load_fleet

    fleet = load_fleet(args.fleet)
    sim = _cluster(args)
    if not sim.status()["running"]:
        raise GpuproofError("the embedded cluster is not running; start it with `gpuproof sim up --fleet ...`")
    sim.load_fleet(fleet, progress=progress)
    return 0


def _build(args) -> int:
    from ..sim import binaries

    if args.force:
        binaries.build(progress=progress, force=True)
    found = binaries.locate(progress=progress)
    print(found.describe())
    print(f"  Go modules: {binaries.modules_dir()}")
    for name in ("kube-apiserver", "etcd", "kwok"):
        print(f"  {name} --version: {binaries.version_of(found[name])}")
    from ..sim import nvidia

    sw = nvidia.build(progress=progress, force=True) if args.force else nvidia.locate(progress=progress)
    print(f"NVIDIA's node software (mock NVML, device plugin, GFD, DRA driver): {sw.root}")
    return 0


def _bundle(args) -> int:
    from ..sim import bundle

    m = bundle.make(args.output, progress=progress, dra=not args.without_dra, fast=args.fast,
                    compress=not args.uncompressed)
    mib = m["size"] / 2**20
    progress(f"bundle {args.output}: {mib:.1f} MiB ({m['raw'] / 2**20:.0f} MiB unpacked, "
             f"{sum(len(p['files']) for p in m['pieces'])} files) in {m['seconds']:.0f}s"
             + (f"; over the {bundle.LIMIT_MIB} MiB it should fit in" if mib > bundle.LIMIT_MIB else ""))
    for p in m["pieces"]:
        print(f"  {p['what']:<62} {sum(f['size'] for f in p['files'].values()) / 2**20:7.1f} MiB  {p['folder']}")
    return 0


def _install(args) -> int:
    from ..sim import bundle, kubelet

    bundle.install(args.bundle, progress=progress)
    missing = bundle.check(args.bundle)
    if missing:
        raise GpuproofError(f"{args.bundle}: installed, but the cache lacks {', '.join(missing)}")
    why = kubelet.missing()
    if why:
        progress(f"the control plane and kwok nodes are ready to start; for kubelet nodes this host lacks: {why}")
    return 0


def _sharing(pool) -> str:
    ts, mig = pool.time_slicing, pool.mig
    parts = [f"{ts.strategy} x{ts.replicas}"] if ts else []
    if mig:
        parts.append(f"MIG {mig.strategy} " + (", ".join(f"{n}x {p}" for p, n in mig.profiles.items()) or "(MIG off)"))
    return "; ".join(parts) or "whole GPUs"


def _fleets(args) -> int:
    from ..sim.fleet_file import load_fleet, shipped_fleets

    if not args.check:
        for name in shipped_fleets():
            fl = load_fleet(name)
            print(f"{name:<12} {fl.node_count:>4} nodes, pools: {', '.join(p.name for p in fl.pools)}")
        return 0
    fl = load_fleet(args.check)
    print(f"{args.check}: valid fleet {fl.name!r}, {fl.node_count} nodes")
    for p in fl.pools:
        res = _sharing(p) if p.gpu else "no GPUs"
        print(f"  {p.name:<16} x{p.count:<4} {p.gpu.product if p.gpu else 'cpu-only':<28} {res}")
    return 0

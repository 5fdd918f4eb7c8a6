"""``gpuproof clean``: remove what earlier runs left in a cluster (only objects labelled as theirs)."""

from __future__ import annotations

import sys

from ..errors import GpuproofError


def register(sub) -> None:
    p = sub.add_parser("clean", help="delete leftovers of earlier runs (namespaces, PriorityClasses)",
                       description="Delete the namespaces and PriorityClasses that earlier gpuproof runs left behind "
                                   "(after a crash or a killed CI job). Only objects carrying the labels "
                                   "app.kubernetes.io/managed-by=gpuproof and gpuproof.dev/run are touched. "
                                   "Without --kubeconfig/--context it cleans the embedded cluster of "
                                   "`gpuproof sim up`.")
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--context", default=None)
    p.add_argument("--run-id", action="append", default=None, help="only this run (repeatable)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted, delete nothing")
    p.set_defaults(func=_clean)


def _clean(args) -> int:
    from ..cluster.api import connect
    from ..sim.controlplane import SimCluster

    from .options import check_kubeconfig

    check_kubeconfig(args.kubeconfig)
    kubeconfig = args.kubeconfig
    if not kubeconfig and not args.context:
        sim = SimCluster()
        if not sim.status()["running"]:
            raise GpuproofError("no cluster named and no embedded cluster running; pass --kubeconfig/--context")
        kubeconfig = str(sim.kubeconfig)
    cluster = connect(kubeconfig, args.context)
    from ..cluster.lease import remove_expired
    from ..cluster.rbac import preflight

    # the rules of ClusterRole/Role gpuproof-clean, before anything is deleted (a dry run only reads)
    preflight(cluster, {"clean"}, read_only=args.dry_run)

    for line in remove_expired(cluster, dry_run=args.dry_run):       # killed runs' run leases
        print(("would remove " if args.dry_run else "removed ") + line)
    leftovers = cluster.leftover_runs()
    if args.run_id:
        leftovers = {k: v for k, v in leftovers.items() if k in args.run_id}
    if not leftovers:
        print(f"nothing to clean in {cluster.name}")
        return 0
    for rid, objs in sorted(leftovers.items()):
        print(f"run {rid}: " + "; ".join(f"{kind} {', '.join(names)}" for kind, names in objs.items()))
    if args.dry_run:
        print("(dry run: nothing deleted)")
        return 0
    cluster.clean(list(leftovers), progress=lambda m: print(m, file=sys.stderr))
    print(f"removed the leftovers of {len(leftovers)} run(s)")
    return 0

"""The cluster a pytest session runs against, and the session's run in it (one :class:`Target` per session).

Target selection:
- no ``--kubeconfig``/``--context``: a private embedded cluster is started for the
  session (fleet from ``--fleet``, default ``mixed``) and stopped at the end;
- ``--kubeconfig`` and/or ``--context``: that cluster, as it is. Nothing outside the
  run's namespace and labelled objects is changed.

The hooks (``gpuproof.plugin.hooks``) and fixtures (``gpuproof.plugin.fixtures``) reach it with :func:`get_target`.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from pathlib import Path

import pytest

from ..errors import GpuproofError, one_line
from ..results import RunDir, new_run_id
from .timeouts import Timeouts

REAL_GPU_REASON = "needs real GPUs: the target's GPU nodes are simulated (kwok)"


# ---------------------------------------------------------------------------- session state


# the run's outcome (run.json) when the cluster stopped answering: gpuproof run ends with CUT_SHORT_EXIT
CUT_SHORT = "cut short: "
CUT_SHORT_EXIT = 75          # sysexits' EX_TEMPFAIL: a temporary failure, worth trying again once the cluster answers
CLEANUP_AFTER_GONE_S = 15.0  # the API deadline of the cleanup of a run that took its API server as gone


def api_gone(exc: BaseException) -> bool:
    """An error that says the API server did not answer (refused, reset, timed out), not that it said no."""
    from ..cluster.api import no_answer

    return no_answer(exc)


class Target:
    """The cluster a session runs against, and this session's run in it."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.cut_short = ""          # what of the cluster cut the run short ('' while it answers)
        self.api_gone = False        # the API server taken as gone (nothing for the API deadline, or at cleanup)
        opt = config.getoption
        from .choice import choose

        # pytest-kubernetes's --k8s-provider/--k8s-kubeconfig, or gpuproof's --kubeconfig/--context (choice.py)
        self.choice = choose(opt)
        self.real = self.choice.real
        self.run_id = opt("--run-id") or new_run_id()
        self.scale = opt("--timeout-scale")
        self.sim = None
        self.fleet = None
        self.cluster = None
        self._run = None
        self._run_dir = None
        self._discovery = None
        self.error: GpuproofError | None = None
        self.lease = None
        self._closed = False

    def progress(self, msg: str) -> None:
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None and not self.config.getoption("quiet", 0) > 1:
            # progress comes during collection and tests too, where pytest captures output: step past it
            capman = self.config.pluginmanager.get_plugin("capturemanager")
            with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
                tr.write_line(f"[gpuproof] {msg}")

    def timeout(self, seconds: float) -> float:
        """``seconds`` scaled by --timeout-scale: for a figure of the caller's own (a benchmark's budget); the
        suites' waits use the named ones, :attr:`timeouts`."""
        return seconds * self.scale

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(scale=self.scale)

    # -- lazily connect / start

    def connect(self):
        if self.cluster is not None or self.error is not None:
            if self.error is not None:
                raise self.error
            return self.cluster
        from ..cluster.api import connect

        try:
            if self.real:
                kubeconfig, context = self.choice.open(self.progress)   # creates a throwaway (kind, ...) cluster
                self.cluster = connect(kubeconfig, context, api_deadline=self.config.getoption("api_deadline", None),
                                       qps=self.config.getoption("api_qps", None))
                self._kubeconfig = kubeconfig
                from ..cluster.rbac import preflight, pytest_needs

                # the RBAC rules of gpuproof/cluster/rbac.yaml this session needs, before the lease or anything else
                preflight(self.cluster, pytest_needs(self.config))
                if not self.config.getoption("--no-lease", False):
                    from ..cluster.lease import RunLease

                    self.lease = RunLease(self.cluster, self.run_id)
                    self.lease.acquire(self.config.getoption("--lease-wait", 300.0), progress=self.progress)
            else:
                from ..sim.fleet_file import load_fleet
                from ..sim.controlplane import SimCluster, find_free_base

                self.fleet = load_fleet(self.choice.fleet or "mixed")
                port = self.config.getoption("--sim-port")
                base = find_free_base() if port == "auto" else int(port)
                state = Path(tempfile.mkdtemp(prefix="gpuproof-sim-"))
                self.sim = SimCluster(state, base_port=base, private=True)
                self.progress(f"starting embedded cluster (fleet {self.fleet.name}, {self.fleet.node_count} nodes)")
                kubeconfig = self.sim.up(self.fleet, progress=self.progress)
                self.cluster = connect(str(kubeconfig), api_deadline=self.config.getoption("api_deadline", None),
                                       qps=self.config.getoption("api_qps", None))
                self.cluster.name = "embedded"
        except GpuproofError as exc:
            self.error = exc
            raise
        return self.cluster

    def lent_image(self):
        """The image this cluster's nodes lend gpuproof's workload pods, if they lend one: the embedded cluster's
        kubelet nodes (the host's Python over NVIDIA's mock NVML), started here (``--fleet``) or reached through
        the kubeconfig ``gpuproof sim up`` wrote; None elsewhere (the stock image, or ``$GPUPROOF_IMAGE``)."""
        if self.sim is not None:
            return self.sim.workload_image()
        if self.real and self.cluster is not None:
            from ..sim.kubelet import lent_image_of_kubeconfig

            # connect() notes the kubeconfig it opened; `gpuproof plan` connects on its own, with the user's
            kubeconfig = getattr(self, "_kubeconfig", None) or getattr(self.choice, "kubeconfig", None)
            return lent_image_of_kubeconfig(kubeconfig)
        return None

    @property
    def is_embedded(self) -> bool:
        return not self.real

    @property
    def run(self):
        if self._run is None:
            cluster = self.connect()
            from ..cluster.api import Run

            run = Run(cluster, self.run_id)
            run.workload_image = self.lent_image()
            run.quick_bench = bool(self.config.getoption("quick_bench", False))
            self._run = run          # set before create so a half-made run is still cleaned up
            _ = self.run_dir         # a run that touches the cluster always leaves its record
            run.create(progress=self.progress, timeout=self.timeouts.run_setup)
        return self._run

    @property
    def run_dir(self) -> RunDir:
        if self._run_dir is None:
            root = Path(self.config.getoption("--report-dir"))
            target = self.choice.label()
            cluster = "embedded" if not self.real else (self.choice.context or self.choice.cluster_name or "")
            self._run_dir = RunDir.create(root, self.run_id, target=target, argv=sys.argv[1:], cluster=cluster,
                                          fleet=(self.choice.fleet or "mixed") if not self.real else "")
        return self._run_dir

    def discovery(self, refresh: bool = False):
        if self._discovery is None or refresh:
            from ..discovery.nodes import discover

            cluster = self.connect()
            nodes = cluster.node_dicts()
            self._discovery = discover(nodes, pool_label=self.config.getoption("--pool-label"),
                                       slices=cluster.dra_objects("resourceslices"),
                                       device_classes=cluster.dra_objects("deviceclasses"))
            if getattr(cluster, "nodewatch", None) is None:
                from ..cluster.nodewatch import watch_nodes

                # the nodes as this run first saw them: one deleted or turned NotReady from now on is lost
                watch_nodes(cluster, nodes, say=self._say_lost)
        return self._discovery

    def _say_lost(self, msg: str) -> None:
        """A node lost, said from the node watch's thread (through the progress plugin, which may speak there)."""
        # progress.PLUGIN_NAME (progress.py imports this module: named here, not imported)
        progress = self.config.pluginmanager.get_plugin("gpuproof-progress")
        if progress is not None and progress.active:
            progress.say(msg)

    def lost_nodes(self) -> dict[str, str]:
        """node -> why, for each node the run saw at its start and lost since (deleted, or NotReady)."""
        watcher = getattr(self.cluster, "nodewatch", None) if self.cluster is not None else None
        return watcher.loss.snapshot() if watcher is not None else {}

    def lost_reason(self, node: str | None) -> str:
        return self.lost_nodes().get(node or "", "")

    def shared_requests_refused(self, node) -> bool | None:
        """Whether the node's device plugin refuses shared requests > 1 (None: unknown)."""
        if node.scheme == "gke" and node.time_sliced:
            return True          # GKE's device plugin always refuses more than one shared GPU
        if self.fleet is not None:    # the embedded cluster: the fleet wrote each pool's device-plugin config file
            try:
                ts = self.fleet.pool(node.name.rsplit("-", 1)[0]).time_slicing
            except KeyError:
                return None
            return bool(ts and ts.fail_requests_greater_than_one)
        opt = self.config.getoption("--shared-requests-refused")
        if not opt:
            return None
        named = {p.strip() for p in opt.split(",")} - {"all"}
        unknown = sorted(named - {n.pool for n in self.discovery().gpu_nodes})
        if unknown and not getattr(self, "_told_unknown_pools", False):
            self._told_unknown_pools = True          # a misspelt pool would silently mean "not refusing"
            self.progress(f"--shared-requests-refused names no pool of this cluster: {', '.join(unknown)} "
                          f"(its pools: {', '.join(sorted({n.pool for n in self.discovery().gpu_nodes}))})")
        return opt == "all" or node.pool in named

    def write_inventory(self) -> None:
        if self.cluster is None or self._run_dir is None:
            return
        from ..discovery.inventory import snapshot

        try:
            inv = snapshot(self.cluster, pool_label=self.config.getoption("--pool-label"))
            self._run_dir.write_inventory(inv)
            self._run_dir.meta.cluster = self.cluster.name
            self._run_dir.meta.kubernetes_version = inv["kubernetes_version"]
            self._run_dir.write_meta()
        except Exception as exc:  # the inventory is a record, never a reason to fail cleanup
            self.progress(f"could not write the inventory: {exc}")

    def delete_now(self) -> None:
        """The run was interrupted: ask the API server to delete what it made before anything else of its end (the
        namespace controller takes 5 s at least; the fan-out's pods go with the namespace). :meth:`close` waits."""
        if self._run is None or self._run._cleaned or self.api_gone or self._closed:
            return
        try:
            self._run.delete(progress=self.progress)
        except Exception as exc:     # noqa: BLE001  (close() asks again, and says what failed)
            self.progress(f"could not ask for run {self.run_id}'s deletion yet: {one_line(exc, 200)}")

    def close(self, outcome: str = "", interrupted: bool = False) -> None:
        """Clean up everything the run created; stop a private embedded cluster. Idempotent.

        ``interrupted`` (Ctrl-C, SIGTERM): the run's records are written without their parquet copies (pandas'
        import alone took seconds to tens of seconds on a loaded machine; the JSONL tables hold every record).
        Interrupted while it waits for the deletion (a second Ctrl-C), it stops waiting, skips the inventory, and
        still writes the run's records (run.json)."""
        if self._closed:
            return
        self._closed = True
        end_cut = ""      # what an interrupt during the end cut short
        # every step stands alone: a cluster that stopped answering costs the steps that need it, never the run's
        # records (the report is written from them after pytest, gpuproof/cli/run.py)
        if self._run is not None and not self._run._cleaned:
            inflight = getattr(self.cluster.api, "gpuproof_inflight", None)
            if inflight is not None and self.api_gone:
                # taken as gone already: the cleanup asks once more, briefly; `gpuproof clean` does the rest later
                inflight.deadline = min(inflight.deadline, CLEANUP_AFTER_GONE_S)
            try:
                self._run.cleanup(wait=True, timeout=self.timeouts.cleanup, progress=self.progress)
            except KeyboardInterrupt:
                end_cut = "interrupted during its cleanup"
                self.progress(f"cleanup of run {self.run_id} not waited for (interrupted while it waited): what was "
                              "asked to be deleted goes by itself; `gpuproof clean` removes whatever is left")
            except Exception as exc:
                if api_gone(exc):
                    self.cut_short = self.cut_short or "the API server stopped answering during the run's cleanup"
                    self.api_gone = True        # what follows asks it nothing more (the inventory)
                self.progress(f"cleanup of run {self.run_id} incomplete: {one_line(exc, 300)}. "
                              f"Run `gpuproof clean` to remove what is left.")
        if self.lease is not None:
            why = self.lease.release()
            if why:
                self.progress(f"could not release the run lease: {why}")
                from ..cluster.lease import NO_ANSWER

                if why.startswith(NO_ANSWER):
                    self.cut_short = self.cut_short or "the API server stopped answering at the run's end"
        lost = self.lost_nodes()
        watcher = getattr(self.cluster, "nodewatch", None) if self.cluster is not None else None
        if watcher is not None:
            watcher.stop()
        # a node lost mid-run cuts the run short too: its checks are not judged (the outcome names it)
        cut = "; ".join(x for x in (self.cut_short, *(f"{why} and its checks are not judged"
                                                      for why in lost.values())) if x)
        self.cut_short = cut
        if self._run_dir is not None:
            if self.api_gone:
                self.progress("the inventory is not written: the API server stopped answering")
            elif end_cut:
                self.progress("the inventory is not written: the run's end was interrupted")
            else:
                try:
                    self.write_inventory()
                except KeyboardInterrupt:
                    end_cut = "interrupted while writing its inventory"
                    self.progress("the inventory is not written: the run's end was interrupted")
            if lost:
                self._run_dir.meta.extra["lost_nodes"] = lost
            if end_cut:
                self._run_dir.meta.extra["end_interrupted"] = end_cut
            self._run_dir.finalize(f"{outcome or 'ended'}; {CUT_SHORT}{cut}" if cut else outcome,
                                   tables=not interrupted)
        if self.sim is not None:
            try:
                self.sim.down()
            except Exception as exc:          # a private cluster's processes: say what is left, go on
                self.progress(f"could not stop the private embedded cluster: {exc}")
            self.sim = None
        self.choice.close(self.progress)     # deletes a throwaway cluster this session created


_KEY = pytest.StashKey[Target]()


def started_target(config: pytest.Config) -> Target | None:
    """The session's target if one was made (None before pytest_configure, or when it failed)."""
    return config.stash.get(_KEY, None)


def get_target(config: pytest.Config) -> Target:
    if _KEY not in config.stash:
        config.stash[_KEY] = Target(config)
    return config.stash[_KEY]


def stop_session(exc: GpuproofError):
    """A target that cannot be used ends the session in one line, not in an error for every module or
    test that needs it (pytest interrupts, exit status 2, and cleans up as after Ctrl-C)."""
    raise pytest.Session.Interrupted(f"gpuproof cannot use its target cluster: {exc}") from None



"""Per-node checks across the whole fleet at once, each node's verdict still its own test.

Long: the fan-out is one piece, its workers, pod slots, progress and end together; the pytest hooks at its foot.

pytest runs ``test_health_per_node[a100-0]``, then ``[a100-1]``, ... one after another. A check that places a pod on
every GPU node would then take the sum of its nodes' times: hours on a fleet of hundreds. Instead, the first item of
such a check starts its per-node work on every node the check is parametrized over (the session's selected items of
the same test function), as background workers with at most ``--parallel`` pods in flight; each item then waits for
its own node's outcome and judges it. The check takes about as long as its slowest node, not the sum.

Width (issue #52): ``--parallel`` defaults to hundreds of pods in flight (``DEFAULT_PARALLEL``), what a real control
plane carries; what spares the API server is the rate: pods start at most ``POD_RATE`` a second, and every request
of the run's client goes through its ``--api-qps`` bucket (cluster/api.py), a 429 sent again as the server says. A
node's pod that never finishes holds its own slot until its deadline, never the other nodes' progress. Per pod in
flight the fan-out costs a worker thread blocked on its wait, and no watch or poll of its own: one watch per check.

A suite calls::

    value = fanout.result(request, node, work)      # work(node, lane) runs in a worker thread

``work`` must use only session-wide things (``run``, ``target``, ``discovery``: never ``check``), take pod slots from
``lane.pods(k)`` around the pods it runs, label its pods with ``lane.labels`` and wait through ``lane`` (one shared
watch on the run's pods instead of one per pod). It raises :class:`NodeSkip` for a node it cannot judge (no free GPU);
any other exception reaches the item, as it would have raised there. A node lost during the run (cluster/nodewatch.py)
gets no work started: its item gets :class:`~gpuproof.errors.NodeLost`, and is not judged.

Safety: work starts only when its item's check is selected; a different check's item drains the others' workers
first (their pods gone), so no two checks compete for GPUs; the end of the session (also -x) stops every worker,
which deletes its pods, and whatever remains with the fan-out's label is deleted too. On Ctrl-C or SIGTERM the run's
namespace is asked to be deleted first and takes the pods with it (plugin/hooks.py, ``end_run``).
Progress: after ``--progress-after`` seconds, then at doubling intervals, a line with nodes done, running and waiting
for a slot; at the end the check's wall time against the sum of its nodes' times, and the slowest node among its
peers. Each job also writes records (benchmark ``fanout``): its wall time, the nodes' sum, the most pods in flight,
and each node's time.
"""

from __future__ import annotations

import contextlib
import queue
import re
import statistics
import threading
import time
from concurrent.futures import CancelledError, Future
from typing import Any, Callable

import pytest

from ..cluster.nodewatch import lost_reason
from ..cluster.rate import TokenBucket
from ..errors import ClusterError, GpuproofError, NodeLost
from ..results import MetricRecord
from .options import DEFAULT_PARALLEL, PARALLEL_ENV, POD_RATE, parse_parallel  # noqa: F401  (declared with the options)

FANOUT_LABEL = "gpuproof.dev/fanout"
_KEY = pytest.StashKey["FanOut"]()


class NodeSkip(Exception):
    """The node cannot be judged by this check (no free GPU, ...): the item skips ``check`` with ``reason``."""

    def __init__(self, check: str, reason: str):
        super().__init__(reason)
        self.check, self.reason = check, reason


class Budget:
    """At most ``limit`` pods in flight across every worker; counts the most there ever were."""

    def __init__(self, limit: int):
        self.limit = limit
        self.in_flight = 0
        self.most = 0
        self._cond = threading.Condition()

    @contextlib.contextmanager
    def take(self, pods: int, stop: threading.Event):
        pods = max(1, min(pods, self.limit))      # a node that needs more pods than the bound runs alone
        with self._cond:
            while self.in_flight + pods > self.limit:
                if stop.is_set():
                    raise GpuproofError("the run is ending")
                self._cond.wait(1.0)
            self.in_flight += pods
            self.most = max(self.most, self.in_flight)
        try:
            yield
        finally:
            with self._cond:
                self.in_flight -= pods
                self._cond.notify_all()

    def wake(self) -> None:
        """Those waiting for slots look at their stop event now."""
        with self._cond:
            self._cond.notify_all()


class Lane:
    """What a job's work gets besides its node: pod slots, the labels its pods carry, waits on one shared watch."""

    def __init__(self, job: "Job"):
        self.job = job
        self.labels = {FANOUT_LABEL: job.label}
        self.stop = job.fan.stop

    @contextlib.contextmanager
    def pods(self, count: int = 1):
        """Hold ``count`` of the ``--parallel`` pod slots while the pods run (counted for the check too)."""
        with self.job.fan.budget.take(count, self.stop), self.job.pods.take(count, self.stop):
            if not self.job.fan.starts.take(count, self.stop):        # POD_RATE: pods started a second, at most
                raise GpuproofError("the run is ending")
            yield

    def wait_done(self, name: str, timeout: float):
        return self.job.watch().wait_done(name, timeout, self.stop)

    def wait_gone(self, name: str, timeout: float) -> None:
        self.job.watch().wait_gone(name, timeout, self.stop)


class Job:
    """One check's per-node work across its nodes."""

    def __init__(self, fan: "FanOut", name: str, function: Any, members: list, work: Callable):
        self.fan, self.name, self.function, self.work = fan, name, function, work
        self.label = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:63] or "job"    # a label value
        self.members = members
        self.futures: dict[str, Future] = {n.name: Future() for n in members}
        self.started: dict[str, float] = {}
        self.took: dict[str, float] = {}
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.pods = Budget(1 << 30)             # this check's own pods: how many now, the most at once
        self.ended = 0                          # nodes whose work has ended
        self.skipped = 0
        self.lane = Lane(self)
        self._watch = None
        self._watch_lock = threading.Lock()
        self.reported = False

    def watch(self):
        with self._watch_lock:
            if self._watch is None and self.fan.stop.is_set():      # no new watch once the run is ending
                raise ClusterError(f"{self.name}: stopped, the run is ending")
            if self._watch is None:
                from ..cluster.podwatch import PodWatch

                self._watch = PodWatch(self.fan.run, f"{FANOUT_LABEL}={self.label}")
            return self._watch

    def run_one(self, node) -> None:
        fut = self.futures[node.name]
        if not fut.set_running_or_notify_cancel():
            return
        self.started[node.name] = time.monotonic()
        value, error = None, None
        try:
            lost = lost_reason(getattr(self.fan.run, "cluster", None), node.name)
            if lost:                          # gone before its turn came: nothing of it to judge
                raise NodeLost(node.name, lost)
            value = self.work(node, self.lane)
        except BaseException as exc:          # noqa: BLE001  (handed to the node's own test item)
            error = exc
        with self.lock:
            self.took[node.name] = time.monotonic() - self.started[node.name]
            self.ended += 1
            self.skipped += isinstance(error, NodeSkip)
            last = self.ended == len(self.members)
        if last:                              # the check's summary line comes before its last verdict
            self.fan._report_end(self)
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)

    def counts(self) -> tuple[int, int, int]:
        done = sum(1 for f in self.futures.values() if f.done())
        running = sum(1 for n, f in self.futures.items() if n in self.started and not f.done())
        return done, running, len(self.futures) - done - running

    def finished(self) -> bool:
        return all(f.done() for f in self.futures.values())

    def cancel_waiting(self) -> None:
        for f in self.futures.values():
            f.cancel()

    def close_watch(self) -> None:
        if self._watch is not None:
            self._watch.close()


class FanOut:
    """The session's fan-out: a pool of worker threads shared by every job, bounded by ``--parallel`` pods."""

    def __init__(self, run, parallel: int, say: Callable[[str], None], after: float = 10.0, run_dir=None):
        self.run, self.parallel, self.say, self.after, self.run_dir = run, parallel, say, after, run_dir
        self.budget = Budget(parallel)
        self.starts = TokenBucket(POD_RATE)
        self.stop = threading.Event()
        self.jobs: dict[Any, Job] = {}
        self._queue: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._cond = threading.Condition()
        self._ticker: threading.Thread | None = None
        self._closed = False

    # ---------------------------------------------------------------- the items' side

    def result(self, item: pytest.Item, node, work: Callable, name: str | None = None,
               member: Callable[[dict], Any] | None = None) -> Any:
        """The outcome of ``work(node, lane)`` for this item's node, started with every other node of the same
        check on first call. Re-raises what the work raised (:class:`NodeSkip` included)."""
        job = self.job(item, work, name, member)
        fut = job.futures.get(node.name)
        if fut is None or fut.cancelled():           # not one of the job's nodes, or drained before its turn
            return work(node, job.lane)
        try:
            return fut.result()
        except CancelledError:
            return work(node, job.lane)

    def again(self, item: pytest.Item, node) -> Any:
        """This item's node's work once more, now, in the item's own thread with the job's pod slots: a figure to
        confirm before it fails the node (the census). Raises what the work raises."""
        job = self.jobs.get(getattr(item, "function", None))
        if job is None:
            raise LookupError(f"{item.nodeid}: no fan-out job to run again (fanout.result first)")
        # a job of its own for this node: the check's job closed its pod watch when its last node ended, and
        # another node's item may be running its work again at the same time
        once = Job(self, f"{job.name} again {node.name}", job.function, [node], job.work)
        try:
            return once.work(node, once.lane)
        finally:
            once.close_watch()

    def peers(self, item: pytest.Item, same: Callable[[Any], bool]) -> dict[str, Any]:
        """node name -> outcome of every node of this item's check for which ``same(node)`` holds, once each has
        arrived (a check that judges a node among its peers: the census). Nodes whose work raised, or never ran
        (drained), are left out: their own items say why."""
        job = self.jobs.get(getattr(item, "function", None))
        if job is None:
            return {}
        out = {}
        for n in job.members:
            if not same(n):
                continue
            fut = job.futures[n.name]
            try:
                out[n.name] = fut.result()
            except (Exception, CancelledError):     # noqa: BLE001  (judged in that node's own test)
                continue
        return out

    def job(self, item: pytest.Item, work: Callable, name: str | None, member: Callable[[dict], Any] | None) -> Job:
        function = getattr(item, "function", None)
        with self._cond:
            job = self.jobs.get(function)
            if job is not None:
                return job
            members, seen = [], set()
            for other in item.session.items:
                if getattr(other, "function", None) is not function:
                    continue
                n = (member or default_member)(getattr(getattr(other, "callspec", None), "params", {}))
                if n is not None and n.name not in seen:
                    seen.add(n.name)
                    members.append(n)
            job = Job(self, name or getattr(item, "originalname", item.name), function, members, work)
            self.jobs[function] = job
        if len(members) > 1:
            plural = "s" if self.parallel > 1 else ""
            self.say(f"{job.name}: {len(members)} nodes at once, at most {self.parallel} pod{plural} in flight "
                     f"(--parallel), started at most {POD_RATE:g} a second")
        self._grow(min(self.parallel, len(members)))
        for n in members:
            self._queue.put((job, n))
        self._start_ticker()
        return job

    def drain(self, keep: Any = None) -> None:
        """Let every other check's running work finish (its pods deleted); its nodes not started yet run in their
        own items later, if those come."""
        for function, job in list(self.jobs.items()):
            if function is keep or job.finished():
                continue
            job.cancel_waiting()
            for fut in job.futures.values():
                # what the work raised is its own item's; Ctrl-C here is the run's (it was swallowed: issue #52)
                with contextlib.suppress(Exception, CancelledError):
                    fut.exception()
            self._report_end(job)

    # ---------------------------------------------------------------- workers

    def _grow(self, wanted: int) -> None:
        while len(self._threads) < wanted:
            t = threading.Thread(target=self._worker, name=f"gpuproof-fanout-{len(self._threads)}", daemon=True)
            self._threads.append(t)
            t.start()

    def _worker(self) -> None:
        while not self.stop.is_set():
            try:
                job, node = self._queue.get(timeout=0.5)
            except queue.Empty:
                continue
            if self.stop.is_set():
                job.futures[node.name].cancel()
                break
            job.run_one(node)

    # ---------------------------------------------------------------- progress and records

    def _start_ticker(self) -> None:
        if self._ticker is None and self.after > 0:
            self._ticker = threading.Thread(target=self._tick, name="gpuproof-fanout-progress", daemon=True)
            self._ticker.start()

    def _tick(self) -> None:
        due: dict[Any, float] = {}
        while not self.stop.wait(min(1.0, self.after / 4)):
            now = time.monotonic()
            for function, job in list(self.jobs.items()):
                if job.finished() or len(job.members) < 2:
                    continue
                at = due.setdefault(function, job.t0 + self.after)
                if now < at:
                    continue
                due[function] = now + min(max(now - job.t0, self.after), 300.0)     # doubling, then every 5 min
                self.say(self.progress_line(job, now))

    def progress_line(self, job: Job, now: float | None = None) -> str:
        now = time.monotonic() if now is None else now
        done, running, waiting = job.counts()
        line = (f"{job.name}: {done}/{len(job.members)} nodes done, {running} running, {waiting} waiting for a "
                f"pod slot ({self.budget.in_flight}/{self.parallel} pods in flight) after {now - job.t0:.0f}s")
        longest = sorted(((now - t, n) for n, t in job.started.items() if not job.futures[n].done()), reverse=True)
        if longest:
            line += f"; longest running: {', '.join(f'{n} {s:.0f}s' for s, n in longest[:3])}"
        return line

    def _report_end(self, job: Job) -> None:
        with self._cond:
            if job.reported:
                return
            job.reported = True
        wall = time.monotonic() - job.t0
        took = dict(job.took)
        job.close_watch()
        skipped = job.skipped
        if len(job.members) > 1 and took:
            total = sum(took.values())
            med = statistics.median(took.values())
            slow, slow_s = max(took.items(), key=lambda kv: kv[1])
            line = (f"{job.name}: {len(took)} nodes in {wall:.1f}s (the nodes' own times add up to {total:.1f}s; "
                    f"median {med:.1f}s, slowest {slow} {slow_s:.1f}s; at most {job.pods.most} "
                    f"pod{'s' if job.pods.most != 1 else ''} in flight)")
            if skipped:
                line += f"; {skipped} node(s) skipped, see their checks"
            self.say(line)
        if self.run_dir is not None and took:
            p = {"job": job.name, "nodes": len(job.members), "parallel": self.parallel}
            recs = [MetricRecord("fanout", "wall_s", wall, "s", dict(p)),
                    MetricRecord("fanout", "node_sum_s", sum(took.values()), "s", dict(p)),
                    MetricRecord("fanout", "max_pods_in_flight", float(job.pods.most), "pods", dict(p))]
            # the node in the parameters too: `report compare` joins runs on them, so one node is followed across runs
            recs += [MetricRecord("fanout", "node_s", s, "s", {**p, "node": n}, node=n)
                     for n, s in sorted(took.items())]
            with contextlib.suppress(Exception):       # a record of timing never fails a check
                self.run_dir.add_metrics(recs)

    # ---------------------------------------------------------------- the end

    def stop_now(self) -> None:
        """Every worker stops at once: no new node's work starts, waiters on pods and pod slots are woken to hear it,
        and the checks' pod watches end (no more of their events decoded while the run ends). Idempotent."""
        self.stop.set()
        for job in list(self.jobs.values()):
            job.cancel_waiting()
            job.close_watch()
        for budget in (self.budget, *(job.pods for job in list(self.jobs.values()))):
            budget.wake()

    def close(self, timeout: float = 30.0) -> None:
        """Stop every worker (each deletes its pods, unless the run's namespace is being deleted: an interrupted run's
        end asks that first), then delete whatever pod still carries the fan-out's label.

        A worker waiting on its pod or for a pod slot hears the stop at once (its watch and slots are woken); one in
        the middle of a request to the API server finishes it. Workers still busy at ``timeout`` are named and left
        (daemon threads): the run's cleanup deletes their pods with its namespace."""
        if self._closed:
            return
        self._closed = True
        self.stop_now()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        busy = [t.name for t in self._threads if t.is_alive()]
        if busy:
            self.say(f"fan-out: {len(busy)} worker(s) still busy {timeout:.0f}s after the run's end began "
                     f"({', '.join(busy[:5])}{' ...' if len(busy) > 5 else ''}); not waited for")
        if self.jobs and self.run is not None:
            with contextlib.suppress(Exception):
                self.run.cluster.core.delete_collection_namespaced_pod(
                    self.run.namespace, label_selector=FANOUT_LABEL, grace_period_seconds=0)


def default_member(params: dict):
    """The node an item is about: its ``gpu_node``, or its ``gpu_pool``'s first node (a pool's probe runs there)."""
    node = params.get("gpu_node")
    if node is None and params.get("gpu_pool") is not None:
        nodes = getattr(params["gpu_pool"], "nodes", None) or []
        node = nodes[0] if nodes else None
    return node


# -------------------------------------------------------------------- the pytest side


def parallel_of(config: pytest.Config) -> int:
    value = config.getoption("parallel", None)
    return DEFAULT_PARALLEL if value in (None, "") else parse_parallel(value)


def get(config: pytest.Config, run=None, say=None, run_dir=None) -> FanOut:
    fan = config.stash.get(_KEY, None)
    if fan is None:
        after = float(config.getoption("progress_after", 10.0) or 0.0)
        fan = FanOut(run, parallel_of(config), say or (lambda msg: None), after=after, run_dir=run_dir)
        config.stash[_KEY] = fan
    return fan


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before a test of another check starts, the per-node work of earlier checks has ended (GPUs free again)."""
    fan = item.config.stash.get(_KEY, None)
    if fan is not None:
        fan.drain(keep=getattr(item, "function", None))


def stop_now(config: pytest.Config) -> None:
    fan = config.stash.get(_KEY, None)
    if fan is not None:
        fan.stop_now()


def close(config: pytest.Config) -> None:
    fan = config.stash.get(_KEY, None)
    if fan is not None:
        fan.close()

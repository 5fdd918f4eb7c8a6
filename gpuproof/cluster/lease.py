"""One gpuproof run at a time per cluster, by agreement: a coordination.k8s.io Lease.

A run against a named cluster takes the Lease ``gpuproof-run`` (in namespace ``gpuproof-system``,
or ``default`` where gpuproof may not create one) before it creates anything. The Lease names
the run id (``holderIdentity``), who started it and when; a thread renews it while the run
lasts, and the run deletes it at the end, also after a failure or Ctrl-C. A SIGKILLed run's
Lease is not renewed and expires after ``leaseDurationSeconds``; the next run takes it over,
and ``gpuproof clean`` deletes it.

A second run waits for the Lease (with progress, up to ``--lease-wait``) and then stops with
one line naming the holder. ``--no-lease`` runs without it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import getpass
import os
import socket
import threading
import time
from typing import Callable

from kubernetes import client as k8s
import urllib3
from kubernetes.client.exceptions import ApiException

from .api import MANAGED_BY, OWNER, WaitTimeout, watch_until
from ..errors import ClusterError

NAME = "gpuproof-run"
NAMESPACE = "gpuproof-system"
STARTED_BY = "gpuproof.dev/started-by"
DURATION_S = int(os.environ.get("GPUPROOF_LEASE_SECONDS", "60"))


class LeaseHeld(ClusterError):
    """Another gpuproof run holds the cluster's run lease."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def expires_at(lease) -> dt.datetime | None:
    spec = lease.spec
    renewed = spec.renew_time or spec.acquire_time
    if renewed is None or not spec.holder_identity:
        return None
    return renewed + dt.timedelta(seconds=spec.lease_duration_seconds or DURATION_S)


def expired(lease) -> bool:
    until = expires_at(lease)
    return until is None or until <= _now()


def describe(lease) -> str:
    spec = lease.spec
    who = (lease.metadata.annotations or {}).get(STARTED_BY, "someone")
    since = spec.acquire_time.strftime("%Y-%m-%d %H:%M:%SZ") if spec.acquire_time else "an unknown time"
    return f"gpuproof run {spec.holder_identity} (started by {who} at {since})"


# how release() begins its line when the API server did not answer (the run is then cut short, plugin/target.py)
NO_ANSWER = "the API server did not answer"

class RunLease:
    """The run lease of one run: acquire() before creating anything, release() at the end."""

    def __init__(self, cluster, run_id: str, duration_s: int = DURATION_S):
        self.cluster, self.run_id, self.duration_s = cluster, run_id, duration_s
        self.api = k8s.CoordinationV1Api(cluster.api)
        self.namespace = NAMESPACE
        self.held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self, resource_version: str | None = None) -> dict:
        now = _now().isoformat()
        meta = {"name": NAME, "labels": {MANAGED_BY: OWNER},
                "annotations": {STARTED_BY: f"{getpass.getuser()}@{socket.gethostname()} (pid {os.getpid()})"}}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": {"holderIdentity": self.run_id, "leaseDurationSeconds": self.duration_s,
                         "acquireTime": now, "renewTime": now}}

    def _pick_namespace(self) -> None:
        try:
            self.cluster.core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {MANAGED_BY: OWNER}}})
        except ApiException as exc:
            if exc.status == 403:
                self.namespace = "default"
            elif exc.status != 409:
                raise

    def _try_take(self) -> object | None:
        """Take the lease if it is free or expired; None when another live run holds it (returned otherwise)."""
        try:
            self.api.create_namespaced_lease(self.namespace, self._body())
            return None
        except ApiException as exc:
            if exc.status == 403:
                raise ClusterError(f"cannot take the run lease {self.namespace}/{NAME} (forbidden: the credentials "
                                   "need create/update/delete on leases.coordination.k8s.io); pass --no-lease to "
                                   "run without it") from None
            if exc.status != 409:
                raise
        lease = self.api.read_namespaced_lease(NAME, self.namespace)
        if lease.spec.holder_identity != self.run_id and not expired(lease):
            return lease
        try:
            self.api.replace_namespaced_lease(NAME, self.namespace, self._body(lease.metadata.resource_version))
            return None
        except ApiException as exc:
            if exc.status in (404, 409):          # changed under us: look again
                return self._try_take()
            raise

    def acquire(self, wait_s: float, progress: Callable[[str], None] = lambda m: None) -> None:
        self._pick_namespace()
        deadline = time.monotonic() + wait_s
        while True:
            holder = self._try_take()
            if holder is None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LeaseHeld(f"the cluster is in use by {describe(holder)}: waited {wait_s:.0f}s for its lease "
                                f"{self.namespace}/{NAME}; run again later, raise --lease-wait, or pass --no-lease")
            until = (expires_at(holder) - _now()).total_seconds() if expires_at(holder) else 0
            progress(f"waiting for the cluster: {describe(holder)} holds its run lease "
                     f"({remaining:.0f}s left of --lease-wait)")
            step = max(1.0, min(remaining, until + 1, 15.0))
            with contextlib.suppress(WaitTimeout):      # released, taken over, or time to look again
                watch_until(self.api.list_namespaced_lease, lambda c: NAME not in c or
                            c[NAME].metadata.resource_version != holder.metadata.resource_version or None,
                            step, f"the run lease {self.namespace}/{NAME} to change", namespace=self.namespace)
        self.held = True
        progress(f"took the run lease {self.namespace}/{NAME} for run {self.run_id}")
        self._thread = threading.Thread(target=self._renew, name="gpuproof-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(self.duration_s / 3):
            with contextlib.suppress(Exception):        # a missed renewal is retried; the lease outlives two
                lease = self.api.read_namespaced_lease(NAME, self.namespace)
                if lease.spec.holder_identity != self.run_id:
                    return
                lease.spec.renew_time = _now()
                self.api.replace_namespaced_lease(NAME, self.namespace, lease)

    def release(self) -> str:
        """Give the lease up. '' when it is gone (or was never held); else why it could not be deleted (an API
        server that stopped answering): it then expires by itself after ``duration_s``, and the next run takes it
        over or ``gpuproof clean`` removes it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if not self.held:
            return ""
        self.held = False
        try:
            lease = self.api.read_namespaced_lease(NAME, self.namespace, _request_timeout=10)
            if lease.spec.holder_identity == self.run_id:
                self.api.delete_namespaced_lease(NAME, self.namespace, body=k8s.V1DeleteOptions(
                    preconditions=k8s.V1Preconditions(resource_version=lease.metadata.resource_version)),
                    _request_timeout=10)
        except ApiException as exc:
            if exc.status not in (404, 409):         # gone already, or taken over
                return f"the API server refused to delete the run lease ({exc.status} {exc.reason})"
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return (f"{NO_ANSWER} ({type(exc).__name__}): the run lease {self.namespace}/{NAME} "
                    f"expires by itself in {self.duration_s:.0f} s")
        return ""


def remove_expired(cluster, dry_run: bool = False) -> list[str]:
    """Delete expired run leases (left by killed runs); returns what was (or would be) removed."""
    api = k8s.CoordinationV1Api(cluster.api)
    gone = []
    for ns in (NAMESPACE, "default"):
        with contextlib.suppress(ApiException):
            lease = api.read_namespaced_lease(NAME, ns)
            if expired(lease):
                gone.append(f"lease {ns}/{NAME} of {describe(lease)}")
                if not dry_run:
                    api.delete_namespaced_lease(NAME, ns)
    return gone

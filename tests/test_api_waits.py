"""Waits on the API server that outlast its restart (issue #41 item 3): a list cut by a refused or reset
connection is asked again, with back-off, until the wait's own deadline, which then says the API server did not
answer."""

from __future__ import annotations

import time

import pytest
import urllib3

from gpuproof.cluster.api import watch_until
from gpuproof.errors import ApiUnreachable, WaitTimeout


def _refused():
    return urllib3.exceptions.MaxRetryError(None, "/api/v1/pods", "Connection refused")


def test_a_list_refused_while_the_api_server_restarts_is_asked_again():
    calls = []

    def list_fn(**kwargs):
        calls.append(kwargs)
        if len(calls) <= 2:
            raise _refused()
        return {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "p"}, "phase": "Running"}]}

    got = watch_until(list_fn, lambda c: c.get("p"), 30, "pod p")
    assert got["phase"] == "Running" and len(calls) == 3


def test_an_api_server_that_stays_away_ends_the_wait_at_its_deadline_saying_so():
    def list_fn(**kwargs):
        raise _refused()

    t0 = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"timed out after 1s waiting for pod p: the API server did not answer "
                                          r"\(MaxRetryError: .*Connection refused"):
        watch_until(list_fn, lambda c: c.get("p"), 1, "pod p")
    assert time.monotonic() - t0 < 3


@pytest.mark.server  # tier: pytest as a process, with gpuproof's plugin
def test_a_check_cut_by_the_api_server_is_not_judged(tmp_path):
    """A check whose wait ended because the API server stopped answering is a skip naming the wait, never a
    failure (issue #41 item 3); any other error still fails."""
    import subprocess
    import sys

    (tmp_path / "test_cut.py").write_text(
        "from gpuproof.errors import ApiUnreachable\n\n\n"
        "def test_cut():\n"
        "    raise ApiUnreachable('timed out after 60s waiting for pod p: the API server did not answer (x)')\n\n\n"
        "def test_broken():\n"
        "    raise RuntimeError('a real error')\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_cut.py", "-q", "-rs", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--junitxml={tmp_path / 'junit.xml'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert "1 failed, 1 skipped" in proc.stdout, proc.stdout[-3000:]
    assert "not judged: timed out after 60s waiting for pod p: the API server did not answer" in proc.stdout
    junit = (tmp_path / "junit.xml").read_text()
    assert '<skipped type="pytest.skip" message="not judged: timed out' in junit, junit


# ------------------------------------------------------------------ the API deadline (issue #41 items 2 and 3)


def _sender(answers: list):
    """A stand-in for the API client's request: each call takes the next answer (an exception is raised)."""
    calls = []

    def send(method, url, *args, **kwargs):
        calls.append((method, kwargs.get("_request_timeout")))
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return send, calls


def _inflight(deadline: float):
    from gpuproof.cluster.api import InFlight

    inflight = InFlight()
    inflight.deadline = deadline
    return inflight


def _broken_off():
    return urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset by peer"))


def _not_connected():
    return urllib3.exceptions.MaxRetryError(None, "/api/v1/pods", urllib3.exceptions.NewConnectionError(
        None, "Failed to establish a new connection: [Errno 111] Connection refused"))


@pytest.mark.parametrize("method, path", [("GET", "/api/v1/namespaces/x/pods"), ("DELETE", "/api/v1/namespaces/x"),
                                          ("PUT", "/apis/coordination.k8s.io/v1/namespaces/x/leases/l")])
def test_a_request_safe_to_send_again_outlasts_a_restarting_api_server(method, path):
    """Reads, deletes of the run's own objects and the lease's renewal are sent again while the API server restarts
    (broken off, then refused), within the API deadline; each try is bounded by what is left of it."""
    send, calls = _sender([_broken_off(), _not_connected(), "answer"])
    assert _inflight(30)._send_within_deadline(send, method, "https://api" + path) == "answer"
    assert [m for m, _ in calls] == [method] * 3
    assert all(0 < t <= 30 for _, t in calls), calls


def test_a_create_broken_off_is_not_sent_again_and_one_never_sent_is():
    from gpuproof.errors import ApiGone, ApiUnreachable

    send, calls = _sender([_broken_off(), "answer"])
    with pytest.raises(ApiUnreachable, match=r"^the API server broke off POST /api/v1/namespaces/x/pods before "
                                             r"answering \(ProtocolError: .*\); not sent again, as it may have") as err:
        _inflight(30)._send_within_deadline(send, "POST", "https://api/api/v1/namespaces/x/pods")
    assert len(calls) == 1 and not isinstance(err.value, ApiGone)
    send, calls = _sender([_not_connected(), "answer"])        # refused: it never reached the API server
    assert _inflight(30)._send_within_deadline(send, "POST", "https://api/api/v1/namespaces/x/pods") == "answer"
    assert len(calls) == 2


def test_an_api_server_that_stays_away_past_the_api_deadline_is_gone():
    from gpuproof.errors import ApiGone

    send, calls = _sender([_not_connected()])
    t0 = time.monotonic()
    with pytest.raises(ApiGone, match=r"^the API server did not answer GET /api/v1/nodes for 1s \(the API deadline, "
                                      r"--api-deadline 1; MaxRetryError: .*Connection refused"):
        _inflight(1)._send_within_deadline(send, "GET", "https://api/api/v1/nodes")
    assert time.monotonic() - t0 < 2.5 and len(calls) >= 2


def test_a_request_is_bounded_by_the_api_deadline_unless_its_caller_bounds_it(tmp_path):
    """Without a timeout of its caller's, a request waits at most the API deadline for its answer (a frozen API
    server); a watch only for its connection (it may be quiet for long); a caller's own timeout is left alone."""
    from kubernetes import client as k8s

    from gpuproof.cluster.api import InFlight

    api = k8s.ApiClient(k8s.Configuration())
    seen = []
    api.rest_client.request = lambda method, url, *a, **kw: seen.append((method, kw.get("_request_timeout")))
    InFlight.attach(api).deadline = 42
    rest = api.rest_client
    rest.request("GET", "https://api/api/v1/nodes", _request_timeout=None)
    rest.request("GET", "https://api/api/v1/pods", query_params=[("watch", True)], _request_timeout=None)
    rest.request("GET", "https://api/version", _request_timeout=10)
    assert seen[0][1] == pytest.approx(42, abs=1) and seen[1:] == [("GET", (42, None)), ("GET", 10)]


def test_a_wait_whose_lists_are_refused_past_the_api_deadline_says_the_api_server_is_gone():
    """A wait longer than the API deadline does not outwait it: the API server gone for the API deadline ends it
    with ApiGone, which stops the run."""
    from types import SimpleNamespace

    from gpuproof.cluster.api import InFlight
    from gpuproof.errors import ApiGone

    class Core:
        api_client = SimpleNamespace(gpuproof_inflight=InFlight())

        def list_pods(self, **kwargs):
            raise _refused()

    Core.api_client.gpuproof_inflight.deadline = 1
    t0 = time.monotonic()
    with pytest.raises(ApiGone, match=r"the API server did not answer for 1s \(the API deadline, --api-deadline 1\) "
                                      r"while waiting for pod p"):
        watch_until(Core().list_pods, lambda c: c.get("p"), 600, "pod p")
    assert time.monotonic() - t0 < 3


def test_a_pod_watch_broken_by_the_api_server_ends_its_waits_as_cut_never_as_timed_out():
    """PodWatch (the fan-out's shared watch): a watch the API server broke is not a pod that never finished. At the
    wait's deadline it is ApiUnreachable (not judged); broken for the API deadline, ApiGone."""
    import threading
    from types import SimpleNamespace

    from gpuproof.cluster.api import InFlight
    from gpuproof.cluster.podwatch import PodWatch
    from gpuproof.errors import ApiGone, ApiUnreachable

    inflight = InFlight()
    watch = PodWatch.__new__(PodWatch)           # its state only: no thread, no cluster
    watch.run = SimpleNamespace(namespace="gpuproof-r", cluster=SimpleNamespace(
        api=SimpleNamespace(gpuproof_inflight=inflight), nodewatch=None))
    watch.cache, watch.tick, watch._cond = {}, 0.1, threading.Condition()
    watch._ready = threading.Event()
    watch._ready.set()
    watch.error, watch.error_since = _refused(), time.monotonic()
    with pytest.raises(ApiUnreachable, match=r"timed out after 0s waiting for pod gpuproof-r/p to finish: the API "
                                             r"server did not answer for the last 0s \(.*Connection refused") as err:
        watch.wait("p", lambda p: False, 0.2, "to finish")
    assert not isinstance(err.value, ApiGone)
    inflight.deadline, watch.error_since = 1, time.monotonic() - 2
    with pytest.raises(ApiGone, match=r"the API server did not answer for 2s \(the API deadline, --api-deadline 1\) "
                                      r"while waiting for pod gpuproof-r/p to finish"):
        watch.wait("p", lambda p: False, 60, "to finish")



def test_a_pod_watch_failing_otherwise_says_so_when_its_wait_times_out():
    """A watch that fails for another reason than a silent API server (an answer the client cannot read) leaves its
    cache as it was: a wait that then times out says so beside what it last saw, so a pod "not found" there is not
    taken for a pod that is gone (a matrix run's wait once timed out so, with nothing said why)."""
    import threading
    from types import SimpleNamespace

    from gpuproof.cluster.api import InFlight
    from gpuproof.cluster.podwatch import PodWatch
    from gpuproof.errors import WaitTimeout

    watch = PodWatch.__new__(PodWatch)           # its state only: no thread, no cluster
    watch.run = SimpleNamespace(namespace="gpuproof-r", cluster=SimpleNamespace(
        api=SimpleNamespace(gpuproof_inflight=InFlight()), nodewatch=None))
    watch.cache, watch.tick, watch._cond = {}, 0.1, threading.Condition()
    watch._ready = threading.Event()
    watch._ready.set()
    watch.error, watch.error_since = ValueError("Invalid value for `phase`"), time.monotonic() - 3
    with pytest.raises(WaitTimeout, match=r"\(last seen: pod not found; the namespace's pod watch has failed for the "
                                          r"last 3s: Invalid value for `phase`\)"):
        watch.wait("p", lambda p: False, 0.2, "to finish")

@pytest.mark.server  # tier: pytest as a process, with gpuproof's plugin
def test_an_api_server_gone_for_the_api_deadline_stops_the_run_and_a_broken_stream_is_not_judged(tmp_path):
    """ApiGone (no answer for the API deadline): the check is not judged and the session stops there, the checks to
    come not run. A watch stream the API server broke off (a raw urllib3 error in the Kubernetes client) is not judged
    either; a connection refused by another server a check talks to still fails it."""
    import subprocess
    import sys

    (tmp_path / "test_gone.py").write_text(
        "import urllib3\n"
        "from kubernetes import watch\n"
        "from gpuproof.errors import ApiGone\n\n\n"
        "def list_pods(**kwargs):\n"
        "    \"\"\":return: V1PodList\"\"\"\n"
        "    raise urllib3.exceptions.ProtocolError('Response ended prematurely')\n\n\n"
        "def test_stream():\n"
        "    for _ in watch.Watch().stream(list_pods):\n"
        "        pass\n\n\n"
        "def test_other_server():\n"
        "    raise ConnectionRefusedError(111, 'the Prometheus of the check refused')\n\n\n"
        "def test_gone():\n"
        "    raise ApiGone('the API server did not answer GET /api/v1/nodes for 8s (the API deadline, x)')\n\n\n"
        "def test_after():\n"
        "    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_gone.py", "-q", "-rfs", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--junitxml={tmp_path / 'junit.xml'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout
    assert proc.returncode == 2 and "1 failed, 2 skipped" in out and "passed" not in out, out[-3000:]
    assert "FAILED test_gone.py::test_other_server - ConnectionRefusedError" in out, out   # another server: a verdict
    assert "not judged: the API server stopped answering (ProtocolError: Response ended prematurely)" in out, out
    assert "not judged: the API server did not answer GET /api/v1/nodes for 8s" in out, out
    assert "Interrupted: the API server stopped answering: the API server did not answer GET" in out, out
    assert "test_after" not in (tmp_path / "junit.xml").read_text()


def test_a_fleet_can_lower_the_embedded_api_servers_inflight_limit(tmp_path):
    """controlPlane.maxRequestsInflight: the embedded API server runs with that limit on reads and on writes, and
    API priority and fairness off, so that the limit itself answers 429 (issue #41 item 6)."""
    from gpuproof.errors import FleetError
    from gpuproof.sim.controlplane import SimCluster
    from gpuproof.sim.fleet import ControlPlane
    from gpuproof.sim.fleet_file import parse_fleet

    pools = [{"name": "l4", "count": 1, "gpu": {"product": "NVIDIA-L4", "count": 1}}]
    fleet = parse_fleet({"name": "t", "controlPlane": {"maxRequestsInflight": 2}, "pools": pools}, source="t")
    assert fleet.control_plane.max_requests_inflight == 2
    assert fleet.control_plane.key() != ControlPlane().key() == "|"      # a running cluster is restarted for it
    with pytest.raises(FleetError, match="maxRequestsInflight: must be a whole number"):
        parse_fleet({"name": "t", "controlPlane": {"maxRequestsInflight": "low"}, "pools": pools}, source="t")
    sim = SimCluster(tmp_path)
    sim._control_plane = fleet.control_plane
    args = sim._args("kube-apiserver", {"kube-apiserver": "/bin/kube-apiserver"}, 20000, None)
    assert {"--enable-priority-and-fairness=false", "--max-requests-inflight=2",
            "--max-mutating-requests-inflight=2"} <= set(args)
    sim._control_plane = ControlPlane()
    assert not [a for a in sim._args("kube-apiserver", {"kube-apiserver": "/x"}, 20000, None) if "inflight" in a]


def test_the_clients_own_tls_error_is_no_answer_and_an_http_error_is_an_answer():
    """The Kubernetes client turns a TLS error into ApiException(status=0): no answer, sent again; a status is an
    answer, raised as it is."""
    from kubernetes.client.exceptions import ApiException

    send, calls = _sender([ApiException(status=0, reason="SSLError: handshake timed out"), "answer"])
    assert _inflight(30)._send_within_deadline(send, "GET", "https://api/api/v1/nodes") == "answer"
    send, calls = _sender([ApiException(status=404, reason="Not Found")])
    with pytest.raises(ApiException):
        _inflight(30)._send_within_deadline(send, "GET", "https://api/api/v1/nodes/x")
    assert len(calls) == 1


def test_a_create_left_unanswered_for_the_whole_api_deadline_means_the_api_server_is_gone():
    """A frozen API server: the create's one try waits the whole deadline, and that is no answer for the deadline."""
    from gpuproof.errors import ApiGone

    def frozen(method, url, *args, **kwargs):
        time.sleep(kwargs["_request_timeout"])          # the socket's read timeout, as a frozen API server leaves it
        raise urllib3.exceptions.MaxRetryError(None, url, urllib3.exceptions.ReadTimeoutError(None, url, "timed out"))

    with pytest.raises(ApiGone, match=r"^the API server did not answer POST /api/v1/namespaces/x/pods for 1s"):
        _inflight(1)._send_within_deadline(frozen, "POST", "https://api/api/v1/namespaces/x/pods")


def test_a_wait_the_api_server_broke_off_that_then_times_out_judges_nothing():
    """A wait whose watch the API server broke off (a restart) and that then ran out of time is ApiUnreachable (not
    judged), not a WaitTimeout: what it waited for may have been lost with the API server (a scheduler's update of
    the pod, made while it was away, is retried only minutes later)."""
    from gpuproof.errors import ApiGone

    def list_pods(**kwargs):
        """:return: V1PodList"""
        if kwargs.get("watch"):
            raise urllib3.exceptions.ProtocolError("Response ended prematurely")
        return {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "p"}, "phase": "Pending"}]}

    with pytest.raises(ApiUnreachable, match=r"^timed out after 1s waiting for pod p \(last seen: 1 objects seen\), "
                                             r"after the API server broke off the wait \(ProtocolError: Response "
                                             r"ended prematurely\): what it waited for may have been lost") as err:
        watch_until(list_pods, lambda c: c["p"]["phase"] == "Running", 1, "pod p")
    assert not isinstance(err.value, ApiGone)


def test_a_wait_on_an_object_deleted_meanwhile_says_so(monkeypatch):
    """'not found' at a wait's deadline tells deleted-by-someone (and when) from never made: the watch saw it go."""
    from gpuproof.cluster import api

    class Watch:
        def stream(self, list_fn, **kwargs):
            yield {"type": "DELETED", "object": {"metadata": {"name": "p", "resourceVersion": "8"}}}
            time.sleep(kwargs["timeout_seconds"])

        def stop(self):
            pass

    monkeypatch.setattr(api.watch, "Watch", Watch)

    def list_pods(**kwargs):
        return {"metadata": {"resourceVersion": "7"}, "items": [{"metadata": {"name": "p"}, "phase": "Pending"}]}

    with pytest.raises(WaitTimeout, match=r"^timed out after 1s waiting for pod p \(last seen: pod not found; "
                                          r"deleted during this wait: p at 0s\)$"):
        watch_until(list_pods, lambda c: c.get("p", {}).get("phase") == "Running", 1, "pod p",
                    describe=lambda c: "pod found" if "p" in c else "pod not found")

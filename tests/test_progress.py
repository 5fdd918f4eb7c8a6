"""Progress during a run: long steps (pods waiting, image pulls, long checks) and the time left.

The board and the estimate are tested with a clock passed in; the plugin is tested end to end:
a pytest run against the embedded cluster whose check leaves a pod unschedulable and plays the
kubelet's image-pull events, with an earlier run's junit.xml to estimate from.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from gpuproof.plugin.progress_board import Board, EventView, PodView, Schedule, fmt_bytes, fmt_duration, go_duration
from gpuproof.plugin.progress_eta import Estimate, history, junit_key

PULLED = ('Successfully pulled image "nvcr.io/nvidia/pytorch:24.05-py3" in 1m2.5s (1m2.5s including waiting). '
          'Image size: 9876543210 bytes.')


# ------------------------------------------------------------------------------ board


def test_pod_waiting_for_a_node_is_reported_at_doubling_intervals_then_how_it_ended():
    b = Board(after=10)
    waiting = PodView("share-extra", unschedulable="0/6 nodes are available: 1 Insufficient nvidia.com/gpu.")
    assert b.pod(waiting, 0) == []
    assert b.tick(9.9) == []
    first = b.tick(10)
    assert first == ["pod share-extra waiting for a node (10s): 0/6 nodes are available: 1 Insufficient "
                     "nvidia.com/gpu."]
    assert b.tick(15) == [] and b.tick(19.9) == []          # one line per step, not per tick
    assert len(b.tick(20)) == 1 and b.tick(39) == [] and len(b.tick(40)) == 1
    ended = b.pod(PodView("share-extra", phase="Running", node="l4-0"), 45)
    assert ended == ["pod share-extra: waiting for a node for 45s; now running on l4-0"]
    assert b.tick(100) == []                               # a running scratch pod is no step


def test_a_short_wait_says_nothing():
    b = Board(after=10)
    b.pod(PodView("quick"), 0)
    assert b.pod(PodView("quick", phase="Running", node="a100-0"), 3) == []
    assert b.tick(30) == []


def test_pod_waiting_on_its_node_and_a_long_workload_pod():
    b = Board(after=5)
    b.pod(PodView("bench-matmul-h100", node="h100-0", waiting="ContainerCreating"), 0)
    assert b.tick(5) == ["pod bench-matmul-h100 on h100-0: ContainerCreating (5.0s)"]
    b.pod(PodView("bench-matmul-h100", phase="Running", node="h100-0", workload=True), 6)
    assert b.tick(11) == ["pod bench-matmul-h100 running on h100-0 (5.0s)"]
    assert b.pod(PodView("bench-matmul-h100", phase="Succeeded", node="h100-0", workload=True), 200) == \
        ["pod bench-matmul-h100 on h100-0: Succeeded after 3m14s running"]


def test_image_pull_started_still_going_and_finished_with_duration_and_size():
    b = Board(after=10)
    b.pod(PodView("bench-matmul-a100", node="a100-0", waiting="ContainerCreating"), 0)
    assert b.event(EventView("bench-matmul-a100", "Pulling", 'Pulling image "nvcr.io/nvidia/pytorch:24.05-py3"',
                             key="u1/1"), 0) == []
    assert b.tick(10) == ["pod bench-matmul-a100 on a100-0: pulling image nvcr.io/nvidia/pytorch:24.05-py3 "
                          "(10s so far)"]     # and not also 'ContainerCreating': the pull says it better
    done = b.event(EventView("bench-matmul-a100", "Pulled", PULLED, key="u2/1"), 63)
    assert done == ["pod bench-matmul-a100 on a100-0: pulled image nvcr.io/nvidia/pytorch:24.05-py3 in 1m02s "
                    "(9.9 GB)"]
    assert b.event(EventView("bench-matmul-a100", "Pulled", PULLED, key="u2/1"), 64) == []   # a relist


def test_fast_or_cached_pulls_say_nothing_and_failures_say_it_once():
    b = Board(after=10)
    b.pod(PodView("p", node="n1"), 0)
    b.event(EventView("p", "Pulling", 'Pulling image "a:1"', key="1"), 0)
    assert b.event(EventView("p", "Pulled", 'Successfully pulled image "a:1" in 812ms (812ms including '
                                            'waiting). Image size: 1000 bytes.', key="2"), 1) == []
    assert b.event(EventView("p", "Pulled", 'Container image "a:1" already present on machine', key="3"), 1) == []
    fail = 'Back-off pulling image "nvcr.io/private/x:1"'
    assert b.event(EventView("p", "BackOff", fail, key="4/1"), 2) == [f"pod p on n1: BackOff: {fail}"]
    assert b.event(EventView("p", "BackOff", fail, key="4/2"), 30) == []
    # a pull whose start progress missed is still reported when the kubelet says it was long
    assert b.event(EventView("q", "Pulled", PULLED, key="5", node="n2"), 70) == \
        ["pod q on n2: pulled image nvcr.io/nvidia/pytorch:24.05-py3 in 1m02s (9.9 GB)"]


def test_many_steps_at_once_are_summed_up():
    b = Board(after=1)
    for i in range(10):
        b.pod(PodView(f"low-{i}"), 0)
    lines = b.tick(1)
    assert len(lines) == 4 and lines[-1] == "... and 7 more pods or pulls still going"


def test_formats():
    assert go_duration("1m2.5s") == 62.5 and go_duration("812ms") == pytest.approx(0.812) and go_duration("x") is None
    assert fmt_duration(0.44) == "0.4s" and fmt_duration(65) == "1m05s" and fmt_duration(7380) == "2h03m"
    assert fmt_bytes(9876543210) == "9.9 GB" and fmt_bytes(37321645) == "37.3 MB"
    s = Schedule(10)
    assert [t for t in range(0, 2000) if s.due("k", t)][:8] == [10, 20, 40, 80, 160, 320, 620, 920]


# ------------------------------------------------------------------------------ the estimate


def _run_folder(root, run_id, target, durations: dict[str, float], fleet=""):
    d = root / run_id
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"run_id": run_id, "target": target, "fleet": fleet}))
    cases = "".join(f'<testcase classname="{k.split("::")[0]}" name="{k.split("::")[1]}" time="{v}"/>'
                    for k, v in durations.items())
    (d / "junit.xml").write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{cases}'
                                 "</testsuite></testsuites>")


def test_history_takes_the_latest_runs_against_the_same_target(tmp_path):
    a, b, c = "suites.test_x::test_a", "suites.test_x::test_b[l4]", "suites.test_y::test_c"
    _run_folder(tmp_path, "20250101-000000-aaaaaa", "embedded", {a: 50, b: 60, c: 70}, fleet="mixed")
    _run_folder(tmp_path, "20250102-000000-bbbbbb", "embedded", {a: 10, b: 20}, fleet="mixed")
    _run_folder(tmp_path, "20250103-000000-cccccc", "kubeconfig:k#prod", {a: 999, b: 999, c: 999})
    _run_folder(tmp_path, "20250104-000000-dddddd", "embedded", {a: 1, b: 1, c: 1}, fleet="minimal")
    _run_folder(tmp_path, "20250105-000000-now000", "embedded", {a: 5}, fleet="mixed")     # this very run
    durations, used = history(tmp_path, "20250105-000000-now000", "embedded", "mixed")
    assert durations == {a: 10, b: 20, c: 70}
    assert used == ["20250102-000000-bbbbbb", "20250101-000000-aaaaaa"]
    assert junit_key("suites/test_x.py::test_b[l4]") == b
    assert history(tmp_path / "none", "x", "embedded") == ({}, [])


def test_estimate_from_earlier_runs_then_from_this_runs_pace():
    e = Estimate(["a", "b", "c"], {"a": 10, "b": 20})
    assert e.remaining() == 10 + 20 + 15                  # c: the mean of the earlier checks
    e.finished("a", 20)                                   # this run goes at twice the earlier time
    assert e.pace() == 2.0
    assert e.remaining() == 20 * 2 + 20                    # b scaled; c: this run's mean
    assert e.remaining("b", running_for=15) == 25 + 20     # b has been running for 15 s already
    assert Estimate(["x", "y"]).remaining() is None       # nothing to go by yet
    fresh = Estimate(["x", "y"])
    fresh.finished("x", 3)
    assert fresh.remaining() == 3


# ------------------------------------------------------------------------------ the plugin, end to end


INNER = '''
import datetime as dt

from gpuproof.plugin.checks import pod

IMAGE = "registry.example/big:1"


def _progress(request):
    return request.config.pluginmanager.get_plugin("gpuproof-progress")


def _kubelet_event(run, target, pod_name, node, reason, message, n):
    now = dt.datetime.now(dt.timezone.utc)
    target.cluster.core.create_namespaced_event(run.namespace, {
        "metadata": {"name": f"{pod_name}.{n}", "namespace": run.namespace},
        "involvedObject": {"kind": "Pod", "name": pod_name, "namespace": run.namespace, "apiVersion": "v1"},
        "reason": reason, "message": message, "type": "Normal", "source": {"component": "kubelet", "host": node},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1})


def test_first(discovery):
    assert discovery.gpu_nodes


def test_waits_and_pulls(run, target, request):
    progress = _progress(request)
    run.apply(pod("stuck", {"nvidia.com/gpu": 1000}))          # no node has that many: it waits
    assert progress.wait_for("pod stuck waiting for a node", 60)
    run.apply(pod("puller"))
    node = run.wait_running("puller").spec.node_name
    # kwok pulls no images: play the kubelet's events
    _kubelet_event(run, target, "puller", node, "Pulling", f'Pulling image "{IMAGE}"', 1)
    assert progress.wait_for(f"pulling image {IMAGE}", 60)
    _kubelet_event(run, target, "puller", node, "Pulled", f'Successfully pulled image "{IMAGE}" in 1m2.5s '
                   "(1m2.5s including waiting). Image size: 9876543210 bytes.", 2)
    assert progress.wait_for(f"pulled image {IMAGE}", 60)
    assert progress.wait_for(f"still running {request.node.nodeid}", 60, count=3)


def test_last(check):
    check.record("nothing", "pass")
'''


def test_run_shows_long_steps_pulls_and_the_time_left(embedded, tmp_path):
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER))
    reports = tmp_path / "reports"
    target = f"kubeconfig:{embedded.kubeconfig}#"
    _run_folder(reports, "20200101-000000-before", target,
                {"test_inner::test_first": 100, "test_inner::test_waits_and_pulls": 200})
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_inner.py", "-q", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--kubeconfig={embedded.kubeconfig}", "--no-lease",
                           f"--report-dir={reports}", "--run-id=now", "--gpuproof-progress-after=0.3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("[gpuproof] ")]
    # the start: 100 + 200 s timed before, the third check at their mean
    assert "[gpuproof] 3 checks to run; about 7m30s by earlier runs (2 of 3 timed in run 20200101-000000-before)" \
        in lines, "\n".join(lines)
    assert any(re.fullmatch(r"\[gpuproof\] pod stuck waiting for a node \([\d.]+s\): 0/\d+ nodes are available.*",
                            ln) for ln in lines), "\n".join(lines)
    assert any(re.fullmatch(r"\[gpuproof\] pod puller on \S+: pulling image registry.example/big:1 "
                            r"\([\d.]+s so far\)", ln) for ln in lines), "\n".join(lines)
    assert any(re.fullmatch(r"\[gpuproof\] pod puller on \S+: pulled image registry.example/big:1 in 1m02s "
                            r"\(9.9 GB\)", ln) for ln in lines), "\n".join(lines)
    assert any(ln.startswith("[gpuproof] still running test_inner.py::test_waits_and_pulls (") for ln in lines)
    # after the long check: done / total and the time left, at this run's pace against the earlier one
    assert any(re.fullmatch(r"\[gpuproof\] 2/3 checks done in [\d.hms]+; about [\d.hms]+ left "
                            r"\(pace [\d.e+-]+x of run 20200101-000000-before\)", ln) for ln in lines), \
        "\n".join(lines)
    assert lines[-1].startswith("[gpuproof] 3 checks in ") or any(ln.startswith("[gpuproof] 3 checks in ")
                                                                 for ln in lines)
    # terse: a handful of lines for a run of three checks, never one per tick
    assert len(lines) < 30, "\n".join(lines)
    assert "Traceback" not in out


PAUSED = '''
import os
import signal
import threading


def test_a_request_the_api_server_does_not_answer(target, run, request):
    progress = request.config.pluginmanager.get_plugin("gpuproof-progress")
    pid = int(os.environ["APISERVER_PID"])
    os.kill(pid, signal.SIGSTOP)                      # frozen, as in issue #41, until the run has said so

    def thaw():   # at most 20 s: the line comes after --progress-after (0.5 s) on an idle machine
        progress.wait_for("waiting for the API server: GET /api/v1/namespaces", 20)
        os.kill(pid, signal.SIGCONT)

    threading.Thread(target=thaw, daemon=True).start()
    try:
        target.cluster.core.list_namespace(_request_timeout=60)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert progress.wait_for("the API server answered GET /api/v1/namespaces", 30)
'''


def test_a_run_says_which_request_the_api_server_leaves_unanswered(embedded, tmp_path):
    """The API server frozen (SIGSTOP) while a check asks it something, until the run has said so (at most 20 s;
    a fixed 2 s pause was over before a loaded machine ran the progress thread): a line names the request and how
    long it has waited, then how long it took (issue #41 item 2; the run waited 30 s without a word)."""
    (tmp_path / "test_paused.py").write_text(textwrap.dedent(PAUSED))
    pid = json.loads(embedded.sim.state_file.read_text())["pids"]["kube-apiserver"]
    env = {**{k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}, "APISERVER_PID": str(pid)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_paused.py", "-q", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", f"--kubeconfig={embedded.kubeconfig}", "--no-lease",
                           f"--report-dir={tmp_path / 'reports'}", "--gpuproof-progress-after=0.5"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-2000:]
    lines = [ln for ln in out.splitlines() if ln.startswith("[gpuproof] ")]
    assert any(re.fullmatch(r"\[gpuproof\] waiting for the API server: GET /api/v1/namespaces has had no answer "
                            r"for [\d.]+s", ln) for ln in lines), "\n".join(lines)
    assert any(re.fullmatch(r"\[gpuproof\] the API server answered GET /api/v1/namespaces after [\d.]+s", ln)
               for ln in lines), "\n".join(lines)


@pytest.mark.server  # tier: gpuproof's CLI as a process
def test_run_hands_progress_after_to_pytest_and_refuses_a_negative_one(tmp_path):
    from gpuproof.cli.main import build_parser
    from gpuproof.cli.run import pytest_argv

    args = build_parser().parse_args(["run", "--progress-after", "5"])
    assert "--progress-after=5" in pytest_argv(args, "rid")
    assert not any(a.startswith("--progress-after") for a in pytest_argv(build_parser().parse_args(["run"]), "rid"))
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--progress-after", "-1"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--progress-after" in proc.stderr, proc.stderr


@pytest.mark.server  # tier: a pytest session as a process
def test_sessions_without_gpuproofs_fixtures_get_no_progress(tmp_path):
    """gpuproof's plugin is loaded in every pytest session once installed: a project whose fixtures only
    share a name with gpuproof's (here `check`) hears nothing from it."""
    (tmp_path / "test_other.py").write_text(
        "import pytest\n\n@pytest.fixture\ndef check():\n    return 1\n\n"
        "def test_a(check):\n    assert check == 1\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "test_other.py", "-q", "-p", "no:cacheprovider",
                           f"--rootdir={tmp_path}", "--gpuproof-progress-after=0.1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[gpuproof]" not in proc.stdout, proc.stdout

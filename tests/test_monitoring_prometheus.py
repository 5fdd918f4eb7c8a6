"""Real Prometheus (Debian's ``prometheus`` 2.42, installed by ./setup.sh) scraping a recorded DCGM exporter output,
and gpuproof's Prometheus check (gpuproof/discovery/monitoring.py, :func:`judge_prometheus`) on what it stored.

The exporter's side is ``tests/data/dcgm/h100-pod-on-gpu0-issue490.prom`` (verbatim from dcgm-exporter #490: GPU 0
attributed to ``default/dcgmproftester2``), served as a file by ``python -m http.server``. Prometheus scrapes it in
two jobs whose target carries the labels a ServiceMonitor's relabelling gives every target (the exporter pod's
``pod``, ``namespace``, ``container``): one with ``honor_labels: true``, one without (kube-prometheus-stack's
default for dcgm-exporter). With it, Prometheus keeps the workload's ``pod`` and the check passes; without it,
Prometheus renames the exporter's ``pod`` to ``exported_pod`` and the check fails with that reason.

Needs ``prometheus`` on PATH; without it these tests skip, except under ``GPUPROOF_REQUIRE_TOOLS=1`` or ``CI``, where
they fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpuproof.discovery import monitoring
from gpuproof.plugin import monitoring_checks as mc
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir
from test_monitoring import H100_NODE, cluster, daemonset, exporter_pod, failed_as_listed
from test_real_gpu_checks import INLINE, suite

pytestmark = pytest.mark.server

DATA = Path(__file__).parent / "data" / "dcgm"
REQUIRED = os.environ.get("GPUPROOF_REQUIRE_TOOLS") == "1" or bool(os.environ.get("CI"))
RECORDED = "h100-pod-on-gpu0-issue490.prom"
PARTIAL = "derived-fault-h100-gpu1-missing.prom"           # the same exporter, GPU 1's series gone
JOBS = ("honored", "default", "partial")
NODE = "computeinstance-e00c1p6dpy98xytphp"
GPU0 = "GPU-8b2281de-6d3c-22ed-0ec8-d3b864870b8b"
EXPORTER = {"pod": "nvidia-dcgm-exporter-x7k2p", "namespace": "gpu-operator", "container": "nvidia-dcgm-exporter"}
DEADLINE_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def until(what: str, probe, timeout: float = DEADLINE_S, every: float = 0.2):
    """Poll ``probe`` until it returns something true; fail naming ``what`` after ``timeout`` seconds."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            if got := probe():
                return got
        except OSError as exc:          # not listening yet
            last = exc
        time.sleep(every)
    pytest.fail(f"waited {timeout:.0f}s for {what}" + (f" (last error: {last})" if last else ""), pytrace=False)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def prometheus_binary() -> str:
    """Debian's prometheus on PATH, or a skip (a failure under GPUPROOF_REQUIRE_TOOLS=1 or CI)."""
    binary = shutil.which("prometheus")
    if binary is None:
        if REQUIRED:
            pytest.fail("prometheus is needed here: ./setup.sh installs Debian's package", pytrace=False)
        pytest.skip("prometheus is not installed (./setup.sh installs Debian's package as root); "
                    "GPUPROOF_REQUIRE_TOOLS=1 makes this a failure")
    return binary


def start_prometheus(binary: str, tmp: Path, scrape_configs: list[dict],
                     listen: str = "127.0.0.1") -> tuple[subprocess.Popen, str]:
    """Prometheus on a free port of ``listen`` (the address it serves on; 0.0.0.0 for every address) with these
    scrape jobs (global interval 1 s), its data and log (``prometheus.log``) under ``tmp``: the process and its URL
    on 127.0.0.1 (it may not answer yet: poll it)."""
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "scrape_configs": scrape_configs}
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with open(tmp / "prometheus.log", "w") as log:
        proc = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address={listen}:{port}"],
                                stdout=log, stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """Prometheus scraping the recorded output every second in jobs ``honored`` and ``default`` (and, in
    ``partial``, the output without GPU 1); its URL once every target has been scraped."""
    with recorded_and_scraped(tmp_path_factory.mktemp("prometheus"), lambda target: [
            {"job_name": "honored", "honor_labels": True, **job(target)}, {"job_name": "default", **job(target)},
            {"job_name": "partial", "honor_labels": True, **job(target), "metrics_path": f"/{PARTIAL}"}]) as url:
        yield url


def job(target: str) -> dict:
    """A scrape job of the recorded output at ``target``, every second, as a ServiceMonitor labels its target."""
    return {"scrape_interval": "1s", "scrape_timeout": "1s", "metrics_path": f"/{RECORDED}",
            "static_configs": [{"targets": [target], "labels": EXPORTER}]}


@contextlib.contextmanager
def recorded_and_scraped(tmp: Path, jobs, listen: str = "127.0.0.1"):
    """``tests/data/dcgm`` served as files by ``python -m http.server`` on 127.0.0.1, and Prometheus (on ``listen``)
    scraping it in ``jobs(target)``; its URL once every job's target is up and its DCGM series stored."""
    binary = prometheus_binary()
    files = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1",
                              "--directory", str(DATA)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    procs = [files]
    try:
        line = files.stdout.readline()          # "Serving HTTP on 127.0.0.1 port N (...)": printed once it listens
        m = re.search(r"port (\d+)", line)
        assert m, f"http.server did not say its port: {line!r}"
        scrape = jobs(f"127.0.0.1:{m.group(1)}")
        names = {j["job_name"] for j in scrape}
        proc, url = start_prometheus(binary, tmp, scrape, listen=listen)
        procs.append(proc)

        def scraped():
            assert procs[1].poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            active = get_json(f"{url}/api/v1/targets")["data"]["activeTargets"]
            return {t["labels"]["job"] for t in active if t["health"] == "up"} == names and \
                len(query(url, 'count(DCGM_FI_DEV_GPU_UTIL) by (job)')) == len(names)
        until(f"Prometheus to have scraped the recorded outputs in jobs {', '.join(sorted(names))}", scraped)
        yield url
    finally:
        for p in reversed(procs):
            stop(p)


def query(url: str, promql: str) -> list[dict]:
    got = get_json(f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
    assert got["status"] == "success", got
    return got["data"]["result"]


def stored(url: str, job: str) -> list:
    return monitoring.samples_from_query(query(url, f'{{__name__=~"DCGM_.*",job="{job}"}}'))


def test_with_honor_labels_prometheus_keeps_the_workload_pod_and_the_check_passes(prometheus):
    out = monitoring.judge_prometheus(NODE, (DATA / RECORDED).read_text(), stored(prometheus, "honored"))
    assert [(f.check, f.verdict) for f in out] == [("prometheus-gpu-series", "pass"), ("prometheus-pod-label", "pass"),
                                                   ("prometheus-gpu-series", "pass")]
    by_gpu = {s.labels["UUID"]: s.labels for s in stored(prometheus, "honored")}
    assert by_gpu[GPU0]["pod"] == "dcgmproftester2" and "exported_pod" not in by_gpu[GPU0]
    # an idle GPU: the exporter wrote no pod, so the target's (the exporter pod's) is what Prometheus stores
    idle = next(labels for uuid, labels in by_gpu.items() if uuid != GPU0)
    assert idle["pod"] == EXPORTER["pod"]


def test_without_honor_labels_the_check_fails_with_exported_pod(prometheus):
    out = monitoring.judge_prometheus(NODE, (DATA / RECORDED).read_text(), stored(prometheus, "default"))
    f, = [f for f in out if f.verdict == "fail"]
    assert (f.check, f.node, f.gpu) == ("prometheus-pod-label", NODE, f"GPU 0 ({GPU0})")
    assert f.expected == "pod=default/dcgmproftester2 (the pod the exporter attributes the GPU to)"
    assert f.actual == ("pod=gpu-operator/nvidia-dcgm-exporter-x7k2p, exported_container=dcgmproftester2, "
                        "exported_namespace=default, exported_pod=dcgmproftester2")
    assert "honorLabels: true" in f.reason
    # what Prometheus stored is what the derived fault file says it stores (tests/test_monitoring.py reads that file)
    dcgm = monitoring.series()
    derived = {s.labels["UUID"]: {k: v for k, v in s.labels.items()}
               for s in dcgm.parse((DATA / "derived-fault-h100-exported-pod.prom").read_text())}
    real = {s.labels["UUID"]: {k: v for k, v in s.labels.items() if k not in ("job", "instance")}
            for s in stored(prometheus, "default")}
    assert real == derived


# ------------------------------------------------------------------------ the suite's check, against this Prometheus

GPU1 = "GPU-15338f3e-5fd9-962d-921a-979b820520f0"
# id: (the Prometheus: this one or a port nothing listens on, --prometheus-selector, [(check, node, expected,
#      the actual's start)] that must fail)
FAULTS = {
    "no-honor-labels": ("here", 'job="default"',
                        [("prometheus-pod-label", NODE, "pod=default/dcgmproftester2 (the pod the exporter attributes "
                          "the GPU to)", "pod=gpu-operator/nvidia-dcgm-exporter-x7k2p, exported_container=")]),
    "a-gpu-never-scraped": ("here", 'job="partial"',
                            [("prometheus-gpu-series", NODE, "the exporter's utilization series in Prometheus",
                              "none")]),
    "prometheus-unreachable": ("closed", "",
                               [("prometheus-gpu-series", NODE, "an answer from {url}", "URLError: ")]),
}


def run_prometheus_check(tmp_path, url: str, selector: str):
    module = suite("monitoring")
    api = cluster([daemonset()], [exporter_pod(NODE)], RECORDED)
    options = {"prometheus": url, "prometheus_selector": selector}
    request = SimpleNamespace(node=None, config=SimpleNamespace(getoption=lambda name, default=None: options[name]),
                              getfixturevalue={"fanout": INLINE}.get)
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, H100_NODE, {NODE: H100_NODE})
    module.test_prometheus_has_each_gpus_series_with_its_pod(needs_real_gpus=None, gpu_node=H100_NODE,
                                                             target=SimpleNamespace(cluster=api),
                                                             exporters=mc.require_exporters(api),
                                                             prometheus_server=lambda: mc.prometheus_of(
                                                                 request, api),
                                                             request=request, check=checker)
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]


def test_the_suites_prometheus_check_passes_with_honor_labels(prometheus, tmp_path):
    checker, records = run_prometheus_check(tmp_path, prometheus, 'job="honored"')
    checker.finish()
    assert [(r["check"], r["verdict"]) for r in records] == [
        ("prometheus-gpu-series", "pass"), ("prometheus-gpu-series", "pass"), ("prometheus-pod-label", "pass"),
        ("prometheus-gpu-series", "pass")]


@pytest.mark.parametrize("case", list(FAULTS))
def test_the_suites_prometheus_check_fails_on_its_fault(prometheus, tmp_path, case):
    where, selector, expectations = FAULTS[case]
    url = prometheus if where == "here" else f"http://127.0.0.1:{free_port()}"
    checker, records = run_prometheus_check(tmp_path, url, selector)
    listed = [(c, t, e.format(url=url), a) for c, t, e, a in expectations]
    for rec in failed_as_listed(checker, records, listed):
        if rec["check"] != "prometheus-gpu-series" or where == "here":
            assert "GPU " in rec["message"] and ("GPU-" in rec["message"]), rec      # the GPU: index and UUID

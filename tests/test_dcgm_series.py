"""The DCGM exporter's /metrics as each release writes it (workloads/dcgm_series.py), on recorded outputs
(tests/data/dcgm/SOURCES.md): both host label spellings, both name sets, units brought to gpuproof's."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

from gpuproof.bench import metrics
from gpuproof.bench.workloads import import_workload

dcgm = import_workload("dcgm_series")
DATA = Path(__file__).parent / "data" / "dcgm"


def _read(name: str):
    samples = dcgm.parse((DATA / name).read_text())
    return samples, {r.quantity: r for r in dcgm.readings(samples)}


def test_a_recorded_gpu_operator_output_reads_whole():
    samples, got = _read("kops-l4-gpu-operator-idle.prom")
    assert len(samples) == 23 and all(s.labels["modelName"] == "NVIDIA L4" for s in samples)
    assert got["gpu_util_pct"].value == 0 and got["fb_free_mib"].value == 22563 and got["power_w"].value == 16.365
    assert got["energy_j"].value == pytest.approx(4742.776)            # mJ -> J
    assert got["sm_clock_mhz"].value == 210 and got["gr_engine_active"].value == 0
    r = got["gpu_util_pct"]
    assert (r.gpu, r.uuid, r.host, r.pod, r.mig) == ("0", "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
                                                     "i-030791dc5a37cd257", None, None)
    assert dcgm.label(r.labels, "driver") == "580.105.08"
    assert dcgm.flavour(samples) == {"names": "classic", "host_label": "Hostname", "releases":
                                     "before 4.9.0 (classic names); before 4.6.0-4.8.3 (label Hostname)"}


def test_the_renamed_host_label_and_the_dcgm_4_7_names_read_the_same():
    classic = _read("kops-l4-gpu-operator-idle.prom")[1]
    _, hostname = _read("derived-4.8.3-hostname.prom")
    assert {q: (r.value, r.host) for q, r in hostname.items()} == {q: (r.value, r.host) for q, r in classic.items()}
    samples, new = _read("derived-4.9.0-dcgm47-names-busy.prom")
    assert new["gpu_util_pct"].value == pytest.approx(93.0) and new["gpu_util_pct"].name == "DCGM_FI_DEV_GPU_UTIL_RATIO"
    assert new["fb_used_mib"].value == pytest.approx(20000.0)           # bytes -> MiB
    assert new["sm_clock_mhz"].value == pytest.approx(210.0) and new["mem_clock_mhz"].value == pytest.approx(405.0)
    assert new["energy_j"].value == pytest.approx(classic["energy_j"].value)
    assert new["fb_free_mib"].value == pytest.approx(classic["fb_free_mib"].value)
    assert new["gpu_util_pct"].host == "i-030791dc5a37cd257"
    assert dcgm.label(new["power_w"].labels, "driver") == "580.105.08"          # DCGM_FI_SYSTEM_DRIVER_VERSION
    assert dcgm.flavour(samples)["releases"] == "4.9.0 or later (DCGM 4.7 names); 4.6.0-4.8.3 or later (label hostname)"


def test_pod_attribution_on_the_gpu_a_pod_holds_only():
    rows = dcgm.readings(dcgm.parse((DATA / "h100-pod-on-gpu0-issue490.prom").read_text()))
    assert {r.gpu: r.pod for r in rows} == {"0": ("default", "dcgmproftester2", "dcgmproftester2"), "1": None}
    # the old namespace's spellings (--use-old-namespace), and an empty pod label as older releases wrote it
    old = dcgm.parse('DCGM_FI_DEV_GPU_UTIL{gpu="0",uuid="GPU-1",pod_name="p",pod_namespace="ns",container_name="c"} 5\n'
                     'DCGM_FI_DEV_GPU_UTIL{gpu="1",uuid="GPU-2",pod="",namespace="",container=""} 0\n')
    a, b = dcgm.readings(old)
    assert (a.uuid, a.pod, b.pod) == ("GPU-1", ("ns", "p", "c"), None)


def test_blank_sentinels_are_no_values():
    text = ('DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775794\n'      # as the exporter's README prints one
            'DCGM_FI_DEV_POWER_USAGE{gpu="0"} 140737488355328.000000\n'
            'DCGM_FI_DEV_GPU_TEMP{gpu="0"} 40\n')
    assert [r.quantity for r in dcgm.readings(dcgm.parse(text))] == ["gpu_temp_c"]


@pytest.mark.parametrize("text, says", [
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0",gpu="1"} 5\n', "line 1: label 'gpu' twice"),
    ('# HELP x\nDCGM_FI_DEV_GPU_UTIL{gpu="0"\n', "line 2: not a sample"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu="0"} five\n', "line 1: value 'five' is not a number"),
    ('DCGM_FI_DEV_GPU_UTIL{gpu=0} 5\n', "line 1: malformed labels"),
])
def test_a_malformed_output_is_refused_naming_its_line(text, says):
    with pytest.raises(dcgm.MetricsError, match=says):
        dcgm.parse(text)


class _Prometheus(BaseHTTPRequestHandler):
    """Answers query_range with the series of a 4.9.0 exporter (DCGM 4.7 names, ratios) for the utilization query,
    and of an older one (Hostname, MHz) for the clock query: one Prometheus can hold both during an upgrade."""
    def log_message(self, *a):
        pass

    def do_GET(self):
        query = parse_qs(urlparse(self.path).query)["query"][0]
        result = []
        if "DCGM_FI_DEV_GPU_UTIL_RATIO" in query:
            result = [{"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL_RATIO", "gpu": "0", "UUID": "GPU-1",
                                  "hostname": "node-a"}, "values": [[1.0, "0.5"], [2.0, "0.7"], [3.0, "0.9"]]}]
        elif "DCGM_FI_DEV_SM_CLOCK_HERTZ" in query:
            result = [{"metric": {"__name__": "DCGM_FI_DEV_SM_CLOCK", "gpu": "0", "UUID": "GPU-2",
                                  "Hostname": "node-b"}, "values": [[1.0, "1980"]]}]
        data = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_the_prometheus_reader_asks_for_both_names_and_records_gpuproofs_units():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Prometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        out = metrics.dcgm_phase_summary(url, [{"name": "matmul", "start": 0.0, "end": 4.0}],
                                         series=("gpu_util_pct", "sm_clock_mhz", "power_w"))
    finally:
        srv.shutdown()
        srv.server_close()
    util = out["matmul"]["gpu_util_pct"]["GPU-1"]
    assert util["mean"] == pytest.approx(70.0) and util["p95"] == pytest.approx(88.0) and util["n"] == 3
    assert (util["node"], util["name"]) == ("node-a", "DCGM_FI_DEV_GPU_UTIL_RATIO")
    clock = out["matmul"]["sm_clock_mhz"]["GPU-2"]
    assert (clock["mean"], clock["node"]) == (1980.0, "node-b")
    assert "power_w" not in out["matmul"]                       # not published: left out
    recs = {r.metric: r for r in metrics.dcgm_to_records(out, benchmark="matmul", node="n")}
    assert recs["dcgm_gpu_util_pct_mean"].value == pytest.approx(70.0) and recs["dcgm_gpu_util_pct_mean"].unit == "%"
    assert recs["dcgm_sm_clock_mhz_mean"].unit == "MHz"
    assert recs["dcgm_gpu_util_pct_p95"].parameters["dcgm_name"] == "DCGM_FI_DEV_GPU_UTIL_RATIO"
    assert recs["dcgm_gpu_util_pct_mean"].parameters["exporter_node"] == "node-a"
    # what the series say of the exporters (one Prometheus, an upgrade half done), kept beside the records
    assert metrics.dcgm_exporter(out) == {
        "names": "classic+dcgm-4.7", "host_label": "Hostname+hostname",
        "releases": "4.9.0 or later (DCGM 4.7 names); 4.6.0-4.8.3 or later (label hostname)"}

"""The health workload (workloads/health.py): NVML-level faults fed as plain data, thresholds, parsers,
records and check records, and the CPU path end to end through ``gpuproof bench --local health``.

The same faults injected into NVIDIA's mock NVML, read by the workload itself: tests/test_nvml_mock.py.
Faults the mock cannot show (retired pages; a PCIe link below its maximum under load) are proven here only."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest

from gpuproof.bench import get
from gpuproof.bench.health import VERDICT_SCORE, record_checks
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir
from gpuproof.bench.workloads import import_workload

health = import_workload("health")


def healthy(**changes) -> dict:
    """What NVML reports for a healthy H100 SXM (18 NVLink links, Gen5 x16) during the load."""
    r = {
        "index": 0, "uuid": "GPU-a091da16-0000-1111-2222-333344445555", "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "0000:3b:00", "unavailable": {},
        "xid_events": [], "xid_log": [],
        "ecc_mode": True, "ecc_volatile_corrected": 0, "ecc_volatile_uncorrected": 0,
        "ecc_aggregate_corrected": 12, "ecc_aggregate_uncorrected": 0,
        "retired_pages_sbe": 0, "retired_pages_dbe": 0, "retired_pages_pending": False,
        "remapped_rows_corrected": 0, "remapped_rows_uncorrected": 0, "remapped_rows_pending": False,
        "remapped_rows_failure": False,
        "clock_event_reasons_load": 0, "load_samples": 50,
        "pcie_gen_load": 5, "pcie_width_load": 16, "pcie_gen_idle": 1, "pcie_width_idle": 16,
        "pcie_max_gen": 5, "pcie_max_width": 16,
        "nvlink": [{"link": i, "active": True} for i in range(18)],
        "nvlink_errors_start": {str(i): dict.fromkeys(health.NVLINK_ERROR_COUNTERS, 2) for i in range(18)},
        "nvlink_errors_end": {str(i): dict.fromkeys(health.NVLINK_ERROR_COUNTERS, 2) for i in range(18)},
        "fabric": {"state": 3, "status": 0, "health_mask": 0x1aa, "health_summary": 1},
        "sram_ecc": {"volatile_uncorrected_parity": 0, "volatile_uncorrected_secded": 0, "volatile_corrected": 3,
                     "aggregate_uncorrected": 0, "aggregate_corrected": 9, "threshold_exceeded": False},
        "persistence_mode": True, "power_limit_w": 700.0, "power_default_w": 700.0,
        "h2d_gbps": 53.1, "d2h_gbps": 54.9,
    }
    r.update(changes)
    return r


def by_name(items: list[dict]) -> dict[str, dict]:
    return {i["name"]: i for i in items}


def test_a_healthy_gpu_passes_every_item():
    items = health.evaluate_gpu(healthy())
    assert {i["verdict"] for i in items} == {"pass"}, [i for i in items if i["verdict"] != "pass"]
    names = set(by_name(items))
    for want in ("gpu_reachable", "sram_ecc", "nvlink_errors", "fabric_health", "xid_during_run", "xid_since_boot",
                 "ecc_mode", "ecc_volatile_uncorrected", "ecc_volatile_corrected",
                 "ecc_aggregate_uncorrected", "retired_pages", "retired_pages_pending", "remapped_rows_pending",
                 "remapped_rows_failure", "remapped_rows_uncorrected", "clock_events_during_load", "pcie_link_gen",
                 "pcie_link_width", "nvlink_links", "persistence_mode", "power_limit", "h2d_bandwidth",
                 "d2h_bandwidth"):
        assert want in names
    for i in items:
        assert set(i) >= {"name", "gpu", "value", "threshold", "verdict", "reason"} and i["reason"]
        assert i["gpu"] == 0 and i["uuid"].startswith("GPU-")


FAULTS = [
    # (changes, item, verdict, words in the reason)
    ({"ecc_volatile_uncorrected": 3}, "ecc_volatile_uncorrected", "fail", ["3 volatile uncorrected", "more than 0"]),
    ({"ecc_volatile_corrected": 5000}, "ecc_volatile_corrected", "warn", ["5000 volatile corrected"]),
    ({"ecc_aggregate_uncorrected": 2}, "ecc_aggregate_uncorrected", "warn", ["2 aggregate uncorrected"]),
    ({"ecc_mode": False}, "ecc_mode", "warn", ["ECC is off"]),
    ({"xid_events": [{"xid": 79, "uuid": "GPU-x"}]}, "xid_during_run", "fail", ["XID 79", "during the run"]),
    ({"xid_events": [{"xid": 13}]}, "xid_during_run", "warn", ["XID 13", "not in the fail list"]),
    ({"xid_log": [{"xid": 48, "pci": "0000:3b:00", "detail": "DBE"}]}, "xid_since_boot", "fail",
     ["XID 48", "kernel log"]),
    ({"retired_pages_pending": True}, "retired_pages_pending", "fail", ["page retirement is pending", "reset"]),
    ({"retired_pages_sbe": 40, "retired_pages_dbe": 30}, "retired_pages", "fail", ["70 retired pages", "more than 60"]),
    ({"retired_pages_dbe": 2}, "retired_pages", "warn", ["2 retired pages", "2 for double-bit"]),
    ({"remapped_rows_pending": True}, "remapped_rows_pending", "fail", ["row remapping is pending"]),
    ({"remapped_rows_failure": True}, "remapped_rows_failure", "fail", ["row remapping failed"]),
    ({"remapped_rows_uncorrected": 2}, "remapped_rows_uncorrected", "warn", ["2 rows remapped for uncorrectable"]),
    ({"clock_event_reasons_load": 0x40}, "clock_events_during_load", "fail",
     ["hw_thermal_slowdown", "during the load"]),
    ({"clock_event_reasons_load": 0x08 | 0x04}, "clock_events_during_load", "fail",
     ["hw_slowdown", "also sw_power_cap"]),
    ({"clock_event_reasons_load": 0x20}, "clock_events_during_load", "fail", ["sw_thermal_slowdown"]),
    ({"clock_event_reasons_load": 0x04}, "clock_events_during_load", "pass", ["noted: sw_power_cap", "not a fault"]),
    ({"pcie_gen_load": 3}, "pcie_link_gen", "fail", ["Gen3 under load", "below Gen5", "degraded"]),
    ({"pcie_width_load": 8}, "pcie_link_width", "fail", ["x8 under load", "below x16"]),
    ({"pcie_gen_load": None, "pcie_gen_idle": 1}, "pcie_link_gen", "warn", ["Gen1 read while idle", "downtrain"]),
    ({"nvlink": [{"link": i, "active": i != 3} for i in range(18)]}, "nvlink_links", "fail",
     ["1 of 18 NVLink links down: [3]"]),
    ({"persistence_mode": False}, "persistence_mode", "warn", ["persistence mode is off"]),
    ({"power_limit_w": 500.0}, "power_limit", "fail", ["500 W is 71% of the default 700 W"]),
    ({"sram_ecc": {**healthy()["sram_ecc"], "volatile_uncorrected_secded": 4, "threshold_exceeded": True}}, "sram_ecc",
     "fail", ["past NVML's threshold", "4 uncorrectable (0 parity, 4 SEC-DED)"]),
    ({"sram_ecc": {**healthy()["sram_ecc"], "volatile_uncorrected_parity": 1}}, "sram_ecc", "warn",
     ["1 uncorrectable", "below NVML's threshold"]),
    ({"nvlink_errors_end": {**healthy()["nvlink_errors_end"], "5": {"replay": 2, "recovery": 2, "crc_flit": 9,
                                                                    "crc_data": 2}}},
     "nvlink_errors", "fail", ["7 NVLink errors during the run (crc_flit 7) on links ['5']", "more than 0"]),
    ({"fabric": {"state": 3, "status": 0, "health_mask": 0x19a, "health_summary": 2}}, "fabric_health", "fail",
     ["fabric health unhealthy: route_unhealthy"]),
    ({"fabric": {"state": 3, "status": 0, "health_mask": 0x1a9, "health_summary": None}}, "fabric_health", "warn",
     ["limited capacity: degraded_bandwidth"]),
    ({"fabric": {"state": 2, "status": 0, "health_mask": 0, "health_summary": None}}, "fabric_health", "fail",
     ["fabric registration in progress"]),
    ({"h2d_gbps": 3.2}, "h2d_bandwidth", "fail", ["3.20 GB/s, below 8.0 GB/s"]),
    ({"d2h_gbps": 20.0}, "d2h_bandwidth", "warn", ["20.00 GB/s is 32% of the link's theoretical 63.0 GB/s"]),
]


@pytest.mark.parametrize("changes,name,verdict,words", FAULTS,
                         ids=[f"{f[1]}-{f[2]}-{i}" for i, f in enumerate(FAULTS)])
def test_each_fault_gives_its_verdict_and_message(changes, name, verdict, words):
    items = by_name(health.evaluate_gpu(healthy(**changes)))
    got = items[name]
    assert got["verdict"] == verdict, got
    for w in words:
        assert w in got["reason"], (w, got["reason"])
    others = [i for n, i in items.items() if n != name and i["verdict"] != "pass"
              and not (name == "pcie_link_gen" and n == "h2d_bandwidth")]   # the link rate feeds the copy check
    assert not others, others


def test_a_fault_reports_value_and_threshold():
    got = by_name(health.evaluate_gpu(healthy(ecc_volatile_uncorrected=3)))["ecc_volatile_uncorrected"]
    assert got["value"] == 3 and got["threshold"] == "<= 0" and got["unit"] == "errors"
    got = by_name(health.evaluate_gpu(healthy(pcie_width_load=8)))["pcie_link_width"]
    assert got["value"] == 8 and got["threshold"] == ">= x16 (the maximum)"


def test_what_nvml_cannot_read_is_unavailable_with_the_reason():
    r = healthy(remapped_rows_pending=None, remapped_rows_failure=None, remapped_rows_uncorrected=None,
                retired_pages_pending=None, nvlink=[], xid_log=None)
    r["unavailable"] = {"remapped_rows_pending": "NVML: Not Supported", "retired_pages_pending": "NVML: Not Supported",
                        "xid_log": "/dev/kmsg: Operation not permitted; dmesg: not in this image"}
    items = by_name(health.evaluate_gpu(r))
    assert items["remapped_rows_pending"]["verdict"] == "unavailable"
    assert "Not Supported" in items["remapped_rows_pending"]["reason"]
    assert items["remapped_rows_failure"]["reason"] == "remapped_rows_failure: not read"
    assert items["nvlink_links"]["verdict"] == "unavailable" and "no NVLink" in items["nvlink_links"]["reason"]
    assert items["xid_since_boot"]["verdict"] == "unavailable" and "Operation not permitted" in \
        items["xid_since_boot"]["reason"]


def test_a_lost_gpu_fails_reachable_and_its_other_readings_are_not_trusted():
    items = by_name(health.evaluate_gpu(healthy(gone="NVML: GPU is lost (reading ecc_mode)",
                                                xid_events=[{"xid": 79, "gpu": 0}])))
    assert items["gpu_reachable"]["verdict"] == "fail" and "GPU is lost" in items["gpu_reachable"]["reason"]
    assert items["xid_during_run"]["verdict"] == "fail"
    others = [i for n, i in items.items() if n not in ("gpu_reachable", "xid_during_run", "xid_since_boot")]
    assert others and all(i["verdict"] == "unavailable" and "not trusted" in i["reason"] for i in others)


def test_a_gpu_nvml_gives_no_handle_for_fails_reachable():
    r = {"index": 2, "uuid": None, "reason": "no NVML handle for GPU 2: NVML: Insufficient Power",
         "unavailable": {"handle": "NVML: Insufficient Power"}}
    items = by_name(health.evaluate_gpu(r))
    assert items["gpu_reachable"]["verdict"] == "fail" and "Insufficient Power" in items["gpu_reachable"]["reason"]
    assert all(i["verdict"] == "unavailable" for n, i in items.items() if n != "gpu_reachable")


def test_idle_readings_say_the_gpus_were_not_loaded():
    got = by_name(health.evaluate_gpu(healthy(load_on_gpu=False, clock_event_reasons_load=0x80)))
    assert got["clock_events_during_load"]["verdict"] == "fail"
    assert "while the GPUs were idle (no CUDA device" in got["clock_events_during_load"]["reason"]


def test_fabric_health_mask_is_decoded():
    assert health.fabric_conditions(0x1aa) == []
    assert health.fabric_conditions(0x19a) == ["route_unhealthy"]
    assert health.fabric_conditions(0x4aa) == ["incorrect_configuration=no_partition"]


def test_without_nvml_every_gpu_item_is_unavailable_with_the_reason():
    why = "NVML unavailable: NVML Shared Library Not Found"
    items = health.evaluate_gpu({"index": None, "reason": why, "unavailable": {}})
    assert items and all(i["verdict"] == "unavailable" and why in i["reason"] for i in items), items


def test_a_cuda_error_during_the_load_fails():
    err = [{"what": "matmul load", "error": "CUDA error: uncorrectable ECC error encountered"}]
    got = health.evaluate_errors(err, "cuda")
    assert got["verdict"] == "fail" and "matmul load: CUDA error: uncorrectable ECC" in got["reason"]
    assert health.evaluate_errors([], "cuda")["verdict"] == "pass"
    assert health.evaluate_errors([], "cpu", "no GPU")["verdict"] == "unavailable"


# ------------------------------------------------------------------ thresholds


@pytest.mark.parametrize("overrides,changes,name,verdict", [
    ({"ecc_volatile_uncorrected_max": 5}, {"ecc_volatile_uncorrected": 3}, "ecc_volatile_uncorrected", "pass"),
    ({"xid_fail": "13,79"}, {"xid_events": [{"xid": 13}]}, "xid_during_run", "fail"),
    ({"xid_fail": {48}}, {"xid_events": [{"xid": 79}]}, "xid_during_run", "warn"),
    ({"throttle_fail": "sw_power_cap"}, {"clock_event_reasons_load": 0x04}, "clock_events_during_load", "fail"),
    ({"throttle_fail": "hw_slowdown"}, {"clock_event_reasons_load": 0x40}, "clock_events_during_load", "pass"),
    ({"pcie_min_gen": 4}, {"pcie_gen_load": 4}, "pcie_link_gen", "pass"),
    ({"pcie_min_width": 8}, {"pcie_width_load": 8}, "pcie_link_width", "pass"),
    ({"nvlink_down_max": 2}, {"nvlink": [{"link": i, "active": i > 1} for i in range(18)]}, "nvlink_links", "pass"),
    ({"persistence_off": "fail"}, {"persistence_mode": False}, "persistence_mode", "fail"),
    ({"ecc_off": "pass"}, {"ecc_mode": False}, "ecc_mode", "pass"),
    ({"power_limit_min_ratio": 0.5}, {"power_limit_w": 500.0}, "power_limit", "pass"),
    ({"power_limit_low": "warn"}, {"power_limit_w": 500.0}, "power_limit", "warn"),
    ({"nvlink_errors_max": 10}, {"nvlink_errors_end": {**healthy()["nvlink_errors_end"], "0": dict.fromkeys(
        health.NVLINK_ERROR_COUNTERS, 3)}}, "nvlink_errors", "pass"),
    ({"copy_min_gbps": 60}, {}, "h2d_bandwidth", "fail"),
    ({"copy_min_link_ratio": 0.1}, {"d2h_gbps": 20.0}, "d2h_bandwidth", "pass"),
    ({"retired_pages_max": 100}, {"retired_pages_sbe": 70}, "retired_pages", "warn"),
])
def test_thresholds_are_overridable(overrides, changes, name, verdict):
    assert by_name(health.evaluate_gpu(healthy(**changes), overrides))[name]["verdict"] == verdict


def test_threshold_flags():
    args = health.build_parser().parse_args(["--copy-min-gbps", "20", "--xid-fail", "31,79", "--throttle-fail",
                                             "hw_slowdown", "--persistence-off", "fail", "--pcie-min-gen", "4"])
    t = health.thresholds_from_args(args)
    assert t["copy_min_gbps"] == 20.0 and t["xid_fail"] == {31, 79} and t["throttle_fail"] == {"hw_slowdown"}
    assert t["persistence_off"] == "fail" and t["pcie_min_gen"] == 4
    assert t["ecc_volatile_uncorrected_max"] == 0          # the rest stay at their defaults
    for bad in (["--throttle-fail", "too_hot"], ["--copy-min-gbps", "fast"], ["--persistence-off", "maybe"],
                ["--xid-fail", "x"]):
        with pytest.raises(ValueError, match=bad[0]):
            health.thresholds_from_args(health.build_parser().parse_args(bad))
    with pytest.raises(ValueError, match="unknown threshold"):
        health.resolve_thresholds({"nope": 1})


def test_a_bad_threshold_flag_exits_2_with_a_json_error(capsys):
    assert health.main(["--device", "cpu", "--copy-min-gbps", "fast"]) == 2
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["ok"] is False and "--copy-min-gbps" in out["error"]


def test_readme_documents_every_threshold():
    from gpuproof.bench.workloads import workloads_dir

    text = (workloads_dir() / "README.md").read_text()
    for name in health.THRESHOLDS:
        assert f"--{name.replace('_', '-')}" in text, name


# ------------------------------------------------------------------ p2p, XIDs from the kernel log, DCGM


def test_p2p_matrix_verdicts():
    pairs = [{"src": 0, "dst": 1, "gbps": 380.0, "peer_access": True},
             {"src": 1, "dst": 0, "gbps": 379.0, "peer_access": True},
             {"src": 0, "dst": 2, "gbps": 150.0, "peer_access": True},
             {"src": 2, "dst": 0, "gbps": 3.0, "peer_access": False},
             {"src": 1, "dst": 2, "gbps": 381.0, "peer_access": True},
             {"src": 2, "dst": 1, "gbps": 378.0, "peer_access": True}]
    items = {i["gpu"]: i for i in health.evaluate_p2p({"device": "cuda", "pairs": pairs})}
    assert items["0->1"]["verdict"] == "pass"
    assert items["0->2"]["verdict"] == "warn" and "of the node's median" in items["0->2"]["reason"]
    assert items["2->0"]["verdict"] == "fail" and "below 5.0 GB/s" in items["2->0"]["reason"]
    assert "no peer access" in items["2->0"]["reason"]
    assert health.evaluate_p2p({"device": "cuda", "pairs": pairs}, {"p2p_min_gbps": 1})[3]["verdict"] == "warn"
    one = health.evaluate_p2p({"device": "cuda", "pairs": [], "reason": "1 GPU visible: no pair to copy between"})
    assert one[0]["verdict"] == "unavailable" and "1 GPU visible" in one[0]["reason"]
    cpu = health.evaluate_p2p({"device": "cpu", "pairs": pairs[:2], "reason": "no GPU"})
    assert cpu[0]["verdict"] == "unavailable" and cpu[0]["value"] == [380.0, 379.0]


def test_xids_from_the_kernel_log_go_to_their_gpu():
    log = ("[  100.1] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "6,1234,5678,-;NVRM: Xid (PCI:0000:86:00): 13, Graphics Exception\n"
           "[  101.0] nvidia-nvswitch: something else\n")
    events = health.parse_xid_lines(log)
    assert [(e["pci"], e["xid"]) for e in events] == [("0000:3b:00", 79), ("0000:86:00", 13)]
    assert health.normalize_bus_id("00000000:3B:00.0") == "0000:3b:00"
    readings = [healthy(index=0, pci_bus_id="0000:3b:00", xid_log=None),
                healthy(index=1, pci_bus_id="0000:86:00", xid_log=None),
                healthy(index=2, pci_bus_id="0000:af:00", xid_log=None)]
    health.fold_kernel_xids(readings, log, None)
    verdicts = [by_name(health.evaluate_gpu(r))["xid_since_boot"]["verdict"] for r in readings]
    assert verdicts == ["fail", "warn", "pass"]
    health.fold_kernel_xids(readings, None, "/dev/kmsg: Permission denied; dmesg: not in this image")
    got = by_name(health.evaluate_gpu(readings[0]))["xid_since_boot"]
    assert got["verdict"] == "unavailable" and "Permission denied" in got["reason"]


DCGM_JSON = json.dumps({"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [
        {"name": "Denylist", "results": [{"status": "Pass"}]},
        {"name": "Page Retirement/Row Remap", "results": [{"gpu_ids": "0", "status": "Pass"}]}]},
    {"category": "Hardware", "tests": [
        {"name": "GPU Memory", "results": [{"gpu_id": "0", "status": "Pass"},
                                            {"gpu_id": "1", "status": "Fail",
                                             "warnings": [{"warning": "DBE error detected on GPU 1"}]}]}]},
    {"category": "Integration", "tests": [
        {"name": "PCIe", "results": [{"gpu_id": "0", "status": "Warn", "warnings": ["bandwidth low"]}]}]},
]}})

DCGM_TEXT = """\
+---------------------------+------------------------------------------------+
| Diagnostic                | Result                                         |
+===========================+================================================+
|-----  Metadata  ----------+------------------------------------------------|
| DCGM Version              | 3.3.5                                          |
|-----  Deployment  --------+------------------------------------------------|
| Denylist                  | Pass                                           |
| Persistence Mode          | Fail - GPU: 1                                  |
+-----  Hardware  ----------+------------------------------------------------+
| GPU Memory                | Pass - All                                     |
+---------------------------+------------------------------------------------+
"""


def test_dcgm_results_are_parsed_per_test():
    tests = health.parse_dcgm_json("Running...\n" + DCGM_JSON)
    items = by_name(health.evaluate_dcgm({"level": 1, "tests": tests}))
    assert items["dcgm_diag:Denylist"]["verdict"] == "pass"
    mem = items["dcgm_diag:GPU Memory"]
    assert mem["verdict"] == "fail" and mem["gpu"] == "1" and "DBE error detected" in mem["reason"]
    assert items["dcgm_diag:PCIe"]["verdict"] == "warn"
    text = by_name(health.evaluate_dcgm({"level": 1, "tests": health.parse_dcgm_text(DCGM_TEXT)}))
    assert text["dcgm_diag:Persistence Mode"]["verdict"] == "fail" and text["dcgm_diag:Persistence Mode"]["gpu"] == "1"
    assert text["dcgm_diag:GPU Memory"]["verdict"] == "pass" and "dcgm_diag:DCGM Version" not in text
    none = health.evaluate_dcgm({"level": 1, "reason": "dcgmi is not in this image (DCGM not installed)"})
    assert none[0]["verdict"] == "unavailable" and "not in this image" in none[0]["reason"]
    with pytest.raises(ValueError):
        health.parse_dcgm_text("Error: unable to connect to host engine")


def test_dcgm_off_or_missing_is_unavailable(monkeypatch):
    assert "turned off" in health.run_dcgm(0, 10)["reason"]
    monkeypatch.setattr(health.shutil, "which", lambda name: None)
    assert "not in this image" in health.run_dcgm(1, 10)["reason"]


# ------------------------------------------------------------------ records and check records


def sample_result() -> dict:
    items = health.evaluate_gpu(healthy(ecc_volatile_uncorrected=2, persistence_mode=False, nvlink=None,
                                        unavailable={"nvlink": "NVML: Not Supported"}))
    return {"workload": "health", "device": "cuda", "items": items, "summary": health.summarize(items),
            "device_name": "NVIDIA H100 80GB HBM3"}


def test_to_records_turn_each_item_into_records():
    result = sample_result()
    records = get("health").to_records(result, node="gpu-a", product="NVIDIA-H100-80GB-HBM3")
    verdicts = [r for r in records if r.metric == "verdict"]
    assert len(verdicts) == len(result["items"])
    score = {r.parameters["item"]: r.value for r in verdicts}
    assert score["ecc_volatile_uncorrected"] == VERDICT_SCORE["fail"] == 0.0
    assert score["persistence_mode"] == 0.5 and score["nvlink_links"] == -1.0 and score["ecc_mode"] == 1.0
    ecc = next(r for r in records if r.metric == "ecc_volatile_uncorrected")
    assert ecc.value == 2 and ecc.unit == "errors" and ecc.node == "gpu-a"
    assert next(r for r in records if r.metric == "items_failed").value == 1


def test_workload_args_carry_thresholds():
    bench = get("health")
    args = bench.workload_args(bench.params({"thresholds": {"copy_min_gbps": 20, "xid_fail": {79, 48}},
                                             "extra_args": ["--dcgm-level", "2"]}, device="cuda"))
    assert args[args.index("--copy-min-gbps") + 1] == "20" and args[args.index("--xid-fail") + 1] == "48,79"
    assert args[-2:] == ["--dcgm-level", "2"] and "--device" in args


def test_failed_items_become_failed_checks_naming_node_expected_actual(tmp_path):
    run_dir = RunDir.create(tmp_path, "c1")
    checker = Checker(run_dir, "health")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record_checks(checker, sample_result(), target="gpu-a")
    assert len(checker.failures) == 1
    msg = checker.failures[0]
    assert msg.startswith("gpu-a: GPU 0 (GPU-a091da16-0000-1111-2222-333344445555): ecc_volatile_uncorrected:")
    assert "expected '<= 0', actual 2" in msg
    rows = [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()]
    verdicts = {r["check"]: r["verdict"] for r in rows}
    assert verdicts["ecc_volatile_uncorrected"] == "fail" and verdicts["persistence_mode"] == "warn"
    assert verdicts["nvlink_links"] == "skip" and verdicts["ecc_mode"] == "pass"
    assert all(r["target"] == "gpu-a" for r in rows)


# ------------------------------------------------------------------ the CPU path end to end


BENCH_ARGS = ["bench", "--local", "health", "--device", "cpu", "--threads", "1", "--run-id", "h1", "--quiet"]


@pytest.mark.server  # tier: gpuproof bench --local as a process
def test_cpu_path_end_to_end_through_gpuproof_bench(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpuproof.cli", *BENCH_ARGS, "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    check_bench_run(proc, tmp_path)


def check_bench_run(proc, tmp_path):
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "h1" / "bench-health.json").read_text())
    assert result["workload"] == "health" and result["ok"] is True and result["device"] == "cpu"
    items = result["items"]
    assert items and all(i["verdict"] == "unavailable" and i["reason"] for i in items), items
    copies = by_name(items)
    assert copies["h2d_bandwidth"]["value"] > 0 and "CPU-to-CPU" in copies["h2d_bandwidth"]["reason"]
    assert copies["p2p_bandwidth"]["value"] and all(v > 0 for v in copies["p2p_bandwidth"]["value"])
    assert "NVML" in copies["ecc_volatile_uncorrected"]["reason"]          # no NVML library here
    metrics = [json.loads(line) for line in (tmp_path / "h1" / "metrics.jsonl").read_text().splitlines()]
    assert any(m["metric"] == "verdict" and m["benchmark"] == "health" for m in metrics)


@pytest.mark.server  # tier: workloads/health.py as a process
def test_the_workload_prints_one_json_line():
    from gpuproof.bench.workloads import workloads_dir

    proc = subprocess.run([sys.executable, str(workloads_dir() / "health.py"), "--device", "cpu", "--threads", "1",
                           "--load-s", "0.2", "--copy-mib", "4", "--copy-iters", "2"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1
    result = json.loads(lines[0])
    assert result["summary"]["unavailable"] == len(result["items"]) and result["nvml"]["available"] is False

"""The NVML readers (health, sampler, probe) against NVIDIA's mock NVML, with no CUDA.

Each node here is one of NVIDIA's GPU profiles (``pkg/gpu/mocknvml/configs`` of
NVIDIA/k8s-test-infra, built by ``gpuproof.sim.nvidia``) and its overrides file; faults and
metrics are set with NVIDIA's own ``nvml-mock-ctl`` and the workloads run as local processes
with the mock first on ``LD_LIBRARY_PATH``, as they would on a node. NVIDIA's software is the
judge of what each fault looks like through NVML: these tests assert only which health item it
fails and what that item says.

What the mock cannot show, so tests/test_health.py proves it on recorded values only:

- retired pages: the mock's ``nvmlDeviceGetRetiredPages`` is always empty and its pending
  status always off, whatever the config says (:func:`test_what_the_mock_cannot_show`);
- a PCIe link below its maximum *under load*: with no CUDA there is no load, so a downtrained
  link is an idle reading, which only warns (shown below); the failing path needs a GPU.

Needs the mock built (``./setup.sh`` or ``gpuproof sim build``). Without it these tests skip,
except under ``GPUPROOF_REQUIRE_TOOLS=1`` or ``CI`` (``.ci/run``), where they fail.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import warnings
from pathlib import Path

import pytest
import yaml

from gpuproof.bench.base import run_workload
from gpuproof.bench.health import record_checks
from gpuproof.errors import ControlPlaneError
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir
from gpuproof.sim import nvidia

REQUIRED = os.environ.get("GPUPROOF_REQUIRE_TOOLS") == "1" or bool(os.environ.get("CI"))
HEALTH_ARGS = ["--device", "cpu", "--threads", "1", "--load-s", "0.3", "--copy-mib", "2", "--copy-iters", "2",
               "--dcgm-level", "0", "--no-kernel-log"]
# what needs CUDA, DCGM or the kernel log: never an NVML answer on this machine
NOT_NVML = {"h2d_bandwidth", "d2h_bandwidth", "p2p_bandwidth", "torch_errors", "dcgm_diag", "xid_since_boot"}
# items a profile's GPUs cannot answer, per NVIDIA's mock (and real NVML): a T4 has no NVLink, only
# NVSwitch systems have a fabric
NOT_ANSWERED = {"h100": set(), "gb200": set(), "gb300": set(), "a100": {"fabric_health"},
                "t4": {"fabric_health", "nvlink_links", "nvlink_errors"}}


@pytest.fixture(scope="module")
def software() -> nvidia.NodeSoftware:
    try:
        return nvidia.locate(build_missing=REQUIRED)
    except ControlPlaneError as exc:
        if REQUIRED:
            pytest.fail(f"NVIDIA's mock NVML is needed here: {exc}", pytrace=False)
        pytest.skip(f"NVIDIA's mock NVML is not built ({str(exc).splitlines()[0]}); run ./setup.sh. "
                    "GPUPROOF_REQUIRE_TOOLS=1 makes this a failure")


@dataclasses.dataclass
class MockNode:
    """One node's NVML: a copy of one of NVIDIA's profiles, and the overrides file nvml-mock-ctl writes."""

    sw: nvidia.NodeSoftware
    profile: str
    root: Path

    def __post_init__(self):
        self.root.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.sw.profiles / f"mock-nvml-config-{self.profile}.yaml", self.config)
        self.spec = yaml.safe_load(self.config.read_text())

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    def ctl(self, command: str, gpu) -> None:
        cmd, *rest = command.split()
        proc = subprocess.run([str(self.sw.exe("nvml-mock-ctl")), "--file", str(self.root / "overrides.yaml"),
                               "--config", str(self.config), cmd, "--gpu", str(gpu), *rest],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"nvml-mock-ctl {cmd} --gpu {gpu} {' '.join(rest)}: {proc.stderr}"

    def run(self, script: str, *args: str) -> dict:
        """The workload as a process of its own over this node's NVML (the mock's fault state is per process)."""
        return run_workload(script, list(args), timeout=300,
                            env={"LD_LIBRARY_PATH": f"{self.sw.lib}:{os.environ.get('LD_LIBRARY_PATH', '')}",
                                 "MOCK_NVML_CONFIG": str(self.config), "MOCK_NVML_OVERRIDES": "",
                                 "CUDA_VISIBLE_DEVICES": ""})

    def uuid(self, gpu: int) -> str:
        return self.spec["devices"][gpu]["uuid"]

    def gpus(self) -> list[dict]:
        """What the profile says each GPU is: index, UUID, name, memory (MiB)."""
        d = self.spec["device_defaults"]
        return [{"index": dev["index"], "uuid": dev["uuid"], "name": dev.get("name", d["name"]),
                 "memory_total_mib": (dev.get("memory") or d["memory"])["total_bytes"] // 2**20}
                for dev in self.spec["devices"]]


@dataclasses.dataclass(frozen=True)
class Fault:
    profile: str
    gpu: int
    command: str                    # nvml-mock-ctl command and its arguments (--gpu is added)
    item: str
    verdict: str
    words: tuple[str, ...]          # in the item's reason
    also: tuple[str, ...] = ()      # the GPU's other items NVIDIA's mock makes fail or warn with it

    @property
    def id(self) -> str:
        return f"{self.profile}-gpu{self.gpu}-{self.command.split()[0]}-{self.item}"


# One node per profile carries all of its faults, one per GPU; the GPUs without one must pass.
FAULTS = [
    Fault("h100", 1, "fail --mode ecc_uncorrectable --xid 79", "xid_during_run", "fail", ("XID 79", "during the run"),
          also=("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected", "remapped_rows_failure",
                "remapped_rows_uncorrected")),
    Fault("h100", 1, "fail --mode ecc_uncorrectable --xid 79", "ecc_volatile_uncorrected", "fail",
          ("volatile uncorrected ECC errors (more than 0)",),
          also=("xid_during_run", "ecc_aggregate_uncorrected", "remapped_rows_failure", "remapped_rows_uncorrected")),
    Fault("h100", 2, "fail --mode ecc_uncorrectable --xid 48", "xid_during_run", "fail", ("XID 48",),
          also=("ecc_volatile_uncorrected", "ecc_aggregate_uncorrected", "remapped_rows_failure",
                "remapped_rows_uncorrected")),
    Fault("h100", 3, "fail --mode lost", "gpu_reachable", "fail", ("GPU is lost", "fell off the bus")),
    Fault("h100", 4, "fail --mode fallen_off_bus --xid 79", "gpu_reachable", "fail", ("GPU is lost",),
          also=("xid_during_run",)),
    Fault("h100", 5, "throttle hw_thermal_slowdown", "clock_events_during_load", "fail",
          ("hw_thermal_slowdown", "no CUDA device")),
    Fault("h100", 6, "throttle hw_power_brake_slowdown", "clock_events_during_load", "fail",
          ("hw_power_brake_slowdown",)),
    Fault("h100", 7, "nvlink-error 1000", "nvlink_errors", "fail", ("NVLink errors during the run", "more than 0")),
    Fault("a100", 1, "set power.enforced_limit_mw=200000", "power_limit", "fail",
          ("enforced power limit 200 W is 50% of the default 400 W",)),
    Fault("a100", 2, "set remapped_rows.pending=true", "remapped_rows_pending", "fail",
          ("row remapping is pending",)),
    Fault("a100", 3, "set remapped_rows.failure_occurred=true", "remapped_rows_failure", "fail",
          ("run out of spare rows",)),
    Fault("a100", 4, "set pcie.current_link_gen=2", "pcie_link_gen", "warn",       # idle only: see the docstring
          ("Gen2 read while idle", "only warns")),
    Fault("t4", 1, "fail --mode lost", "gpu_reachable", "fail", ("GPU is lost",)),
    Fault("t4", 2, "throttle hw_slowdown", "clock_events_during_load", "fail", ("hw_slowdown",)),
    Fault("gb200", 1, "sram-ecc 5 --type secded --source l2 --threshold-exceeded", "sram_ecc", "fail",
          ("past NVML's threshold", "5 SEC-DED")),
    Fault("gb200", 2, "fabric-health route_unhealthy", "fabric_health", "fail", ("unhealthy: route_unhealthy",)),
    Fault("gb200", 3, "fabric-health degraded_bandwidth", "fabric_health", "warn",
          ("limited capacity: degraded_bandwidth",)),
    Fault("gb300", 1, "sram-ecc 3 --type parity --threshold-exceeded", "sram_ecc", "fail",
          ("past NVML's threshold", "3 parity")),
    Fault("gb300", 2, "fabric-health no_partition", "fabric_health", "fail",
          ("incorrect_configuration=no_partition",)),
]
PROFILES = sorted(NOT_ANSWERED)
# set on the a100 node too: retired pages, which NVIDIA's mock does not show (see test_what_the_mock_cannot_show)
RETIRED_PAGES = ("a100", 5, "set retired_pages.pending_retirement=true retired_pages.double_bit_retirement.count=3")
COMMANDS = [(f.profile, f.gpu, f.command) for f in FAULTS] + [RETIRED_PAGES]     # (profile, gpu, nvml-mock-ctl)


@pytest.fixture(scope="module")
def health_runs(software, tmp_path_factory):
    """profile -> (node, the health workload's result over it with its faults injected); run once per profile."""
    cache: dict[str, tuple[MockNode, dict]] = {}

    def get(profile: str) -> tuple[MockNode, dict]:
        if profile not in cache:
            node = MockNode(software, profile, tmp_path_factory.mktemp(f"mock-{profile}"))
            for _, gpu, command in dict.fromkeys(c for c in COMMANDS if c[0] == profile):
                node.ctl(command, gpu)
            cache[profile] = node, node.run("health", *HEALTH_ARGS)
        return cache[profile]

    return get


def items_of(result: dict, gpu: int) -> dict[str, dict]:
    return {i["name"]: i for i in result["items"] if i["gpu"] == gpu}


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_each_fault_fails_its_item_naming_gpu_uuid_expected_and_actual(health_runs, fault):
    node, result = health_runs(fault.profile)
    items = items_of(result, fault.gpu)
    got = items[fault.item]
    assert got["verdict"] == fault.verdict, got
    for w in fault.words:
        assert w in got["reason"], (w, got["reason"])
    assert got["uuid"] == node.uuid(fault.gpu) and got["threshold"] is not None and got["value"] is not None, got
    if fault.verdict == "fail":
        line = f"GPU {fault.gpu} ({node.uuid(fault.gpu)}): {fault.item}: "
        assert any(f.startswith(line) for f in result["failed"]), result["failed"]
        assert result["ok"] is False and result["exit_code"] == 1
    others = {n: i["verdict"] for n, i in items.items()
              if n != fault.item and i["verdict"] in ("fail", "warn") and n not in fault.also}
    assert not others, others


@pytest.mark.parametrize("profile", PROFILES)
def test_gpus_without_a_fault_pass_every_item_the_mock_answers(health_runs, profile):
    node, result = health_runs(profile)
    faulty = {f.gpu for f in FAULTS if f.profile == profile}
    healthy = [g for g in node.gpus() if g["index"] not in faulty]
    assert healthy and [g["uuid"] for g in result["gpus"]] == [g["uuid"] for g in node.gpus()]
    for g in healthy:
        items = items_of(result, g["index"])
        unavailable = {n: i["reason"] for n, i in items.items() if i["verdict"] == "unavailable"}
        assert set(unavailable) == {"h2d_bandwidth", "d2h_bandwidth", "xid_since_boot"} | NOT_ANSWERED[profile], \
            unavailable
        assert all("need CUDA" in unavailable[n] for n in ("h2d_bandwidth", "d2h_bandwidth")), unavailable
        assert all("Not Supported" in why or "no NVLink" in why or "no active NVLink" in why
                   for n, why in unavailable.items() if n in NOT_ANSWERED[profile]), unavailable
        assert {i["verdict"] for n, i in items.items() if n not in unavailable} == {"pass"}, items
    node_wide = {i["name"]: i for i in result["items"] if i["gpu"] is None or "->" in str(i["gpu"])}
    assert set(node_wide) <= NOT_NVML and all(i["verdict"] == "unavailable" for i in node_wide.values())


def test_a_healthy_h100_node_passes_and_reads_every_nvml_answer(software, tmp_path):
    node = MockNode(software, "h100", tmp_path)
    result = node.run("health", *HEALTH_ARGS)
    assert result["ok"] is True and result["exit_code"] == 0 and result["nvml"]["available"] is True
    assert result["cuda"]["available"] is False and "--device cpu" in result["cuda"]["reason"]
    assert [g["uuid"] for g in result["gpus"]] == [g["uuid"] for g in node.gpus()]
    for i in result["items"]:
        assert i["verdict"] == ("unavailable" if i["name"] in NOT_NVML else "pass"), i
    r = result["readings"][0]
    assert (r["pcie_max_gen"], r["pcie_max_width"], r["power_default_w"]) == (5, 16, 700.0)
    assert r["fabric"]["health_summary"] == 1 and len(r["nvlink"]) == 18 and r["load_samples"] > 0
    assert r["load_on_gpu"] is False


def test_what_the_mock_cannot_show(health_runs):
    """Retired pages: the mock answers 'none, none pending' whatever its config says (GPU 5 of the a100 node
    has some set). If this fails, NVIDIA's mock has learned to show them: move the retired-pages faults of
    tests/test_health.py here."""
    profile, gpu, _ = RETIRED_PAGES
    items = items_of(health_runs(profile)[1], gpu)
    assert items["retired_pages_pending"]["verdict"] == "pass" and items["retired_pages"]["value"] == 0


def test_a_failed_item_becomes_a_check_naming_node_gpu_uuid_expected_actual(health_runs, tmp_path):
    node, result = health_runs("h100")
    run_dir = RunDir.create(tmp_path, "mock")
    checker = Checker(run_dir, "health")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        record_checks(checker, result, target="gpu-node-0")
    msg = next(m for m in checker.failures if "nvlink_errors" in m)
    assert msg.startswith(f"gpu-node-0: GPU 7 ({node.uuid(7)}): nvlink_errors:")
    assert "expected '<= 0 during the run', actual " in msg


@pytest.mark.parametrize("profile", ["h100", "a100", "t4"])
def test_the_probe_reports_the_profiles_gpus(software, tmp_path, profile):
    node = MockNode(software, profile, tmp_path)
    result = node.run("probe", "--device", "cpu", "--threads", "1")
    assert result["ok"] is True and result["torch_devices"] == [] and result["nvml"]["available"] is True
    got = [{k: d[k] for k in ("index", "uuid", "name", "memory_total_mib")} for d in result["nvml"]["devices"]]
    assert got == node.gpus()
    assert result["nvml_uuids"] == [g["uuid"] for g in node.gpus()]
    assert result["driver_version"] == node.spec["system"]["driver_version"]


def test_the_probe_names_a_lost_gpu(software, tmp_path):
    node = MockNode(software, "h100", tmp_path)
    node.ctl("fail --mode lost", 2)
    result = node.run("probe", "--device", "cpu", "--threads", "1")
    assert result["ok"] is False and result["problems"] == ["NVML GPU 2: NVML: GPU is lost"]
    assert len(result["nvml_uuids"]) == 7 and node.uuid(2) not in result["nvml_uuids"]


def test_the_sampler_records_the_pinned_utilization_and_its_cost(software, tmp_path):
    node = MockNode(software, "h100", tmp_path)
    node.ctl("util 37", "all")
    node.ctl("util 81", 3)
    result = node.run("nvml_sampler", "--hz", "10", "--duration", "1", "--samples")
    u = result["utilization"]
    assert u["available"] is True and len(u["devices"]) == 8 and u["skipped_devices"] == {}
    for d in u["devices"]:   # NVIDIA's mock answers Not Supported to nvmlDeviceGetSamples
        assert d["util_source"] == "utilization_rates" and "Not Supported" in d["util_fallback"], d
    gpus = u["phases"]["sample"]["gpus"]
    assert {g: s["gpu_util_pct"]["mean"] for g, s in gpus.items()} == {str(i): 81 if i == 3 else 37 for i in range(8)}
    assert {row["util_source"] for row in result["samples"]} == {"utilization_rates"}
    cost = u["sampler_cost"]
    assert cost["ticks"] > 0 and cost["thread_cpu_s"] > 0 and cost["pct_of_core_per_gpu"] is not None
    assert set(cost["read_cpu_us"]) >= {"util", "fields", "clock_event_reasons"}

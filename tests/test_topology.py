"""The NVLink-set check (gpuproof/discovery/topology.py, suites/test_topology.py) over NVIDIA's mock NVML.

The probe runs as a local process over the mock (``NodeSoftware.mock_env``), seeing the GPUs a pod
would: the mock shows a process only the GPUs whose ``/dev/nvidia<N>`` exist in its mount namespace
(``engine/engine.go`` detectVisibleDevices), and all of them where none exist. So each probe runs in a
private mount namespace whose ``/dev`` is a fresh tmpfs holding only those GPUs' nodes (195:N, as
kubelet.py makes them), or with no namespace at all for every GPU.

Every NVLink profile NVIDIA ships links all pairs through NVSwitch (H100, A100, GB200, GB300: NV# between
every pair), and the others have no NVLink (T4, L40S, and B200, "standalone": no switch, no link), so
none of them can hand out a fragmented set. The mock also models direct GPU-GPU links
(``nvlink.device_links`` with ``remote_index``, NodeFabric in ``engine/topology.go``): ``h100-bridged``
is NVIDIA's H100 profile with its NVSwitches replaced by 4 NVLinks between the GPUs of each pair
(0-1, 2-3, 4-5, 6-7), the shape of PCIe cards joined by NVLink bridges. GPUs 0 and 4 there are a
fragmented set (no link, PCIe path SYS); the mock computes every answer from that topology.

Needs the mock built and root (a mount namespace, mknod); without them these tests skip, except under
``GPUPROOF_REQUIRE_TOOLS=1`` or ``CI``, where they fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import test_nvml_mock
import yaml
from test_real_gpu_checks import node, suite

from gpuproof.bench import workloads
from gpuproof.plugin.fixtures import Checker
from gpuproof.results import RunDir
from gpuproof.discovery.topology import nvlink_set

# a fresh /dev holding only the GPUs in $GPUS (and what a process needs), then the command
VISIBLE_ONLY = ("mount -t tmpfs -o mode=755 gpuproof-dev /dev && mknod -m 666 /dev/null c 1 3 && "
                "mknod -m 666 /dev/zero c 1 5 && mknod -m 666 /dev/urandom c 1 9 && "
                'for n in $GPUS; do mknod -m 666 /dev/nvidia$n c 195 $n; done && exec "$@"')
PROBE_ARGS = ["--device", "cpu", "--threads", "1"]
software = test_nvml_mock.software        # the fixture: NVIDIA's mock NVML, located (or built under CI)
H100 = "GPU-01000100-0000-0000-0000-0000000000"          # + the GPU's number, two digits
T4 = "GPU-00000074-0000-0000-0000-0000000000"


def h100_node(name: str):
    n, = node(name, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"},
              {"nvidia.com/gpu": "8"}).nodes
    return n


class _Quoted(yaml.SafeDumper):
    """Every string quoted: the mock's Go YAML reads a bare 0421819085400 (a serial) as a number."""


_Quoted.add_representer(str, lambda dumper, s: dumper.represent_scalar("tag:yaml.org,2002:str", s, style='"'))


def mock_config(sw, profile: str, into: Path) -> Path:
    """One of NVIDIA's profiles as a node's mock config; ``h100-bridged``: H100 with NVLink bridges for NVSwitches."""
    base, _, variant = profile.partition("-")
    path, text = into / f"{profile}.yaml", (sw.profiles / f"mock-nvml-config-{base}.yaml").read_text()
    if variant == "bridged":
        spec = yaml.safe_load(text)
        nv = spec["nvlink"]
        del nv["switches"]
        nv["device_links"] = [{"index": i, "links": [{"link": k, "state": "active", "remote_index": i ^ 1}
                                                     for k in range(4)]} for i in range(len(spec["devices"]))]
        text = yaml.dump(spec, Dumper=_Quoted)
    path.write_text(text)
    return path


def run_probe(sw, config: Path, visible: tuple[int, ...] | None) -> dict:
    """The probe over the mock, seeing only the GPUs ``visible`` (every GPU for None)."""
    cmd = [sys.executable, str(workloads.workloads_dir() / "probe.py"), *PROBE_ARGS]
    env = {**sw.mock_env(config), "CUDA_VISIBLE_DEVICES": ""}
    if visible is not None:
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", VISIBLE_ONLY, "sh", *cmd]
        env["GPUS"] = " ".join(map(str, visible))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "falling back to defaults" not in proc.stderr, proc.stderr[-2000:]
    return workloads.parse_result(proc.stdout, what="probe")


@pytest.fixture(scope="module")
def probe(software, tmp_path_factory):
    """probe(profile, visible) -> the probe's result, one process per (profile, visible) for the module."""
    if os.geteuid() != 0 and not test_nvml_mock.REQUIRED:
        pytest.skip("a private mount namespace with /dev/nvidia<N> nodes needs root")
    root, done = tmp_path_factory.mktemp("topology"), {}

    def get(profile: str, visible: tuple[int, ...] | None = None) -> dict:
        if (profile, visible) not in done:
            done[profile, visible] = run_probe(software, mock_config(software, profile, root), visible)
        return done[profile, visible]
    return get


# the fan-out, run in line: the suite's per-node work on this one node, in this thread (tests/test_fanout.py tests the
# fan-out itself)
INLINE = SimpleNamespace(result=lambda item, node, work, **kw: work(node, None))


def run_suite(tmp_path, monkeypatch, result: dict, gpu_node) -> tuple[Checker, list[dict], list]:
    """The suite's test on ``gpu_node`` with a real Checker, its probe pod's output ``result``."""
    module, asked = suite("topology"), []

    def probe_on(run, target, n, count, limits, args=(), prefix="probe", lane=None):
        asked.append((n.name, count, limits, prefix))
        return [result]

    monkeypatch.setattr(module, "probe_on", probe_on)
    monkeypatch.setattr(module, "free_on", lambda cluster, n, resource: n.allocatable_of(resource))
    run_dir = RunDir(tmp_path / "run")
    checker = Checker(run_dir, module.FEATURE, gpu_node)
    try:
        module.test_the_gpus_of_a_pod_share_nvlink(needs_real_gpus=None, gpu_node=gpu_node, run=None,
                                                   target=SimpleNamespace(cluster=None), check=checker,
                                                   fanout=INLINE, request=SimpleNamespace(node=None))
    except pytest.skip.Exception:
        pass
    return checker, [json.loads(line) for line in (run_dir.path / "checks.jsonl").read_text().splitlines()], asked


@pytest.mark.parametrize("visible, numbers", [(None, "0,1,2,3,4,5,6,7"), ((0, 1), "0,1"), ((0, 1, 2, 3), "0,1,2,3")],
                         ids=["all-8", "0-1", "0-3"])
def test_every_set_on_an_nvswitch_node_passes(probe, visible, numbers):
    result = probe("h100", visible)
    topo = result["topology"]
    assert [g["minor"] for g in topo["gpus"]] == [int(n) for n in numbers.split(",")]
    assert {(p["through_nvswitch"], p["direct"], p["p2p_nvlink"]) for p in topo["pairs"]} == {(18, 0, "OK")}
    v = nvlink_set(result, "h100-0")
    n = len(topo["gpus"])
    assert (v.verdict, v.expected) == ("pass", "GPUs 0,1 share NVLink" if n == 2 else
                                       f"an NVLink-connected set of {n} GPUs ({numbers}: every pair linked, "
                                       "directly or through NVSwitch)")
    assert v.actual == f"every pair of GPUs {numbers} linked (NV18 through NVSwitch)"


def test_a_bridged_pair_passes(probe):
    result = probe("h100-bridged", (0, 1))
    (pair,) = result["topology"]["pairs"]
    assert (pair["direct"], pair["through_nvswitch"], pair["p2p_nvlink"],
            pair["common_ancestor"]) == (4, 0, "OK", "PIX")
    v = nvlink_set(result, "h100-0")
    assert (v.verdict, v.expected, v.actual) == ("pass", "GPUs 0,1 share NVLink", "every pair of GPUs 0,1 linked (NV4)")


FRAGMENTED = (f"no NVLink between GPU 0 ({H100}00) and GPU 4 ({H100}04, index 1 in the pod) (P2P over NVLink: "
              "NOT_SUPPORTED, PCIe path SYS); GPU 0's NVLinks reach 00000000:1B:00.0 (4), outside this pod; "
              "GPU 4's NVLinks reach 00000000:8B:00.0 (4), outside this pod")
# id: (mock profile, the GPUs the pod got, [(check, node, expected, actual)] that must fail)
FAULTS = {
    "bridged-h100-pod-gets-gpus-0-and-4": ("h100-bridged", (0, 4),
                                           [("nvlink-set", "h100-0", "GPUs 0,4 share NVLink", FRAGMENTED)]),
}


@pytest.mark.parametrize("case", list(FAULTS))
def test_a_fragmented_set_fails_naming_node_expected_actual(probe, tmp_path, monkeypatch, case):
    profile, visible, expectations = FAULTS[case]
    checker, records, asked = run_suite(tmp_path, monkeypatch, probe(profile, visible), h100_node("h100-0"))
    assert asked == [("h100-0", 1, {"nvidia.com/gpu": 2}, "nvlink-probe")]
    with pytest.raises(pytest.fail.Exception) as failed:
        checker.finish()
    for check, target, expected, actual in expectations:
        rec, = (r for r in records if r["check"] == check)
        assert (rec["target"], rec["verdict"], rec["expected"], rec["actual"]) == (target, "fail", expected, actual)
        assert str(failed.value) == f"{target}: the GPUs of one pod: expected {expected!r}, actual {actual!r}"


def test_a_fragmented_set_only_warns_while_other_pods_hold_gpus(probe):
    v = nvlink_set(probe("h100-bridged", (0, 4)), "h100-0", held_by_others=3)
    assert (v.verdict, v.actual) == ("warn", FRAGMENTED)
    assert v.message.endswith("(other pods hold 3 GPUs of the node: the free ones may include no linked set)")


def test_a_pcie_only_node_skips_saying_why(probe, tmp_path, monkeypatch):
    result = probe("t4", (0, 1))
    assert [p["p2p_nvlink"] for p in result["topology"]["pairs"]] == ["NOT_SUPPORTED"]
    t4, = node("t4-0", {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "4"},
               {"nvidia.com/gpu": "4"}).nodes
    checker, records, _ = run_suite(tmp_path, monkeypatch, result, t4)
    assert checker.failures == []
    assert [(r["check"], r["target"], r["verdict"]) for r in records] == [("nvlink-set", "t4-0", "skip")]
    assert records[0]["message"] == ("t4-0: PCIe only: none of GPUs 0,1 has an active NVLink (no link is active); a "
                                     "PCIe-only node cannot have a fragmented NVLink set")
    assert T4 + "01" in result["nvml_uuids"]

"""The access suite (``secure_accelerator_access``) with NVIDIA's container toolkit as the runtime (issue #38 item 2),
through ``gpuproof run``.

Two kubelet nodes whose runtime is NVIDIA's container toolkit v1.19.0 (``nvidia-container-runtime``,
gpuproof/sim/kubelet/toolkit.py): ``a100-tk-0`` set up as NVIDIA recommends
(``accept-nvidia-visible-devices-envvar-when-unprivileged = false``), ``a100-tk-1`` with the toolkit's own default
``true``, so the runtime hands a pod without a grant every GPU its ``NVIDIA_VISIBLE_DEVICES=all`` asks for. The fault
is the toolkit's own switch in its config.toml; the device files and the GPUs NVML lists in the pod are what the
toolkit's CDI edits gave it. Only ``access-envvar-none`` fails, on ``a100-tk-1`` only, naming the pod, the grant and
the GPUs it reached (both UUIDs, both device files); every other check passes on both nodes.

The suite on runc nodes granted by NVIDIA's device plugin (time-sliced too) and on a DRA node granted by claims runs
in the lab fleet's whole-suite run (tests/test_bundle_lab.py), every check passing there.
"""

from __future__ import annotations

import pytest
import yaml
from test_kubelet_pods import NEEDS, gpuproof_run, records

from gpuproof.sim.fleet_file import parse_fleet

needs_kubelet = pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
ENVVAR = "accept-nvidia-visible-devices-envvar-when-unprivileged"
A100 = {"product": "NVIDIA-A100-SXM4-40GB", "count": 2}
FLEET = {"name": "kaccess", "pools": [
    {"name": "a100-tk", "count": 2, "backend": "kubelet", "instanceType": "a2-highgpu-2g", "gpu": A100,
     "faults": [{"node": 0, "containerToolkit": {}}, {"node": 1, "containerToolkit": {ENVVAR: True}}]},
]}
NODES = ("a100-tk-0", "a100-tk-1")
CHECKS = ("access-granted-one-gpu", "access-ungranted-none", "access-envvar-none", "access-sibling-none")
NONE = "no GPU: no /dev/nvidia<N>, none listed by NVML"
# case: (the node's fault, [(check, node, expected, words of the actual)] that must fail): tests/test_check_coverage.py
FAULTS = {
    "toolkit-honours-nvidia-visible-devices-from-unprivileged-pods": ({ENVVAR: True}, [
        ("access-envvar-none", "a100-tk-1", NONE, "2 GPUs: /dev/nvidia0, /dev/nvidia1; NVML lists 2: ")]),
}


def uuids(node: str) -> list[str]:
    """The node's GPU UUIDs as its mock NVML config says them."""
    from gpuproof.sim import nvidia
    from gpuproof.sim.gpunodes import mock_config

    pool = next(p for p in parse_fleet(FLEET, source="kaccess.yaml").pools if node in p.node_names())
    return [d["uuid"] for d in mock_config(nvidia.locate(), pool.gpu, seed=f"{FLEET['name']}/{node}")["devices"]]


def test_the_toolkit_node_is_a_fleet_setting_of_device_plugin_nodes():
    from gpuproof.errors import FleetError

    pool = parse_fleet(FLEET, source="kaccess.yaml").pools[0]
    assert pool.container_toolkit(0) == {} and pool.container_toolkit(1) == {ENVVAR: True}
    plain = {**FLEET["pools"][0], "faults": []}
    assert parse_fleet({"name": "x", "pools": [plain]}, source="x.yaml").pools[0].container_toolkit(0) is None
    kwok = {**FLEET["pools"][0], "backend": "kwok"}
    with pytest.raises(FleetError, match=r"faults\[0\].containerToolkit: is for kubelet nodes"):
        parse_fleet({"name": "x", "pools": [kwok]}, source="x.yaml")
    dra = {**FLEET["pools"][0], "offer": "dra"}
    with pytest.raises(FleetError, match=r"containerToolkit: is for GPU nodes that offer their GPUs through"):
        parse_fleet({"name": "x", "pools": [dra]}, source="x.yaml")
    bad = {**FLEET["pools"][0], "faults": [{"containerToolkit": {"accept-everything": True}}]}
    with pytest.raises(FleetError, match=r"containerToolkit.accept-everything: not a top-level setting"):
        parse_fleet({"name": "x", "pools": [bad]}, source="x.yaml")


def test_the_toolkits_config_and_containerd_runtime(tmp_path):
    from gpuproof.sim import kubelet
    from gpuproof.sim.kubelet import toolkit as kubelet_toolkit

    text = kubelet_toolkit.config_toml({ENVVAR: True}, "/var/lib/gpuproof/driver", tmp_path / "nvidia-cdi-hook",
                                       tmp_path / "rt.log")
    assert f"{ENVVAR} = true" in text and text.count(ENVVAR) == 1
    assert f"{ENVVAR} = false" in kubelet_toolkit.config_toml({}, "/d", tmp_path / "h", tmp_path / "l")
    assert '[nvidia-container-cli]\nroot = "/var/lib/gpuproof/driver"' in text
    assert f'[nvidia-ctk]\npath = "{tmp_path / "nvidia-cdi-hook"}"' in text
    from gpuproof.sim.kubelet.runtime import NodeRuntime

    runtime = NodeRuntime(tmp_path / "c", tmp_path / "r", tmp_path / "p")
    config = kubelet_toolkit.containerd_config(kubelet.containerd_config(tmp_path, "pause", runtime), tmp_path / "w")
    assert 'default_runtime_name = "nvidia"' in config
    assert f'runtimes.nvidia.options]\n        BinaryName = "{tmp_path / "w"}"' in config
    wrapper = kubelet_toolkit.wrapper(tmp_path, tmp_path / "config.toml", "/var/lib/gpuproof/mock-nvml.yaml")
    assert f"NVIDIA_CTK_CONFIG_FILE_PATH={tmp_path / 'config.toml'}" in wrapper
    assert wrapper.rstrip().endswith(f'exec {tmp_path / "nvidia-container-runtime"} "$@"')


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet` as a process, kubelet nodes
@needs_kubelet
def test_access_suite_on_kubelet_nodes_and_the_toolkits_own_fault(tmp_path):
    path = tmp_path / "kaccess.yaml"
    path.write_text(yaml.safe_dump(FLEET))
    proc, run = gpuproof_run(tmp_path, "--fleet", str(path), "-k", "TestSecureAcceleratorAccess")
    out = proc.stdout + proc.stderr
    got = {(r["check"], r["target"]): r for r in records(run, "checks.jsonl") if r["feature"] == "access"}
    failed = sorted(k for k, r in got.items() if r["verdict"] != "pass")
    assert failed == [("access-envvar-none", "a100-tk-1")], (failed, out[-4000:])
    assert set(got) == {(c, n) for c in CHECKS for n in NODES}, sorted(got)
    assert proc.returncode == 1, out[-3000:]
    rec = got[("access-envvar-none", "a100-tk-1")]
    (_, (check, node, expected, words)), = [(k, e) for k, (_, es) in FAULTS.items() for e in es]
    assert (rec["expected"], rec["target"]) == (expected, node) and words in rec["actual"], rec
    assert all(u in rec["actual"] for u in uuids("a100-tk-1")), rec
    assert "container ungranted-env-all on a100-tk-1, granted nothing with NVIDIA_VISIBLE_DEVICES=all" in \
        rec["message"] and rec["message"] in out
    junit = (run / "junit.xml").read_text()
    for sub in ("PositiveAccessTest", "NegativeIsolationTest", "EnvVarIsolationTest", "MultiContainerIsolationTest"):
        assert f'classname="suites.test_access.TestSecureAcceleratorAccess" name="test_{sub}[a100-tk-1]"' in junit

"""kind-configs/: every kind config passes kind's own loading and validation (tools/kindcheck, built
from sigs.k8s.io/kind), has the shape its README row promises, and a broken one is refused. The setup
scripts parse and refuse missing inputs. No Docker: creating the clusters is not tested here.

kindcheck is built by ./setup.sh; without it these tests skip, or fail under GPUPROOF_REQUIRE_TOOLS=1 (CI).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from gpuproof.plugin.choice import config_cluster_name
from gpuproof.plugin.throwaway import setup_script
from gpuproof.tools import for_test

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "kind-configs"
KIND_CONFIGS = sorted(p for p in CONFIGS.glob("*.yaml") if not p.name.startswith("k3d-"))
MOCK_PROFILES = {"a100", "h100", "b200", "gb200", "l40s", "t4"}     # the gpu-mock chart's gpu.profile values
GPU_MOUNT_DIR = "/var/run/nvidia-container-devices/"


def kindcheck(*paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(for_test("kindcheck")), "-json", *map(str, paths)], capture_output=True, text=True,
                          timeout=60)


@pytest.fixture(scope="module")
def loaded() -> dict[str, dict]:
    """Each kind config as kind loads it (defaults applied), by file name."""
    proc = kindcheck(*KIND_CONFIGS)
    assert proc.returncode == 0, proc.stderr
    out = [json.loads(line) for line in proc.stdout.splitlines()]
    return {Path(c["file"]).name: c for c in out}


def test_the_shipped_kind_configs_are_there():
    assert {p.name for p in KIND_CONFIGS} >= {"cpu-only.yaml", "gpu-mock.yaml", "gpu-nvkind.yaml"}


@pytest.mark.parametrize("path", KIND_CONFIGS, ids=[p.name for p in KIND_CONFIGS])
def test_kind_accepts_the_config(path, loaded):
    cfg = loaded[path.name]
    assert sum(n["role"] == "control-plane" for n in cfg["nodes"]) >= 1
    # pytest-kubernetes creates with --config and deletes by the cluster's name: the file must carry it
    raw = yaml.safe_load(path.read_text())
    assert raw.get("name") == cfg["name"] != "kind", f"{path.name}: give the cluster a name of its own"


def test_cpu_only_has_no_gpus(loaded):
    nodes = loaded["cpu-only.yaml"]["nodes"]
    assert not any(m["containerPath"].startswith(GPU_MOUNT_DIR) for n in nodes for m in n["extraMounts"])
    assert not any(k.startswith("gpu-mock/") for n in nodes for k in (n["labels"] or {}))
    assert setup_script(str(CONFIGS / "cpu-only.yaml")) is None


def test_gpu_mock_workers_name_a_profile_and_count(loaded):
    workers = [n for n in loaded["gpu-mock.yaml"]["nodes"] if n["role"] == "worker"]
    mock = [n["labels"] for n in workers if "gpu-mock/profile" in (n["labels"] or {})]
    assert len(mock) >= 2, "two mock GPU types, so per-product checks have something to compare"
    for labels in mock:
        assert labels["gpu-mock/profile"] in MOCK_PROFILES, labels
        assert labels["gpu-mock/count"].isdigit() and int(labels["gpu-mock/count"]) > 0, labels
        assert labels.get("node.kubernetes.io/instance-type"), "a pool label, so discovery groups the nodes"
    assert not any(m["containerPath"].startswith(GPU_MOUNT_DIR) for n in workers for m in n["extraMounts"])
    assert setup_script(str(CONFIGS / "gpu-mock.yaml")) == CONFIGS / "gpu-mock.setup.sh"


def test_gpu_nvkind_hands_host_gpus_to_a_worker(loaded):
    nodes = loaded["gpu-nvkind.yaml"]["nodes"]
    gpu_mounts = [(n["role"], m) for n in nodes for m in n["extraMounts"]
                  if m["containerPath"].startswith(GPU_MOUNT_DIR)]
    assert gpu_mounts, "no worker gets GPUs"
    for role, m in gpu_mounts:
        # the toolkit reads the mount's target name as the device list; the source must be /dev/null
        assert role == "worker" and m["hostPath"] == "/dev/null", m
    assert setup_script(str(CONFIGS / "gpu-nvkind.yaml")) == CONFIGS / "gpu-nvkind.setup.sh"


BROKEN = {
    # (what is wrong, how to break a shipped config, what kind says)
    "typo-in-field": ("gpu-nvkind.yaml", ("extraMounts:", "extraMount:"), "field extraMount not found"),
    "unknown-role": ("cpu-only.yaml", ("role: worker", "role: gpu-worker"), '"gpu-worker" is not a valid node role'),
    "no-control-plane": ("gpu-mock.yaml", ("role: control-plane", "role: worker"),
                         "must have at least one control-plane node"),
    "bad-cluster-name": ("cpu-only.yaml", ("name: gpuproof-cpu", "name: GPUproof_CPU"), "is not a valid cluster name"),
    "wrong-api-version": ("cpu-only.yaml", ("kind.x-k8s.io/v1alpha4", "kind.x-k8s.io/v1alpha3"),
                          "unknown apiVersion"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.server  # tier: tools/kindcheck as a process
def test_a_broken_config_fails_kinds_validation(case, tmp_path):
    source, (old, new), says = BROKEN[case]
    text = (CONFIGS / source).read_text()
    assert old in text, f"{source} no longer contains {old!r}: update this case"
    broken = tmp_path / f"{case}.yaml"
    broken.write_text(text.replace(old, new))
    proc = kindcheck(broken)
    assert proc.returncode == 1, proc
    assert proc.stderr.startswith(f"{broken}: ") and says in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, "one line per broken file"


@pytest.mark.server  # tier: tools/kindcheck as a process
def test_kindcheck_takes_the_name_as_kind_create_does(tmp_path):
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\n")
    proc = kindcheck(unnamed)
    assert proc.returncode == 0 and json.loads(proc.stdout)["name"] == "kind"     # kind's default
    proc = subprocess.run([str(for_test("kindcheck")), "-json", "-name", "Bad_Name", str(unnamed)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "not a valid cluster name" in proc.stderr


def test_k3d_config_names_its_cluster():
    """On paper: k3d's own validation needs Docker; this checks what gpuproof relies on."""
    path = CONFIGS / "k3d-cpu-only.yaml"
    data = yaml.safe_load(path.read_text())
    assert (data["apiVersion"], data["kind"]) == ("k3d.io/v1alpha5", "Simple")
    assert config_cluster_name("k3d", str(path)) == "gpuproof-cpu"
    assert data["servers"] >= 1


SCRIPTS = sorted(CONFIGS.glob("*.setup.sh"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
@pytest.mark.server  # tier: bash -n
def test_setup_script_parses(script):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert (CONFIGS / script.name.replace(".setup.sh", ".yaml")).is_file(), "a setup script belongs to a config"


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.name for p in SCRIPTS])
@pytest.mark.server  # tier: the setup script in bash
def test_setup_script_says_what_is_missing(script, tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("KIND_CLUSTER_NAME", "KUBECONFIG")}
    proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and proc.stderr.strip() == \
        f"{script.name}: KIND_CLUSTER_NAME is not set (the kind cluster to set up)", proc.stderr
    # a PATH with bash only: the first command the script needs is named
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "bash").symlink_to(subprocess.run(["bash", "-c", "command -v bash"], capture_output=True,
                                                text=True).stdout.strip())
    env.update(KIND_CLUSTER_NAME="gpuproof-x", KUBECONFIG=str(tmp_path / "kubeconfig"), PATH=str(bindir))
    proc = subprocess.run([str(bindir / "bash"), str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "needs `" in proc.stderr and "` on PATH" in proc.stderr, proc.stderr


@pytest.mark.server  # tier: tools/kindcheck as a process
def test_containerd_patches_are_merged_as_kind_merges_them(tmp_path):
    """No shipped config patches containerd yet; one that does is merged with kind's TOML patcher."""
    head = "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nname: patched\ncontainerdConfigPatches:\n  - |-\n"
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(head + '    [plugins."io.containerd.grpc.v1.cri"]\n      enable_cdi = true\n')
    bad.write_text(head + '    [plugins."io.containerd.grpc.v1.cri"\n      enable_cdi = true\n')
    proc = kindcheck(good)
    assert proc.returncode == 0 and json.loads(proc.stdout)["containerdConfigPatches"] == 1, proc.stderr
    proc = kindcheck(bad)
    assert proc.returncode == 1 and "containerdConfigPatches do not apply" in proc.stderr, proc.stderr

"""The bundle on a machine without Go (issue #42 item 3): the bundle `gpuproof sim bundle` writes, installed into a
clean cache by ``GPUPROOF_BUNDLE`` with ``go`` (and gcc, cc, make) hidden from PATH, brings up the ``lab`` fleet: its
control plane, kwok node, kubelet nodes (containerd 1.7 on the DRA node), NVIDIA's device plugin, GFD and DRA driver,
NFD and CoreDNS all come from the bundle, and ``gpuproof run --fleet lab`` is green on it.

The bundles are made once per module with ``--fast`` (xz -1: what is under test is the bundle's contents and their
install, not its size, which benchmarks/RESULTS.md records at xz -9e) unless ``GPUPROOF_TEST_BUNDLE`` and
``GPUPROOF_TEST_BUNDLE_WITHOUT_DRA`` name ones already made from this checkout. The module is an xdist group of its
own: its private clusters run beside the other kubelet tests' in another worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuproof.sim import kubelet

NEEDS = kubelet.missing()
pytestmark = pytest.mark.xdist_group("kubelet-bundle")       # beside the kubelet group, not in it
HIDDEN = ("go", "gofmt", "gcc", "cc", "make")          # what building from source needs


def path_without_build_tools(tmp_path: Path) -> str:
    """A PATH holding links to every program of this one but the build tools."""
    shadow = tmp_path / "path"
    shadow.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        if not folder or not Path(folder).is_dir():
            continue
        for exe in Path(folder).iterdir():
            if exe.name in HIDDEN or (shadow / exe.name).exists() or not os.access(exe, os.X_OK):
                continue
            (shadow / exe.name).symlink_to(exe.resolve() if exe.is_symlink() else exe)
    return str(shadow)


def _bundle(factory, variable: str, *flags: str) -> Path:
    given = os.environ.get(variable)
    if given:
        return Path(given)
    out = factory.mktemp("bundle") / "gpuproof-bundle.tar.xz"
    subprocess.run([sys.executable, "-m", "gpuproof", "sim", "bundle", "--fast", *flags, "-o", str(out)], check=True,
                   timeout=3600)
    return out


@pytest.fixture(scope="module")
def made_bundle(tmp_path_factory) -> Path:
    return _bundle(tmp_path_factory, "GPUPROOF_TEST_BUNDLE")


@pytest.fixture(scope="module")
def bundle_without_dra(tmp_path_factory) -> Path:
    return _bundle(tmp_path_factory, "GPUPROOF_TEST_BUNDLE_WITHOUT_DRA", "--without-dra")


def run_without_go(bundle: Path, tmp_path: Path, fleet: str, suites: str) -> tuple[subprocess.CompletedProcess, float]:
    """``gpuproof run --fleet FLEET -k SUITES`` with the bundle installed by GPUPROOF_BUNDLE into a clean cache, the
    build tools hidden from PATH."""
    cache = tmp_path / "cache"
    tmp_path.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPROOF_KUBE", "GPUPROOF_NVIDIA_DIR"))}
    env.update(GPUPROOF_CACHE=str(cache), GPUPROOF_BUNDLE=str(bundle), PATH=path_without_build_tools(tmp_path))
    for var in ("GPUPROOF_BIN_DIR", "KUBEBUILDER_ASSETS", "GPUPROOF_ETCD", "GPUPROOF_KWOK", "GPUPROOF_KUBELET",
                "GPUPROOF_COREDNS"):
        env.pop(var, None)
    probe = subprocess.run([sys.executable, "-c", "import shutil; print([shutil.which(t) for t in "
                            f"{list(HIDDEN)!r}])"], env=env, capture_output=True, text=True)
    assert probe.stdout.strip() == str([None] * len(HIDDEN)), probe.stdout
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--fleet", fleet, "--report-dir",
                           str(tmp_path / "reports"), "-k", suites], env=env, capture_output=True, text=True,
                          timeout=1800)
    for folder in ("controlplane", "nvidia", "images"):
        assert (cache / folder).is_dir()
    return proc, time.monotonic() - t0


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet lab` as a process, kubelet nodes
@pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
def test_lab_is_green_from_the_bundle_without_go(made_bundle, tmp_path):
    proc, took = run_without_go(made_bundle, tmp_path, "lab", "discovery or nodes or advertisement or labels or health"
                                " or driver or dra")
    out = proc.stdout[-5000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, f"gpuproof run --fleet lab from the bundle failed:\n{out}"
    assert "installed" in proc.stderr and "building" not in proc.stderr, proc.stderr[-3000:]
    print(f"lab from the bundle, install included: {took:.0f}s", file=sys.stderr)


LAB_WITHOUT_DRA = Path(__file__).parent / "data" / "fleets" / "lab-without-dra.yaml"


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet` as a process, kubelet nodes
@pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
def test_a_bundle_without_dra_runs_lab_without_its_dra_node_and_refuses_lab(bundle_without_dra, tmp_path):
    """The bundle the GPU machine carries (``--without-dra``, under 56 MiB): lab less its DRA node is green from it;
    lab itself is refused in one line, naming the flag."""
    proc, took = run_without_go(bundle_without_dra, tmp_path / "a", str(LAB_WITHOUT_DRA),
                                "discovery or nodes or advertisement or labels or health")
    assert proc.returncode == 0, f"lab without DRA from the bundle failed:\n{proc.stdout[-5000:]}{proc.stderr[-3000:]}"
    print(f"lab without its DRA node from the --without-dra bundle, install included: {took:.0f}s", file=sys.stderr)
    proc, _ = run_without_go(bundle_without_dra, tmp_path / "b", "lab", "nodes")
    assert proc.returncode != 0 and "made with --without-dra" in proc.stdout + proc.stderr, proc.stderr[-3000:]

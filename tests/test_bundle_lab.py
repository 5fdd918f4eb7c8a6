"""The bundle on a machine without Go (issue #42 item 3): the bundle `gpuproof sim bundle` writes, installed into a
clean cache by ``GPUPROOF_BUNDLE`` with ``go`` (and gcc, cc, make) hidden from PATH, brings up the ``lab`` fleet: its
control plane, kwok node, kubelet nodes (containerd 1.7 on the DRA node), NVIDIA's device plugin, GFD and DRA driver,
NFD and CoreDNS all come from the bundle, and the whole suite, ``gpuproof run --fleet lab --quick-bench``, is green on
it, every check that needs kubelet nodes run and passed there (issue #28's pod paths, #38's access, the 1.37 evidence).
That whole-suite run is the project's one run of lab: from the bundle, it proves the bundle and the pod paths at once
(issue #37: one lab cluster fewer than a run from the Go build and another from the bundle).

The bundles are made once per module with ``--uncompressed`` (a plain tar: what is under test is the bundle's
contents and their install, not its size, which benchmarks/RESULTS.md records at xz -9e; tests/test_bundle.py reads xz
ones) unless ``GPUPROOF_TEST_BUNDLE`` and ``GPUPROOF_TEST_BUNDLE_WITHOUT_DRA`` name ones already made from this
checkout. The module is an xdist group of its own: its private clusters run beside the other kubelet tests' in another
worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from gpuproof.sim import kubelet
from test_kubelet_pods import records

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
    out = factory.mktemp("bundle") / "gpuproof-bundle.tar"
    subprocess.run([sys.executable, "-m", "gpuproof", "sim", "bundle", "--uncompressed", *flags, "-o", str(out)],
                   check=True, timeout=3600)
    return out


@pytest.fixture(scope="module")
def made_bundle(tmp_path_factory) -> Path:
    return _bundle(tmp_path_factory, "GPUPROOF_TEST_BUNDLE")


@pytest.fixture(scope="module")
def bundle_without_dra(tmp_path_factory) -> Path:
    return _bundle(tmp_path_factory, "GPUPROOF_TEST_BUNDLE_WITHOUT_DRA", "--without-dra")


def run_without_go(bundle: Path, tmp_path: Path, fleet: str, *args: str) -> tuple[subprocess.CompletedProcess, Path,
                                                                                  float]:
    """``gpuproof run --fleet FLEET ARGS...`` with the bundle installed by GPUPROOF_BUNDLE into a clean cache, the
    build tools hidden from PATH: the process, its run folder (None when it wrote none) and its wall time."""
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
    reports = tmp_path / "reports"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "gpuproof", "run", "--fleet", fleet, "--report-dir", str(reports),
                           *args], env=env, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - t0
    for folder in ("controlplane", "nvidia", "images"):
        assert (cache / folder).is_dir()
    runs = sorted(p for p in reports.iterdir() if p.is_dir()) if reports.exists() else []
    return proc, (runs[-1] if runs else None), took


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet lab` as a process, kubelet nodes
@pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
def test_the_whole_suite_passes_on_lab_from_the_bundle_with_its_pod_paths(made_bundle, tmp_path):
    """``gpuproof run --fleet lab --quick-bench`` from the bundle, without Go: everything installed, nothing built,
    and the whole suite passes; on the kubelet nodes the checks that skip on kwok nodes run and pass: health in a
    pod on every kubelet GPU node, the time-sliced GPU's pods seeing one UUID, NVIDIA's device plugin refusing a pod
    2 of them (its own Allocate, over the pool's config file), its pods Ready, the claim's GPU seen in the pod
    (NVIDIA's DRA driver), and every benchmark through its pod path (probe, matmul, HBM, all-reduce in one pod and
    across the 2 A100 nodes as the fabric suite's pair and ring, inference Deployment + Service with its load pods,
    the NVML sampler in their pods), recorded like real ones: at the benchmarks' smallest sizes (``--quick-bench``,
    marked so in their records), since the paths, not the CPU's figures, are under test here
    (tests/test_bench_cpu_path.py runs each benchmark's CPU path at those sizes too)."""
    proc, run, took = run_without_go(made_bundle, tmp_path, "lab", "--quick-bench")
    assert run, f"gpuproof run wrote no report (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}"
    print(f"lab's whole suite from the bundle, install included: {took:.0f}s", file=sys.stderr)
    assert proc.returncode == 0, f"gpuproof run --fleet lab --quick-bench failed:\n{proc.stdout[-6000:]}"
    assert "installed" in proc.stderr and "building" not in proc.stderr, proc.stderr[-3000:]
    checks = records(run, "checks.jsonl")
    kubelet_gpu_nodes = {"a100-0", "a100-1", "l4-shared-0"}
    health = {r["target"] for r in checks if r["feature"] == "health" and r["verdict"] == "pass"}
    assert health == kubelet_gpu_nodes, f"health items passed on {health}"
    same = [r for r in checks if r["check"] == "same-gpu-uuid"]
    assert [(r["target"], r["verdict"]) for r in same] == [("l4-shared-0", "pass")], same
    refused = [(r["check"], r["target"], r["verdict"]) for r in checks if r["check"].startswith("shared-request-gt1")]
    assert refused == [("shared-request-gt1-refused", "l4-shared-0", "pass")], \
        f"NVIDIA's device plugin refuses 2 shared GPUs, judged from the pool's config file: {refused}"
    ready = {r["target"] for r in checks if r["check"] == "device-plugin-ready" and r["verdict"] == "pass"}
    assert kubelet_gpu_nodes <= ready, f"device-plugin-ready passed on {ready}"
    dra_probe = [(r["target"], r["verdict"]) for r in checks if r["check"] == "dra-probe-uuid"]
    assert dra_probe == [("a100-dra-0", "pass")], f"the claim's GPU, and only it, in the pod: {dra_probe}"
    nvlink = {r["target"]: r["verdict"] for r in checks if r["check"] == "nvlink-set"}
    assert nvlink == {"a100-0": "pass", "a100-1": "pass"}, nvlink
    metrics = records(run, "metrics.jsonl")
    for bench in ("probe", "matmul", "hbm", "inference"):
        nodes = {m["node"] for m in metrics if m["benchmark"] == bench}
        assert nodes == {"a100-0", "l4-shared-0"}, f"{bench}: records on {nodes} (one node per product)"
    benches = [m for m in metrics if m["benchmark"] in ("probe", "matmul", "hbm", "inference", "allreduce")]
    assert benches and all(json.loads(m["parameters"]).get("sizes") == "quick" for m in benches), benches[:2]
    multi = {m["node"] for m in metrics if m["benchmark"] in ("allreduce", "fabric")}
    assert {"a100-0", "2 nodes", "a100-0<->a100-1", "a100-1"} <= multi, \
        f"all-reduce in a100-0, and across a100-0 and a100-1 (the fabric suite's pair and ring): records on {multi}"
    fabric = {(r["check"], r["verdict"]) for r in checks if r["feature"] == "fabric"}
    assert {("fabric-pair-result", "pass"), ("fabric-ring-result", "pass")} <= fabric, fabric
    visible = {m["node"]: m["value"] for m in metrics if m["metric"] == "nvml_visible_devices"}
    assert visible == {"a100-0": 2, "l4-shared-0": 1}, f"GPUs NVML shows the probe pod: {visible}"
    util = [m for m in metrics if m["benchmark"] == "utilization" and m["metric"] == "gpu_util_pct_mean"]
    assert util and all(json.loads(m["parameters"]).get("run_mode") == "cluster" for m in util), util[:2]
    # driver_runtime_management: a probe pod granted a GPU by NVIDIA's device plugin, and by a claim on NVIDIA's DRA
    # driver, reads through the mock NVML the driver and CUDA driver versions GFD labelled and the DRA driver published
    got = {(r["check"], r["target"]): (r["verdict"], str(r["actual"])) for r in checks if r["feature"] == "driver"}
    for node in (*kubelet_gpu_nodes, "a100-dra-0"):
        assert got[("driver-version-in-pod", node)] == ("pass", "550.163.01"), got
        assert got[("cuda-driver-version-in-pod", node)] == ("pass", "12.4"), got
        assert got[("driver-version-advertised", node)][0] == "pass", got
    assert "DRA driverVersion of gpu-0, gpu-1=550.163.1" in got[("driver-version-advertised", "a100-dra-0")][1]
    # secure_accelerator_access on runc (device plugin, time-sliced too) and DRA nodes: every check passes, the
    # granted container reaches exactly its one GPU (tests/test_access_kubelet.py: the toolkit's own fault)
    access = {(r["check"], r["target"]): r for r in checks if r["feature"] == "access"}
    access_nodes = (*kubelet_gpu_nodes, "a100-dra-0")
    assert {k for k, r in access.items() if r["verdict"] == "pass"} == {
        (c, n) for c in ("access-granted-one-gpu", "access-ungranted-none", "access-envvar-none",
                         "access-sibling-none") for n in access_nodes}, sorted(access)
    assert all(access[("access-granted-one-gpu", n)]["actual"].startswith("1 GPU: /dev/nvidia") for n in access_nodes)
    junit = (run / "junit.xml").read_text()
    for sub in ("PositiveAccessTest", "NegativeIsolationTest", "EnvVarIsolationTest", "MultiContainerIsolationTest"):
        assert f'classname="suites.test_access.TestSecureAcceleratorAccess" name="test_{sub}[a100-dra-0]"' in junit
    # the Kubernetes AI Conformance 1.37 evidence folder made from this run, checked by the CNCF CI's rules: what the
    # run shows is Implemented with anchors that exist; only metadata and the MUSTs gpuproof does not test are left
    from gpuproof.report.conformance import CHECKLISTS, write_evidence

    ev = write_evidence(run, tmp_path / "evidence")
    doc = yaml.safe_load((tmp_path / "evidence" / "PRODUCT.yaml").read_text())
    status = {r["id"]: r["status"] for items in doc["spec"].values() for r in items}
    assert {status[r] for r in ("secure_accelerator_access", "driver_runtime_management", "gpu_sharing")} == {
        "Implemented"}, status
    untested = {r.id for r in CHECKLISTS["1.37"] if r.level == "MUST"} - {"secure_accelerator_access"}
    assert {p.split(":")[0].rsplit(".", 1)[1] for p in ev.problems if p.startswith("spec.")} == untested, ev.problems
    assert all(p.startswith("spec.") or "still a placeholder" in p for p in ev.problems), ev.problems
    assert (tmp_path / "evidence" / "PRODUCT.md").is_file()


@pytest.mark.sim
@pytest.mark.kubelet  # tier: `gpuproof run --fleet` as a process, a kubelet node
@pytest.mark.skipif(bool(NEEDS), reason=NEEDS or "")
def test_the_bundle_without_dra_runs_the_gpu_host_fleet_and_refuses_lab(bundle_without_dra, tmp_path, monkeypatch):
    """What the GPU machine does (benchmarks/gpu_run.sh): the ``--without-dra`` bundle installed with no Go, then the
    gpu-host fleet over the host's driver, here a driver root whose library is NVIDIA's mock NVML
    (tests/test_gpuhost.py): NVIDIA's device plugin and GFD load that driver's NVML and advertise and label its two
    GPUs; a pod granted one sees exactly that one through the node's device files (the driver root's device
    numbers), a pod granted none sees none; the workloads keep the CPU path (the driver has no CUDA). lab itself is
    refused in one line, naming the flag."""
    from test_gpuhost import mock_driver_root

    _, config = mock_driver_root(tmp_path / "host", monkeypatch)
    uuids = {d["uuid"] for d in config["devices"]}
    proc, run, took = run_without_go(bundle_without_dra, tmp_path / "a", "gpu-host",
                                     "-k", "advertisement or labels or TestSecureAcceleratorAccess")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and run, f"gpu-host from the bundle failed:\n{out[-5000:]}"
    print(f"gpu-host over the mock driver from the --without-dra bundle, install included: {took:.0f}s",
          file=sys.stderr)
    checks = records(run, "checks.jsonl")
    on_node = [r for r in checks if r["target"] == "gpu-host-0"]
    assert on_node and all(r["verdict"] != "fail" for r in checks), [r for r in checks if r["verdict"] == "fail"]
    passed = {r["check"] for r in on_node if r["verdict"] == "pass"}
    assert {"access-granted-one-gpu", "access-ungranted-none", "access-envvar-none", "access-sibling-none",
            "capacity-matches-count", "gfd-labels-on-gpu-node"} <= passed, sorted(passed)
    granted = next(r for r in on_node if r["check"] == "access-granted-one-gpu")
    assert sum(u in granted["actual"] for u in uuids) == 1, granted          # one of the driver's two GPUs
    assert "NVIDIA-A100-SXM4-40GB" in (run / "inventory.json").read_text()   # the product the driver's NVML named
    proc, _, _ = run_without_go(bundle_without_dra, tmp_path / "b", "lab", "-k", "nodes")
    assert proc.returncode != 0 and "made with --without-dra" in proc.stdout + proc.stderr, proc.stderr[-3000:]

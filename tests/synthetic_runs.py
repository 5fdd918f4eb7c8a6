"""Run folders for the report tests, written through RunDir, whose metrics come from recorded benchmark results
passed through each benchmark's own ``to_records``: the records carry exactly the names and parameters the
benchmarks write, so a report test cannot pass on a vocabulary no benchmark speaks (issue #40).

The recorded results (tests/data/results/, their sources in SOURCES.md): matmul on one H100 (the first GPU run),
all-reduce (2 gloo ranks) and inference (the built-in server on the CPU) on a 2-core CI machine. For a product the
result was not measured on, matmul's figures are scaled by the two products' datasheet peaks (gpuproof's catalog
figures) and the dtypes it lacks are left out; all-reduce's and inference's figures are used as recorded.
``scale`` multiplies chosen metrics after that (to seed a regression); checks, samples and inventory are made up
in the shapes gpuproof writes them.

Try the reports on them: ``python tests/synthetic_runs.py /tmp/demo``.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import random
from pathlib import Path

from gpuproof.bench import get
from gpuproof.results import CheckRecord, RunDir

RESULTS = Path(__file__).resolve().parent / "data" / "results"
RECORDED = {"matmul": "h100-matmul.json", "allreduce": "cpu-allreduce.json", "inference": "cpu-inference.json"}
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
PEAK = {A100: {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
        H100: {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4}}
MEASURED_ON = H100          # the product of the recorded matmul result


def recorded(benchmark: str) -> dict:
    return json.loads((RESULTS / RECORDED[benchmark]).read_text())


def as_measured_on(benchmark: str, result: dict, product: str) -> dict:
    """``result`` as ``product`` would give it: matmul scaled by the datasheet peaks (dtypes without a peak for
    ``product`` left out); the others as recorded."""
    result = copy.deepcopy(result)
    if benchmark == "matmul" and product != MEASURED_ON:
        rows = []
        for row in result["results"]:
            if row["dtype"] not in PEAK[product]:
                continue
            ratio = PEAK[product][row["dtype"]] / PEAK[MEASURED_ON][row["dtype"]]
            for key in ("tflops", "tflops_best", "peak_tflops"):
                if row.get(key) is not None:
                    row[key] *= ratio
            for key in ("median_ms", "mean_ms", "min_ms", "p90_ms"):
                if row.get(key) is not None:
                    row[key] /= ratio
            rows.append(row)
        result["results"] = rows
        result["checks"] = [c for c in result.get("checks") or [] if c["dtype"] in PEAK[product]]
        result["device_name"] = product
        result.pop("utilization", None)         # the H100's samples are not this product's
    return result


def gpu_node(name: str, pool: str, product: str, driver: str = "550.54.15", cuda: str = "12.4",
             gpus: int = 8, memory_mib: int = 81920) -> dict:
    """One node in inventory.json's shape, with the labels GFD would set."""
    major, minor, rev = (driver.split(".") + ["", "", ""])[:3]
    cmaj, cmin = (cuda.split(".") + ["", ""])[:2]
    labels = {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus),
        "nvidia.com/gpu.memory": str(memory_mib), "nvidia.com/gpu.family": "ampere" if "A100" in product else "hopper",
        "nvidia.com/cuda.driver-version.major": major, "nvidia.com/cuda.driver-version.minor": minor,
        "nvidia.com/cuda.driver-version.revision": rev, "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.runtime-version.major": cmaj, "nvidia.com/cuda.runtime-version.minor": cmin,
        "nvidia.com/cuda.runtime-version.full": cuda, "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/mig.strategy": "none", "nvidia.com/gpu.replicas": "1",
    }
    capacity = {"nvidia.com/gpu": str(gpus), "cpu": "96", "memory": "1056000Mi", "pods": "110"}
    return {"name": name, "pool": pool, "gpu": True, "product": product, "gpu_count": gpus,
            "gpu_memory_mib": memory_mib, "driver_version": driver, "cuda_version": cuda,
            "sharing_strategy": "none", "replicas": 1, "mig_strategy": "none", "labels": labels,
            "capacity": capacity, "allocatable": dict(capacity), "taints": ["nvidia.com/gpu=present:NoSchedule"]}


def fleet_inventory(nodes_per_pool: int = 2, k8s: str = "v1.35.4") -> dict:
    nodes = [gpu_node(f"a100-{i}", "a100", A100) for i in range(nodes_per_pool)]
    nodes += [gpu_node(f"h100-{i}", "h100", H100, memory_mib=81559) for i in range(nodes_per_pool)]
    nodes.append({"name": "cpu-0", "pool": "cpu", "gpu": False, "product": "", "gpu_count": 0, "labels": {},
                  "capacity": {"cpu": "32", "memory": "128000Mi", "pods": "110"},
                  "allocatable": {"cpu": "32", "memory": "128000Mi", "pods": "110"}, "taints": []})
    return {"captured": "2025-01-01T00:00:00+00:00", "cluster": "embedded", "kubernetes_version": k8s, "nodes": nodes}


def set_driver(inventory: dict, node: str, driver: str) -> dict:
    """A copy of ``inventory`` whose ``node`` runs ``driver`` (labels included)."""
    inv = copy.deepcopy(inventory)
    for n in inv["nodes"]:
        if n["name"] == node:
            fresh = gpu_node(n["name"], n["pool"], n["product"], driver=driver, cuda=n["cuda_version"],
                             gpus=n["gpu_count"], memory_mib=n["gpu_memory_mib"])
            n["driver_version"] = driver
            n["labels"] = fresh["labels"]
    return inv


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="{failures}" skipped="2" tests="6" time="12.3">
<testcase classname="suites.test_advertisement" name="test_capacity_matches_count[a100]" time="0.8"/>
<testcase classname="suites.test_advertisement" name="test_capacity_matches_count[h100]" time="0.7"/>
<testcase classname="suites.test_labels" name="test_gfd_labels_present" time="1.1">{label_failure}</testcase>
<testcase classname="suites.test_scheduling" name="test_gpu_pod_lands_on_gpu_node" time="4.2"/>
<testcase classname="suites.test_mig" name="test_mig_profiles" time="0.0">
  <skipped type="pytest.skip" message="no MIG-enabled pool in this fleet">suites/test_mig.py:12: no MIG</skipped>
</testcase>
<testcase classname="suites.test_gpu" name="test_nvidia_smi_in_pod" time="0.0">
  <skipped type="pytest.skip" message="needs a real GPU (embedded cluster)">suites/test_gpu.py:8: no GPU</skipped>
</testcase>
</testsuite></testsuites>
"""


def make_run(root: str | Path, run_id: str, *, scale: dict[str, float] | None = None,
             inventory: dict | None = None, fail_labels: bool = True, samples: bool = True,
             junit: bool = True, seed: int = 1, noise: float = 0.0) -> Path:
    """A complete run: checks, the recorded matmul/allreduce/inference metrics on each GPU product of the inventory
    (on its first node of that product), samples, inventory and junit.xml. ``scale`` maps "benchmark/metric" (or
    "benchmark/metric/dtype") to a factor applied to that metric, e.g. {"matmul/tflops/fp16": 0.9}."""
    scale = scale or {}
    rng = random.Random(seed)
    inventory = inventory or fleet_inventory()
    started = _dt.datetime(2025, 1, 1, 12, 0, tzinfo=_dt.timezone.utc)
    run = RunDir.create(root, run_id=run_id, target="embedded", cluster="embedded",
                        kubernetes_version=inventory.get("kubernetes_version", ""), fleet="fleets/mixed.yaml",
                        gpuproof_version="0.1.0", started=started.isoformat(), argv=["gpuproof", "run"])
    run.write_inventory(inventory)

    def factor(bench: str, metric: str, extra: str = "") -> float:
        f = scale.get(f"{bench}/{metric}", 1.0) * (scale.get(f"{bench}/{metric}/{extra}", 1.0) if extra else 1.0)
        return f * (1 + rng.uniform(-noise, noise))

    gpu_nodes = [n for n in inventory["nodes"] if n.get("gpu")]
    for n in inventory["nodes"]:
        ok = {"feature": "advertisement", "target": n["name"], "pool": n.get("pool", ""),
              "product": n.get("product", "")}
        want = str(n.get("gpu_count", 0))
        got = n.get("capacity", {}).get("nvidia.com/gpu", "0")
        run.add_check(CheckRecord(check="capacity-matches-count", verdict="pass" if got == want else "fail",
                                  expected=want, actual=got, **ok))
        if n.get("gpu"):
            labels_ok = not (fail_labels and n["name"] == gpu_nodes[-1]["name"])
            run.add_check(CheckRecord(feature="labels", check="gfd-labels-present", target=n["name"],
                                      verdict="pass" if labels_ok else "fail", pool=n["pool"], product=n["product"],
                                      expected={"nvidia.com/gpu.count": want},
                                      actual={"nvidia.com/gpu.count": want if labels_ok else None},
                                      message="" if labels_ok else "label nvidia.com/gpu.count missing on the node"))
            run.add_check(CheckRecord(feature="taints", check="gpu-taint-present", target=n["name"], verdict="pass",
                                      pool=n["pool"], product=n["product"],
                                      expected="nvidia.com/gpu=present:NoSchedule",
                                      actual="nvidia.com/gpu=present:NoSchedule"))
    for pool in sorted({n["pool"] for n in gpu_nodes}):
        run.add_check(CheckRecord(feature="mig", check="mig-profiles", target=f"pool/{pool}", verdict="skip",
                                  message="pool has no MIG strategy"))
        run.add_check(CheckRecord(feature="timeslicing", check="replicas-advertised", target=f"pool/{pool}",
                                  verdict="warn" if pool == "h100" else "pass", expected="32", actual="8",
                                  message="time-slicing configured but not advertised yet" if pool == "h100" else ""))
    run.add_check(CheckRecord(feature="quota", check="gpu-quota-enforced", target="cluster", verdict="pass",
                              expected="403 Forbidden", actual="403 Forbidden"))
    # nodes checks left out when they ran (gpuproof.plugin.coverage)
    if len(gpu_nodes) > 1:
        cordoned, kwok = gpu_nodes[1], gpu_nodes[-1]
        run.add_coverage([{"check": check, "feature": feature, "node": cordoned["name"], "pool": cordoned["pool"],
                           "reason": "cannot take pods: cordoned (spec.unschedulable)"}
                          for feature, check in (("taints", "test_tolerating_gpu_pod_lands"),
                                                 ("health", "test_health_per_node"))])
        run.add_coverage([{"check": "test_health_per_node", "feature": "health", "node": kwok["name"],
                           "pool": kwok["pool"], "reason": "simulated (kwok): no GPU executes there, and this check "
                                                           "needs real GPUs"}])

    for product in sorted({n["product"] for n in gpu_nodes}):
        node = next(n["name"] for n in gpu_nodes if n["product"] == product)
        for benchmark in RECORDED:
            result = as_measured_on(benchmark, recorded(benchmark), product)
            records = get(benchmark).to_records(result, node=node, product=product)
            for record in records:
                if isinstance(record.value, (int, float)) and not isinstance(record.value, bool):
                    record.value *= factor(benchmark, record.metric, str(record.parameters.get("dtype") or ""))
            run.add_metrics(records)

    if samples:
        phases = [("warmup", 10), ("matmul", 40), ("allreduce", 30), ("idle", 10)]
        rows, t = [], 0
        for phase, ticks in phases:
            for _ in range(ticks):
                ts = (started + _dt.timedelta(seconds=t)).isoformat()
                for idx in range(2):
                    busy = {"warmup": 20, "matmul": 97, "allreduce": 70, "idle": 0}[phase]
                    util = max(0, min(100, busy + rng.uniform(-3, 3)))
                    rows.append({"ts": ts, "node": "local", "gpu_index": idx, "gpu_uuid": f"GPU-{idx:04d}",
                                 "gpu_name": "NVIDIA H100 80GB HBM3", "phase": phase, "gpu_util": round(util, 1),
                                 "mem_util": round(util * 0.6, 1), "mem_used_mib": 1024 + util * 700,
                                 "power_w": 90 + util * 5.6, "temp_c": 35 + util * 0.35,
                                 "sm_clock_mhz": 1980 if busy else 345})
                t += 1
        run.add_samples(rows)
    if junit:
        failure = ('<failure message="AssertionError: node h100-1 lacks label nvidia.com/gpu.count">'
                   'assert None == \'8\'</failure>') if fail_labels else ""
        (run.path / "junit.xml").write_text(JUNIT.format(failures=1 if fail_labels else 0, label_failure=failure))
    run.meta.finished = (started + _dt.timedelta(minutes=3, seconds=12)).isoformat()
    run.finalize(outcome="failed" if fail_labels else "passed")
    run.meta.finished = (started + _dt.timedelta(minutes=3, seconds=12)).isoformat()
    run.write_meta()
    return run.path


if __name__ == "__main__":  # pragma: no cover - a convenience for trying the reports
    import sys

    from gpuproof.report import write_all

    root = Path(sys.argv[1] if len(sys.argv) > 1 else "reports")
    path = make_run(root, "demo-before", noise=0.01)
    after = make_run(root, "demo-after", scale={"matmul/tflops/fp16": 0.9},
                     inventory=set_driver(fleet_inventory(), "a100-0", "560.35.03"), noise=0.01, seed=2)
    for p in (path, after):
        print(write_all(p))

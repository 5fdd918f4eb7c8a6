"""One product catalog (issue #51 item 3): the datasheet peaks live in gpuproof/catalog.yaml and reach the workloads'
pods as catalog.json in the workloads' ConfigMap, so that adding a product is one entry in one file.

The values themselves are pinned in tests/test_workloads_formulas.py (TFLOPS) and tests/test_hbm.py (bandwidth).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from gpuproof import catalog
from gpuproof.bench import workloads as wl

datasheet = wl.import_workload("datasheet")
matmul = wl.import_workload("matmul")

# a product the shipped catalog does not have, as one entry of products: (figures made up for the test)
B300 = ("  - {label: NVIDIA-B300, memoryMiB: 275040, family: blackwell, compute: \"10.3\", sms: 148, mig: unknown,\n"
        "     peaks: {hbmTBps: 8.0, tflops: {fp32: 75.0, tf32: 1100.0, bf16: 2250.0, fp16: 2250.0, fp8: 4500.0}}}\n")


def with_b300(tmp_path):
    """A copy of gpuproof's catalog with B300 added as the last product: the one change."""
    text = catalog.CATALOG_FILE.read_text()
    head, sep, rest = text.partition("\nmigTables:")
    assert sep, "catalog.yaml has its products before migTables"
    path = tmp_path / "catalog.yaml"
    path.write_text(head.rstrip("\n") + "\n" + B300 + sep + rest)
    return path


def test_the_workloads_read_every_product_as_gpuproof_does():
    """datasheet.py (no gpuproof in a pod) finds each product by its label and NVML name, as catalog.lookup does,
    and reads the same figures catalog.py parses."""
    for label, product in catalog.PRODUCTS.items():
        for name in {label, label.replace("-", " ", 1), product.nvml or label, f"{label}-MIG-1g.10gb",
                     f"{label}-SHARED"}:
            assert catalog.lookup(name) is product, name
            assert datasheet.product(name)["label"] == label, name
        peaks = product.peaks
        assert matmul.peak_key(label) == (peaks.name if peaks and peaks.tflops else None), label
        assert matmul.hbm_key(label) == (peaks.name if peaks and peaks.hbm_tbps is not None else None), label
        assert matmul.peak_hbm_tbps(label) == (peaks.hbm_tbps if peaks else None), label
        for dtype in catalog.DTYPES:
            assert matmul.peak_tflops(label, dtype) == (peaks.tflops_of(dtype) if peaks else None), (label, dtype)
    assert datasheet.product("NVIDIA GeForce RTX 4090") is None and matmul.peak_key("") is None


def test_the_configmap_ships_the_catalog_as_json():
    files = wl.workload_files(include_pynvml=False)
    shipped = json.loads(files[wl.CATALOG_JSON])
    assert shipped == yaml.safe_load(catalog.CATALOG_FILE.read_text())
    cm = wl.configmap(labels={"a": "b"}, namespace="ns", include_pynvml=False)
    assert cm["data"][wl.CATALOG_JSON] == files[wl.CATALOG_JSON] and "datasheet.py" in cm["data"]


def test_a_peak_dtype_the_workloads_do_not_measure_is_refused(tmp_path):
    path = tmp_path / "catalog.yaml"
    path.write_text(catalog.CATALOG_FILE.read_text().replace("tflops: {fp32: 8.1,", "tflops: {fp64: 0.25, fp32: 8.1,"))
    with pytest.raises(ValueError, match="Tesla-T4: peaks.tflops names no dtype gpuproof measures: fp64"):
        catalog._load(path)


POD_CHECK = """\
import json, sys
import census, datasheet, hbm, matmul
g = {"dtype": "bf16", "matmul_tflops": 1125.0, "d2d_copy_gbps": 6000.0}
census.datasheet(g, "NVIDIA B300")
print(json.dumps({"catalog": str(datasheet.catalog_file()), "yaml": "yaml" in sys.modules, "census": g,
                  "matmul": [matmul.peak_key("NVIDIA B300"), matmul.peak_tflops("NVIDIA-B300", "fp8")],
                  "hbm": hbm.ratio_to_peak(4000.0, "NVIDIA B300"), "h100": matmul.peak_tflops("NVIDIA H100 80GB HBM3",
                                                                                            "bf16")}))
"""


@pytest.mark.server  # tier: the workloads as a process, as in a pod
def test_a_product_added_to_the_catalog_reaches_the_census_and_matmul_peaks(tmp_path):
    """Adding NVIDIA B300 to (a copy of) catalog.yaml, and changing no other file: the workloads' ConfigMap carries
    it, and in a folder holding only what the ConfigMap holds, run by a Python without site-packages (no gpuproof,
    no PyYAML: a stock image at worst), the census' datasheet figures and matmul's and hbm's peaks know it."""
    path = with_b300(tmp_path)
    assert catalog._load(path)[0]["NVIDIA-B300"].peaks == catalog.Peaks(
        "NVIDIA-B300", (("fp32", 75.0), ("tf32", 1100.0), ("bf16", 2250.0), ("fp16", 2250.0), ("fp8", 4500.0)), 8.0)
    assert "NVIDIA-B300" not in catalog.PRODUCTS and matmul.peak_key("NVIDIA B300") is None    # the shipped one

    pod = tmp_path / "gpuproof-workloads"            # the ConfigMap, mounted
    pod.mkdir()
    for name, text in wl.workload_files(include_pynvml=False, catalog=path).items():
        (pod / name).write_text(text)
    (pod / "check.py").write_text(POD_CHECK)
    env = {k: v for k, v in os.environ.items() if k != datasheet.CATALOG_ENV}
    proc = subprocess.run([sys.executable, "-S", "-E", str(pod / "check.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["catalog"] == str(pod / "catalog.json") and out["yaml"] is False
    g = out["census"]
    assert (g["peak_key"], g["peak_tflops"], g["matmul_ratio_to_peak"]) == ("NVIDIA-B300", 2250.0, 0.5)
    assert (g["hbm_key"], g["peak_hbm_gbps"], g["copy_ratio_to_peak"]) == ("NVIDIA-B300", 8000.0, 0.75)
    assert out["matmul"] == ["NVIDIA-B300", 4500.0] and out["hbm"] == [8000.0, 0.5]
    assert out["h100"] == 989.0                       # the catalog's other products as they were

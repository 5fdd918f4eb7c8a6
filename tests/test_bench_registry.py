"""The benchmark registry: parameters, CLI flags, records from results, cluster manifests."""

import pytest

from gpuproof.bench import REGISTRY, get, names
from gpuproof.bench.base import flag_args, pod_name
from gpuproof.errors import GpuproofError
from gpuproof.results import MetricRecord

LABELS = {"gpuproof.dev/run": "r1"}


def test_registry():
    assert names()[:4] == ["probe", "matmul", "allreduce", "inference"]
    assert "hbm" in names()  # gpuproof/bench/hbm.py, imported by gpuproof.bench
    for name in REGISTRY:
        b = get(name)
        assert b.name == name and b.script and b.description and b.ci_params is not None
    with pytest.raises(GpuproofError, match="unknown benchmark"):
        get("nope")


def test_params_layering():
    m = get("matmul")
    assert m.params(device="cuda")["sizes"] == "8192"
    assert m.params(device="cpu")["sizes"] == "512"          # CPU defaults
    p = m.params({"sizes": "64", "iters": None}, device="cpu")
    assert p["sizes"] == "64" and p["iters"] == 20            # None means "not given"
    assert m.workload_args(p)[:2] == ["--device", "cpu"]
    assert "--sizes" in m.workload_args(p)


def test_flag_args():
    assert flag_args({"a": 1, "b": None, "c": True, "d": False, "e": [1, 2]},
                     {"a": "--a", "b": "--b", "c": "--c", "d": "--d", "e": "--e"}) == [
        "--a", "1", "--c", "--e", "1,2"]


def test_pod_names_are_dns_safe():
    n = pod_name("matmul", "NVIDIA-H100-80GB-HBM3")
    assert n == "bench-matmul-nvidia-h100-80gb-hbm3"
    assert len(pod_name("allreduce", "X" * 200)) <= 50


MATMUL_RESULT = {
    "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "ok": True,
    "results": [{"dtype": "bf16", "m": 8192, "n": 8192, "k": 8192, "iters": 50, "median_ms": 1.4,
                 "tflops": 785.4, "ratio_to_peak": 0.794, "peak_tflops": 989.0, "sm_clock_mhz_mean": 1980.0,
                 "sm_clock_mhz_max": 1980.0, "ratio_to_peak_at_clock": 0.794, "throttled_fraction": 0.0}],
    "checks": [{"dtype": "bf16", "size": 256, "rel_err": 0.002, "tolerance": 0.015, "ok": True}],
    "utilization": {"available": True, "phases": {"matmul:bf16:8192x8192x8192": {"duration_s": 2.0, "gpus": {
        "0": {"n": 20, "gpu_util_pct": {"mean": 99.0, "p95": 100.0}, "power_w": {"mean": 690.0, "p95": 700.0},
              "energy_j": 1380.0, "clock_event_reasons": [], "throttled_fraction": 0.0}}}}},
}


def test_matmul_records():
    recs = get("matmul").to_records(MATMUL_RESULT, node="gpu-1", product="NVIDIA-H100-80GB-HBM3")
    assert all(isinstance(r, MetricRecord) for r in recs)
    by = {(r.benchmark, r.metric): r for r in recs}
    t = by[("matmul", "tflops")]
    assert (t.value, t.unit, t.node, t.product) == (785.4, "TFLOPS", "gpu-1", "NVIDIA-H100-80GB-HBM3")
    assert t.parameters["dtype"] == "bf16" and t.parameters["m"] == 8192
    assert by[("matmul", "ratio_to_peak")].value == 0.794
    at_clock = by[("matmul", "ratio_to_peak_at_clock")]
    assert at_clock.value == 0.794 and at_clock.parameters["sm_clock_mhz_max"] == 1980.0
    assert by[("matmul", "check_rel_err")].parameters["tolerance"] == 0.015
    assert by[("utilization", "gpu_util_pct_mean")].value == 99.0
    assert by[("utilization", "power_w_p95")].parameters["phase"] == "matmul:bf16:8192x8192x8192"
    row = t.as_row()  # long format: parameters as canonical JSON
    assert set(row) >= {"run_id", "cluster", "node", "product", "benchmark", "parameters", "metric", "value", "unit"}


def test_allreduce_records():
    result = {"device": "cuda", "backend": "nccl", "world_size": 8, "nnodes": 1, "ok": True,
              "results": [{"size_bytes": 2**30, "count": 2**28, "type": "float32", "redop": "sum",
                           "time_us": 10000.0, "algbw_gbps": 107.37, "busbw_gbps": 187.9, "wrong": 0}],
              "avg_busbw_gbps": 187.9, "max_busbw_gbps": 187.9, "wrong_total": 0}
    recs = get("allreduce").to_records(result, node="n", product="P")
    busbw = next(r for r in recs if r.metric == "busbw_gbps")
    assert busbw.unit == "GB/s" and busbw.parameters["size_bytes"] == 2**30 and busbw.parameters["world_size"] == 8
    assert {r.metric for r in recs} >= {"algbw_gbps", "time_us", "wrong", "avg_busbw_gbps", "wrong_total"}
    assert not {"no_bandwidth", "stragglers", "node_inter_busbw_gbps"} & {r.metric for r in recs}


def test_allreduce_per_node_records_name_the_node():
    node = {"intra_busbw_gbps": 450.0, "inter_busbw_gbps": 45.0, "straggler": False, "straggler_reason": None}
    result = {"device": "cuda", "backend": "nccl", "world_size": 24, "nnodes": 3, "ok": True, "results": [],
              "straggler_pct": 80.0, "per_node_size_bytes": 2**28, "stragglers": ["gpu-c"],
              "nodes": [{**node, "node": "gpu-a"}, {**node, "node": "gpu-b"},
                        {**node, "node": "gpu-c", "inter_busbw_gbps": 20.0, "straggler": True,
                         "straggler_reason": "inter-node busbw 20 GB/s is below 80% of the median 45 GB/s"}]}
    recs = get("allreduce").to_records(result, node="3 nodes", product="P")
    inter = {r.node: r.value for r in recs if r.metric == "node_inter_busbw_gbps"}
    assert inter == {"gpu-a": 45.0, "gpu-b": 45.0, "gpu-c": 20.0}
    flag = {r.node: (r.value, r.parameters["reason"]) for r in recs if r.metric == "straggler"}
    assert flag["gpu-c"][0] == 1.0 and "below 80%" in flag["gpu-c"][1] and flag["gpu-a"] == (0.0, "")
    (count,) = [r for r in recs if r.metric == "stragglers"]
    assert (count.value, count.node, count.parameters["names"]) == (1.0, "3 nodes", "gpu-c")


def test_cluster_manifests_from_benchmarks():
    m = get("matmul")
    (pod,) = m.manifests(m.params(device="cuda"), labels=LABELS, namespace="ns", name="bench-matmul-x",
                         product="NVIDIA-L4", node="n1")
    assert pod["spec"]["containers"][0]["command"][:2] == ["python", "/gpuproof/workloads/matmul.py"]
    a = get("allreduce")
    (ar,) = a.manifests(a.params({"nproc": 4}, device="cuda"), labels=LABELS, namespace="ns", name="ar",
                        gpus=8)
    cmd = ar["spec"]["containers"][0]["command"]
    assert cmd[0] == "torchrun" and "--nproc-per-node=8" in cmd and "--nproc" not in cmd
    (ar,) = a.manifests(a.params({"straggler_pct": 70, "ranks_per_node": 2}, device="cuda"), labels=LABELS,
                        namespace="ns", name="ar", gpus=8)
    cmd = ar["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--straggler-pct") + 1] == "70" and "--ranks-per-node" not in cmd
    i = get("inference")
    dep, svc, load = i.manifests(i.params(device="cuda"), labels=LABELS, namespace="ns", name="infer")
    assert (dep["kind"], svc["kind"], load["kind"]) == ("Deployment", "Service", "Pod")
    assert "http://infer.ns.svc:8000" in load["spec"]["containers"][0]["command"]
    assert "--rates" in load["spec"]["containers"][0]["command"]


def _node(name, capacity, labels=None):
    from gpuproof.discovery.nodes import GpuNode

    return GpuNode(name=name, labels=labels or {}, capacity=capacity, allocatable=capacity, taints=[])


def test_node_gpus_picks_the_resource_a_pod_can_get():
    from types import SimpleNamespace

    from gpuproof.plugin.bench_checks import node_gpus

    nodes = {
        "whole": _node("whole", {"nvidia.com/gpu": "8"}),
        "sliced": _node("sliced", {"nvidia.com/gpu": "16"},
                        {"nvidia.com/gpu.present": "true", "nvidia.com/gpu.replicas": "4"}),  # GFD-labelled
        "renamed": _node("renamed", {"nvidia.com/gpu.shared": "8"}),
        "mig": _node("mig", {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"}),
    }
    d = SimpleNamespace(node=lambda n: nodes[n])
    assert node_gpus(d, "whole") == ("nvidia.com/gpu", 1)
    assert node_gpus(d, "whole", all_gpus=True) == ("nvidia.com/gpu", 8)
    assert node_gpus(d, "sliced", all_gpus=True) == ("nvidia.com/gpu", 1)
    assert node_gpus(d, "renamed", all_gpus=True) == ("nvidia.com/gpu.shared", 1)
    assert node_gpus(d, "mig", all_gpus=True) == ("nvidia.com/mig-3g.40gb", 1)
    assert node_gpus(d, "missing") == ("nvidia.com/gpu", 1)


def test_a_server_that_will_not_stop_costs_its_own_summary_not_the_load_figures(monkeypatch, tmp_path):
    """``gpuproof bench --local inference``: when the server outlives SIGTERM by 60 s it is killed, and
    the load's figures (steps, capacity, verdict) are kept with a note saying what is missing, instead
    of the whole run failing (it did on an H200 before the server woke on a signal any thread got)."""
    from gpuproof.bench import inference as bm
    from gpuproof.errors import WaitTimeout

    load_result = {"ok": True, "verdict": "pass", "url": "http://127.0.0.1:1", "steps": [], "capacity_rps": 7.0}

    class Fake:
        def __init__(self, script, args, env=None, echo=False):
            self.script, self.proc = script, self
            if script == "inference_server":
                port_file = args[args.index("--port-file") + 1]
                with open(port_file, "w") as fh:
                    fh.write("1")

        def poll(self):
            return None

        def terminate(self):
            pass

        def wait(self, timeout):
            if self.script == "inference_server":
                raise WaitTimeout("inference_server did not finish within 60s; last output:\n...")
            return dict(load_result)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(bm, "WorkloadProcess", Fake)
    inf = bm.Inference()
    result = inf.run_local(inf.params({}, device="cpu"))
    assert result["ok"] is True and result["load"]["capacity_rps"] == 7.0
    assert result["server_error"].startswith("the inference server did not stop within 60 s of SIGTERM")
    assert "inference_server did not finish within 60s" in result["server_error"]
    assert result["utilization"]["available"] is False
    assert inf.to_records(result) is not None   # the records are still written


def test_each_benchmark_takes_its_own_options_and_writes_its_own_line():
    """What differs per benchmark lives in its class (issue #40): `gpuproof bench` asks each registered benchmark
    which of its options it takes and for its headline; every parameter it takes is one it knows."""
    from gpuproof.cli.main import build_parser

    args = build_parser().parse_args(["bench", "--local", "all", "--sizes", "256", "--threads", "2"])
    for name in names():
        bench = get(name)
        taken = bench.cli_params(args)
        assert taken["threads"] == 2, name
        unknown = set(taken) - set(bench.defaults) - set(bench.flags)
        assert not unknown, f"{name} takes options it has no parameter for: {unknown}"
        assert isinstance(bench.headline({}), str), name
    assert get("matmul").cli_params(args)["sizes"] == "256"
    assert get("matmul").headline(MATMUL_RESULT) == "bf16 8192: 785 TFLOPS (79% of peak)"


def test_the_help_lists_the_registry():
    """`gpuproof bench --help` lists every registered benchmark with its description: a new benchmark needs no
    edit of the CLI (issue #40 item 3)."""
    from gpuproof.cli.bench import _listing

    text = _listing()
    for name in names():
        assert f"\n  {name:<11} {get(name).description[:40]}" in text, name


def test_the_command_line_and_the_pytest_glue_switch_on_no_benchmark_name():
    """What differs per benchmark lives in its class (issue #40 item 3): no comparison in gpuproof/cli/ or
    gpuproof/plugin/ names a registered benchmark (``name == "inference"``, ``"allreduce" in todo``), so a new
    benchmark is a module in gpuproof/bench/ and no edit here."""
    import ast
    from pathlib import Path

    def strings(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, (ast.Set, ast.List, ast.Tuple)):
            for element in node.elts:
                yield from strings(element)

    pkg = Path(__file__).resolve().parents[1] / "gpuproof"
    found = []
    for path in sorted([*(pkg / "cli").rglob("*.py"), *(pkg / "plugin").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                named = set(names()) & {s for side in (node.left, *node.comparators) for s in strings(side)}
                if named:
                    found.append(f"{path.relative_to(pkg.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not found, "benchmark name switches outside the classes:\n" + "\n".join(found)


def test_all_reduce_takes_one_rank_per_gpu_on_cuda_unless_told(monkeypatch):
    """`gpuproof bench --local allreduce` on CUDA without --nproc: one local rank per GPU torch sees (the class's
    cli_params, given the device); --nproc as given; on the CPU the default (1)."""
    import sys
    from types import SimpleNamespace

    from gpuproof.cli.main import build_parser

    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(cuda=SimpleNamespace(device_count=lambda: 8)))
    bench = get("allreduce")
    args = build_parser().parse_args(["bench", "--local", "allreduce"])
    assert bench.params(bench.cli_params(args, "cuda"), device="cuda")["nproc"] == 8
    assert bench.params(bench.cli_params(args, "cpu"), device="cpu")["nproc"] == 1
    given = build_parser().parse_args(["bench", "--local", "allreduce", "--nproc", "2"])
    assert bench.params(bench.cli_params(given, "cuda"), device="cuda")["nproc"] == 2


def test_what_the_local_run_needs_and_notes_is_the_benchmarks_own():
    """torch for every workload, locust for inference's load generator; probe alone leaves no utilization summary
    (gpuproof bench notes an empty one for the others)."""
    assert {name: get(name).local_modules for name in names()} == {
        name: ("torch", "locust") if name == "inference" else ("torch",) for name in names()}
    assert [name for name in names() if not get(name).samples_utilization] == ["probe"]


def test_inference_takes_its_load_generators_image_from_the_run(monkeypatch):
    """The cluster's lent workload image (it has locust), else $GPUPROOF_LOADGEN_IMAGE, else locust's own: the
    benchmark's choice, so the bench suites pass only the workload image."""
    from types import SimpleNamespace

    from gpuproof.bench import inference
    from gpuproof.images import DEFAULT_LOADGEN_IMAGE

    monkeypatch.delenv(inference.LOADGEN_IMAGE_ENV, raising=False)
    assert inference.load_generator_image(SimpleNamespace()) == DEFAULT_LOADGEN_IMAGE
    monkeypatch.setenv(inference.LOADGEN_IMAGE_ENV, "mirror/locust:1")
    assert inference.load_generator_image(None) == "mirror/locust:1"
    assert inference.load_generator_image(SimpleNamespace(workload_image="lent")) == "lent"

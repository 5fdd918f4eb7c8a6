"""Baselines and regression rules: a seeded 10% regression is flagged, a 2% change
under a 5% rule is not, and bad rules files are reported by field."""

import json
import time

import pytest

from gpuproof.cli.main import main
from gpuproof.errors import GpuproofError
from gpuproof.report.baseline import (
    RulesError,
    check_run,
    judge,
    load_baseline,
    load_rules,
    make_baseline,
    parse_rules,
    save_baseline,
)
from gpuproof.report.data import load_run
from synthetic_runs import make_run
from gpuproof.results import MetricRecord, RunDir

RULES = """\
rules:
  - metric: matmul/tflops
    tolerance: 5%
    direction: higher_is_better
  - metric: "re:^inference/p(50|99)_ms$"
    tolerance: 0.05
    direction: lower_is_better
  - metric: allreduce/busbw_gbps
    parameters: {size_bytes: "16777216"}
    tolerance: 0.05
    direction: higher_is_better
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    base = make_run(root, "base")
    after = make_run(root, "after", scale={
        "matmul/tflops/fp16": 0.90,          # the seeded 10% regression
        "matmul/tflops/bf16": 0.98,          # a 2% drop: within the 5% rule
        "allreduce/busbw_gbps": 0.98,
        "inference/p99_ms": 1.02,    # 2% slower: within the 5% rule
        "inference/p50_ms": 0.80,    # 20% faster: improved
    })
    rules = root / "rules.yaml"
    rules.write_text(RULES)
    baseline = root / "baseline.json"
    save_baseline(make_baseline([load_run(base)]), baseline)
    return {"root": root, "base": base, "after": after, "rules": rules, "baseline": baseline}


def _report(runs, run="after"):
    return check_run(load_run(runs[run]), load_baseline(runs["baseline"]), load_rules(runs["rules"]))


def test_seeded_ten_percent_regression_is_flagged_and_two_percent_is_not(runs):
    report = _report(runs)
    regressed = {(v.benchmark, v.metric, json.loads(v.parameters)["dtype"], v.product) for v in report.regressions}
    # fp16 tflops, both products: and nothing else
    assert {(b, m, d) for b, m, d, _ in regressed} == {("matmul", "tflops", "fp16")}
    assert len(report.regressions) == 2                      # 2 products x the recorded shape (8192)
    for v in report.regressions:
        assert v.change == pytest.approx(-0.10)
    by_name = {}
    for v in report.verdicts:
        by_name.setdefault((v.benchmark, v.metric, json.loads(v.parameters).get("dtype")), set()).add(v.status)
    assert by_name[("matmul", "tflops", "bf16")] == {"ok"}         # -2% under a 5% rule
    assert by_name[("allreduce", "busbw_gbps", "float32")] == {"ok"}
    assert by_name[("inference", "p99_ms", None)] == {"ok"}  # +2% latency under a 5% rule
    assert by_name[("inference", "p50_ms", None)] == {"improved"}
    # rows the rules do not cover are counted, not judged
    assert report.unjudged > 0
    assert not any(v.metric == "ratio_to_peak" for v in report.verdicts)


def test_same_run_against_its_own_baseline_is_clean(runs):
    report = _report(runs, "base")
    assert not report.regressions and report.count("improved") == 0 and report.count("ok") > 0


def test_check_command_exits_one_with_a_readable_table(runs, capsys):
    rc = main(["report", "check", str(runs["after"]), "--baseline", str(runs["baseline"]),
               "--rules", str(runs["rules"])])
    out, err = capsys.readouterr()
    assert rc == 1
    lines = out.splitlines()
    assert lines[0].split() == ["status", "metric", "parameters", "product", "baseline", "current", "change",
                                "allowed", "rule"]
    regression_lines = [line for line in lines if line.startswith("REGRESSION")]
    assert len(regression_lines) == 2
    assert all("matmul/tflops" in line and "dtype=fp16" in line and "-10.0%" in line and "≥ -5.0%" in line
               for line in regression_lines)
    assert "2 regressions" in out and "regression" in err
    assert "bf16" not in out                                  # within tolerance: only with --all

    rc = main(["report", "check", str(runs["base"]), "--baseline", str(runs["baseline"]),
               "--rules", str(runs["rules"]), "--format", "md"])
    out, _ = capsys.readouterr()
    assert rc == 0 and out.startswith("## ✅ gpuproof regression check") and "0 regressions" in out


def test_check_json_and_all(runs, capsys, tmp_path):
    out_file = tmp_path / "check.json"
    rc = main(["report", "check", str(runs["after"]), "--baseline", str(runs["baseline"]),
               "--rules", str(runs["rules"]), "--format", "json", "-o", str(out_file)])
    assert rc == 1
    data = json.loads(out_file.read_text())
    assert data["regressions"] == 2
    assert {v["parameters"]["dtype"] for v in data["verdicts"] if v["status"] == "regression"} == {"fp16"}
    rc = main(["report", "check", str(runs["after"]), "--baseline", str(runs["baseline"]),
               "--rules", str(runs["rules"]), "--all"])
    assert "bf16" in capsys.readouterr().out


def test_baseline_is_the_median_of_several_runs(tmp_path):
    paths = [make_run(tmp_path, f"r{i}", scale={"matmul/tflops": f}, samples=False, junit=False)
             for i, f in enumerate((1.0, 1.2, 0.5))]
    baseline = make_baseline([load_run(p) for p in paths])
    single = make_baseline([load_run(paths[0])])
    key = lambda r: (r["benchmark"], r["metric"], r["parameters"], r["product"])  # noqa: E731
    ref = {key(r): r for r in single["metrics"]}
    tflops = [r for r in baseline["metrics"] if r["metric"] == "tflops"]
    assert tflops and all(r["n"] == 3 for r in tflops)
    for r in tflops:
        assert r["value"] == pytest.approx(ref[key(r)]["value"])       # median of 1.0, 1.2, 0.5 is 1.0
        assert r["min"] == pytest.approx(ref[key(r)]["value"] * 0.5)
    assert [run["run_id"] for run in baseline["runs"]] == ["r0", "r1", "r2"]


def test_baseline_make_command(runs, tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["report", "baseline", "make", str(runs["base"]), str(runs["after"]), "-o", str(out)]) == 0
    assert "metric rows from 2 run(s)" in capsys.readouterr().out
    assert json.loads(out.read_text())["kind"] == "gpuproof-baseline"


def test_judge_directions_and_absolute_tolerance():
    (rule_hi,) = parse_rules([{"metric": "*", "tolerance": 0.05, "direction": "higher_is_better"}])
    (rule_lo,) = parse_rules([{"metric": "*", "tolerance": "5%", "direction": "lower_is_better", "abs_tolerance": 0.5}])
    assert judge(100, 90, rule_hi) == "regression"
    assert judge(100, 98, rule_hi) == "ok"
    assert judge(100, 95, rule_hi) == "ok"                    # exactly at the tolerance is allowed
    assert judge(100, 110, rule_hi) == "improved"
    assert judge(10, 11, rule_lo) == "regression"             # +10% and +1.0 > 0.5
    assert judge(1.0, 1.3, rule_lo) == "ok"                   # +30% but only +0.3 < abs_tolerance 0.5
    assert judge(0.0, 0.6, rule_lo) == "regression"           # from zero: only the absolute tolerance applies
    assert judge(0.0, 0.4, rule_lo) == "ok"


def test_rule_parameter_filters(runs):
    (rule,) = parse_rules({"rules": [{"metric": "matmul/*", "tolerance": 0.05, "direction": "higher_is_better",
                                      "parameters": {"dtype": ["fp16", "bf*"], "m": 8192}}]})
    assert rule.matches("matmul", "tflops", json.dumps({"dtype": "bf16", "m": 8192}))
    assert not rule.matches("matmul", "tflops", json.dumps({"dtype": "fp32", "m": 8192}))
    assert not rule.matches("matmul", "tflops", json.dumps({"dtype": "fp16", "m": 4096}))
    assert not rule.matches("matmul", "tflops", json.dumps({"m": 8192}))
    assert not rule.matches("allreduce", "busbw_gbps", "{}")


def test_new_and_missing_rows(tmp_path):
    base = make_run(tmp_path, "base", samples=False, junit=False)
    baseline = {k: v for k, v in load_baseline(_saved(tmp_path, base)).items() if k[1] != "p50_ms"}
    run = load_run(base)
    run.metrics = run.metrics[run.metrics["metric"] != "throughput_rps"]
    rules = parse_rules([{"metric": "inference/*", "tolerance": 0.05, "direction": "lower_is_better"}])
    report = check_run(run, baseline, rules)
    assert {v.metric for v in report.verdicts if v.status == "new"} == {"p50_ms"}
    assert {v.metric for v in report.verdicts if v.status == "missing"} == {"throughput_rps"}
    assert not report.regressions


def _saved(tmp_path, run_path):
    path = tmp_path / "saved-baseline.json"
    save_baseline(make_baseline([load_run(run_path)]), path)
    return path


@pytest.mark.parametrize("text, field", [
    ("rules:\n  - metric: matmul/tflops\n    tolerance: lots\n    direction: higher_is_better\n", "rules[0].tolerance"),
    ("rules:\n  - metric: matmul/tflops\n    tolerance: 0.05\n    direction: up\n", "rules[0].direction"),
    ("rules:\n  - metric: a\n    tolerance: 0.1\n    direction: lower_is_better\n"
     "  - tolerance: 0.05\n    direction: higher_is_better\n", "rules[1].metric"),
    ("rules:\n  - metric: a\n    tolerance: 0.05\n    direction: higher_is_better\n    tolerence: 3\n",
     "rules[0].tolerence"),
    ("rules:\n  - metric: 're:(['\n    tolerance: 0.05\n    direction: higher_is_better\n", "rules[0].metric"),
    ("rules:\n  - metric: a\n    tolerance: 0.05\n    direction: higher_is_better\n    parameters: [1]\n",
     "rules[0].parameters"),
    ("rules: []\n", "rules"),
    ("rule:\n  - metric: a\n", "rule"),
])
def test_malformed_rules_name_the_field(tmp_path, text, field):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RulesError) as exc:
        load_rules(path)
    assert str(exc.value).startswith(f"{path}: {field}:")


def test_bad_inputs_are_clear_errors(tmp_path, runs, capsys):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("rules: [unclosed\n")
    with pytest.raises(RulesError, match="not valid YAML"):
        load_rules(bad_yaml)
    with pytest.raises(GpuproofError, match="rules file .* not found"):
        load_rules(tmp_path / "nope.yaml")
    (tmp_path / "notbase.json").write_text("{}")
    with pytest.raises(RulesError, match="kind: not a gpuproof baseline"):
        load_baseline(tmp_path / "notbase.json")
    empty = RunDir(tmp_path / "empty-run")
    with pytest.raises(GpuproofError, match="has no metrics"):
        make_baseline([load_run(empty.path)])
    rc = main(["report", "check", str(tmp_path / "missing-run"), "--baseline", str(runs["baseline"]),
               "--rules", str(runs["rules"])])
    assert rc == 2 and "run folder" in capsys.readouterr().err


def _cpu_matmul_run(root, run_id, sizes=(96, 160)):
    """A run recorded from a real (tiny) CPU matmul benchmark, as the bench module would."""
    import numpy as np

    run = RunDir.create(root, run_id=run_id, cluster="local", target="local")
    rng = np.random.default_rng(0)
    for dtype in ("float32", "float64"):
        for n in sizes:
            a = rng.random((n, n), dtype=dtype)
            b = rng.random((n, n), dtype=dtype)
            reps, start = 0, time.perf_counter()
            while reps < 5 or time.perf_counter() - start < 0.02:
                a @ b
                reps += 1
            elapsed = time.perf_counter() - start
            tflops = 2 * n ** 3 * reps / elapsed / 1e12
            run.add_metric(MetricRecord("matmul", "tflops", tflops, "TFLOP/s",
                                        {"dtype": dtype, "m": n, "n": n, "k": n, "device": "cpu"},
                                        node="localhost", product="cpu"))
    run.finalize("passed")
    return run


def test_rules_on_a_recorded_cpu_benchmark(tmp_path):
    """Measured numbers, then a copy with one metric 10% lower and one 2% lower."""
    measured = _cpu_matmul_run(tmp_path, "cpu-a")
    seeded = RunDir.create(tmp_path, run_id="cpu-b", cluster="local", target="local")
    for row in measured.metrics():
        params = json.loads(row["parameters"])
        factor = {("float32", 160): 0.90, ("float64", 96): 0.98}.get((params["dtype"], params["n"]), 1.0)
        seeded.add_metric(MetricRecord(row["benchmark"], row["metric"], row["value"] * factor, row["unit"], params,
                                       node=row["node"], product=row["product"]))
    seeded.finalize("passed")
    baseline = make_baseline([load_run(measured.path)])
    save_baseline(baseline, tmp_path / "b.json")
    rules = parse_rules([{"metric": "matmul/tflops", "tolerance": 0.05, "direction": "higher_is_better"}])
    report = check_run(load_run(seeded.path), load_baseline(tmp_path / "b.json"), rules)
    flagged = [(json.loads(v.parameters)["dtype"], json.loads(v.parameters)["n"]) for v in report.regressions]
    assert flagged == [("float32", 160)]
    assert report.count("ok") == 3

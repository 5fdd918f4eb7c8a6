"""ci-templates/github-actions/gpuproof-nightly.yml: actionlint (built from its Go module) accepts it and
refuses broken copies; it asks for what the nightly needs; and its shell steps, run here as GitHub
runs them (bash -eo pipefail, GITHUB_OUTPUT/GITHUB_STEP_SUMMARY files), do what they say: the run
step against the embedded cluster, the rules check against a baseline, and a verdict that is the
rules' exit code.

actionlint is built by ./setup.sh; without it those tests skip, or fail under GPUPROOF_REQUIRE_TOOLS=1 (CI).
"""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpuproof.tools import for_test

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "ci-templates" / "github-actions"
WORKFLOW = TEMPLATES / "gpuproof-nightly.yml"
ACTIONLINT_CONFIG = TEMPLATES / "actionlint.yaml"
RULES = """\
rules:
  - metric: matmul/tflops
    tolerance: 5%
    direction: higher_is_better
"""


def actionlint(path: Path) -> subprocess.CompletedProcess:
    # shellcheck/pyflakes integration off: the result must not depend on what else is on PATH
    return subprocess.run([str(for_test("actionlint")), "-config-file", str(ACTIONLINT_CONFIG), "-shellcheck=",
                           "-pyflakes=", "-no-color", "-oneline", str(path)], capture_output=True, text=True,
                          timeout=60)


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps() -> dict[str, dict]:
    return {s.get("name") or s.get("uses"): s for s in workflow()["jobs"]["nightly"]["steps"]}


@pytest.mark.server  # tier: actionlint as a process
def test_actionlint_accepts_the_nightly_workflow():
    proc = actionlint(WORKFLOW)
    assert proc.returncode == 0, proc.stdout + proc.stderr


BROKEN = {
    # what is wrong: (text in the workflow, its broken form, what actionlint says)
    "runs-on-typo": ("    runs-on: [self-hosted", "    runs_on: [self-hosted", 'unexpected key "runs_on"'),
    "unknown-step-id": ("steps.check.outputs.code", "steps.chek.outputs.code", 'property "chek" is not defined'),
    "secrets-typo": ("secrets.GPUPROOF_KUBECONFIG }}", "secret.GPUPROOF_KUBECONFIG }}", 'undefined variable "secret"'),
    "unknown-runner-label": ("x64, gpu]", "x64, gpu-h100]", 'label "gpu-h100" is unknown'),
    "bad-cron": ('cron: "17 2 * * *"', 'cron: "17 25 * * *"', "invalid CRON format"),
    "unknown-input": ("inputs.bench }}", "inputs.benh }}", 'property "benh" is not defined'),
    "bad-action-input": ("retention-days: 30", "retention-day: 30", 'input "retention-day" is not defined'),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
@pytest.mark.server  # tier: actionlint as a process
def test_actionlint_refuses_a_broken_copy(case, tmp_path):
    good, bad, says = BROKEN[case]
    text = WORKFLOW.read_text()
    assert text.count(good) >= 1, f"the workflow no longer contains {good!r}: update this case"
    broken = tmp_path / "gpuproof-nightly.yml"
    broken.write_text(text.replace(good, bad))
    proc = actionlint(broken)
    assert proc.returncode == 1, proc.stdout
    assert says in proc.stdout, proc.stdout


def test_workflow_is_the_nightly_the_issue_asks_for():
    wf = workflow()
    job = wf["jobs"]["nightly"]
    assert {"self-hosted", "gpu"} <= set(job["runs-on"])
    assert wf[True]["schedule"][0]["cron"]             # YAML 1.1 reads the key `on` as True
    s = steps()
    assert "${{ secrets.GPUPROOF_KUBECONFIG }}" in s["Kubeconfig from the secret"]["env"].values()
    assert "gpuproof run" in s["gpuproof run"]["run"] and "--bench" in s["gpuproof run"]["run"]
    check = s["gpuproof report check"]["run"]
    assert "gpuproof report check" in check and '--baseline "$BASELINE"' in check and '--rules "$RULES"' in check
    assert "GITHUB_STEP_SUMMARY" in s["Summary"]["run"] and s["Summary"]["if"] == "always()"
    upload = s["Upload the report"]
    assert upload["uses"].startswith("actions/upload-artifact@") and upload["if"] == "always()"
    assert upload["with"]["path"] == "${{ env.REPORT_DIR }}/${{ env.RUN_ID }}/"
    assert list(s)[-1] == "Verdict" and 'exit "$RULES_CODE"' in s["Verdict"]["run"]
    # expressions reach the scripts only through env: nothing from an input or a variable is pasted into bash
    for name, step in s.items():
        assert "${{" not in step.get("run", ""), f"step {name!r} puts an expression into its script"


# ---------------------------------------------------------------------------- the steps, run here


STEP_OUTPUT = re.compile(r"^\$\{\{ steps\.([\w-]+)\.outputs\.([\w-]+) \}\}$")


class Runner:
    """Runs a step's script the way GitHub's Linux runner does, with its files and variables. A step's
    ``env`` entries of the form ``${{ steps.ID.outputs.NAME }}`` are taken from the outputs earlier steps
    wrote to GITHUB_OUTPUT (or set in :attr:`outputs`); any other expression the test gives."""

    def __init__(self, tmp: Path, env: dict[str, str]):
        self.tmp = tmp
        self.temp = tmp / "runner-temp"
        self.temp.mkdir()
        self.summary = tmp / "step-summary.md"
        self.summary.touch()
        self.env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
                        RUNNER_TEMP=str(self.temp), GITHUB_STEP_SUMMARY=str(self.summary),
                        GITHUB_ENV=str(tmp / "github-env"), **env)
        self.outputs: dict[str, dict[str, str]] = {}      # step id -> its outputs

    def step(self, name: str, **env: str) -> tuple[subprocess.CompletedProcess, dict[str, str]]:
        spec = steps()[name]
        resolved = {}
        for key, value in (spec.get("env") or {}).items():
            m = STEP_OUTPUT.match(str(value))
            if key in env or not m:
                continue
            step_id, output = m.groups()
            assert any(s.get("id") == step_id for s in steps().values()), f"{name}: no step with id {step_id!r}"
            # a missing output is what GitHub gives too: an empty string
            resolved[key] = self.outputs.get(step_id, {}).get(output, "")
        out = self.tmp / f"output-{re.sub(r'[^a-z]+', '-', name.lower())}"
        out.write_text("")
        script = self.tmp / "step.sh"
        script.write_text(spec["run"])
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                              env=dict(self.env, GITHUB_OUTPUT=str(out), **resolved, **env), capture_output=True,
                              text=True, timeout=600)
        outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
        if spec.get("id"):
            self.outputs[spec["id"]] = outputs
        return proc, outputs


@pytest.fixture
def synthetic(tmp_path):
    """A good run, a run with a 10% matmul regression, and a baseline + rules made from the good one."""
    from gpuproof.report.baseline import make_baseline, save_baseline
    from gpuproof.report.data import load_run
    from synthetic_runs import make_run

    reports = tmp_path / "reports"
    base = make_run(reports, "nightly-good")
    worse = make_run(reports, "nightly-worse", scale={"matmul/tflops": 0.90})
    from gpuproof.report import write_all

    write_all(worse)                      # summary.md and report.html, as gpuproof run leaves them
    save_baseline(make_baseline([load_run(base)]), tmp_path / "baseline.json")
    (tmp_path / "rules.yaml").write_text(RULES)
    return reports


@pytest.mark.server  # tier: the template's step in bash, gpuproof's CLI in it
def test_rules_decide_the_exit_code(tmp_path, synthetic):
    runner = Runner(tmp_path, {"REPORT_DIR": str(synthetic), "BASELINE": str(tmp_path / "baseline.json"),
                               "RULES": str(tmp_path / "rules.yaml")})
    runner.outputs["run"] = {"code": "0"}
    proc, out = runner.step("gpuproof report check", RUN_ID="nightly-good")
    assert proc.returncode == 0 and out == {"code": "0"}, proc.stderr
    proc, _ = runner.step("Verdict", FAIL_ON_CHECKS="")
    assert proc.returncode == 0, proc.stdout

    proc, out = runner.step("gpuproof report check", RUN_ID="nightly-worse")
    assert proc.returncode == 0 and out == {"code": "1"}, "the check step records the code, the verdict acts on it"
    assert "matmul" in proc.stdout
    proc, _ = runner.step("Summary", RUN_ID="nightly-worse")
    summary = runner.summary.read_text()
    assert summary.startswith((synthetic / "nightly-worse" / "summary.md").read_text())
    assert "## Against the baseline" in summary and "regression" in summary.lower()
    proc, _ = runner.step("Verdict", FAIL_ON_CHECKS="")
    assert proc.returncode == 1 and "::error title=gpuproof report check::regression" in proc.stdout

    # failed acceptance checks alone: annotated, not fatal, unless GPUPROOF_FAIL_ON_CHECKS=true
    runner.outputs.update(run={"code": "1"}, check={"code": "0"})
    proc, _ = runner.step("Verdict", FAIL_ON_CHECKS="")
    assert proc.returncode == 0 and "::warning title=gpuproof run::" in proc.stdout
    proc, _ = runner.step("Verdict", FAIL_ON_CHECKS="true")
    assert proc.returncode == 1
    runner.outputs.clear()          # the run step failed before the check ran
    proc, _ = runner.step("Verdict", FAIL_ON_CHECKS="")
    assert proc.returncode == 1 and "the rules were not checked" in proc.stdout


@pytest.mark.server  # tier: the template's step in bash, gpuproof's CLI in it
def test_a_benchmark_figure_missing_from_the_run_fails_the_rules(tmp_path, synthetic):
    """--strict: a figure the baseline has and the run lacks (a benchmark that did not run) is a failure."""
    import json

    baseline = json.loads((tmp_path / "baseline.json").read_text())
    row = next(r for r in baseline["metrics"] if (r["benchmark"], r["metric"]) == ("matmul", "tflops"))
    baseline["metrics"].append({**row, "product": "NVIDIA-B200"})      # a GPU type the run no longer has
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))
    runner = Runner(tmp_path, {"REPORT_DIR": str(synthetic), "BASELINE": str(tmp_path / "baseline.json"),
                               "RULES": str(tmp_path / "rules.yaml")})
    proc, out = runner.step("gpuproof report check", RUN_ID="nightly-good")
    assert out == {"code": "1"} and "NVIDIA-B200" in proc.stdout, proc.stdout + proc.stderr


def test_run_step_against_the_embedded_cluster(tmp_path, synthetic, embedded):
    """The run step as written, against a real API server: a report folder, the run's code as an output,
    and a run without benchmark figures fails the rules check."""
    reports = tmp_path / "run-reports"
    runner = Runner(tmp_path, {"REPORT_DIR": str(reports), "RUN_ID": "nightly-42-1",
                               "BASELINE": str(tmp_path / "baseline.json"), "RULES": str(tmp_path / "rules.yaml")})
    proc, _ = runner.step("Kubeconfig from the secret", KUBECONFIG_DATA=Path(embedded.kubeconfig).read_text())
    assert proc.returncode == 0, proc.stderr
    kubeconfig = dict(line.split("=", 1) for line in (tmp_path / "github-env").read_text().splitlines())["KUBECONFIG"]
    written = yaml.safe_load(Path(kubeconfig).read_text())
    assert written == yaml.safe_load(Path(embedded.kubeconfig).read_text())
    assert oct(Path(kubeconfig).stat().st_mode & 0o777) == "0o600"
    # the secret may also hold the kubeconfig base64-encoded
    Path(kubeconfig).unlink()
    encoded = base64.b64encode(Path(embedded.kubeconfig).read_bytes()).decode()
    proc, _ = runner.step("Kubeconfig from the secret", KUBECONFIG_DATA=encoded)
    assert proc.returncode == 0 and yaml.safe_load(Path(kubeconfig).read_text()) == written, proc.stderr

    proc, out = runner.step("gpuproof run", KUBECONFIG=kubeconfig, CONTEXT="", BENCH="false",
                            PYTEST_ARGS="-x -k test_discovery")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert out == {"code": "0"} and (reports / "nightly-42-1" / "summary.md").is_file(), proc.stdout[-3000:]
    junit = (reports / "nightly-42-1" / "junit.xml").read_text()
    assert re.search(r'tests="[1-9]', junit) and 'failures="0"' in junit, "the -- pytest arguments got through"
    proc, out = runner.step("gpuproof report check", KUBECONFIG=kubeconfig)
    assert out["code"] != "0" and "no metrics" in proc.stderr, "a nightly without benchmark figures must not pass"
    proc, _ = runner.step("Verdict", FAIL_ON_CHECKS="")
    assert proc.returncode == int(out["code"])

    # an unset secret is named, not a confusing kubeconfig error later
    proc, _ = runner.step("Kubeconfig from the secret", KUBECONFIG_DATA="")
    assert proc.returncode == 1 and "the secret GPUPROOF_KUBECONFIG is not set" in proc.stdout

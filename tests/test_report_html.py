"""report.html: self-contained, has its plots, and renders in a real headless browser
(Debian's chromium) without script errors.

The browser test skips when chromium is missing, unless GPUPROOF_REQUIRE_BROWSER=1
(CI), where it fails. Its screenshot goes to the test's tmp dir and, when
GPUPROOF_ARTIFACTS is set, to that folder too.
"""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuproof.report import write_all
from gpuproof.report.data import load_run
from gpuproof.report.html import render_html
from synthetic_runs import make_run
from gpuproof.results import CheckRecord, MetricRecord, RunDir

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    path = make_run(tmp_path_factory.mktemp("html"), "20250101-120000-abc123")
    write_all(path)
    return path / "report.html"


def _plots(page: str) -> list[str]:
    return re.findall(r'<figure class="plot" data-plot="([a-z]+)">', page)


def test_report_has_every_plot(report):
    page = report.read_text()
    plots = _plots(page)
    assert plots.count("matmul") == 1
    assert plots.count("allreduce") == 1
    assert plots.count("latency") == 2                 # one per GPU product
    assert plots.count("throughput") == 1
    assert plots.count("utilization") == 2 * 5         # 2 GPUs x (util %, memory, power, temp, clock)
    assert page.count('<svg class="chart"') == len(plots)
    assert page.count('class="ref"') == 9             # a peak marker per product and dtype (fp8: H100 only)
    for section in ("failures", "matrix", "coverage", "checks", "benchmarks", "utilization", "tests", "inventory"):
        assert f'<section id="{section}">' in page


def test_report_is_self_contained(report):
    page = report.read_text()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page, re.I)
    assert "url(" not in page and "@import" not in page
    assert "http://" not in page and "https://" not in page


def test_report_escapes_recorded_text(tmp_path):
    run = RunDir(tmp_path / "r")
    run.add_check(CheckRecord("labels", "x", "<node>", "fail", expected="<script>alert(1)</script>",
                              actual='"quoted" & more', message="</td></table>"))
    page = render_html(load_run(run.path))
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;/td&gt;&lt;/table&gt;" in page


def test_sampler_shaped_samples_and_unknown_metrics(tmp_path):
    """Samples as the NVML sampler writes them (gpu index, uuid, epoch-second ts, a
    clock-reason bit mask, the benchmark they ran under), and metrics no view knows."""
    run = RunDir(tmp_path / "r")
    run.add_samples([{"ts": 1700000000.0 + t, "gpu": i, "uuid": f"GPU-{i}", "node": "n1", "benchmark": "matmul",
                      "phase": "warmup" if t < 2 else "measure", "gpu_util_pct": 50 + i, "fan_pct": 30,
                      "clock_event_reasons": 4, "ecc_corrected_delta": None, "enabled": True}
                     for t in range(5) for i in range(3)])
    run.add_metric(MetricRecord("custom", "widgets_per_s", 12.5, "1/s", {"size": 3}))
    run.finalize("passed")
    page = render_html(load_run(run.path))
    plots = _plots(page)
    assert plots.count("utilization") == 3 * 2        # gpu_util_pct and fan_pct per GPU; masks, bools, blanks are not
    assert "n1/gpu2" in page and "matmul measure" in page
    assert "widgets_per_s" in page and "matmul" not in plots


# ------------------------------------------------------------------ browser

def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    reason = "chromium is not installed (Debian: apt-get install chromium)"
    if os.environ.get("GPUPROOF_REQUIRE_BROWSER") == "1":
        pytest.fail(f"{reason}, and GPUPROOF_REQUIRE_BROWSER=1 requires the browser test to run")
    pytest.skip(f"{reason}; set GPUPROOF_REQUIRE_BROWSER=1 to make this a failure")


def _render(browser: str, page: Path, profile: Path, screenshot: Path | None = None) -> str:
    """The DOM after the page's scripts ran (and a screenshot, when asked)."""
    cmd = [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
           "--window-size=1280,2000"]
    if screenshot:
        cmd.append(f"--screenshot={screenshot}")
    cmd += ["--dump-dom", page.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"chromium failed ({proc.returncode}): {proc.stderr[-2000:]}"
    return proc.stdout


@pytest.mark.server  # tier: headless Chromium
def test_report_renders_in_headless_chromium(report, tmp_path):
    browser = _browser()
    shot = tmp_path / "report.png"
    dom = _render(browser, report, tmp_path / "profile", screenshot=shot)
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    assert 'data-gpuproof-ready="ok"' in html_tag, f"report.js did not finish: {html_tag}"
    errors = re.search(r'<div id="js-errors"[^>]*>(.*?)</div>', dom, re.S).group(1)
    assert "data-gpuproof-errors" not in html_tag, f"script errors: {errors}"
    n_plots = len(_plots(report.read_text()))
    assert f'data-gpuproof-plots="{n_plots}"' in html_tag          # every plot's SVG is in the rendered DOM
    assert re.search(r'<span id="check-shown"[^>]*>18 shown</span>', dom)   # the checks filter ran
    # the coverage table: every node a check left out, with the reason and the checks, as rendered
    section = re.search(r'<section id="coverage">(.*?)</section>', dom, re.S).group(1)
    coverage = section.split("</table>")[0]            # then the skips by check and reason (test_report_fleet.py)
    assert "Coverage: 2 GPU nodes left out of some checks" in coverage
    assert "<h3>Why checks were skipped</h3>" in section
    rows = re.findall(r"<tr>(.*?)</tr>", coverage, re.S)[1:]
    cells = [re.findall(r"<td[^>]*>(.*?)</td>", r, re.S) for r in rows]
    assert [c[:3] for c in cells] == [
        ["a100-1", "a100", "cannot take pods: cordoned (spec.unschedulable)"],
        ["h100-1", "h100", "simulated (kwok): no GPU executes there, and this check needs real GPUs"]]
    assert cells[0][3] == "taints: test_tolerating_gpu_pod_lands, health: test_health_per_node"
    assert 'href="#coverage"' in dom
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    artifacts = os.environ.get("GPUPROOF_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(artifacts) / "report-screenshot.png")
        shutil.copy(report, Path(artifacts) / "report.html")


@pytest.mark.server  # tier: headless Chromium
def test_browser_check_catches_script_errors_and_network_fetches(report, tmp_path):
    """The detection itself works: a broken script and a fetch to the network are recorded."""
    browser = _browser()
    broken = tmp_path / "broken.html"
    page = report.read_text()
    page = page.replace("<main>", '<main><script>notAFunction();</script>'
                                  '<img src="https://example.invalid/pixel.png" alt="">', 1)
    broken.write_text(page)
    dom = _render(browser, broken, tmp_path / "profile")
    html_tag = re.search(r"<html[^>]*>", dom).group(0)
    count = re.search(r'data-gpuproof-errors="(\d+)"', html_tag)
    assert count and int(count.group(1)) >= 2, html_tag         # the script error, the blocked fetch (+ its load error)
    errors = re.search(r'<div id="js-errors"[^>]*>(.*?)</div>', dom, re.S).group(1)
    assert "notAFunction" in errors and "example.invalid" in errors

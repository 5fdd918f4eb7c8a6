"""gpuproof as users install it: a wheel built from this checkout, installed (not -e) into fresh
virtualenvs outside the repository, used from another folder.

- the core install (no extra) runs `gpuproof --help`, `python -m gpuproof`, `gpuproof sim fleets`,
  and says in one line that `gpuproof bench --local` needs the [bench] extra; every gpuproof module
  imports without torch, locust or pynvml;
- with nothing but Go (no GPUPROOF_BIN_DIR, KUBEBUILDER_ASSETS or binaries on PATH) the core install
  builds its control plane from the Go modules it ships, or finds what a checkout on this machine
  built (the build cache is keyed on those modules' content), and `gpuproof run --fleet minimal` is
  green with no metric rows in its summary (sim); without Go or binaries it stops in one line;
- a user's own test project (tests/external_project: no conftest, nothing importing gpuproof's
  plugin) gets gpuproof's fixtures and options from the pytest11 entry point (sim);
- the [bench] install runs `gpuproof bench --local probe --device cpu`.

Cost. The core dependencies are installed for real, from PyPI the first time and then offline from
a wheelhouse in gpuproof's cache (~/.cache/gpuproof/wheelhouse, or $GPUPROOF_CACHE/wheelhouse),
since pip's own cache is not always there. The [bench] extra is torch with CUDA (~5 GB installed),
far too big to download and unpack per test run: the [bench] venv is a real install of the wheel and
its core dependencies as above, and the bench packages it resolves `gpuproof[bench]` against come
from this test's own environment (its site-packages appended to the new venv's path, after the
venv's own). So pip still has to find torch, locust and nvidia-ml-py at versions the extra accepts
(with --no-index it cannot fetch them), and the benchmark runs gpuproof and its workloads from the
wheel; what it does not re-prove is PyPI serving torch, which ./setup.sh (`pip install -e .[bench]`)
does on every CI run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.build]  # tier: a wheel, an sdist and venvs on them

BENCH_MODULES = ("torch", "locust", "pynvml")


def _cache_root() -> Path:
    return Path(os.environ.get("GPUPROOF_CACHE") or Path.home() / ".cache" / "gpuproof")


WHEELHOUSE = _cache_root() / "wheelhouse"


def sh(cmd, *, cwd=None, env=None, timeout=600, check=True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"exit {proc.returncode}: {' '.join(map(str, cmd))}\n--- stdout\n{proc.stdout[-4000:]}\n"
                    f"--- stderr\n{proc.stderr[-4000:]}", pytrace=False)
    return proc


def _du(path: Path) -> int:
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


# ------------------------------------------------------------------ build


def _copy_checkout(dst: Path) -> None:
    """The files a clean clone would have (tracked, plus new files not ignored): no build/, .venv, caches."""
    out = subprocess.run(["git", "ls-files", "-z", "-c", "-o", "--exclude-standard"], cwd=REPO,
                         capture_output=True, timeout=60)
    if out.returncode != 0:
        pytest.skip("not a git checkout: cannot tell the source files from build output")
    for rel in sorted(set(out.stdout.decode().split("\0")) - {""}):
        src, to = REPO / rel, dst / rel
        if not src.is_symlink() and not src.exists():
            continue                      # deleted in the working tree
        to.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            os.symlink(os.readlink(src), to)
        elif src.is_file():
            shutil.copy2(src, to)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("build")
    _copy_checkout(root / "src")
    t0 = time.monotonic()
    # --no-build-isolation: setuptools from this environment, so the build needs no network
    sh([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist",
        root / "src"], timeout=300)
    (whl,) = (root / "dist").glob("gpuproof-*.whl")
    print(f"\n[packaging] wheel {whl.name}: {whl.stat().st_size / 1e3:.0f} kB, built in {time.monotonic() - t0:.1f}s",
          file=sys.stderr)
    return whl


def test_wheel_holds_what_run_and_bench_need(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    # the Go modules of the embedded cluster's control plane: what a build reads, as the checkout has it
    assert {n.removeprefix("gpuproof/_controlplane/") for n in names if n.startswith("gpuproof/_controlplane/")} \
        == _module_files()
    for folder, wheel_folder in (("suites", "gpuproof/suites"), ("workloads", "gpuproof/_workloads")):
        files = {p.name for p in (REPO / folder).iterdir() if p.suffix in (".py", ".md")}
        assert files and {f"{wheel_folder}/{f}" for f in files} <= names, f"{folder}/ not all in the wheel"
    for f in ("gpuproof/sim/fleets/minimal.yaml", "gpuproof/sim/fleets/mixed.yaml", "gpuproof/cli/suites.ini",
              "gpuproof/report/report.js", "gpuproof/report/report.css", "gpuproof/__main__.py",
              "gpuproof/report/checklists/AIConformance-1.37.yaml", "gpuproof/report/checklists/SOURCES.md"):
        assert f in names, f
    # every package of the checkout (pyproject lists them by hand) is in the wheel
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "gpuproof").rglob("__init__.py")}
    assert packages and {f"{p}/__init__.py" for p in packages} <= names, packages - {n.rsplit("/", 1)[0] for n in names}
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    core = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line]
    bench = [line for line in meta.splitlines() if line.startswith("Requires-Dist:") and "extra == \"bench\"" in line]
    assert not any(m in line for line in core for m in ("torch", "locust", "nvidia-ml-py")), core
    assert all(any(m in line for line in bench) for m in ("torch", "locust", "nvidia-ml-py")), bench
    entry = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "[pytest11]" in entry and "gpuproof.pytest_plugin" in entry


def _module_files() -> set[str]:
    """controlplane/'s build inputs (gpuproof/sim/binaries.py's MODULE_FILES), relative to controlplane/."""
    from gpuproof.sim import binaries

    modules = REPO / "controlplane"
    files = {p.relative_to(modules).as_posix() for m in modules.iterdir() if (m / "go.mod").is_file()
             for p in binaries.module_files(m.name)}
    assert {"kube/go.mod", "kube/go.sum", "kube/cmd/etcd/main.go", "kwok/go.mod", "kwok/go.sum"} <= files
    return files


def test_sdist_holds_the_go_modules(tmp_path):
    """A wheel built from the sdist (what pip does without a wheel) can build the control plane too."""
    import tarfile

    src = tmp_path / "src"
    _copy_checkout(src)
    code = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp_path / 'dist')!r}))"
    name = sh([sys.executable, "-c", code], cwd=src, timeout=300).stdout.strip().splitlines()[-1]
    with tarfile.open(tmp_path / "dist" / name) as tar:
        prefix = f"{name.removesuffix('.tar.gz')}/gpuproof/_controlplane/"
        shipped = {m.name.removeprefix(prefix) for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)}
    assert shipped == _module_files()


# ------------------------------------------------------------------ install


class Venv:
    def __init__(self, path: Path, elsewhere: Path):
        self.path = path
        self.bin = path / "bin"
        self.python = self.bin / "python"
        self.elsewhere = elsewhere       # the folder commands run in: neither the repo nor the venv

    @property
    def site_packages(self) -> Path:
        return Path(sh([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "GPUPROOF_REPORT_DIR", "GPUPROOF_DEBUG")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        return {**env, **extra}

    def run(self, *args, check=True, timeout=600, **env) -> subprocess.CompletedProcess:
        return sh(args, cwd=self.elsewhere, env=self.env(**env), check=check, timeout=timeout)

    def pip_install(self, *reqs) -> None:
        """Install offline from the wheelhouse; fill the wheelhouse from PyPI first when it lacks something."""
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        pip = [sys.executable, "-m", "pip", "--python", self.python]   # this pip, working on the new venv
        offline = [*pip, "install", "-q", "--no-index", "--find-links", WHEELHOUSE, *reqs]
        if sh(offline, check=False, timeout=600).returncode == 0:
            return
        fetch = sh([*pip, "download", "-q", "-d", WHEELHOUSE, *reqs], check=False, timeout=900)
        for own in WHEELHOUSE.glob("gpuproof-*"):
            own.unlink()                 # the wheelhouse holds dependencies, never gpuproof itself
        if fetch.returncode != 0:
            pytest.skip(f"cannot fetch gpuproof's dependencies into {WHEELHOUSE} (no network?): "
                        f"{fetch.stderr.strip().splitlines()[-1:]}")
        sh(offline, timeout=600)


def _make_venv(root: Path) -> Venv:
    elsewhere = root / "elsewhere"
    elsewhere.mkdir()
    sh([sys.executable, "-m", "venv", "--without-pip", root / "venv"], timeout=300)   # pip comes from outside
    return Venv(root / "venv", elsewhere)


@pytest.fixture(scope="module")
def core(wheel, tmp_path_factory) -> Venv:
    """The wheel with no extra, in a fresh venv outside the repository."""
    t0 = time.monotonic()
    venv = _make_venv(tmp_path_factory.mktemp("core"))
    venv.pip_install(wheel)
    print(f"\n[packaging] core venv: {time.monotonic() - t0:.1f}s to make, "
          f"{_du(venv.path) / 1e6:.0f} MB installed", file=sys.stderr)
    return venv


@pytest.fixture(scope="module")
def bench(wheel, tmp_path_factory) -> Venv:
    """The wheel with [bench], in a fresh venv; the bench packages come from this environment (see above)."""
    missing = [m for m in BENCH_MODULES if not _importable(m)]
    if missing:
        pytest.skip(f"this environment lacks {', '.join(missing)} (install gpuproof with [bench]: ./setup.sh)")
    t0 = time.monotonic()
    venv = _make_venv(tmp_path_factory.mktemp("bench"))
    venv.pip_install(wheel)                             # gpuproof and its core dependencies, for real
    own = sysconfig.get_paths()["purelib"]
    (venv.site_packages / "_gpuproof_test_bench_packages.pth").write_text(own + "\n")
    venv.pip_install(f"{wheel}[bench]")                 # must find torch, locust, nvidia-ml-py: no index
    print(f"\n[packaging] [bench] venv: {time.monotonic() - t0:.1f}s to make", file=sys.stderr)
    return venv


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ------------------------------------------------------------------ core install


def test_core_install_runs_from_another_folder(core):
    assert not (core.elsewhere / "suites").exists() and REPO not in core.elsewhere.parents
    out = core.run("gpuproof", "--help").stdout
    assert out.startswith("usage: gpuproof") and "run" in out and "bench" in out
    assert core.run(core.python, "-m", "gpuproof", "--version").stdout.startswith("gpuproof ")
    fleets = core.run("gpuproof", "sim", "fleets").stdout
    assert "minimal" in fleets and "mixed" in fleets
    where = core.run(core.python, "-c", "import gpuproof, gpuproof.bench.workloads as w, gpuproof.cli.run as r; "
                                        "print(gpuproof.__file__); print(w.workloads_dir()); print(r.suites_dir())")
    pkg, workloads, suites = (Path(line) for line in where.stdout.split())
    assert core.path in pkg.parents and workloads == pkg.parent / "_workloads" and suites == pkg.parent / "suites"
    assert (workloads / "probe.py").is_file() and (suites / "conftest.py").is_file()


def test_core_install_has_no_bench_packages_and_imports_without_them(core):
    """Every gpuproof module imports in the core install, where torch, locust and pynvml are absent."""
    code = ("import importlib, importlib.util, pkgutil, gpuproof\n"
            f"assert not [m for m in {BENCH_MODULES!r} if importlib.util.find_spec(m)]\n"
            "mods = [m.name for m in pkgutil.walk_packages(gpuproof.__path__, 'gpuproof.')\n"
            "        if not m.name.startswith(('gpuproof.suites', 'gpuproof._workloads'))]\n"
            "for m in mods: importlib.import_module(m)\n"
            f"assert not [m for m in {BENCH_MODULES!r} if m in __import__('sys').modules]\n"
            "print(len(mods))\n")
    assert int(core.run(core.python, "-c", code).stdout) > 10


def test_core_install_names_the_missing_extra_in_one_line(core):
    for argv in (["bench", "--local", "probe", "--device", "cpu"], ["bench", "--local", "inference"]):
        proc = core.run("gpuproof", *argv, check=False)
        err = proc.stderr.strip()
        assert proc.returncode != 0 and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert "pip install 'gpuproof[bench]'" in err and "torch" in err, err


# ------------------------------------------------------------------ with the embedded cluster


BIN_VARIABLES = ("GPUPROOF_BIN_DIR", "KUBEBUILDER_ASSETS")


def _bare_env(venv: Venv, *hidden: str, **extra) -> dict:
    """The venv's environment without a way to name control-plane binaries: no variable, and no PATH
    folder holding one of them (or one of ``hidden``)."""
    from gpuproof.sim.binaries import BINARIES, env_var

    env = {k: v for k, v in venv.env().items() if k not in {*BIN_VARIABLES, *map(env_var, BINARIES)}}
    keep = [d for d in env["PATH"].split(os.pathsep) if d and not any(
        (Path(d) / name).exists() for name in (*BINARIES, *hidden))]
    return {**env, "PATH": os.pathsep.join(keep), **extra}


def _cache_folders(python, cwd: Path) -> list[str]:
    """Where the gpuproof that ``python`` imports (run in ``cwd``) caches the control plane's builds."""
    code = "from gpuproof.sim import binaries as b; print(*(b.module_cache(m, f) for m, f in b.LDFLAGS.items()))"
    return sh([python, "-c", code], cwd=cwd).stdout.split()


def _checkout_built() -> bool:
    from gpuproof.sim.binaries import BINARIES, LDFLAGS, module_cache

    return all((module_cache(m, LDFLAGS[m]) / n).is_file() for n, (m, _) in BINARIES.items())


def test_core_install_without_go_or_binaries_stops_in_one_line(core, tmp_path):
    env = _bare_env(core, "go", GPUPROOF_CACHE=str(tmp_path / "empty-cache"))
    proc = sh(["gpuproof", "run", "--fleet", "minimal", "--run-id", "no-go"], cwd=core.elsewhere, env=env,
              check=False, timeout=300)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert all(way in err for way in ("Go 1.25", "GPUPROOF_BIN_DIR", "KUBEBUILDER_ASSETS")), err
    assert not (core.elsewhere / "reports" / "no-go").exists()


@pytest.fixture(scope="module")
def controlplane(core) -> dict:
    """`gpuproof sim build` of the installed wheel with nothing but Go: it finds the binaries a checkout
    built (one cache key for the same modules) or builds them from the modules it ships."""
    env = _bare_env(core)
    assert _cache_folders(core.python, core.elsewhere) == _cache_folders(sys.executable, REPO)
    if not shutil.which("go", path=env["PATH"]) and not _checkout_built():
        pytest.skip("neither Go nor a build of this checkout's control plane on this machine")
    t0 = time.monotonic()
    proc = sh(["gpuproof", "sim", "build"], cwd=core.elsewhere, env=env, timeout=3600)
    assert "$GPUPROOF" not in proc.stdout and "KUBEBUILDER" not in proc.stdout and "(PATH)" not in proc.stdout
    assert str(core.path) in proc.stdout           # the Go modules it reports are the install's own
    built = "just built" in proc.stdout
    print(f"\n[packaging] gpuproof sim build from the wheel: {'built' if built else 'found the checkout-built'} "
          f"binaries in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return env


@pytest.mark.sim
def test_core_install_runs_the_suites(core, controlplane):
    t0 = time.monotonic()
    proc = sh(["gpuproof", "run", "--fleet", "minimal", "--run-id", "wheel1"], cwd=core.elsewhere, env=controlplane,
              check=False, timeout=900)
    run = core.elsewhere / "reports" / "wheel1"
    assert proc.returncode == 0, _failures(proc.stdout) + proc.stderr[-3000:]
    junit = (run / "junit.xml").read_text()
    assert 'classname="suites.test_' in junit and "failures=\"0\"" in junit
    for f in ("checks.jsonl", "summary.md", "report.html", "inventory.json"):
        assert (run / f).is_file(), f
    checks = [json.loads(line) for line in (run / "checks.jsonl").read_text().splitlines()]
    assert checks and not [c for c in checks if c["verdict"] == "fail"]
    # only the cluster: no workload ran on this host, so no metric rows (the health checks skip, saying why)
    from gpuproof.report.data import load_run
    from gpuproof.report.summary import benchmark_tables

    metrics = run / "metrics.jsonl"
    assert not metrics.exists() or not metrics.read_text().strip(), metrics.read_text()[:2000]
    assert benchmark_tables(load_run(run)) == [], (run / "summary.md").read_text()
    assert "suites/test_health.py" in proc.stdout and "needs real GPUs" in proc.stdout, proc.stdout[-3000:]
    print(f"\n[packaging] gpuproof run --fleet minimal from the wheel: {time.monotonic() - t0:.0f}s", file=sys.stderr)


@pytest.mark.sim
def test_core_install_benchmarks_skip_on_the_embedded_cluster(core, controlplane):
    """No workload runs on this host, so the core install (no torch) runs them: each skips, saying why."""
    proc = sh(["gpuproof", "run", "--only-bench", "--fleet", "minimal", "--run-id", "wheel-bench"],
              cwd=core.elsewhere, env=controlplane, check=False, timeout=900)
    assert proc.returncode == 0, _failures(proc.stdout) + proc.stderr[-3000:]
    assert " passed" not in proc.stdout.splitlines()[-1] and " skipped" in proc.stdout.splitlines()[-1], proc.stdout
    assert "needs real GPUs" in proc.stdout and "gpuproof bench --local" in proc.stdout, proc.stdout[-3000:]


def _failures(out: str) -> str:
    """pytest's FAILURES section (or the tail), not the list of skips at the end."""
    start = out.find("= FAILURES =")
    return out[start:start + 8000] if start >= 0 else out[-6000:]


@pytest.mark.sim
def test_external_project_gets_the_fixtures_from_the_entry_point(core, controlplane, tmp_path):
    project = tmp_path / "my-cluster-tests"
    shutil.copytree(REPO / "tests" / "external_project", project)
    assert not list(project.rglob("conftest.py"))
    proc = sh([core.python, "-m", "pytest", "-p", "no:cacheprovider", "--gpuproof-fleet", "minimal",
               "--gpuproof-report-dir", tmp_path / "reports"], cwd=project, env=controlplane,
              check=False, timeout=600)
    assert proc.returncode == 0, _failures(proc.stdout) + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout and "gpuproof: target embedded cluster, fleet minimal" in proc.stdout
    # loading the plugin by hand as well (-p, or pytest_plugins in a conftest) is harmless: registered once
    (project / "conftest.py").write_text('pytest_plugins = ["gpuproof.pytest_plugin"]\n')
    proc = sh([core.python, "-m", "pytest", "-p", "gpuproof.pytest_plugin", "--collect-only", "-q",
               "-p", "no:cacheprovider"], cwd=project, env=core.env(), check=False, timeout=300)
    assert proc.returncode == 0 and "3 tests collected" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


# ------------------------------------------------------------------ [bench]


def test_bench_install_runs_a_local_benchmark(bench):
    assert bench.run(bench.python, "-c", "import gpuproof; print(gpuproof.__file__)").stdout.startswith(
        str(bench.path))
    proc = bench.run("gpuproof", "bench", "--local", "probe", "--device", "cpu", "--threads", "1",
                     "--run-id", "b1", "--quiet", timeout=300)
    run = bench.elsewhere / "reports" / "b1"
    assert (run / "metrics.parquet").is_file() and (run / "bench-probe.json").is_file(), proc.stderr[-3000:]
    result = json.loads((run / "bench-probe.json").read_text())
    assert result["ok"] is True and result["workload"] == "probe"

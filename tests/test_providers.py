"""Clusters chosen the pytest-kubernetes way (gpuproof/plugin/choice.py, throwaway.py and providers.py).

- which options choose which cluster, and the one-line refusals of conflicting ones;
- a plain pytest project (no conftest, gpuproof only installed) asking for pytest-kubernetes's ``k8s``
  fixture with ``--k8s-provider gpuproof`` gets gpuproof's embedded GPU cluster, the same one gpuproof's
  own fixtures use;
- with ``--kubeconfig/--context`` the ``k8s`` fixture is that cluster and context, and its kubeconfig
  is never deleted;
- kind without its command, or without a container engine that answers, is refused before anything
  runs, saying which.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gpuproof.plugin.choice import EMBEDDED, EXTERNAL, ProviderChoiceError, choose
from gpuproof.tools import for_test


def options(**given):
    """config.getoption over the given options (dests as pytest stores them)."""
    return lambda name, default=None: given.get(name, default)


# ---------------------------------------------------------------------------- choice

CHOICES = {
    "nothing": ({}, (EMBEDDED, None, None, None)),
    "fleet": ({"fleet": "minimal"}, (EMBEDDED, None, None, "minimal")),
    "provider-gpuproof": ({"k8s_provider": "gpuproof"}, (EMBEDDED, None, None, None)),
    "provider-embedded-alias": ({"k8s_provider": "Embedded"}, (EMBEDDED, None, None, None)),
    "provider-config-is-fleet": ({"k8s_provider": "gpuproof", "k8s_provider_config": "managed"},
                                 (EMBEDDED, None, None, "managed")),
    "gpuproof-kubeconfig": ({"kubeconfig": "/k/a.yaml"}, (EXTERNAL, "/k/a.yaml", None, None)),
    "gpuproof-context-only": ({"context": "prod"}, (EXTERNAL, None, "prod", None)),
    "k8s-kubeconfig": ({"k8s_kubeconfig": "/k/b.yaml", "context": "c"}, (EXTERNAL, "/k/b.yaml", "c", None)),
    "k8s-kubeconfig-override": ({"k8s_kubeconfig_override": "/k/o.yaml"}, (EXTERNAL, "/k/o.yaml", None, None)),
    "explicit-external": ({"k8s_provider": "external", "kubeconfig": "/k/a.yaml"}, (EXTERNAL, "/k/a.yaml", None, None)),
    "kind-default": ({"k8s_provider": "kind"}, ("kind", None, None, None)),
    "k3d": ({"k8s_provider": "k3d"}, ("k3d", None, None, None)),
    "minikube-kvm2": ({"k8s_provider": "minikube-kvm2"}, ("minikube-kvm2", None, None, None)),
}


@pytest.mark.parametrize("case", sorted(CHOICES))
def test_options_choose_the_cluster(case):
    given, (provider, kubeconfig, context, fleet) = CHOICES[case]
    c = choose(options(**given))
    assert (c.provider, c.kubeconfig, c.context, c.fleet) == (provider, kubeconfig, context, fleet)
    assert c.real == (provider != EMBEDDED)


def test_kind_config_is_taken_with_its_cluster_name():
    cfg = str(Path(__file__).resolve().parents[1] / "kind-configs" / "gpu-mock.yaml")
    c = choose(options(k8s_provider="kind", k8s_provider_config=cfg))
    assert (c.provider, c.provider_config, c.cluster_name, c.fleet) == ("kind", cfg, "gpuproof-gpu-mock", None)
    assert c.throwaway and c.label() == f"kind:{cfg}" and "deleted at the end" in c.describe()


REFUSED = {
    "unknown-provider": ({"k8s_provider": "docker-desktop"}, "--k8s-provider docker-desktop: no such provider"),
    "two-kubeconfigs": ({"kubeconfig": "/k/a.yaml", "k8s_kubeconfig": "/k/b.yaml"}, "name different clusters"),
    "gpuproof-and-kubeconfig": ({"k8s_provider": "gpuproof", "kubeconfig": "/k/a.yaml"},
                                "starts gpuproof's embedded cluster, and --kubeconfig names an existing one"),
    "fleet-twice": ({"k8s_provider": "gpuproof", "k8s_provider_config": "minimal", "fleet": "mixed"},
                    "both name the embedded cluster's fleet"),
    "external-without-cluster": ({"k8s_provider": "external"}, "name it with --kubeconfig/--context"),
    "external-with-config": ({"k8s_provider": "external", "context": "c", "k8s_provider_config": "x.yaml"},
                             "is for a cluster that gets created"),
    "kind-and-context": ({"k8s_provider": "kind", "context": "prod"},
                         "creates a new cluster, and --context names an existing one"),
    "kind-and-fleet": ({"k8s_provider": "kind", "fleet": "minimal"}, "--fleet is for gpuproof's embedded cluster"),
    "kind-config-missing": ({"k8s_provider": "kind", "k8s_provider_config": "/nonexistent/kind.yaml"},
                            "--k8s-provider-config /nonexistent/kind.yaml: no such file"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_conflicting_options_are_refused_in_one_line(case):
    given, says = REFUSED[case]
    with pytest.raises(ProviderChoiceError) as err:
        choose(options(**given))
    assert says in str(err.value) and "\n" not in str(err.value)
    assert isinstance(err.value, pytest.UsageError)      # pytest prints it as "ERROR: ..." and exits 4


def test_a_kind_config_that_is_not_yaml_is_refused(tmp_path):
    bad = tmp_path / "kind.yaml"
    bad.write_text("nodes: [\n")
    with pytest.raises(ProviderChoiceError, match="cannot be read as YAML"):
        choose(options(k8s_provider="kind", k8s_provider_config=str(bad)))


# ---------------------------------------------------------------------------- a user's project


def user_project(tmp_path: Path, files: dict[str, str]) -> Path:
    project = tmp_path / "project"
    project.mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\naddopts = -ra\n")
    for name, text in files.items():
        (project / name).write_text(textwrap.dedent(text))
    return project


def run_pytest(project: Path, *args: str, env: dict | None = None, timeout: float = 300
               ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", f"--rootdir={project}",
                           f"--report-dir={project / 'reports'}", *args], cwd=project, capture_output=True, text=True,
                          timeout=timeout, env=env if env is not None else os.environ.copy())


EMBEDDED_PROJECT = {
    "test_gpus.py": '''
        import pytest
        from kubernetes import client, config

        def gpu_nodes(kubeconfig):
            api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
            return {n.metadata.name: n.status.allocatable.get("nvidia.com/gpu") for n in api.list_node().items
                    if n.status.allocatable.get("nvidia.com/gpu")}

        def test_k8s_is_a_gpu_cluster(k8s):
            k8s.create()
            assert gpu_nodes(k8s.kubeconfig) == {"l4-0": "1"}      # the minimal fleet: one L4 node
            print("KUBECONFIG", k8s.kubeconfig)

        def test_k8s_is_the_cluster_gpuproofs_fixtures_use(k8s, target, discovery):
            k8s.create()
            assert target.is_embedded and k8s.kubeconfig == target.sim.kubeconfig
            assert [n.product for n in discovery.gpu_nodes] == ["NVIDIA-L4"]

        @pytest.mark.k8s(provider="gpuproof")
        def test_marker_gpuproof_shares_the_session_cluster(k8s, target):
            k8s.create()
            assert k8s.kubeconfig == target.sim.kubeconfig
            with pytest.raises(RuntimeError, match="runs no containers"):
                k8s.load_image("my-image:1")
    ''',
}


@pytest.mark.server  # tier: a user's pytest session as a process
def test_plain_project_k8s_fixture_gets_the_embedded_gpu_cluster(tmp_path):
    project = user_project(tmp_path, EMBEDDED_PROJECT)
    proc = run_pytest(project, "--k8s-provider", "gpuproof", "--k8s-provider-config", "minimal")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "3 passed" in out
    assert "gpuproof: target embedded cluster, fleet minimal" in out
    # one embedded cluster for the session, stopped at its end
    kubeconfigs = {line.split()[1] for line in out.splitlines() if line.startswith("KUBECONFIG ")}
    assert len(kubeconfigs) == 1 and not Path(kubeconfigs.pop()).exists()


EXTERNAL_PROJECT = {
    "test_external.py": '''
        import pytest

        def test_k8s_is_the_named_cluster_and_context(k8s, request):
            assert str(k8s.kubeconfig) == request.config.getoption("--kubeconfig")
            assert k8s.context == "gpu-prod"
            assert type(k8s).__name__ == "SessionClusterManager"

        @pytest.mark.k8s(provider_config="kind-configs/cpu-only.yaml")
        def test_a_config_without_a_provider_is_refused(k8s):
            pass
    ''',
}


@pytest.mark.server  # tier: a user's pytest session as a process
def test_kubeconfig_and_context_are_the_k8s_fixtures_cluster(tmp_path):
    project = user_project(tmp_path, EXTERNAL_PROJECT)
    kubeconfig = tmp_path / "prod-kubeconfig.yaml"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    proc = run_pytest(project, f"--kubeconfig={kubeconfig}", "--context=gpu-prod")
    out = proc.stdout + proc.stderr
    assert "1 passed, 1 error" in out, out[-4000:]
    assert "needs provider=... as well: without a provider the k8s fixture is the session's cluster" in out
    assert "gpuproof: target cluster from kubeconfig" in out and "context gpu-prod" in out
    # pytest-kubernetes's external manager unlinks its kubeconfig when a test never called create();
    # gpuproof's session manager leaves the user's file alone
    assert kubeconfig.read_text().startswith("apiVersion: v1")


# ---------------------------------------------------------------------------- kind: missing pieces

PLAIN = {"test_x.py": "def test_x(k8s):\n    k8s.create()\n"}


def bin_dir(tmp_path: Path, **links: Path) -> Path:
    """A PATH folder holding only the given commands (real binaries, linked)."""
    d = tmp_path / "bin"
    d.mkdir()
    for name, target in links.items():
        (d / name).symlink_to(target)
    return d


@pytest.mark.server  # tier: a user's pytest session as a process
def test_unknown_provider_is_a_usage_error(tmp_path):
    proc = run_pytest(user_project(tmp_path, PLAIN), "--k8s-provider", "kubeadm")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.strip() == ("ERROR: --k8s-provider kubeadm: no such provider; choose one of gpuproof "
                                   "(gpuproof's embedded cluster), kind, k3d, minikube, minikube-docker, "
                                   "minikube-kvm2, external")


@pytest.mark.server  # tier: a user's pytest session as a process
def test_kind_without_the_kind_command_is_refused(tmp_path):
    env = dict(os.environ, PATH=str(bin_dir(tmp_path)))
    proc = run_pytest(user_project(tmp_path, PLAIN), "--k8s-provider", "kind", env=env)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.startswith("ERROR: --k8s-provider kind needs the `kind` command on PATH, and there is none"), \
        proc.stderr


@pytest.mark.server  # tier: a user's pytest session as a process
def test_kind_without_a_container_engine_is_refused(tmp_path):
    """The real kind (built from its Go module) on PATH; Docker's client may be there, its engine is not."""
    links = {"kind": for_test("kind")}
    if shutil.which("docker"):
        links["docker"] = Path(shutil.which("docker"))
    env = dict(os.environ, PATH=str(bin_dir(tmp_path, **links)), DOCKER_HOST="unix:///nonexistent/docker.sock")
    env.pop("KIND_EXPERIMENTAL_PROVIDER", None)
    proc = run_pytest(user_project(tmp_path, PLAIN), "--k8s-provider", "kind", env=env)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith("ERROR: --k8s-provider kind runs its nodes as docker containers, "), line
    assert ("but the docker engine does not answer: " in line) if "docker" in links else ("no `docker`" in line)
    assert len(line.splitlines()) == 1
    # kind's own engine choice is followed
    env["KIND_EXPERIMENTAL_PROVIDER"] = "podman"
    proc = run_pytest(user_project(tmp_path / "p2", PLAIN), "--k8s-provider", "kind", env=env)
    assert "runs its nodes as podman containers, and there is no `podman` command on PATH" in proc.stderr


@pytest.mark.server  # tier: a user's pytest session as a process
def test_marker_naming_kind_is_checked_the_same_way(tmp_path):
    project = user_project(tmp_path, {"test_m.py": '''
        import pytest

        @pytest.mark.k8s(provider="kind")
        def test_m(k8s):
            pass
    '''})
    proc = run_pytest(project, env=dict(os.environ, PATH=str(bin_dir(tmp_path))))
    out = proc.stdout + proc.stderr
    assert "1 error" in out and "--k8s-provider kind needs the `kind` command on PATH" in out, out[-3000:]

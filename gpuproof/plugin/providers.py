"""Which cluster a session uses, chosen the pytest-kubernetes way, and gpuproof's embedded cluster
as a pytest-kubernetes provider.

Long: pytest-kubernetes's providers and gpuproof's choice of cluster are one integration.

One choice per pytest session, made from pytest-kubernetes's options and gpuproof's own:

==========================================  ===================================================
options                                     cluster
==========================================  ===================================================
(none)                                      gpuproof's embedded cluster (``--gpuproof-fleet``)
``--k8s-provider gpuproof``                 the same; ``--k8s-provider-config`` may name the fleet
``--kubeconfig``/``--context``,             an existing cluster, as it is (pytest-kubernetes's
``--k8s-kubeconfig``, ``--k8s-provider      ``external`` provider, with a context)
external``
``--k8s-provider kind|k3d|minikube[-*]``    a throwaway cluster that pytest-kubernetes's provider
``[--k8s-provider-config FILE]``            creates (from ``kind-configs/``) and deletes at the end
==========================================  ===================================================

gpuproof's fixtures (``target``, ``run``, ...) and pytest-kubernetes's ``k8s`` fixture then see the
same cluster: ``k8s`` without a provider of its own (``@pytest.mark.k8s(provider=...)``) is the
session's cluster, created once, never deleted by a test. A marker that names a provider gets
pytest-kubernetes's usual per-test cluster; ``provider="gpuproof"`` there gets an embedded cluster
(``provider_config`` = fleet), shared with the session when the fleet is the session's.

A config file ``kind-configs/NAME.yaml`` may have a companion ``NAME.setup.sh``: it runs once the
cluster is up (``KUBECONFIG`` and ``KIND_CLUSTER_NAME`` set) and installs what makes it a GPU
cluster (NVIDIA's GPU mock, the device plugin, GFD).

pytest-kubernetes 0.9 refuses provider names outside its own list and, since its cluster name
option has a default, every ``--k8s-provider-config``; and its ``k8s`` fixture reads neither from the
command line. gpuproof validates both itself, then clears them before pytest-kubernetes looks
(:func:`install`, from gpuproof's ``pytest_configure``, which runs first).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml
from pytest_kubernetes.providers import select_provider_manager
from pytest_kubernetes.providers.base import AClusterManager
from pytest_kubernetes.providers.external import ExternalManagerBase

from ..errors import ClusterError, GpuproofError

EMBEDDED = "gpuproof"
EXTERNAL = "external"
EMBEDDED_NAMES = (EMBEDDED, "embedded")
# provider -> (command it runs, container engine it needs: None = none, "kind" = kind's choice)
THROWAWAY = {
    "kind": ("kind", "kind"),
    "k3d": ("k3d", "docker"),
    "minikube": ("minikube", "docker"),
    "minikube-docker": ("minikube", "docker"),
    "minikube-kvm2": ("minikube", None),
}
PROVIDERS = (EMBEDDED, *THROWAWAY, EXTERNAL)
INSTALL = {
    "kind": "https://kind.sigs.k8s.io/docs/user/quick-start/#installation, or `python -m gpuproof.tools build kind` "
            "and put its folder on PATH",
    "k3d": "https://k3d.io/#installation",
    "minikube": "https://minikube.sigs.k8s.io/docs/start/",
}
PLUGIN_NAME = "gpuproof.plugin.providers"
Progress = Callable[[str], None]


class ProviderChoiceError(GpuproofError, pytest.UsageError):
    """The options name no usable cluster (pytest prints it as a one-line usage error)."""


def _quiet(msg: str) -> None:
    pass


def default_kubeconfig() -> str:
    """The kubeconfig kubectl would read: the first of $KUBECONFIG, else ~/.kube/config."""
    first = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return first[0] if first else str(Path.home() / ".kube" / "config")


def config_cluster_name(provider: str, path: str | None) -> str | None:
    """The cluster name a kind (``name``) or k3d (``metadata.name``) config file gives."""
    if not path:
        return None
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(data, dict):
        return None
    if provider == "k3d":
        meta = data.get("metadata")
        return meta.get("name") if isinstance(meta, dict) else None
    return data.get("name") if isinstance(data.get("name"), str) else None


# ---------------------------------------------------------------------------- the choice


@dataclasses.dataclass
class ClusterChoice:
    """The session's cluster: which provider makes it, and from what."""

    provider: str                        # gpuproof, external, kind, k3d, minikube, ...
    kubeconfig: str | None = None        # external
    context: str | None = None           # external
    provider_config: str | None = None   # kind/k3d config file; the fleet for gpuproof
    k8s_version: str | None = None       # --k8s-version, for a throwaway cluster without a config
    _manager: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def real(self) -> bool:
        """Real kubelets (anything but the embedded cluster)."""
        return self.provider != EMBEDDED

    @property
    def throwaway(self) -> bool:
        return self.provider in THROWAWAY

    @property
    def fleet(self) -> str | None:
        return self.provider_config if self.provider == EMBEDDED else None

    @property
    def cluster_name(self) -> str | None:
        return config_cluster_name(self.provider, self.provider_config) if self.throwaway else None

    def label(self) -> str:
        """The target as the run's meta.json records it."""
        if self.provider == EMBEDDED:
            return "embedded"
        if self.provider == EXTERNAL:
            return f"kubeconfig:{self.kubeconfig or '~/.kube/config'}#{self.context or ''}"
        return f"{self.provider}:{self.provider_config or self.cluster_name or 'default'}"

    def describe(self) -> str:
        if self.provider == EMBEDDED:
            return f"embedded cluster, fleet {self.fleet or 'mixed'}"
        if self.provider == EXTERNAL:
            return (f"cluster from kubeconfig {self.kubeconfig or '(default)'} "
                    f"context {self.context or '(current)'}")
        made = f"from {self.provider_config}" if self.provider_config else "with the provider's defaults"
        return f"a new {self.provider} cluster {made} (pytest-kubernetes; deleted at the end)"

    # -- real clusters: open (creating a throwaway one once) and close

    def open(self, progress: Progress = _quiet) -> tuple[str, str | None]:
        """(kubeconfig, context) of a real cluster; a throwaway one is created on the first call."""
        if self.provider == EMBEDDED:
            raise ValueError("the embedded cluster is started by gpuproof's Target, not opened")
        if self.provider == EXTERNAL:
            return self.kubeconfig, self.context        # None: the client's default ($KUBECONFIG, ~/.kube/config)
        if self._manager is None:
            self._manager = self._create(progress)
        return str(self._manager.kubeconfig), None

    def _create(self, progress: Progress):
        preflight(self.provider)
        klass = select_provider_manager(self.provider, {"version": self.k8s_version} if self.k8s_version else {})
        name = self.cluster_name
        if name:
            # pytest-kubernetes 0.9 names clusters "pytest-<name>" and deletes (and, for k3d, reads the
            # kubeconfig of) that name, while kind/k3d create the one the config file gives: use the file's
            klass = type(klass.__name__, (klass,), {"cluster_name": property(lambda self, _n=name: _n)})
        manager = klass(None, self.provider_config, None)
        progress(f"creating a {self.provider} cluster "
                 f"{f'from {self.provider_config}' if self.provider_config else ''} (pytest-kubernetes)")
        try:
            manager.create()
        except subprocess.CalledProcessError as exc:
            out = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
            raise ClusterError(f"{self.provider} could not create the cluster"
                               f"{f' from {self.provider_config}' if self.provider_config else ''}: "
                               f"{_last_line(out) or exc}") from None
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            raise ClusterError(f"{self.provider} could not create the cluster: {exc}") from None
        self._manager = manager
        script = setup_script(self.provider_config)
        if script is not None:
            run_setup_script(script, str(manager.kubeconfig), manager.cluster_name, progress)
        return manager

    def close(self, progress: Progress = _quiet) -> None:
        """Delete a throwaway cluster this session created. Idempotent."""
        manager, self._manager = self._manager, None
        if manager is None:
            return
        progress(f"deleting the {self.provider} cluster {manager.cluster_name}")
        try:
            manager.delete()
        except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
            progress(f"could not delete the {self.provider} cluster {manager.cluster_name}: {exc}")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def choose(opt: Callable[..., Any]) -> ClusterChoice:
    """The session's cluster from the options (``opt`` = ``config.getoption``). Conflicting or
    unusable options raise :class:`ProviderChoiceError` with one line that says which."""
    def get(name: str):
        value = opt(name, None)
        return value.strip() if isinstance(value, str) and value.strip() else (value or None)

    provider = get("k8s_provider")
    provider = provider.lower() if provider else None
    if provider == "embedded":
        provider = EMBEDDED
    if provider is not None and provider not in PROVIDERS:
        raise ProviderChoiceError(f"--k8s-provider {provider}: no such provider; choose one of "
                                  f"{EMBEDDED} (gpuproof's embedded cluster), {', '.join(THROWAWAY)}, {EXTERNAL}")
    kc, ctx = get("kubeconfig"), get("context")
    k8s_kc = get("k8s_kubeconfig_override") or get("k8s_kubeconfig")
    if kc and k8s_kc and _same_file(kc, k8s_kc) is False:
        raise ProviderChoiceError(f"--kubeconfig {kc} and --k8s-kubeconfig {k8s_kc} name different clusters: "
                                  f"give one")
    kubeconfig = k8s_kc or kc
    pconf, fleet = get("k8s_provider_config"), get("fleet")
    named_existing = " / ".join(n for n, v in (("--kubeconfig", kc), ("--context", ctx),
                                               ("--k8s-kubeconfig", k8s_kc)) if v)
    if provider is None:
        if kubeconfig or ctx:
            provider = EXTERNAL
        else:
            provider = EMBEDDED

    if provider == EMBEDDED:
        if named_existing:
            raise ProviderChoiceError(f"--k8s-provider {EMBEDDED} starts gpuproof's embedded cluster, and "
                                      f"{named_existing} names an existing one: give one")
        if pconf and fleet and pconf != fleet:
            raise ProviderChoiceError(f"--k8s-provider-config {pconf} and --fleet {fleet} both name the embedded "
                                      f"cluster's fleet: give one")
        return ClusterChoice(EMBEDDED, provider_config=fleet or pconf)
    if provider == EXTERNAL:
        if not (kubeconfig or ctx):
            raise ProviderChoiceError(f"--k8s-provider {EXTERNAL} uses an existing cluster: name it with "
                                      f"--kubeconfig/--context (or --k8s-kubeconfig)")
        if pconf:
            raise ProviderChoiceError(f"--k8s-provider-config {pconf} is for a cluster that gets created; "
                                      f"{EXTERNAL} uses an existing one")
        return ClusterChoice(EXTERNAL, kubeconfig=kubeconfig, context=ctx)
    # a throwaway cluster
    if named_existing:
        raise ProviderChoiceError(f"--k8s-provider {provider} creates a new cluster, and {named_existing} names an "
                                  f"existing one: give one")
    if fleet:
        raise ProviderChoiceError(f"--fleet is for gpuproof's embedded cluster (--k8s-provider {EMBEDDED}), "
                                  f"not for {provider}")
    if pconf:
        p = Path(pconf)
        if not p.is_file():
            raise ProviderChoiceError(f"--k8s-provider-config {pconf}: no such file")
        try:
            data = yaml.safe_load(p.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ProviderChoiceError(f"--k8s-provider-config {pconf} cannot be read as YAML: "
                                      f"{' '.join(str(exc).split())}") from None
        if not isinstance(data, dict):
            raise ProviderChoiceError(f"--k8s-provider-config {pconf} is not a {provider} config (not a mapping)")
    return ClusterChoice(provider, provider_config=pconf, k8s_version=get("k8s_version"))


def _same_file(a: str, b: str) -> bool | None:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except OSError:
        return None


def preflight(provider: str) -> None:
    """A throwaway-cluster provider's command and container engine are there, or one line saying which is not."""
    binary, engine = THROWAWAY[provider]
    if not shutil.which(binary):
        raise ProviderChoiceError(f"--k8s-provider {provider} needs the `{binary}` command on PATH, and there is none "
                                  f"(install: {INSTALL[binary]})")
    if engine == "kind":          # kind's own choice of engine: docker unless KIND_EXPERIMENTAL_PROVIDER says
        engine = os.environ.get("KIND_EXPERIMENTAL_PROVIDER") or "docker"
    if engine is None:
        return
    if not shutil.which(engine):
        raise ProviderChoiceError(f"--k8s-provider {provider} runs its nodes as {engine} containers, and there is "
                                  f"no `{engine}` command on PATH")
    try:
        proc = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise ProviderChoiceError(f"--k8s-provider {provider} runs its nodes as {engine} containers, and "
                                  f"`{engine} info` did not answer within 30 s") from None
    if proc.returncode != 0:
        raise ProviderChoiceError(f"--k8s-provider {provider} runs its nodes as {engine} containers, but the "
                                  f"{engine} engine does not answer: {_last_line(proc.stderr) or proc.stdout[-200:]}")


def setup_script(provider_config: str | None) -> Path | None:
    """``NAME.setup.sh`` next to ``NAME.yaml``: what turns the new cluster into a GPU cluster."""
    if not provider_config:
        return None
    p = Path(provider_config)
    script = p.with_name(p.name.rsplit(".", 1)[0] + ".setup.sh")
    return script if script.is_file() else None


def run_setup_script(script: Path, kubeconfig: str, cluster_name: str, progress: Progress = _quiet,
                     timeout: float = 3600) -> None:
    progress(f"running {script} (installs what makes the cluster a GPU cluster)")
    env = dict(os.environ, KUBECONFIG=kubeconfig, KIND_CLUSTER_NAME=cluster_name)
    try:
        proc = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ClusterError(f"{script} did not finish within {timeout:.0f} s") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ClusterError(f"{script} failed (exit {proc.returncode}):\n{tail}")


# ---------------------------------------------------------------------------- pytest-kubernetes providers


class EmbeddedClusterManager(AClusterManager):
    """pytest-kubernetes provider ``gpuproof``: gpuproof's embedded GPU cluster (real control plane,
    kwok nodes from a fleet). ``provider_config`` is the fleet (a shipped name or a file)."""

    _target = None      # the session's Target; its embedded cluster is shared when the fleet is the same

    def __init__(self, cluster_name: str | None = None, provider_config: str | None = None,
                 kubeconfig: Path | None = None) -> None:
        if kubeconfig:
            raise ProviderChoiceError(f"provider {EMBEDDED} starts gpuproof's embedded cluster; k8s_kubeconfig "
                                      f"{kubeconfig} names another one (that is provider {EXTERNAL})")
        self._cluster_options = copy.copy(self._cluster_options)
        self._cluster_options.cluster_name = cluster_name or "gpuproof"
        self._cluster_options.kubeconfig_path = None
        self.fleet = str(provider_config) if provider_config else None
        self._sim = None
        self._created = False

    @classmethod
    def get_binary_name(cls) -> str:
        return ""           # no command: gpuproof.sim.binaries finds (or builds) the control plane

    def _ensure_executable(self) -> None:
        pass

    def _shares_session(self) -> bool:
        t = self._target
        return t is not None and t.is_embedded and self.fleet in (None, t.choice.fleet or "mixed")

    def create(self, cluster_options=None, timeout: int = 180, **kwargs) -> None:
        """Start the cluster (or take the session's); the kubeconfig is then :attr:`kubeconfig`."""
        if self.kubeconfig is not None:
            return
        if self._shares_session():
            t = self._target
            _open_session_target(t.connect)     # starts the session's embedded cluster once
            self._cluster_options.kubeconfig_path = Path(t.sim.kubeconfig)
            self._created = False
            return
        self._on_create(self._cluster_options, timeout=timeout)

    def _on_create(self, cluster_options, **kwargs) -> None:
        from ..sim.fleet_file import load_fleet
        from ..sim.controlplane import SimCluster, find_free_base

        fleet = load_fleet(self.fleet or "mixed")
        state = Path(tempfile.mkdtemp(prefix="gpuproof-k8s-"))
        self._sim = SimCluster(state, base_port=find_free_base(), private=True)
        cluster_options.kubeconfig_path = self._sim.up(fleet, timeout=float(kwargs.get("timeout") or 180))
        self._created = True

    def _on_delete(self) -> None:
        if self._sim is not None:
            self._sim.down()
            self._sim = None

    def delete(self) -> None:
        """Stop a cluster this manager started (the session's is stopped when the session ends)."""
        if self._created:
            self._on_delete()
        self._created = False
        self._cluster_options.kubeconfig_path = None

    def ready(self, timeout: int = 20) -> bool:
        if self.kubeconfig is None:
            return False
        from ..cluster.api import connect

        try:
            connect(str(self.kubeconfig)).check_reachable(timeout=timeout)
        except GpuproofError:
            return False
        return True

    def load_image(self, image: str) -> None:
        raise RuntimeError(f"the embedded cluster runs no containers (kwok plays its kubelets): there is nothing "
                           f"to load {image} into")


class SessionClusterManager(ExternalManagerBase):
    """The session's real cluster (named by --kubeconfig/--context, or created by a provider once) as
    the ``k8s`` fixture: create() opens it, delete() leaves it (and its kubeconfig) alone."""

    _target = None

    def __init__(self, cluster_name: str | None = None, provider_config: str | None = None,
                 kubeconfig: Path | str | None = None) -> None:
        if provider_config or kubeconfig:
            raise ProviderChoiceError(
                "@pytest.mark.k8s(provider_config=/k8s_kubeconfig=...) needs provider=... as well: without a "
                "provider the k8s fixture is the session's cluster (" + self._target.choice.describe() + ")")
        AClusterManager.__init__(self, cluster_name, None, None)
        self._kubeconfig = None
        choice = self._target.choice
        if choice.provider == EXTERNAL:
            kc, self.context = choice.open()
            self._kubeconfig = Path(kc or default_kubeconfig())     # pytest-kubernetes's kubectl needs a path
            self._cluster_options.kubeconfig_path = self._kubeconfig

    def create(self, cluster_options=None, timeout: int = 20, **kwargs) -> None:
        t = self._target
        kc, ctx = _open_session_target(t.choice.open, t.progress)
        self._kubeconfig = Path(kc or default_kubeconfig())
        self._cluster_options.kubeconfig_path = self._kubeconfig
        self.context = ctx

    def delete(self) -> None:
        pass        # outlives every test; a throwaway one is deleted when the session ends


def _open_session_target(open_, *args):
    """The session's cluster, or the end of the session in one line when it cannot be had."""
    try:
        return open_(*args)
    except GpuproofError as exc:
        stop_session(exc)


def session_manager(target) -> type[AClusterManager]:
    """The pytest-kubernetes manager class of the session's cluster."""
    base = EmbeddedClusterManager if target.choice.provider == EMBEDDED else SessionClusterManager
    return type(base.__name__, (base,), {"_target": target})


@pytest.fixture(scope="session")
def k8s_manager(request, k8s_manager):
    """pytest-kubernetes's provider factory with gpuproof's choice: no provider named = the session's
    cluster; ``gpuproof`` = the embedded cluster; any other name = pytest-kubernetes's provider."""
    parent = k8s_manager
    target = request.config.stash[SESSION_TARGET]

    def factory(provider_name: str | None = None):
        if request.config.getoption("k8s_kubeconfig_override", None):
            return parent(provider_name)          # pytest-kubernetes: the override wins over everything
        name = (provider_name or "").strip().lower()
        if not name:
            return session_manager(target)
        if name in EMBEDDED_NAMES:
            return type("EmbeddedClusterManager", (EmbeddedClusterManager,), {"_target": target})
        if name not in PROVIDERS:
            raise ProviderChoiceError(f"@pytest.mark.k8s(provider={provider_name!r}): no such provider; choose one "
                                      f"of {', '.join(PROVIDERS)}")
        if name in THROWAWAY:
            preflight(name)
        return parent(name)

    return factory


SESSION_TARGET = pytest.StashKey[Any]()     # the session's target, set by install()


def install(config: pytest.Config, target) -> None:
    """From gpuproof's pytest_configure (which runs before pytest-kubernetes's): check a throwaway
    provider can work, hand pytest-kubernetes options it accepts, and add gpuproof's providers to
    its ``k8s`` fixture. ``target`` is the session's (``gpuproof.plugin.target.Target``): the ``k8s_manager``
    fixture below finds it in the config's stash."""
    config.stash[SESSION_TARGET] = target
    choice = target.choice
    if choice.throwaway:
        preflight(choice.provider)
    # pytest-kubernetes 0.9 reads this marker but does not declare it (--strict-markers would refuse it)
    config.addinivalue_line("markers", "k8s(provider=None, provider_config=None, cluster_name=None, keep=False, "
                                       "k8s_kubeconfig=None): the cluster pytest-kubernetes's k8s fixture gives the "
                                       f"test; provider '{EMBEDDED}' is gpuproof's embedded cluster "
                                       "(provider_config: its fleet)")
    # gpuproof has chosen (and checked) the provider and its config; pytest-kubernetes 0.9 would refuse
    # "gpuproof" and any --k8s-provider-config, and its k8s fixture reads neither from the command line
    for dest in ("k8s_provider", "k8s_provider_config"):
        if getattr(config.option, dest, None) is not None:
            setattr(config.option, dest, None)
    try:
        import pytest_kubernetes.plugin as pk_plugin
    except ImportError:
        return
    pm = config.pluginmanager
    if pm.is_registered(pk_plugin) and not pm.has_plugin(PLUGIN_NAME):
        # registered after pytest-kubernetes, so this module's k8s_manager overrides (and wraps) its own
        pm.register(sys.modules[__name__], PLUGIN_NAME)


def stop_session(exc: GpuproofError):
    """A target that cannot be used ends the session in one line, not in an error for every module or
    test that needs it (pytest interrupts, exit status 2, and cleans up as after Ctrl-C)."""
    raise pytest.Session.Interrupted(f"gpuproof cannot use its target cluster: {exc}") from None

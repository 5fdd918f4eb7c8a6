"""gpuproof's clusters as pytest-kubernetes providers: the ``k8s`` fixture sees the session's cluster.

The session's cluster is :mod:`.choice`'s (the options) and, for kind, k3d and minikube, :mod:`.throwaway`'s.
gpuproof's fixtures (``target``, ``run``, ...) and pytest-kubernetes's ``k8s`` fixture then see the
same cluster: ``k8s`` without a provider of its own (``@pytest.mark.k8s(provider=...)``) is the
session's cluster, created once, never deleted by a test. A marker that names a provider gets
pytest-kubernetes's usual per-test cluster; ``provider="gpuproof"`` there gets an embedded cluster
(``provider_config`` = fleet), shared with the session when the fleet is the session's.

pytest-kubernetes 0.9 refuses provider names outside its own list and, since its cluster name
option has a default, every ``--k8s-provider-config``; and its ``k8s`` fixture reads neither from the
command line. gpuproof validates both itself, then clears them before pytest-kubernetes looks
(:func:`install`, from gpuproof's ``pytest_configure``, which runs first).
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from pytest_kubernetes.providers.base import AClusterManager
from pytest_kubernetes.providers.external import ExternalManagerBase

from ..errors import GpuproofError
from .choice import EMBEDDED, EMBEDDED_NAMES, EXTERNAL, PROVIDERS, ProviderChoiceError, default_kubeconfig, preflight
from .target import stop_session
from .throwaway import THROWAWAY

PLUGIN_NAME = "gpuproof.plugin.providers"


class EmbeddedClusterManager(AClusterManager):
    """pytest-kubernetes provider ``gpuproof``: gpuproof's embedded GPU cluster (real control plane, kwok and
    kubelet nodes from a fleet). ``provider_config`` is the fleet (a shipped name or a file)."""

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
        raise RuntimeError(f"the embedded cluster runs no containers but gpuproof's own (its kwok nodes none, its "
                           f"kubelet nodes gpuproof's workload images): there is nothing to load {image} into")


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

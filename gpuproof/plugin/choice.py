"""Which cluster a pytest session uses, chosen the pytest-kubernetes way: one choice per session, made from
pytest-kubernetes's options and gpuproof's own (:func:`choose`), and that choice's real cluster opened and closed.

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

The options are checked here: conflicting or unusable ones end the session in one line
(:class:`ProviderChoiceError`). A throwaway cluster is made by :mod:`.throwaway`; gpuproof's providers for
pytest-kubernetes's ``k8s`` fixture are :mod:`.providers`'.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from ..errors import GpuproofError
from . import throwaway
from .throwaway import THROWAWAY, Progress, quiet

EMBEDDED = "gpuproof"
EXTERNAL = "external"
EMBEDDED_NAMES = (EMBEDDED, "embedded")
PROVIDERS = (EMBEDDED, *THROWAWAY, EXTERNAL)


class ProviderChoiceError(GpuproofError, pytest.UsageError):
    """The options name no usable cluster (pytest prints it as a one-line usage error)."""


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

    def open(self, progress: Progress = quiet) -> tuple[str, str | None]:
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
        manager = throwaway.create(self.provider, self.provider_config, self.k8s_version, self.cluster_name,
                                   progress)
        self._manager = manager
        script = throwaway.setup_script(self.provider_config)
        if script is not None:
            throwaway.run_setup_script(script, str(manager.kubeconfig), manager.cluster_name, progress)
        return manager

    def close(self, progress: Progress = quiet) -> None:
        """Delete a throwaway cluster this session created. Idempotent."""
        manager, self._manager = self._manager, None
        if manager is not None:
            throwaway.delete(self.provider, manager, progress)


def preflight(provider: str) -> None:
    """A throwaway-cluster provider's command and container engine are there, or one line saying which is not."""
    problem = throwaway.preflight_problem(provider)
    if problem:
        raise ProviderChoiceError(problem)


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

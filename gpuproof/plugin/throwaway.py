"""A throwaway cluster: one that pytest-kubernetes's kind, k3d or minikube provider creates for the session (from a
config file of ``kind-configs/``) and deletes at its end.

Whether the provider can work here (its command, its container engine answering), and the cluster's creation
through pytest-kubernetes. A config file ``kind-configs/NAME.yaml`` may have a companion ``NAME.setup.sh``: it runs
once the cluster is up (``KUBECONFIG`` and ``KIND_CLUSTER_NAME`` set) and installs what makes it a GPU cluster
(NVIDIA's GPU mock, the device plugin, GFD). Which
cluster a session uses is :mod:`.choice`'s; this module knows nothing of the options.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

from pytest_kubernetes.providers import select_provider_manager

from ..errors import ClusterError

# provider -> (command it runs, container engine it needs: None = none, "kind" = kind's choice)
THROWAWAY = {
    "kind": ("kind", "kind"),
    "k3d": ("k3d", "docker"),
    "minikube": ("minikube", "docker"),
    "minikube-docker": ("minikube", "docker"),
    "minikube-kvm2": ("minikube", None),
}
INSTALL = {
    "kind": "https://kind.sigs.k8s.io/docs/user/quick-start/#installation, or `python -m gpuproof.tools build kind` "
            "and put its folder on PATH",
    "k3d": "https://k3d.io/#installation",
    "minikube": "https://minikube.sigs.k8s.io/docs/start/",
}
Progress = Callable[[str], None]


def quiet(msg: str) -> None:
    pass


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def preflight_problem(provider: str) -> str | None:
    """Why a throwaway-cluster provider cannot work here (its command or container engine missing, the engine not
    answering), in one line; None when it can."""
    binary, engine = THROWAWAY[provider]
    if not shutil.which(binary):
        return (f"--k8s-provider {provider} needs the `{binary}` command on PATH, and there is none "
                f"(install: {INSTALL[binary]})")
    if engine == "kind":          # kind's own choice of engine: docker unless KIND_EXPERIMENTAL_PROVIDER says
        engine = os.environ.get("KIND_EXPERIMENTAL_PROVIDER") or "docker"
    if engine is None:
        return None
    if not shutil.which(engine):
        return (f"--k8s-provider {provider} runs its nodes as {engine} containers, and there is "
                f"no `{engine}` command on PATH")
    try:
        proc = subprocess.run([engine, "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return (f"--k8s-provider {provider} runs its nodes as {engine} containers, and "
                f"`{engine} info` did not answer within 30 s")
    if proc.returncode != 0:
        return (f"--k8s-provider {provider} runs its nodes as {engine} containers, but the "
                f"{engine} engine does not answer: {last_line(proc.stderr) or proc.stdout[-200:]}")
    return None


def create(provider: str, provider_config: str | None, k8s_version: str | None, cluster_name: str | None,
           progress: Progress = quiet):
    """A new cluster made by pytest-kubernetes's ``provider``: its manager, whose ``kubeconfig`` reaches it. Fails
    with one line (:class:`ClusterError`) when it cannot be made. The config's setup script is the caller's to run
    once it holds the manager (:func:`setup_script`), so a cluster whose script fails is still deleted."""
    klass = select_provider_manager(provider, {"version": k8s_version} if k8s_version else {})
    if cluster_name:
        # pytest-kubernetes 0.9 names clusters "pytest-<name>" and deletes (and, for k3d, reads the
        # kubeconfig of) that name, while kind/k3d create the one the config file gives: use the file's
        klass = type(klass.__name__, (klass,), {"cluster_name": property(lambda self, _n=cluster_name: _n)})
    manager = klass(None, provider_config, None)
    progress(f"creating a {provider} cluster "
             f"{f'from {provider_config}' if provider_config else ''} (pytest-kubernetes)")
    try:
        manager.create()
    except subprocess.CalledProcessError as exc:
        out = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
        raise ClusterError(f"{provider} could not create the cluster"
                           f"{f' from {provider_config}' if provider_config else ''}: "
                           f"{last_line(out) or exc}") from None
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        raise ClusterError(f"{provider} could not create the cluster: {exc}") from None
    return manager


def delete(provider: str, manager, progress: Progress = quiet) -> None:
    """Delete a cluster :func:`create` made; a failure is said, not raised (the session is ending)."""
    progress(f"deleting the {provider} cluster {manager.cluster_name}")
    try:
        manager.delete()
    except (subprocess.SubprocessError, RuntimeError, OSError) as exc:
        progress(f"could not delete the {provider} cluster {manager.cluster_name}: {exc}")


def setup_script(provider_config: str | None) -> Path | None:
    """``NAME.setup.sh`` next to ``NAME.yaml``: what turns the new cluster into a GPU cluster."""
    if not provider_config:
        return None
    p = Path(provider_config)
    script = p.with_name(p.name.rsplit(".", 1)[0] + ".setup.sh")
    return script if script.is_file() else None


def run_setup_script(script: Path, kubeconfig: str, cluster_name: str, progress: Progress = quiet,
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


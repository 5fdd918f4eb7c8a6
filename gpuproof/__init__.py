"""gpuproof: acceptance and benchmark suite for GPU Kubernetes clusters.

How the package is built (docs/development.md, "How gpuproof is built"; ``tests/test_layers.py`` keeps it true),
bottom-up: base modules here (``vocab``, ``errors``, ``results``, ``catalog``, ``images``), then ``cluster/``,
``discovery/``, ``sim/`` beside ``bench/`` and ``report/``, ``plugin/``, and ``cli/`` on top. Each package's
``__init__`` says what it is for and what it may import. This module holds the version and
:func:`package_folder`, and imports only :mod:`gpuproof.errors`.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from .errors import GpuproofError

__version__ = "0.1.0"


def _in_package(name: str):
    return resources.files("gpuproof").joinpath(name)


def package_folder(name: str) -> Path:
    """A folder shipped inside the gpuproof package (``suites``, ``_workloads``, ``fleets``).

    The one way gpuproof finds its own files: through the import system, so a checkout
    (``gpuproof/suites`` and ``gpuproof/_workloads`` link to the repository's ``suites/`` and
    ``workloads/``), an editable install and an installed wheel all give the same answer.
    """
    folder = _in_package(name)
    if not isinstance(folder, Path):   # e.g. a zip import: pytest and subprocesses need real files
        raise GpuproofError(f"gpuproof is installed where its {name} folder is not a plain folder ({folder}); "
                            "install it with pip into a virtualenv")
    if not folder.is_dir():
        raise GpuproofError(f"gpuproof's {name} folder {folder} is missing: this install is incomplete; "
                            "reinstall it (pip install --force-reinstall gpuproof)")
    return folder

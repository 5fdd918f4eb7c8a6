"""The one command line, ``gpuproof <command>``: ``main`` builds the parser from each command's module (``run``,
``plan``, ``sim``, ``clean``, ``bench``, ``report``); ``options`` holds what several commands share.

Layer 5, the top: may import every layer; nothing imports it (``gpuproof.__main__`` and ``gpuproof.tools`` are
command-line entries too).
"""

from .main import main  # noqa: F401  (the ``gpuproof`` script: gpuproof.cli:main)

"""The check helpers under their old name (``from gpuproof.suite import pod, Scratch, ...``), so suites written
before the layout of issue #24 still import. New suites import :mod:`gpuproof.plugin.checks`.
"""

from .plugin.checks import *  # noqa: F401,F403

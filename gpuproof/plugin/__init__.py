"""The pytest side: the target cluster of a session (``target``; the cluster chosen from the options, ``choice``; a
throwaway kind/k3d/minikube cluster, ``throwaway``; pytest-kubernetes's providers, ``providers``), gpuproof's hooks
and fixtures, the check helpers suites import (``checks``, ``bench_checks``), and the plugins that ride along:
progress lines, ``gpuproof plan``'s collector and the coverage of each check.

pytest loads it through ``gpuproof.pytest_plugin`` (the entry point users name). Suites import check helpers
from :mod:`gpuproof.plugin.checks`.

Layer 4: may import every layer below it (``sim``, ``bench``, ``report``, ``discovery``, ``cluster``, base);
never ``cli``.
"""

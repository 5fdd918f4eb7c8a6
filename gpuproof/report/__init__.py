"""Reports for a run folder: summary.md, report.html, compare, baselines and rules.

``write_all(run_path)`` is called at the end of every run; the ``gpuproof report``
commands (see :mod:`gpuproof.cli.report`) give access to the rest.

Layer 3, beside ``sim`` and ``bench``: reads records only, so it may import the base modules (``results``,
``errors``) and nothing else of gpuproof.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_all(run_path: str | os.PathLike) -> dict[str, Path]:
    """Write summary.md and report.html into a finished run's folder; returns their paths."""
    from .data import HTML_FILE, SUMMARY_FILE, load_run
    from .html import render_html
    from .summary import render_summary

    run = load_run(Path(run_path))
    written = {}
    for name, render in ((SUMMARY_FILE, render_summary), (HTML_FILE, render_html)):
        path = run.path / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(render(run), encoding="utf-8")
        tmp.replace(path)
        written[name] = path
    return written


__all__ = ["write_all"]

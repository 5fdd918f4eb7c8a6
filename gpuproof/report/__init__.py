"""Reports for a run folder: summary.md, report.html, failed-nodes.csv, junit-grouped.xml, compare, baselines, rules.

``write_all(run_path)`` is called at the end of every run; the ``gpuproof report``
commands (see :mod:`gpuproof.cli.report`) give access to the rest.

Layer 3, beside ``sim`` and ``bench``: reads records only, so it may import the base modules (``results``,
``errors``) and nothing else of gpuproof.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_all(run_path: str | os.PathLike) -> dict[str, Path]:
    """Write summary.md, report.html, failed-nodes.csv and junit-grouped.xml into a finished run's folder; returns
    their paths. The records are loaded once and read once (gpuproof.report.digest); every report renders from that.
    """
    from .data import HTML_FILE, JUNIT_FILE, SUMMARY_FILE, load_run
    from .digest import FAILED_NODES_FILE, digest_of, failed_nodes_csv
    from .html import render_html
    from .junit import GROUPED_FILE, group_by_node
    from .summary import render_summary

    run = load_run(Path(run_path), canonical=False)
    written = {}
    if run.junit is not None:       # first the files report.html links to
        group_by_node(run.path / JUNIT_FILE, run.path / GROUPED_FILE, digest_of(run).nodes)
        written[GROUPED_FILE] = run.path / GROUPED_FILE
    renders = ((FAILED_NODES_FILE, lambda r: failed_nodes_csv(digest_of(r))), (SUMMARY_FILE, render_summary),
               (HTML_FILE, render_html))
    for name, render in renders:
        path = run.path / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(render(run), encoding="utf-8")
        tmp.replace(path)
        written[name] = path
    return written


__all__ = ["write_all"]

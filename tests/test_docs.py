"""The README and the documentation site (docs/, mkdocs.yml) stay in step with the code (issue #51).

- no relative link of README.md, of docs/ or of a file a page includes leads nowhere: its file exists, and its
  #anchor is a heading there, as GitHub makes anchors and, on the site's pages, as mkdocs makes them;
- every check a suite can fail (tests/test_check_coverage.py collects them from ``check.true``/``check.equal``) is
  named, in backticks, on the page that renders its suite: in the suite's docstring or in the page's own text;
- every suite is rendered by one page, and every feature page has its row in the README's feature table;
- the site builds with warnings as errors (also run by .ci/run's lint gate). Without mkdocs that test skips, except
  under ``GPUPROOF_REQUIRE_TOOLS=1`` or ``CI``, where it fails (mkdocs is in the ``docs`` extra, which setup.sh
  installs).

Each checker is also run on a copy with a seeded drift (a broken link, a broken anchor, a check no page names, a
suite no page renders) and must report exactly it: a checker that finds nothing would pass on any docs.

The reading of Markdown (links, anchors, markers) is docs/hooks.py's, the one the site is built with.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SUITES = REPO / "suites"
REQUIRED = os.environ.get("GPUPROOF_REQUIRE_TOOLS") == "1" or bool(os.environ.get("CI"))
README_MAX_LINES = 200
ROW_MAX_WORDS = 30

_spec = importlib.util.spec_from_file_location("gpuproof_docs_hooks", DOCS / "hooks.py")
hooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hooks)

sys.path.insert(0, str(Path(__file__).parent))
import test_check_coverage  # noqa: E402


def pages(docs: Path = DOCS) -> list[Path]:
    return sorted(docs.rglob("*.md"))


def included(docs: Path = DOCS, root: Path = REPO) -> list[Path]:
    """The repository's Markdown files the pages include."""
    return sorted({root / m.group("path") for p in pages(docs) for m in hooks.INCLUDE_MARK.finditer(p.read_text())})


def markdown_files(root: Path = REPO) -> list[Path]:
    docs = root / "docs"
    return list(dict.fromkeys([root / "README.md", *pages(docs), *included(docs, root)]))


def page_of_suite(docs: Path = DOCS) -> dict[str, list[Path]]:
    """suite name (test_<name>.py) -> the pages that render it."""
    out: dict[str, list[Path]] = {}
    for page in pages(docs):
        for name in hooks.suites_of(page.read_text()):
            out.setdefault(name, []).append(page)
    return out


def unnamed_checks(checks: dict[str, str], docs: Path = DOCS, root: Path = REPO,
                   suites: Path = SUITES) -> list[str]:
    """Each check (name -> its suite file) that the page rendering its suite does not name in backticks."""
    of_suite = page_of_suite(docs)
    rendered: dict[Path, str] = {}
    missing = []
    for name, file in sorted(checks.items()):
        suite = file.removesuffix(".py").removeprefix("test_")
        if not of_suite.get(suite):
            missing.append(f"{name} ({file}): no page renders suites/{file} (<!-- suite: {suite} -->)")
            continue
        page = of_suite[suite][0]
        if page not in rendered:
            rendered[page] = hooks.rendered(page.read_text(), page, root, suites)
        if f"`{name}`" not in rendered[page]:
            missing.append(f"{name} ({file}): not named on {page.relative_to(root)} (write `{name}` in the "
                           f"suite's docstring or on the page: what it checks and what its failure says)")
    return missing


def suites_without_one_page(docs: Path = DOCS, suites: Path = SUITES) -> list[str]:
    of_suite = page_of_suite(docs)
    out = []
    for path in sorted(suites.glob("test_*.py")):
        name = path.stem.removeprefix("test_")
        where = [str(p.relative_to(docs)) for p in of_suite.get(name, [])]
        if len(where) != 1:
            out.append(f"suites/{path.name}: rendered by {where or 'no page'} (one page, <!-- suite: {name} -->)")
    return out


def feature_rows(readme: str) -> dict[str, str]:
    """The README's feature table: link target -> the row."""
    table = readme.split("## What it checks", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): line for line in table.splitlines() if line.startswith("| [")
            for m in [re.match(r"\| \[[^\]]+\]\(([^)]+)\)", line)] if m}


# ---------------------------------------------------------------- links


def test_no_broken_link_in_the_readme_or_the_docs():
    files = markdown_files()
    assert len(files) > 30, [str(f) for f in files]
    broken = hooks.broken_links(files, REPO)
    assert not broken, "broken links:\n" + "\n".join(broken)


def copy_docs(tmp_path: Path) -> Path:
    """README.md, docs/ and the files the pages include, in a folder of their own, with what their links lead to
    (Markdown files as they are, for their anchors; other files empty; folders)."""
    def put(path: Path) -> None:
        dest = tmp_path / path.relative_to(REPO)
        if path.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        elif not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, dest) if path.suffix == ".md" else dest.touch()

    for path in markdown_files():
        put(path)
        for target in hooks.links(path.read_text()):
            dest = (path.parent / target.partition("#")[0]).resolve()
            if target and not hooks.SCHEME.match(target) and dest.exists() and dest.is_relative_to(REPO):
                put(dest)
    return tmp_path


def test_a_broken_link_or_anchor_is_found(tmp_path):
    """Seeded drift: a README link to a page that is not there, a page's link to a heading that is not there, and
    one the site would make otherwise than GitHub; the unchanged copy has none."""
    root = copy_docs(tmp_path)
    files = markdown_files(root)
    assert hooks.broken_links(files, root) == []
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "\nSee [gone](docs/features/gone.md).\n")
    health = root / "docs" / "features" / "health.md"
    health.write_text(health.read_text() + "\n[nodes](nodes.md#what-a-failure-sayz)\n"
                      "\n## A -- B\n\n[here](#a----b)\n")
    assert hooks.broken_links(files, root) == [
        "README.md: docs/features/gone.md (no such file)",
        "docs/features/health.md: nodes.md#what-a-failure-sayz (no heading #what-a-failure-sayz on GitHub)",
        "docs/features/health.md: #a----b (no heading #a----b on the site: mkdocs makes it otherwise)",
    ]


def test_links_in_code_are_not_links():
    text = "a [x](one.md) `[y](two.md)`\n\n```sh\n[z](three.md)\n```\n[w](four.md#h \"t\")\n"
    assert hooks.links(text) == ["one.md", "four.md#h"]


def test_slugs_as_github_and_mkdocs_make_them():
    assert hooks.slug_github("Permissions (RBAC)") == hooks.slug_mkdocs("Permissions (RBAC)") == "permissions-rbac"
    assert hooks.slug_github("The `gpu-host` fleet") == "the-gpu-host-fleet"
    assert (hooks.slug_github("A -- B"), hooks.slug_mkdocs("A -- B")) == ("a----b", "a-b")


# ---------------------------------------------------------------- checks named in the docs


def test_every_check_the_suites_can_fail_is_named_on_its_page():
    checks = test_check_coverage.recordable_checks()
    assert len(checks) >= 85
    unnamed = unnamed_checks(checks)
    assert not unnamed, "checks the docs do not name:\n" + "\n".join(unnamed)


def test_a_check_no_page_names_is_found(tmp_path, monkeypatch):
    """Seeded drift: a suite that records a new check its docstring and page do not name."""
    suites = tmp_path / "suites"
    shutil.copytree(SUITES, suites, ignore=shutil.ignore_patterns("__pycache__"))
    nodes = suites / "test_nodes.py"
    nodes.write_text(nodes.read_text() + '\n\ndef test_seeded(check):\n'
                     '    check.true("node-seeded-drift", True, expected="", actual="")\n')
    monkeypatch.setattr(test_check_coverage, "SUITES", suites)
    checks = test_check_coverage.recordable_checks()
    assert checks["node-seeded-drift"] == "test_nodes.py"
    assert unnamed_checks(checks, suites=suites) == [
        "node-seeded-drift (test_nodes.py): not named on docs/features/nodes.md (write `node-seeded-drift` in the "
        "suite's docstring or on the page: what it checks and what its failure says)"]


def test_every_suite_has_one_page_and_every_feature_page_a_readme_row():
    assert suites_without_one_page() == []
    rows = feature_rows((REPO / "README.md").read_text())
    features = {f"docs/features/{p.name}" for p in (DOCS / "features").glob("*.md")}
    assert features - set(rows) == set(), "feature pages without a row in the README's feature table"
    assert {t for t in rows if t.startswith("docs/features/")} - features == set()


def test_a_suite_without_a_page_is_found(tmp_path):
    suites = tmp_path / "suites"
    shutil.copytree(SUITES, suites, ignore=shutil.ignore_patterns("__pycache__"))
    (suites / "test_seeded.py").write_text('"""Seeded: a suite no page renders."""\n')
    assert suites_without_one_page(suites=suites) == [
        "suites/test_seeded.py: rendered by no page (one page, <!-- suite: seeded -->)"]


def test_a_page_renders_its_suites_docstring_once():
    """The docstring is the page's text (rendered, not copied): its first line is on the page once, after the hook."""
    page = DOCS / "features" / "nodes.md"
    first = hooks.suite_docstring("nodes").splitlines()[0]
    assert first not in page.read_text()
    assert hooks.rendered(page.read_text(), page).count(first) == 1


def test_an_optional_suite_may_be_missing_and_a_named_one_may_not(tmp_path):
    page = DOCS / "features" / "x.md"
    assert "Not in this checkout yet" in hooks.rendered("<!-- suite: nothing optional -->\n", page, REPO, tmp_path)
    with pytest.raises(hooks.DocsError, match="test_nothing.py"):
        hooks.rendered("<!-- suite: nothing -->\n", page, REPO, tmp_path)


# ---------------------------------------------------------------- the README


def test_the_readme_is_short_and_opens_with_the_two_commands():
    text = (REPO / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines: move detail to a page under docs/"
    assert lines[2] == "```sh"
    assert lines[3].startswith("./setup.sh && .venv/bin/gpuproof run ")
    assert lines[4].startswith("./setup.sh && .venv/bin/python -m pytest ")
    long_rows = {t: len(row.split()) for t, row in feature_rows(text).items() if len(row.split()) > ROW_MAX_WORDS}
    assert long_rows == {}, "one line per feature: its page holds the rest"


# ---------------------------------------------------------------- the site


def test_the_site_builds_with_warnings_as_errors(tmp_path, monkeypatch, caplog):
    try:
        from mkdocs.commands.build import build
        from mkdocs.config import load_config
        from mkdocs.exceptions import Abort
    except ImportError as e:
        why = f"mkdocs is not installed ({e}): pip install -e '.[docs]' (setup.sh does)"
        if REQUIRED:
            pytest.fail(f"{why}; GPUPROOF_REQUIRE_TOOLS=1 or CI requires it", pytrace=False)
        pytest.skip(f"{why}; GPUPROOF_REQUIRE_TOOLS=1 makes this a failure")
    monkeypatch.setenv("NO_MKDOCS_2_WARNING", "1")
    config = load_config(str(REPO / "mkdocs.yml"), site_dir=str(tmp_path / "site"), strict=True)
    try:
        build(config)
    except Abort as e:
        warnings = [r.getMessage() for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
        pytest.fail(f"{e}: {warnings}", pytrace=False)
    site = tmp_path / "site"
    assert (site / "features" / "health" / "index.html").is_file()
    health = (site / "features" / "health" / "index.html").read_text()
    assert "GPU health in a pod on every GPU node" in health          # the suite's docstring, rendered

"""The documentation site's hook (mkdocs.yml ``hooks:``), and the reading of Markdown that tests/test_docs.py shares.

Each feature's text exists once. What a suite checks is its module docstring (``suites/test_<name>.py``); its page
under docs/ says where that text goes with a marker on a line of its own, and the hook puts the docstring there
when the site is built (``double backticks`` become Markdown's single ones)::

    <!-- suite: health -->             the docstring of suites/test_health.py
    <!-- suite: fabric optional -->    the same, or a note while that suite is not in the checkout
    <!-- include: reports/README.md +1 -->   a Markdown file of the repository, its headings one level down

Links are written as they work in the repository (on GitHub, from the file that holds them). An included file's
links are rebased onto the page that includes it; a link that leaves docs/ (``../benchmarks/RESULTS.md``,
``../../tests/test_health.py``) points into the source repository when mkdocs.yml names one (``repo_url``), and is
left as its text otherwise, so the site never holds a dead link and ``mkdocs build --strict`` passes either way.

The same reading is what tests/test_docs.py checks the docs with: ``broken_links`` (files and anchors, as GitHub
and mkdocs make them) and ``rendered`` (a page as the site shows it, to find the check names in).
"""

from __future__ import annotations

import ast
import os
import posixpath
import re
import unicodedata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SUITES = REPO / "suites"

SUITE_MARK = re.compile(r"^<!-- suite: (?P<name>\w+)(?P<optional> optional)? -->[ \t]*$", re.M)
INCLUDE_MARK = re.compile(r"^<!-- include: (?P<path>\S+?)(?: \+(?P<shift>\d))? -->[ \t]*$", re.M)
FENCE = re.compile(r"^[ \t]{0,3}(`{3,}|~{3,})")
CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`).+?(?<!`)\1(?!`)", re.S)
# an inline link or image: [text](target "title"); the text may hold one level of brackets
LINK = re.compile(r"!?\[(?P<text>(?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*<?(?P<target>[^()\s<>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(?P<hashes>#{1,6})[ \t]+(?P<text>.+?)[ \t]*#*[ \t]*$")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


class DocsError(Exception):
    """A marker the hook cannot honour: a suite or file that is not there."""


# ---------------------------------------------------------------- reading Markdown

def blocks(text: str) -> list[tuple[bool, str]]:
    """The text in order as (is fenced code, chunk); joined, the chunks are the text."""
    out: list[tuple[bool, str]] = []
    prose: list[str] = []
    fence = None
    code: list[str] = []
    for line in text.splitlines(keepends=True):
        m = FENCE.match(line)
        if fence is None and m:
            if prose:
                out.append((False, "".join(prose)))
                prose = []
            fence, code = m.group(1), [line]
        elif fence is not None:
            code.append(line)
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line.strip().strip(fence[0]):
                out.append((True, "".join(code)))
                fence = None
        else:
            prose.append(line)
    if fence is not None:
        out.append((True, "".join(code)))
    if prose:
        out.append((False, "".join(prose)))
    return out


def _masked(prose: str) -> str:
    """The prose with its code spans blanked (same length), so that nothing inside them reads as a link."""
    return CODE_SPAN.sub(lambda m: "\0" * len(m.group(0)), prose)


def rewrite_links(text: str, change) -> str:
    """The text with each inline link's target passed through ``change(target)``, outside code: a string is the new
    target, None leaves the link as its text alone."""
    out = []
    for is_code, chunk in blocks(text):
        if is_code:
            out.append(chunk)
            continue
        pos, masked = 0, _masked(chunk)
        for m in LINK.finditer(masked):
            new = change(chunk[m.start("target"):m.end("target")])
            out.append(chunk[pos:m.start()])
            if new is None:
                out.append(chunk[m.start("text"):m.end("text")])
            else:
                out.append(chunk[m.start():m.start("target")] + new + chunk[m.end("target"):m.end()])
            pos = m.end()
        out.append(chunk[pos:])
    return "".join(out)


def links(text: str) -> list[str]:
    """Every inline link target of the text, outside code."""
    found: list[str] = []
    rewrite_links(text, lambda target: found.append(target) or target)
    return found


def headings(text: str) -> list[tuple[int, str]]:
    """(level, text) of each ATX heading outside code."""
    return [(len(m.group("hashes")), m.group("text")) for is_code, chunk in blocks(text) if not is_code
            for m in map(HEADING.match, chunk.splitlines()) if m]


def _plain(heading: str) -> str:
    """A heading's text as rendered: links as their text, no code or emphasis marks."""
    heading = LINK.sub(lambda m: m.group("text"), heading)
    return re.sub(r"[`*]|(?<!\w)_|_(?!\w)", "", heading)


def slug_mkdocs(heading: str) -> str:
    """The anchor Python-Markdown's toc (mkdocs) gives a heading."""
    value = unicodedata.normalize("NFKD", _plain(heading)).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def slug_github(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", _plain(heading).strip().lower()).replace(" ", "-")


def anchors(text: str) -> tuple[set[str], set[str]]:
    """(GitHub's, mkdocs') anchors of a Markdown text's headings, repeats numbered as each numbers them."""
    gh: dict[str, int] = {}
    md: dict[str, int] = {}
    out_gh, out_md = set(), set()
    for _, heading in headings(text):
        for slug, seen, out, sep in ((slug_github(heading), gh, out_gh, "-"), (slug_mkdocs(heading), md, out_md, "_")):
            out.add(f"{slug}{sep}{seen[slug]}" if slug in seen else slug)
            seen[slug] = seen.get(slug, 0) + 1
    return out_gh, out_md


def broken_links(files: list[Path], root: Path, docs: Path | None = None) -> list[str]:
    """Each relative link of these Markdown files that leads nowhere: 'file: target (why)'. A link's file must exist
    (inside ``root``) and its #anchor must be a heading of the Markdown file it names, as GitHub makes anchors, and
    for a file under ``docs`` (the site's pages) as mkdocs makes them too."""
    root = root.resolve()
    docs = (docs or root / "docs").resolve()
    cache: dict[Path, tuple[set[str], set[str]]] = {}
    bad = []
    for path in files:
        path = path.resolve()
        text = path.read_text()
        for target in links(text):
            if not target or SCHEME.match(target) or target.startswith("/"):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.relative_to(root)}: {target}"
            if not dest.is_relative_to(root):
                bad.append(f"{where} (outside the repository)")
            elif not dest.exists():
                bad.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md":
                if dest not in cache:
                    cache[dest] = anchors(dest.read_text())
                gh, md = cache[dest]
                if anchor not in gh:
                    bad.append(f"{where} (no heading #{anchor} on GitHub)")
                elif dest.is_relative_to(docs) and anchor not in md:
                    bad.append(f"{where} (no heading #{anchor} on the site: mkdocs makes it otherwise)")
    return bad


# ---------------------------------------------------------------- the site's pages

def suite_docstring(name: str, suites: Path = SUITES) -> str | None:
    """A suite's module docstring as Markdown, or None when the suite is not there."""
    path = suites / f"test_{name}.py"
    if not path.exists():
        return None
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path))) or ""
    return re.sub(r"``(.+?)``", r"`\1`", doc, flags=re.S)


def suites_of(text: str) -> list[str]:
    """The suites a page renders."""
    return [m.group("name") for m in SUITE_MARK.finditer(text)]


def _rebase(target: str, source_dir: Path, page_dir: Path) -> str:
    """A relative link written in ``source_dir``, as written in ``page_dir``."""
    if not target or SCHEME.match(target) or target.startswith(("/", "#")):
        return target
    file, hash_, anchor = target.partition("#")
    dest = os.path.normpath(source_dir / file)
    return Path(os.path.relpath(dest, page_dir)).as_posix() + hash_ + anchor


def rendered(text: str, page: Path, root: Path = REPO, suites: Path = SUITES) -> str:
    """A page's Markdown with its markers replaced: suites' docstrings and included files (their links rebased onto
    the page). ``page`` is the page's path in the repository."""
    def suite(m: re.Match) -> str:
        doc = suite_docstring(m.group("name"), suites)
        if doc is not None:
            return doc
        if m.group("optional"):
            return (f"!!! note \"Not in this checkout yet\"\n    This page renders the module docstring of "
                    f"`suites/test_{m.group('name')}.py`, which this checkout does not have yet.")
        raise DocsError(f"{page.name}: the marker names suites/test_{m.group('name')}.py, which does not exist")

    def include(m: re.Match) -> str:
        source = root / m.group("path")
        if not source.is_file():
            raise DocsError(f"{page.name}: the marker includes {m.group('path')}, which does not exist")
        body = rewrite_links(source.read_text(), lambda t: _rebase(t, source.parent, page.parent))
        shift = int(m.group("shift") or 0)
        if shift:
            body = "".join(chunk if is_code else re.sub(r"^#{1,6}(?=[ \t])", lambda h: "#" * min(6, len(h.group(0))
                                                                                                + shift), chunk,
                                                          flags=re.M)
                           for is_code, chunk in blocks(body))
        return body.rstrip("\n")

    return INCLUDE_MARK.sub(include, SUITE_MARK.sub(suite, text))


LIST_ITEM = re.compile(r"^(?:[-*+]|\d+\.)[ \t]")


def lists_apart(text: str) -> str:
    """A blank line before each list that follows a paragraph line: GitHub starts the list there, Python-Markdown
    (mkdocs) would read it as more of the paragraph."""
    out = []
    for is_code, chunk in blocks(text):
        if is_code:
            out.append(chunk)
            continue
        lines = chunk.splitlines(keepends=True)
        for i, line in enumerate(lines):
            before = lines[i - 1] if i else ""
            if (LIST_ITEM.match(line) and before.strip() and not before[0].isspace() and not LIST_ITEM.match(before)
                    and not before.lstrip().startswith(("|", "#", "<!--"))):
                out.append("\n")
            out.append(line)
    return "".join(out)


def outside_docs(target: str, page: Path, docs: Path, root: Path, repo_url: str | None) -> str | None:
    """A link of a page that leaves docs/, made a link into the source repository (or None: its text alone)."""
    if not target or SCHEME.match(target) or target.startswith(("/", "#")):
        return target
    file, hash_, anchor = target.partition("#")
    dest = Path(os.path.normpath(page.parent / file))
    if dest.is_relative_to(docs):
        return target
    if not repo_url or not dest.is_relative_to(root):
        return None
    kind = "tree" if dest.is_dir() else "blob"
    return f"{repo_url.rstrip('/')}/{kind}/main/{posixpath.join(*dest.relative_to(root).parts)}{hash_}{anchor}"


# ---------------------------------------------------------------- the mkdocs hook

def on_page_markdown(markdown, page, config, files):
    docs = Path(config["docs_dir"]).resolve()
    path = docs / page.file.src_uri
    try:
        text = rendered(markdown, path)
    except DocsError as e:
        from mkdocs.exceptions import PluginError

        raise PluginError(str(e)) from None
    return lists_apart(rewrite_links(text, lambda t: outside_docs(t, path, docs, REPO, config.get("repo_url"))))

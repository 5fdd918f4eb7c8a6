"""gpuproof's layers, and the imports that keep them true (docs/development.md, "How gpuproof is built").

Bottom-up, each layer imports only layers below it (imports inside functions count too):

    0 base       gpuproof (the package), vocab, errors, results, catalog, images
    1 cluster    API access, run namespace, lease, churn, RBAC
    2 discovery  the reader of clusters
    3 sim | bench | report   side by side, never importing each other; sim never imports discovery (the words
                 both need are gpuproof.vocab's), report reads records only (base)
    4 plugin     the pytest side (gpuproof.pytest_plugin is its face under the entry point's name)
    5 cli        the command line (gpuproof.__main__, gpuproof.tools and gpuproof.rbac are command-line entries)

The checker is a plain function over a folder, so the tests below also run it over a made-up package to show
that it catches what it must.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "gpuproof"
NOT_CODE = ("suites", "_workloads", "_controlplane")     # links to suites/, workloads/, controlplane/: not layers

# module or package (prefix) -> layer; the longest prefix names a module's layer
LAYER_OF = {
    "gpuproof": "base", "gpuproof.vocab": "base", "gpuproof.errors": "base", "gpuproof.results": "base",
    "gpuproof.catalog": "base", "gpuproof.images": "base",
    "gpuproof.cluster": "cluster",
    "gpuproof.discovery": "discovery",
    "gpuproof.sim": "sim",
    "gpuproof.bench": "bench",
    "gpuproof.report": "report",
    "gpuproof.plugin": "plugin", "gpuproof.pytest_plugin": "plugin",
    "gpuproof.cli": "cli", "gpuproof.__main__": "cli", "gpuproof.tools": "cli", "gpuproof.rbac": "cli",
}
RANK = {"base": 0, "cluster": 1, "discovery": 2, "sim": 3, "bench": 3, "report": 3, "plugin": 4, "cli": 5}
# imports a lower rank allows but the design does not: (from layer, to layer)
FORBIDDEN = {("sim", "discovery"), ("report", "cluster"), ("report", "discovery")}


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root`` (links to data folders left out)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in NOT_CODE:
            continue
        parts = [root.name, *rel.with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module ``name`` imports, anywhere in it (relative imports resolved; ``from
    a import b`` counts as a.b when b is a module, else as a)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    root = name.split(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            wanted = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            wanted = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for mod in wanted:
            while mod not in known and "." in mod:
                mod = mod.rsplit(".", 1)[0]
            if mod in known and mod.split(".")[0] == root and mod != name:
                out.add(mod)
    return out


def graph(root: Path) -> dict[str, set[str]]:
    known = modules(root)
    return {name: imported(name, path, known) for name, path in known.items()}


def layer(name: str, table: dict[str, str]) -> str | None:
    """The layer of the longest entry that covers ``name``; the root package's entry covers itself alone."""
    probe = name
    while probe not in table or (probe != name and "." not in probe):
        if "." not in probe:
            return None
        probe = probe.rsplit(".", 1)[0]
    return table[probe]


def wrong_imports(edges: dict[str, set[str]], table=LAYER_OF, rank=RANK, forbidden=FORBIDDEN) -> list[str]:
    """Every import that runs upward, sideways between two layers of one rank, or along a forbidden pair."""
    bad = []
    for src, targets in sorted(edges.items()):
        a = layer(src, table)
        for dst in sorted(targets):
            b = layer(dst, table)
            if a is None or b is None or a == b:
                continue
            if rank[b] > rank[a]:
                bad.append(f"{src} -> {dst}: {a} imports {b}, a higher layer")
            elif rank[b] == rank[a]:
                bad.append(f"{src} -> {dst}: {a} imports {b}, beside it")
            elif (a, b) in forbidden:
                bad.append(f"{src} -> {dst}: {a} may not import {b}")
    return bad


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def unplaced(names, table=LAYER_OF) -> list[str]:
    return sorted(n for n in names if layer(n, table) is None)


# ---------------------------------------------------------------------------- gpuproof itself


def test_every_module_belongs_to_a_layer():
    """A new file cannot dodge the rule: a module no entry of LAYER_OF covers fails here (add it to the table)."""
    assert unplaced(modules(PKG)) == []
    assert set(LAYER_OF.values()) <= set(RANK)


def test_imports_run_down_the_layers():
    assert wrong_imports(graph(PKG)) == []


def test_no_import_circles():
    assert circles(graph(PKG)) == []


def test_the_simulator_and_the_reader_share_only_the_base():
    """The embedded cluster (sim) and the reader of clusters (discovery) do not reach each other, even through
    another module: what both need is gpuproof.vocab's (or catalog's)."""
    edges = graph(PKG)

    def reach(start: str) -> set[str]:
        seen, todo = set(), [m for m in edges if layer(m, LAYER_OF) == start]
        while todo:
            m = todo.pop()
            for n in edges.get(m, ()):
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return {layer(m, LAYER_OF) for m in seen}

    assert "discovery" not in reach("sim")
    assert "sim" not in reach("discovery")
    assert "gpuproof.vocab" in edges["gpuproof.sim.fleet"] and "gpuproof.vocab" in edges["gpuproof.discovery.nodes"]


def test_every_package_says_what_it_is_for_and_what_it_may_import():
    for init in sorted(PKG.glob("*/__init__.py")):
        if init.parent.name in NOT_CODE:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert doc, init
        assert "import" in doc, f"{init}: say what the package may import"


WORKLOADS = PKG.parent / "workloads"
LOOSE_MAX = 8          # modules at the package's top level, besides __init__ and __main__


def test_long_modules_say_why_at_their_top():
    """No module of gpuproof/ or workloads/ over ~400 lines without a reason on its first lines ("Long: ...")."""
    long = []
    files = {**modules(PKG), **{f"workloads/{p.name}": p for p in sorted(WORKLOADS.glob("*.py"))}}
    for name, path in files.items():
        text = path.read_text()
        if text.count("\n") > 420 and "Long:" not in "\n".join(text.splitlines()[:40]):
            long.append(f"{name} ({text.count(chr(10))} lines)")
    assert long == []


def test_the_top_level_keeps_few_loose_modules():
    """What belongs to a layer lives in its package; the top level keeps the base's words and the entries users
    know (issue #40: nine were loose)."""
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= LOOSE_MAX, loose


# ---------------------------------------------------------------------------- the checker catches what it must


@pytest.fixture
def made_up(tmp_path) -> Path:
    """A package with one layer per rank, and a module for each wrong import."""
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "words.py": "X = 1\n",
        "reader/__init__.py": "",
        "reader/nodes.py": "from ..words import X\n",
        "sim/__init__.py": "",
        "sim/model.py": "from .. import words\n",
        "bench/__init__.py": "",
        "bench/run.py": "from ..words import X\n",
        "cli/__init__.py": "",
        "cli/main.py": "from ..sim import model\nfrom ..reader.nodes import X\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


TABLE = {"pkg": "base", "pkg.words": "base", "pkg.reader": "discovery", "pkg.sim": "sim", "pkg.bench": "bench",
         "pkg.cli": "cli"}


def test_a_clean_made_up_package_passes(made_up):
    edges = graph(made_up)
    assert edges["pkg.cli.main"] == {"pkg.sim.model", "pkg.reader.nodes"}
    assert wrong_imports(edges, TABLE) == [] and circles(edges) == [] and unplaced(edges, TABLE) == []


def test_the_checker_catches_an_upward_import_even_inside_a_function(made_up):
    (made_up / "reader" / "nodes.py").write_text("def f():\n    from ..cli import main\n")
    assert wrong_imports(graph(made_up), TABLE) == ["pkg.reader.nodes -> pkg.cli.main: discovery imports cli, "
                                                    "a higher layer"]


def test_the_checker_catches_sideways_and_forbidden_imports(made_up):
    (made_up / "sim" / "model.py").write_text("import pkg.bench.run\nfrom ..reader import nodes\n")
    assert wrong_imports(graph(made_up), TABLE) == [
        "pkg.sim.model -> pkg.bench.run: sim imports bench, beside it",
        "pkg.sim.model -> pkg.reader.nodes: sim may not import discovery"]


def test_the_checker_catches_a_circle_inside_a_layer(made_up):
    (made_up / "sim" / "model.py").write_text("from . import render\n")
    (made_up / "sim" / "render.py").write_text("def f():\n    from .model import Fleet\n")
    assert circles(graph(made_up)) == [["pkg.sim.model", "pkg.sim.render"]]


def test_the_checker_catches_a_module_outside_every_layer(made_up):
    (made_up / "helpers.py").write_text("")
    assert unplaced(graph(made_up), TABLE) == ["pkg.helpers"]

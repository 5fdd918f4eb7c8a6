"""The embedded cluster (fleet + sim) and the reader of clusters (discovery) do not import each other.

They share only ``gpuproof/vocab.py``. (The full layering of issue #24 is not done yet; this keeps the
part that is true from regressing.)
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "gpuproof"
SIMULATOR = [PKG / "fleet.py", *sorted((PKG / "sim").glob("*.py"))]
READER = [PKG / "discovery.py"]


def imported(path: Path) -> set[str]:
    """Modules ``path`` imports, as absolute gpuproof names (relative imports resolved)."""
    package = ["gpuproof", *path.relative_to(PKG).parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("gpuproof")}


def test_simulator_does_not_import_the_reader():
    offenders = {p.name: sorted(m for m in imported(p) if m.startswith("gpuproof.discovery")) for p in SIMULATOR}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_reader_does_not_import_the_simulator():
    for path in READER:
        bad = sorted(m for m in imported(path) if m.startswith(("gpuproof.sim", "gpuproof.fleet")))
        assert bad == [], path.name


def test_the_check_sees_relative_imports():
    assert "gpuproof.vocab" in imported(PKG / "fleet.py")
    assert "gpuproof.vocab.SIMULATED" in imported(PKG / "sim" / "controlplane.py")

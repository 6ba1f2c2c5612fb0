"""No import cycle anywhere in the five parts, at file level (issue 34).

Every ``import`` / ``from ... import`` of every module of reference, simulator, probes, auditor and dashboard
counts — module-level, inside functions and under ``TYPE_CHECKING`` alike (a lazy import only hides a cycle,
it does not remove it); relative imports are resolved, and ``from pkg import name`` counts as an import of
``pkg.name`` when that is a module, else of ``pkg``. The graph's strongly connected components (Tarjan) of
more than one module are the cycles; there must be none. Store migrations are left out (Alembic loads them).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("reference", "simulator", "probes", "auditor", "dashboard")


def repo_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` of the five parts (``pkg/__init__.py`` is ``pkg``)."""
    out: dict[str, Path] = {}
    for part in PARTS:
        for f in sorted((root / part).rglob("*.py")):
            if "migrations" in f.parts:
                continue
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def module_imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The repo modules that module ``name`` (file ``path``) imports anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        for t in targets:
            while t and t not in known:  # a name inside a module → the module
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """Module → the repo modules it imports."""
    return {m: module_imports(m, p, known) for m, p in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (each sorted), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return out


def test_the_cycle_finder_finds_cycles_lazy_and_type_checking_ones_too(tmp_path: Path) -> None:
    """The check itself can fail: a lazy import and a ``TYPE_CHECKING`` import each close a cycle it reports."""
    pkg = tmp_path / "auditor"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from auditor.b import x\n")
    (pkg / "b.py").write_text("def f():\n    from auditor import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .sub.d import y\n")
    (pkg / "sub" / "d.py").write_text("from ..c import z\n")
    (pkg / "e.py").write_text("import auditor.a\n")  # imports into a cycle without being in one
    known = repo_modules(tmp_path)
    assert module_imports("auditor.sub.d", known["auditor.sub.d"], known) == {"auditor.c"}
    assert sorted(cycles(import_graph(known))) == [["auditor.a", "auditor.b"], ["auditor.c", "auditor.sub.d"]]


def test_no_import_cycles() -> None:
    """0 cycles among the repo's modules (there were 8 before issue 34)."""
    known = repo_modules()
    assert len(known) > 100  # the parts were found
    found = cycles(import_graph(known))
    assert found == [], "import cycles (cut each along its seam; no lazy import hides one):\n" + "\n".join(
        " <-> ".join(c) for c in found)

"""The layering rules of docs/ARCHITECTURE.md ("Parts and allowed arrows"), enforced.

Every ``import`` / ``from ... import`` in the five parts (reference, simulator, probes, auditor,
dashboard) is read with :mod:`ast` — module-level, function-level and ``TYPE_CHECKING`` ones alike,
relative imports resolved — and checked against the rules L1–L11 below, which mirror the rule
table in the doc (``test_doc_and_test_list_the_same_rules`` keeps the two in step). L9 is checked
by importing the light parts in a subprocess where torch and transformers cannot be imported.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("reference", "simulator", "probes", "auditor", "dashboard")
STDLIB = frozenset(sys.stdlib_module_names) | {"__future__"}


@dataclass(frozen=True)
class Import:
    """One imported module, as written in ``file`` (repo-relative, posix) at ``lineno``."""

    module: str
    file: str
    lineno: int
    lazy: bool  # inside a function or an ``if TYPE_CHECKING:`` block

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        return f"{self.file}:{self.lineno}: {self.module}" + (" (lazy)" if self.lazy else "")


def _is_module(dotted: str) -> bool:
    p = ROOT.joinpath(*dotted.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def _package_of(rel: Path) -> list[str]:
    parts = list(rel.with_suffix("").parts)
    return parts[:-1]  # a module's package; for __init__.py the package itself is parts[:-1] too


def _walk(body: list[ast.stmt], lazy: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, lazy
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from _walk(node.body, True)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _walk(node.body, True)
            yield from _walk(node.orelse, lazy)
        else:
            for field in ("body", "orelse", "finalbody", "handlers", "cases"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    stmts: list[ast.stmt] = []
                    for c in children:
                        stmts.extend(c.body if isinstance(c, ast.excepthandler | ast.match_case) else [c])
                    yield from _walk(stmts, lazy)


@cache
def imports_of(rel_path: str) -> tuple[Import, ...]:
    """Every module the repo file ``rel_path`` imports (see :func:`imports_in`)."""
    return imports_in((ROOT / rel_path).read_text(encoding="utf-8"), rel_path)


def imports_in(source: str, rel_path: str) -> tuple[Import, ...]:
    """Every module ``source`` (as file ``rel_path``) imports: for ``from M import n``, M and also
    M.n when that is a module of this repo; relative imports resolved against ``rel_path``."""
    rel = Path(rel_path)
    tree = ast.parse(source, rel_path)
    out: list[Import] = []
    for node, lazy in _walk(tree.body, False):
        if isinstance(node, ast.Import):
            out.extend(Import(a.name, rel_path, node.lineno, lazy) for a in node.names)
            continue
        if node.level:
            base = _package_of(rel)
            base = base[: len(base) - (node.level - 1)]
            module = ".".join(base + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        out.append(Import(module, rel_path, node.lineno, lazy))
        for a in node.names:
            sub = f"{module}.{a.name}"
            if _is_module(sub):
                out.append(Import(sub, rel_path, node.lineno, lazy))
    return tuple(out)


def files_of(part: str) -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / part).rglob("*.py"))


def all_imports(part: str) -> list[Import]:
    return [imp for f in files_of(part) for imp in imports_of(f)]


def matches(module: str, prefixes: frozenset[str] | set[str] | tuple[str, ...]) -> bool:
    """True when module is one of ``prefixes`` or inside one of them."""
    return any(module == p or module.startswith(p + ".") for p in prefixes)


# ------------------------------------------------------------------------------------------ rules
@dataclass(frozen=True)
class Rule:
    """A layering rule: which files it covers and which of their imports break it."""

    id: str
    text: str
    files: Callable[[], list[str]]
    broken_by: Callable[[Import], bool]

    def violations(self) -> list[Import]:
        return [imp for f in self.files() for imp in imports_of(f) if self.broken_by(imp)]


HTTP_STACK = frozenset({"fastapi", "starlette", "uvicorn", "httpx"})
TORCH_STACK = frozenset({"torch", "transformers", "safetensors", "accelerate", "optimum", "gguf", "tokenizers"})
#: the places where auditor/ may use the simulator (noise floor, calibration, their CLI commands)
SIMULATOR_USERS = ("auditor/check/measured_floors.py", "auditor/calibration/", "auditor/cli/serve.py",
                   "auditor/cli/calibrate.py")
#: what dashboard/ may import from auditor/ (exact modules: the store's query functions and engine helpers)
DASHBOARD_AUDITOR_API = frozenset(
    {"auditor.store", "auditor.store.queries", "auditor.store.dashboard_queries", "auditor.store.run_detail_queries",
     "auditor.store.db", "auditor.util"}
)
#: third-party imports that must stay lazy (function-level or TYPE_CHECKING) anywhere in auditor/ (L10),
#: together with every repo module that imports one of them at load time (:func:`loads_heavy`)
HEAVY = frozenset({"torch", "transformers", "fastapi", "uvicorn", "starlette", "streamlit", "matplotlib",
                   "optimum"})


def _file_of(module: str) -> str | None:
    p = ROOT.joinpath(*module.split("."))
    if (p / "__init__.py").is_file():
        return (p / "__init__.py").relative_to(ROOT).as_posix()
    if p.with_suffix(".py").is_file():
        return p.with_suffix(".py").relative_to(ROOT).as_posix()
    return None


def _eager_deps(module: str) -> tuple[bool, list[str]]:
    """(imports a HEAVY package at load time, repo modules it loads at load time) for one module,
    counting its parent packages' ``__init__`` too."""
    parts = module.split(".")
    heavy, deps = False, []
    for k in range(1, len(parts) + 1):
        f = _file_of(".".join(parts[:k]))
        if f is None:
            continue
        for imp in imports_of(f):
            if imp.lazy:
                continue
            heavy |= imp.top in HEAVY
            if imp.top in PARTS:
                deps.append(imp.module)
    return heavy, deps


@cache
def loads_heavy(module: str) -> bool:
    """True when importing repo module ``module`` imports a HEAVY package at load time (transitively)."""
    seen, todo = {module}, [module]
    while todo:
        heavy, deps = _eager_deps(todo.pop())
        if heavy:
            return True
        for d in deps:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return False


def _heavy_eager(imp: Import) -> bool:
    if imp.lazy:
        return False
    return imp.top in HEAVY or (imp.top in PARTS and loads_heavy(imp.module))


def _third_party(imp: Import) -> bool:
    return imp.top not in STDLIB and imp.top not in PARTS


RULES: dict[str, Rule] = {
    r.id: r
    for r in (
        Rule("L1", "reference/ imports no other part",
             lambda: files_of("reference"),
             lambda i: i.top in {"probes", "simulator", "auditor", "dashboard"}),
        Rule("L2", "simulator/ imports reference/ only, never probes/, auditor/ or dashboard/",
             lambda: files_of("simulator"),
             lambda i: i.top in {"probes", "auditor", "dashboard"}),
        Rule("L3", "probes/ imports no other part and never torch/transformers",
             lambda: files_of("probes"),
             lambda i: i.top in {"reference", "simulator", "auditor", "dashboard"} or i.top in TORCH_STACK),
        Rule("L4", "auditor/detectors/ imports numpy, scipy, the standard library, itself and auditor.util only",
             lambda: [f for f in files_of("auditor") if f.startswith("auditor/detectors/")],
             lambda i: not (i.top in STDLIB or i.top in {"numpy", "scipy"}
                            or matches(i.module, ("auditor.detectors", "auditor.util")))),
        Rule("L5", "auditor/ imports simulator/ only in the noise floor, calibration, serve and calibrate modules",
             lambda: [f for f in files_of("auditor") if not f.startswith(SIMULATOR_USERS)],
             lambda i: i.top == "simulator"),
        Rule("L6", "auditor/ imports dashboard/ only in auditor/cli/dashboard.py",
             lambda: [f for f in files_of("auditor") if f != "auditor/cli/dashboard.py"],
             lambda i: i.top == "dashboard"),
        Rule("L7", "auditor/util.py imports the standard library only",
             lambda: ["auditor/util.py"],
             lambda i: i.top not in STDLIB),
        Rule("L8", "dashboard/ reads auditor/ through auditor.store query modules only; never torch, httpx, "
                   "reference/, simulator/, probes/",
             lambda: files_of("dashboard"),
             lambda i: (i.top == "auditor" and i.module not in DASHBOARD_AUDITOR_API)
             or i.top in {"reference", "simulator", "probes"} or i.top in TORCH_STACK or i.top in HTTP_STACK),
        Rule("L10", "auditor/ imports torch, transformers, fastapi, uvicorn, streamlit, matplotlib, and any module "
                    "that loads them, lazily",
             lambda: files_of("auditor"),
             _heavy_eager),
        Rule("L11", "auditor/verdict/ imports numpy, scipy, the standard library, itself, auditor.detectors and "
                    "auditor.util only",
             lambda: [f for f in files_of("auditor") if f.startswith("auditor/verdict/")],
             lambda i: not (i.top in STDLIB or i.top in {"numpy", "scipy"}
                            or matches(i.module, ("auditor.verdict", "auditor.detectors", "auditor.util")))),
    )
}


@pytest.mark.parametrize("rule_id", sorted(RULES, key=lambda k: int(k[1:])))
def test_rule(rule_id: str) -> None:
    rule = RULES[rule_id]
    files = rule.files()
    assert files, f"{rule_id} covers no file; is the rule stale?"
    bad = rule.violations()
    assert not bad, f"{rule_id} ({rule.text}) broken by:\n" + "\n".join(f"  {b}" for b in bad)


def test_allowed_arrows_between_parts() -> None:
    """The part graph is exactly the doc's diagram (a subset of it, and acyclic)."""
    allowed = {
        "reference": set(),
        "simulator": {"reference"},
        "probes": set(),
        "auditor": {"reference", "probes", "simulator", "dashboard"},
        "dashboard": {"auditor"},
    }
    for part in PARTS:
        used = {i.top for i in all_imports(part) if i.top in PARTS and i.top != part}
        assert used <= allowed[part], f"{part}/ imports {sorted(used - allowed[part])}, not an allowed arrow"


# ---------------------------------------------------------------------------------- the checker itself
def test_checker_sees_function_level_relative_and_type_checking_imports() -> None:
    src = textwrap.dedent(
        """
        from __future__ import annotations
        from typing import TYPE_CHECKING
        import numpy as np
        from . import base
        if TYPE_CHECKING:
            import torch
        try:
            import httpx
        except ImportError:
            httpx = None
        def f():
            from ..store import queries
            import transformers
        """
    )
    imps = imports_in(src, "auditor/detectors/example.py")
    got = {(i.module, i.lazy) for i in imps}
    assert ("numpy", False) in got
    assert ("auditor.detectors", False) in got and ("auditor.detectors.base", False) in got
    assert ("torch", True) in got
    assert ("httpx", False) in got
    assert ("auditor.store", True) in got and ("auditor.store.queries", True) in got
    assert ("transformers", True) in got
    bad = {i.module for i in imps if RULES["L4"].broken_by(i)}
    assert bad == {"torch", "httpx", "auditor.store", "auditor.store.queries", "transformers"}
    assert {i.module for i in imps if RULES["L10"].broken_by(i)} == set()  # all heavy ones lazy here
    eager = imports_in("import reference.models\nimport simulator.profiles\n", "auditor/example.py")
    assert [i.module for i in eager if RULES["L10"].broken_by(i)] == ["reference.models"]  # loads torch


def test_doc_and_test_list_the_same_rules() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    doc_ids = set(re.findall(r"^\|\s*(L\d+)\s*\|", doc, flags=re.M))
    assert doc_ids == set(RULES) | {"L9"}, "docs/ARCHITECTURE.md rule table and tests/test_layering.py differ"


# ---------------------------------------------------------------------------------- L9: install sets
_BLOCKER = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"blocked for the layering test: {{name}}", name=name)
        return None
sys.meta_path.insert(0, _Block())
"""


def _import_walled(modules: list[str], blocked: set[str]) -> subprocess.CompletedProcess[str]:
    code = _BLOCKER.format(blocked=sorted(blocked)) + textwrap.dedent(
        f"""
        import importlib
        for m in {modules!r}:
            importlib.import_module(m)
        leaked = sorted(k for k in sys.modules if k.split(".")[0] in {sorted(blocked)!r})
        assert not leaked, leaked
        """
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=120)


def _modules(part: str, skip: tuple[str, ...] = ()) -> list[str]:
    out = []
    for f in files_of(part):
        if f.startswith(skip):
            continue
        m = f.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        out.append(m)
    return out


def test_L9_light_parts_import_without_torch() -> None:
    """A core install (no `reference` extra) can use probes/, the detectors, the verdict and the store."""
    modules = (
        _modules("probes")
        + _modules("auditor/detectors")
        + _modules("auditor/verdict")
        + ["auditor.util"]
        + _modules("auditor/store", skip=("auditor/store/migrations/",))
    )
    res = _import_walled(modules, {"torch", "transformers", "fastapi", "uvicorn", "streamlit"})
    assert res.returncode == 0, res.stderr[-3000:]


def test_L9_dashboard_imports_without_torch_or_httpx() -> None:
    pytest.importorskip("streamlit")
    modules = _modules("dashboard", skip=("dashboard/app.py",))
    res = _import_walled(modules, {"torch", "transformers", "httpx", "reference", "simulator", "probes"})
    assert res.returncode == 0, res.stderr[-3000:]


def test_L9_cli_shell_imports_without_torch() -> None:
    res = _import_walled(["auditor.cli"], {"torch", "transformers"})
    assert res.returncode == 0, res.stderr[-3000:]


# Parse every file once while the module is collected, before any test runs: CPython 3.11.7's
# ast.parse can raise "SystemError: AST constructor recursion depth mismatch" once another test in
# the same thread has caught a RecursionError (CPython gh-106905, fixed in later releases), which
# made these tests fail depending on test order. The parsed imports are cached by `imports_of`.
for _part in ("reference", "simulator", "probes", "auditor", "dashboard", "benchmarks", "tests"):
    if (ROOT / _part).is_dir():
        for _f in files_of(_part):
            imports_of(_f)

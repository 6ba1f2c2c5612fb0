"""docs/ARCHITECTURE.md's signature blocks cannot drift from the code.

Every top-level ``def`` line in a ```` ```python ```` block of the "Key contracts" section is read as a
signature and compared with ``inspect.signature`` of the function it names (found as the one top-level
``def`` of that name in the product, or in ``_HOMES`` where several modules define one):

- the parameters, in order, with their kind (positional-only ``/``, keyword-only after ``*``, ``*args``,
  ``**kwargs``); a last parameter ``...`` stands for further parameters, each of which must be optional;
- a default written in the doc equals the code's (literals, or a name the function's module defines), and a
  parameter the doc writes without a default has none in the code;
- an annotation written in the doc (parameter or return) equals the code's, as text.

What the doc leaves out (annotations, the optional tail behind ``...``) is not checked; what it writes is.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import pytest

_ROOT = Path(__file__).resolve().parents[1]
_DOC = _ROOT / "docs" / "ARCHITECTURE.md"
_PRODUCT = ("auditor", "probes", "reference", "simulator", "dashboard")
#: Names several product modules define at top level: the one the doc means.
_HOMES = {"render": "auditor.report.render"}
_ETC = "__etc__"


def _doc_signatures(text: str) -> list[tuple[int, str]]:
    """(doc line, ``def …`` text without its comment) of each top-level def in the python blocks."""
    out: list[tuple[int, str]] = []
    lines = text.splitlines()
    in_block = False
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            in_block = line.strip() == "```python"
        elif in_block and line.startswith("def "):
            start, sig, depth = i + 1, "", 0
            while True:
                code = lines[i].split("#", 1)[0]
                sig += " " + code.strip()
                depth += code.count("(") - code.count(")")
                if depth <= 0 or i + 1 >= len(lines):
                    break
                i += 1
            out.append((start, sig.strip()))
        i += 1
    return out


def _parse(sig: str) -> ast.FunctionDef:
    src = re.sub(r"([(,]\s*)\.\.\.(\s*\))", rf"\g<1>{_ETC}=None\g<2>", sig)
    node = ast.parse(f"{src}: pass").body[0]
    assert isinstance(node, ast.FunctionDef), sig
    return node


def _home(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    pattern = re.compile(rf"^(async )?def {re.escape(name)}\(", re.M)
    hits = [p for part in _PRODUCT for p in sorted((_ROOT / part).rglob("*.py"))
            if pattern.search(p.read_text(encoding="utf-8"))]
    assert len(hits) == 1, f"{name}: defined in {[str(h.relative_to(_ROOT)) for h in hits]} (name one in _HOMES)"
    module = ".".join(hits[0].relative_to(_ROOT).with_suffix("").parts).removesuffix(".__init__")
    return getattr(importlib.import_module(module), name)


def _text(annotation: object) -> str:
    raw = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"\s+", "", raw).replace("'", '"')


def _doc_params(fn: ast.FunctionDef) -> list[tuple[str, inspect._ParameterKind, ast.expr | None, ast.expr | None]]:
    """(name, kind, annotation, default) per parameter of the doc's signature, in order."""
    a = fn.args
    P = inspect.Parameter
    positional = [(x, P.POSITIONAL_ONLY) for x in a.posonlyargs] + [(x, P.POSITIONAL_OR_KEYWORD) for x in a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(x.arg, k, x.annotation, d) for (x, k), d in zip(positional, defaults, strict=True)]
    if a.vararg:
        out.append((a.vararg.arg, P.VAR_POSITIONAL, a.vararg.annotation, None))
    out += [(x.arg, P.KEYWORD_ONLY, x.annotation, d) for x, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        out.append((a.kwarg.arg, P.VAR_KEYWORD, a.kwarg.annotation, None))
    return out


def _value(expr: ast.expr, fn: Any) -> object:
    """A doc default: a literal, or a constant the function's module defines (``DEFAULT_MODEL``)."""
    if isinstance(expr, ast.Name):
        return getattr(inspect.getmodule(fn), expr.id)
    return ast.literal_eval(expr)


def _drift(sig: str) -> list[str]:
    """How the doc's signature ``sig`` differs from the code's (empty: it matches)."""
    doc = _parse(sig)
    fn = _home(doc.name)
    code = [p for p in inspect.signature(fn).parameters.values() if p.name != "self"]
    params = _doc_params(doc)
    etc = bool(params) and params[-1][0] == _ETC
    if etc:
        params = params[:-1]
    problems = []
    names_doc, names_code = [p[0] for p in params], [p.name for p in code]
    if (names_code[: len(names_doc)] if etc else names_code) != names_doc:
        problems.append(f"parameters {names_doc}{' + ...' if etc else ''} but the code has {names_code}")
        return problems
    for (name, kind, ann, default), p in zip(params, code, strict=False):
        if kind != p.kind:
            problems.append(f"{name}: {kind.description} in the doc, {p.kind.description} in the code")
        if ann is not None and (p.annotation is p.empty or _text(ast.unparse(ann)) != _text(p.annotation)):
            problems.append(f"{name}: annotated {ast.unparse(ann)!r} in the doc, {p.annotation!r} in the code")
        if default is None and p.default is not p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            problems.append(f"{name}: the code has a default ({p.default!r}) the doc does not write")
        elif default is not None and (p.default is p.empty or _value(default, fn) != p.default):
            problems.append(f"{name}: default {ast.unparse(default)} in the doc, "
                            f"{'none' if p.default is p.empty else repr(p.default)} in the code")
    problems += [f"{p.name}: required in the code, hidden behind '...' in the doc"
                 for p in code[len(params):] if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    ret = inspect.signature(fn).return_annotation
    if doc.returns is not None and _text(ast.unparse(doc.returns)) != _text(ret):
        problems.append(f"returns {ast.unparse(doc.returns)!r} in the doc, {ret!r} in the code")
    return problems


_SIGNATURES = _doc_signatures(_DOC.read_text(encoding="utf-8"))


def test_the_doc_has_signature_blocks() -> None:
    names = {_parse(s).name for _, s in _SIGNATURES}
    assert {"score_continuations", "decide_verdict", "load_standing", "normalize_response", "run_check"} <= names


@pytest.mark.parametrize(("line", "sig"), _SIGNATURES, ids=[f"L{n}-{_parse(s).name}" for n, s in _SIGNATURES])
def test_doc_signature_matches_the_code(line: int, sig: str) -> None:
    assert not _drift(sig), f"docs/ARCHITECTURE.md:{line} {sig}\n" + "\n".join(_drift(sig))


def test_drift_is_seen() -> None:
    """The comparison can fail: a renamed parameter, a wrong default, a missing keyword-only marker,
    a wrong return type and a required parameter hidden behind ``...`` are each reported."""
    assert not _drift("def load_report(run_id: str, db_url: str | None = None) -> AuditReport")
    assert _drift("def load_report(run, db_url=None)")
    assert _drift("def load_report(run_id, db_url='sqlite://')")
    assert _drift("def load_report(run_id, db_url=None) -> Verdict")
    assert _drift("def run_detectors(batch, floor=None, names=None, ...)")  # names is keyword-only
    assert _drift("def draw_audit(pool, budget, ...)")  # mix and rng are required
    assert _drift("def decide_verdict(results, alpha=0.05, *, floor=None, power=0.8)")  # more keywords exist

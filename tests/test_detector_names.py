"""Detector names only through the enum: outside ``auditor/detectors/`` (where ``DetectorName`` and the
registry live) no module of ``auditor/`` spells a detector's name as a bare string literal.

A member equals its string value, so a bare ``"greedy-match"`` works today and silently stops matching
when the registry renames the detector; ``DetectorName.GREEDY_MATCH`` fails at import instead.
``auditor/store/`` is left out on purpose: the store imports no rule and no detector (docs/ARCHITECTURE.md
L8), so the names it reads back are the stored strings. Prose (docstrings, f-string text) is not a bare
name: only a literal whose whole value is a detector name counts.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from auditor.detectors import DetectorName

_ROOT = Path(__file__).resolve().parents[1]
_EXEMPT = ("auditor/detectors/", "auditor/store/")


def _bare_names(source: str, filename: str = "<string>") -> list[tuple[int, str]]:
    """(line, name) of each string literal in ``source`` whose whole value is a ``DetectorName`` value."""
    values = {m.value for m in DetectorName}
    return sorted(
        (n.lineno, n.value) for n in ast.walk(ast.parse(source, filename=filename))
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in values
    )


def test_no_bare_detector_names_in_auditor() -> None:
    found = []
    for path in sorted((_ROOT / "auditor").rglob("*.py")):
        rel = path.relative_to(_ROOT).as_posix()
        if rel.startswith(_EXEMPT):
            continue
        found += [f"{rel}:{line} {name!r}" for line, name in _bare_names(path.read_text(encoding="utf-8"), rel)]
    assert not found, f"use auditor.detectors.DetectorName members instead of bare strings: {found}"


def test_bare_name_check_sees_literals_and_not_prose() -> None:
    src = (
        'x = d.get("greedy-match")\n'
        "y = f\"{p(d, 'self-tail')} rate\"\n"
        '"""The greedy-match test."""\n'
        'z = f"greedy-match p = {p}"\n'
        "w = DetectorName.GREEDY_MATCH\n"
    )
    assert _bare_names(src) == [(1, "greedy-match"), (2, "self-tail")]


def test_architecture_lists_every_detector_name() -> None:
    """docs/ARCHITECTURE.md's "Registry keys" sentence names every member (and nothing else)."""
    text = (_ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    sentence = text.split("Registry keys", 1)[1].split("(`tests/", 1)[0]
    listed = set(re.findall(r"\b[a-z]+(?:-[a-z0-9]+)+\b", sentence.split(":", 1)[1]))
    assert listed == {m.value for m in DetectorName}

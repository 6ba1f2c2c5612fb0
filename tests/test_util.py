"""auditor.util: the one `finite` and the one `json_safe`."""

from __future__ import annotations

import ast
import dataclasses
import datetime as dt
import json
import math
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel

from auditor.util import finite, json_safe


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.5, 1.5),
        (3, 3.0),
        ("2.25", 2.25),
        (np.float32(0.5), 0.5),
        (np.int64(7), 7.0),
        (-0.0, 0.0),
        (None, None),
        (True, None),
        (np.nan, None),
        (math.inf, None),
        (-math.inf, None),
        ("nan", None),
        ("abc", None),
        ([1.0], None),
        ({}, None),
        (10**400, None),  # float() overflows
    ],
)
def test_finite(value: object, expected: float | None) -> None:
    got = finite(value)
    assert got == expected
    assert got is None or type(got) is float


@dataclasses.dataclass
class _Point:
    x: float
    tags: tuple[str, ...]


class _Model(BaseModel):
    a: int
    b: float | None


def test_json_safe_gives_strict_json() -> None:
    obj = {
        "nan": float("nan"),
        "inf": np.float64("inf"),
        "np_scalars": [np.float32(0.25), np.int32(3), np.bool_(True)],
        "array": np.array([[1.0, np.nan], [np.inf, 2.0]]),
        "tuple": (1, 2),
        "set": {5},
        1: "int key",
        "bytes": b"\xe9t\xe9",
        "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        "day": dt.date(2026, 1, 2),
        "point": _Point(float("-inf"), ("a",)),
        "model": _Model(a=1, b=None),
        "other": object,
    }
    out = json_safe(obj)
    text = json.dumps(out, allow_nan=False)  # raises on any NaN/inf left behind
    back = json.loads(text)
    assert back["nan"] is None and back["inf"] is None
    assert back["np_scalars"] == [0.25, 3, True]
    assert type(out["np_scalars"][2]) is bool  # type: ignore[index]
    assert back["array"] == [[1.0, None], [None, 2.0]]
    assert back["tuple"] == [1, 2] and back["set"] == [5]
    assert back["1"] == "int key"
    assert back["bytes"] == "\xe9t\xe9"  # latin-1: one char per byte, lossless
    assert back["bytes"].encode("latin-1") == b"\xe9t\xe9"
    assert back["when"] == "2026-01-02T03:04:05+00:00" and back["day"] == "2026-01-02"
    assert back["point"] == {"x": None, "tags": ["a"]}
    assert back["model"] == {"a": 1, "b": None}
    assert back["other"] == str(object)


def test_json_safe_utf8_bytes_for_reports() -> None:
    assert json_safe("é".encode() + b"\xff", bytes_encoding="utf-8") == "é\ufffd"


def test_json_safe_returns_plain_python_floats() -> None:
    out = json_safe([np.float64(1.5)])
    assert out == [1.5] and type(out[0]) is float  # type: ignore[index]


def test_fmt_p_and_md_cell() -> None:
    import numpy as np

    from auditor.util import fmt_p, md_cell

    assert fmt_p(3e-9) == "3.0e-09" and fmt_p(0.05) == "0.0500" and fmt_p(0.5) == "0.500"
    assert fmt_p(np.float32(0.25)) == "0.250"
    assert [fmt_p(x) for x in (None, True, float("nan"), float("inf"), "x")] == ["—"] * 5
    assert md_cell("a|b`c\nd") == "a\\|b'c d"


# -- one home: auditor/util.py holds the only `finite` and `json_safe` (docs/ARCHITECTURE.md, L7) --

_PRODUCT = ("auditor", "probes", "reference", "simulator", "dashboard")
_ROOT = Path(__file__).resolve().parents[1]
_HELPER_NAMES = {"finite", "json_safe"}


def _product_functions() -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    out = []
    for part in _PRODUCT:
        for path in sorted((_ROOT / part).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            rel = path.relative_to(_ROOT).as_posix()
            out += [(rel, n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return out


def _is_finite_or_none(node: ast.expr | None) -> bool:
    """``x if math.isfinite(x) else None`` (any spelling of ``isfinite``): the body of ``finite``."""
    return (
        isinstance(node, ast.IfExp)
        and isinstance(node.orelse, ast.Constant) and node.orelse.value is None
        and isinstance(node.test, ast.Call)
        and (ast.unparse(node.test.func).endswith("isfinite"))
        and len(node.test.args) == 1 and ast.unparse(node.test.args[0]) == ast.unparse(node.body)
    )


def test_one_definition_of_each_helper() -> None:
    """No second ``finite`` / ``json_safe`` (public, private or a ``_json_…``/``_finite`` variant) in
    the product, and no function that re-implements ``finite`` by returning ``x if isfinite(x) else
    None``: callers import ``auditor.util``'s."""
    functions = _product_functions()
    homes = sorted({rel for rel, f in functions if f.name in _HELPER_NAMES})
    assert homes == ["auditor/util.py"], homes
    copies = [
        f"{rel}:{f.lineno} {f.name}" for rel, f in functions
        if rel != "auditor/util.py" and (
            f.name.lstrip("_") in _HELPER_NAMES
            or f.name.startswith(("_json_value", "_json_safe", "_jsonable", "_finite_or_none"))
            or (f.body and isinstance(f.body[-1], ast.Return) and _is_finite_or_none(f.body[-1].value))
        )
    ]
    assert not copies, f"copies of auditor.util.finite/json_safe (import them instead): {copies}"


def test_copy_detector_sees_a_copy() -> None:
    """The check above is not vacuous: it recognises the shape it forbids."""
    src = "def f(x):\n    v = float(x)\n    return v if math.isfinite(v) else None\n"
    ret = ast.parse(src).body[0].body[-1]  # type: ignore[attr-defined]
    assert _is_finite_or_none(ret.value)
    assert not _is_finite_or_none(ast.parse("v if v > 0 else None", mode="eval").body)

"""auditor.util: the one `finite` and the one `json_safe`."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math

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

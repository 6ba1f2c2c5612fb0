"""Small value helpers every part of the auditor shares: :func:`finite`, :func:`json_safe`, and the
report formatting of a p-value (:func:`fmt_p`) and of a Markdown table cell (:func:`md_cell`).

A leaf module: standard library only (numpy values are recognised by duck typing, ``tolist``), so
``auditor/detectors``, ``auditor/store`` and ``dashboard/`` can all import it without pulling
anything (docs/ARCHITECTURE.md, layering rule L7).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, overload

__all__ = ["JSONValue", "committed_calibration_path", "finite", "fmt_p", "json_safe", "kl_floor_text", "md_cell"]

#: What :func:`json_safe` returns: strict JSON data (RFC 8259; no NaN/Infinity).
JSONValue = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]


def finite(x: object) -> float | None:
    """``x`` as a finite float, or None.

    None, booleans, values ``float()`` cannot convert (TypeError/ValueError, e.g. "abc", a list)
    and NaN/±inf all give None; numpy scalars and numeric strings convert. Never raises.
    """
    if x is None or isinstance(x, bool):
        return None
    try:
        f = float(x)  # type: ignore[arg-type]  # anything float() accepts; the rest is None
    except (TypeError, ValueError, OverflowError):
        return None
    return f if math.isfinite(f) else None


@overload
def json_safe(obj: Mapping[Any, Any], *, bytes_encoding: Literal["latin-1", "utf-8"] = ...) -> dict[str, JSONValue]: ...
@overload
def json_safe(obj: list[Any] | tuple[Any, ...] | set[Any] | frozenset[Any], *,
              bytes_encoding: Literal["latin-1", "utf-8"] = ...) -> list[JSONValue]: ...
@overload
def json_safe(obj: object, *, bytes_encoding: Literal["latin-1", "utf-8"] = ...) -> JSONValue: ...
def json_safe(obj: object, *, bytes_encoding: Literal["latin-1", "utf-8"] = "latin-1") -> JSONValue:
    """Convert ``obj`` to strict JSON data (``json.dumps(..., allow_nan=False)`` accepts the result); a mapping
    gives a ``dict[str, JSONValue]``, a list/tuple/set a ``list[JSONValue]`` (the overloads say so to callers).

    Rules: NaN/±inf → None; mappings → dicts with ``str`` keys; lists, tuples and sets → lists;
    numpy arrays and scalars (anything with ``tolist``, torch tensors too) → Python numbers/lists;
    dataclass instances → dicts; pydantic models → ``model_dump(mode="json")``; dates → ISO 8601
    strings; bytes → str (``"latin-1"``: lossless, one char per byte, the store's choice;
    ``"utf-8"``: readable, invalid bytes replaced, for reports); anything else → ``str(obj)``.
    """
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):  # numpy float64 too (a float subclass): returned as a plain float
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, bytes | bytearray):
        raw = bytes(obj)
        return raw.decode("latin-1") if bytes_encoding == "latin-1" else raw.decode("utf-8", errors="replace")
    if isinstance(obj, Mapping):  # (str, int, bool, None and float items are converted here, not recursed into)
        out: dict[str, JSONValue] = {}
        for k, v in obj.items():
            key, t = str(k), type(v)
            if t is str or t is int or t is bool or v is None:
                out[key] = v
            elif t is float:
                out[key] = v if math.isfinite(v) else None
            else:
                out[key] = json_safe(v, bytes_encoding=bytes_encoding)
        return out
    if isinstance(obj, list | tuple | set | frozenset):
        items: list[JSONValue] = []
        for v in obj:
            t = type(v)
            if t is str or t is int or t is bool or v is None:
                items.append(v)
            elif t is float:
                items.append(v if math.isfinite(v) else None)
            else:
                items.append(json_safe(v, bytes_encoding=bytes_encoding))
        return items
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields: dict[str, object] = dataclasses.asdict(obj)
        return json_safe(fields, bytes_encoding=bytes_encoding)
    if isinstance(obj, dt.datetime | dt.date):
        return obj.isoformat()
    dump = getattr(obj, "model_dump", None)
    if callable(dump):  # pydantic models
        dumped: object = dump(mode="json")
        return json_safe(dumped, bytes_encoding=bytes_encoding)
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):  # numpy arrays and scalars, torch tensors
        listed: object = tolist()
        return json_safe(listed, bytes_encoding=bytes_encoding)
    return str(obj)


def kl_floor_text(ratio: float) -> str:
    """The KL-vs-floor ratio (``auditor.detectors.logprob.kl_floor_ratio``) as every report and the dashboard
    print it: three significant figures below 100, whole numbers above, e.g. ``"1890"``, ``"145"``, ``"1.4"``,
    ``"0.699"`` (the caller adds the unit words)."""
    return f"{ratio:.0f}" if ratio >= 100 else f"{ratio:.3g}"


def fmt_p(p: object) -> str:
    """A p-value for reports: ``"3.0e-09"`` below 1e-4, 4 decimals below 0.1, else 3; ``"—"`` for
    None, a value ``float()`` cannot read, or a non-finite value (numpy scalars are read too)."""
    if p is None or isinstance(p, bool):
        return "—"
    try:
        v = float(p)  # type: ignore[arg-type]  # numpy scalars, numeric strings from stored JSON
    except (TypeError, ValueError):
        return "—"
    if not math.isfinite(v):
        return "—"
    if v < 1e-4:
        return f"{v:.1e}"
    return f"{v:.4f}" if v < 0.1 else f"{v:.3f}"


def md_cell(s: object) -> str:
    """Text made safe inside a Markdown table cell (and code spans): pipes escaped, backticks → ``'``,
    newlines → spaces. Backslashes stay as they are (a token shown as ``\\n`` renders literally)."""
    return str(s).replace("|", "\\|").replace("`", "'").replace("\n", " ")


def committed_calibration_path() -> Path:
    """``docs/calibration.json`` of this checkout: the committed benchmark results that ``auditor plan``
    and the dashboard's Calibration page fall back to when the database holds none."""
    return Path(__file__).resolve().parents[1] / "docs" / "calibration.json"


def committed_card_calibration_paths() -> list[Path]:
    """``docs/cards/*/calibration.json`` of this checkout, sorted: the committed calibrations run under a model card
    (``auditor calibrate --card NAME``; their records' ``model`` is the card's model, e.g.
    ``smollm2-135m-instruct+fp8``), which ``auditor plan`` reads for a model that the float32 file does not cover."""
    return sorted((committed_calibration_path().parent / "cards").glob("*/calibration.json"))

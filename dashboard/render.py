"""Pure formatting helpers for the dashboard (no Streamlit import; unit-tested directly).

Safety rule: every provider-controlled string (provider and model names, token text, response
text, reasons) goes through :func:`escape_md` before it reaches ``st.markdown``; the app never
passes ``unsafe_allow_html``. ``escape_md`` backslash-escapes every ASCII punctuation character
(CommonMark allows that for all of them), which also disarms Streamlit's extensions: colour
directives (``:red[...]``), emoji shortcodes (``:smile:``), LaTeX (``$...$``) and autolinks.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Any

from auditor.util import finite as _finite

__all__ = [
    "VERDICT_COLORS",
    "VERDICT_HEX",
    "escape_md",
    "fmt_dt",
    "fmt_kl_vs_floor",
    "fmt_ms",
    "fmt_num",
    "fmt_p",
    "fmt_pct",
    "fmt_tokens",
    "fmt_usd",
    "md_code",
    "md_table",
    "verdict_badge",
    "visible_token",
]

#: Streamlit badge colour per verdict.
VERDICT_COLORS = {
    "PASS": "green",
    "QUANTIZATION": "orange",
    "RELAXED_VERIFICATION": "red",
    "SUBSTITUTION": "violet",
    "QUANTIZATION_OR_SUBSTITUTION": "violet",
    "QUANTIZATION_OR_RELAXED_VERIFICATION": "orange",
    "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT": "orange",
    "DECODING_NONCOMPLIANT": "yellow",
    "INCONCLUSIVE": "gray",
}
#: Chart colour per verdict (same hues as the badges).
VERDICT_HEX = {
    "PASS": "#2e7d32",
    "QUANTIZATION": "#ef6c00",
    "RELAXED_VERIFICATION": "#c62828",
    "SUBSTITUTION": "#6a1b9a",
    "QUANTIZATION_OR_SUBSTITUTION": "#ad1457",
    "QUANTIZATION_OR_RELAXED_VERIFICATION": "#d84315",
    "RELAXED_VERIFICATION_OR_DECODING_NONCOMPLIANT": "#e65100",
    "DECODING_NONCOMPLIANT": "#b8860b",
    "INCONCLUSIVE": "#757575",
}

_MD_PUNCT = re.compile(r"([!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def escape_md(text: Any, *, max_len: int | None = None) -> str:
    """Escape ``text`` for literal display inside Streamlit markdown (one line).

    Newlines and tabs become spaces, other control characters are dropped, every ASCII
    punctuation character is backslash-escaped; ``max_len`` truncates (with "…") first.
    """
    s = "" if text is None else str(text)
    if max_len is not None and len(s) > max_len:
        s = s[: max(0, max_len - 1)] + "…"
    s = s.replace("\r\n", " ").replace("\n", " ").replace("\r", " ").replace("\t", " ")
    s = _CONTROL.sub("", s)
    return _MD_PUNCT.sub(r"\\\1", s)


def md_code(text: Any, *, in_table: bool = False) -> str:
    """``text`` as an inline code span (literal: markdown, HTML and directives are not
    interpreted inside code spans); the backtick fence is longer than any backtick run in it.
    ``in_table``: escape ``|`` (GFM splits table cells on pipes even inside code spans)."""
    s = "" if text is None else str(text)
    s = _CONTROL.sub("", s.replace("\r", " ").replace("\n", " "))
    if in_table:
        s = s.replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {s} {fence}" if s else "—"


def visible_token(token: Any) -> str:
    """Token text with whitespace made visible: space → ␣, newline → ↵, tab → ⇥ (not escaped)."""
    s = "" if token is None else str(token)
    s = s.replace(" ", "␣").replace("\r", "").replace("\n", "↵").replace("\t", "⇥")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", s) if s else "∅"


def verdict_badge(verdict: str | None) -> str:
    """A coloured Streamlit badge directive for ``verdict`` (escaped; "—" when None)."""
    if not verdict:
        return "—"
    color = VERDICT_COLORS.get(verdict, "blue")
    return f":{color}-badge[{escape_md(verdict)}]"


#: Badge colour of each answer to the buyer's two questions (``auditor.verdict.questions.Answer``).
ANSWER_COLORS = {"yes": "green", "no": "red", "undecided": "orange", "not tested": "gray", "not established": "violet"}


def answer_badge(answer: object) -> str:
    """A coloured Streamlit badge directive for an answer to one of the buyer's questions (escaped)."""
    return f":{ANSWER_COLORS.get(str(answer), 'gray')}-badge[{escape_md(answer)}]"


def md_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, align: Sequence[str] | None = None) -> str:
    """A GitHub-flavoured markdown table. Cells must already be markdown-safe (escape provider
    text with :func:`escape_md`); ``align`` per column is "l", "r" or "c"."""
    if not headers:
        return ""
    align = align or ["l"] * len(headers)
    sep = {"l": ":--", "r": "--:", "c": ":-:"}
    lines = [
        "| " + " | ".join(headers) + " |",
        "| " + " | ".join(sep.get(a, "---") for a in align) + " |",
    ]
    for row in rows:
        cells = [c if c not in (None, "") else "—" for c in row]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def fmt_p(p: Any) -> str:
    """A p-value: "—" when missing, scientific below 1e-3 ("3.2e-09"), else three decimals."""
    f = _finite(p)
    if f is None:
        return "—"
    if f < 1e-3:
        return f"{f:.1e}"
    return f"{f:.3f}"


def fmt_num(x: Any, digits: int = 3) -> str:
    """A number with ``digits`` significant digits ("—" when missing)."""
    f = _finite(x)
    if f is None:
        return "—"
    return f"{f:.{digits}g}"


def fmt_pct(x: Any, digits: int = 1) -> str:
    """A fraction as a percentage ("0.062" → "6.2%")."""
    f = _finite(x)
    return "—" if f is None else f"{100 * f:.{digits}f}%"


def fmt_ms(seconds: Any) -> str:
    """Seconds shown as milliseconds ("0.085" → "85 ms"; below 10 ms one decimal)."""
    f = _finite(seconds)
    if f is None:
        return "—"
    ms = 1000 * f
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def fmt_usd(x: Any) -> str:
    """US dollars: two decimals from $1, else two significant digits ("$0.000064")."""
    f = _finite(x)
    if f is None:
        return "—"
    if f == 0:
        return "$0"
    if abs(f) >= 1:
        return f"${f:,.2f}"
    if abs(f) >= 1e-4:
        return f"${f:.2g}"
    if abs(f) < 1e-6:
        return "<$0.000001"
    return f"${f:.6f}".rstrip("0")


def fmt_tokens(n: Any) -> str:
    """A token count with thousands separators."""
    f = _finite(n)
    return "—" if f is None else f"{int(f):,}"


def fmt_dt(value: dt.datetime | None) -> str:
    """``YYYY-MM-DD HH:MM UTC`` ("—" when None)."""
    if value is None:
        return "—"
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def fmt_kl_vs_floor(kl: Any, floor: Any) -> str:
    """Mean KL with its noise floor and ratio, e.g. "0.094 (floor 0.0052, 18×)" (nats)."""
    k, f = _finite(kl), _finite(floor)
    if k is None:
        return "—"
    if f is None or f <= 0:
        return f"{k:.3g}"
    return f"{k:.3g} (floor {f:.2g}, {k / f:.1f}×)"
